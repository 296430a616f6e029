#!/usr/bin/env bash
# The md5 of every example's "step N loss L" lines on the layouts a change must leave bitwise as
# they were (or, where an order of summation changes, explain): run it with the binaries before and
# after a change and compare the two listings line by line.
#   bash scripts/curve_digests.sh BUILD_DIR [name-filter] [--against OTHER_BUILD_DIR]
# BUILD_DIR holds examples/train_transformer, train_llama, train_unet and train_mlp (a build tree).
# Prints "<layout> <md5> <last step line>" per layout; a run that fails prints FAILED instead.
# With --against, each layout also runs OTHER_BUILD_DIR's binaries and prints the largest relative
# difference of their losses from BUILD_DIR's (0 where the curves are bitwise equal).
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
build=${1:?usage: curve_digests.sh BUILD_DIR [filter] [--against OTHER_BUILD_DIR]}
filter=${2:-} other=
[[ $filter == --against ]] && filter= other=${3:?--against needs a build directory}
[[ ${3:-} == --against ]] && other=${4:?--against needs a build directory}
bin="$build/examples"
tt=(--steps 6 --layers 2 --dmodel 32 --heads 4 --seq 16 --batch 8 --vocab 64)
llama=(--steps 6 --layers 2 --dmodel 32 --heads 4 --kv-heads 2 --seq 16 --batch 8 --vocab 64)
unet=(--steps 4 --size 19 --width 17 --batch 2 --channels 3 --double)
runs=(
  "transformer.1rank|1|train_transformer ${tt[*]}"
  "transformer.model2|2|train_transformer ${tt[*]} --mesh model=2"
  "transformer.model3|3|train_transformer ${tt[*]} --mesh model=3"
  "transformer.data2_zero2|2|train_transformer ${tt[*]} --mesh data=2 --zero 2"
  "transformer.data3_zero3|3|train_transformer ${tt[*]} --mesh data=3 --zero 3"
  "transformer.data2_model2_experts|4|train_transformer ${tt[*]} --mesh data=2,model=2 --experts 4"
  "transformer.stage2_1f1b_remat|2|train_transformer ${tt[*]} --mesh stage=2 --microbatches 4 --schedule 1f1b --remat"
  "transformer.model2_bf16|2|train_transformer ${tt[*]} --mesh model=2 --dtype bf16"
  "transformer.data2_double|2|train_transformer ${tt[*]} --mesh data=2 --double"
  "transformer.model2_selective|2|train_transformer ${tt[*]} --mesh model=2 --activation-checkpoint selective"
  "llama.1rank|1|train_llama ${llama[*]}"
  "llama.model2|2|train_llama ${llama[*]} --mesh model=2"
  "llama.data2|2|train_llama ${llama[*]} --mesh data=2"
  "unet.h2w3|6|train_unet ${unet[*]} --mesh h=2,w=3"
  "unet.1rank|1|train_unet ${unet[*]}"
  "mlp.model2|2|train_mlp --model 2 --steps 12"
)
for run in "${runs[@]}"; do
  IFS='|' read -r name np cmd <<<"$run"
  [[ -z "$filter" || "$name" == *"$filter"* ]] || continue
  read -r -a argv <<<"$cmd"
  if out=$(mpirun -np "$np" --oversubscribe "$bin/${argv[0]}" "${argv[@]:1}" 2>&1); then
    steps=$(grep '^step ' <<<"$out")
    printf '%-36s %s %s' "$name" "$(md5sum <<<"$steps" | cut -c1-12)" "$(tail -n 1 <<<"$steps")"
    if [[ -n $other ]]; then
      theirs=$(mpirun -np "$np" --oversubscribe "$other/examples/${argv[0]}" "${argv[@]:1}" 2>&1 | grep '^step ')
      paste <(awk '{print $4}' <<<"$steps") <(awk '{print $4}' <<<"$theirs") |
        awk 'BEGIN { w = 0 } { d = ($1 - $2) / $2; if (d < 0) d = -d; if (d > w) w = d } END { printf "   against: %.2e", w }'
    fi
    echo
  else
    printf '%-36s FAILED\n' "$name"
    tail -n 3 <<<"$out" | sed 's/^/    /'
  fi
done
