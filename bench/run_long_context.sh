#!/usr/bin/env bash
# Long sequences on one rank (float):
#  1. bench/attention_bench.cpp: attention forward + backward, ts::nn::scaled_dot_product_attention
#     (fused, blockwise) against the same attention written out (T x T scores), per sequence
#     length up to 8192 (longer ones only in the Llama runs of 2.-4., to keep the run short),
#     B 2, 4 heads, Dh 16, with its FLOP rate against an sgemm's in the same run;
#  2. train_llama --dmodel 64 --heads 4 --kv-heads 2 --layers 2 --batch 1 --vocab 256 --steps 2 at
#     each --seq, --attention fused against --attention einsum (skipped above --written-max, as
#     it needs T^2 memory): tokens/s, the buffer pool's peak and the resident memory's;
#  3. the same with --mesh context=C for each C of --contexts (the sequence split over C ranks:
#     with 2 key-value heads, C = 2 takes the all-to-all and C = 4 the ring), tokens/s over all
#     ranks and rank 0's pool peak (on a machine with fewer cores than C, the rates mean nothing);
#     beside it, rank 0's activations (the pool's peak less what stays in use after training:
#     parameters, gradients, optimizer state) against one rank's at the same T, and the issue's
#     goal for them, 1.15 / C;
#  4. with --goal C: the long-context issue's memory goal, the Llama at T 16384 (--dmodel 256
#     --heads 8 --kv-heads 2 --layers 2 --batch 1) on C ranks, --mesh context=C.
# Where PyTorch >= 2 is importable, bench/sdpa_bench.py times its CPU flash kernel
# (scaled_dot_product_attention) on the shapes of 1., one thread, beside tshard's fused times.
#   bash bench/run_long_context.sh [--seq 1024,2048,4096,8192,16384] [--written-max 4096] [--reps 3] [--contexts 2,4]
#                                  [--goal 4]
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/prepare.sh
bench_build "libopenblas-dev" tshard_bench_attention train_llama
seqs=1024,2048,4096,8192,16384 written_max=4096 reps=3 steps=2 contexts=2,4 goal=
[[ -n $bench_tiny ]] && seqs=64,160 written_max=64 reps=1 steps=1 contexts=2
while (($#)); do
  case $1 in
    --seq) seqs=$2; shift 2 ;;
    --written-max) written_max=$2; shift 2 ;;
    --reps) reps=$2; shift 2 ;;
    --contexts) contexts=$2; shift 2 ;;
    --goal) goal=$2; shift 2 ;;
    *) echo "run_long_context.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
attention_seqs=$seqs
[[ -z $bench_tiny ]] && attention_seqs=$(echo "$seqs" | tr , '\n' | awk '$1 <= 8192' | paste -sd,)
echo "== attention alone"
attention_out=$(mktemp)
trap 'rm -f "$attention_out"' EXIT
mpirun -np 1 "$bench_dir"/bench/tshard_bench_attention --seq "$attention_seqs" --written-max "$written_max" --reps "$reps" |
  tee "$attention_out"
echo "== PyTorch's scaled_dot_product_attention on the same shapes"
sdpa_status=0
python3 bench/sdpa_bench.py --seq "$attention_seqs" --written-max "$written_max" --reps "$reps" \
  --against "$attention_out" || sdpa_status=$?
((sdpa_status == 0 || sdpa_status == 77)) || exit "$sdpa_status"
# One train_llama run on RANKS ranks at sequence T: its tokens/s, rank 0's pool peak, its
# activations (the peak less what the pool still holds after training) and the resident memory
# line's figure; with ONE (one rank's activations at T), their ratio and the goal 1.15 / RANKS.
llama_row() {
  local t=$1 label=$2 ranks=$3 one=$4
  shift 4
  mpirun -np "$ranks" "$bench_dir"/examples/train_llama --seq "$t" --dmodel 64 --heads 4 --kv-heads 2 --layers 2 --batch 1 \
    --vocab 256 --steps "$steps" "$@" | awk -v t="$t" -v a="$label" -v one="$one" -v c="$ranks" '
      /^mesh/ { for (i = 1; i <= NF; i++) if ($i == "tokens/s,") s = $(i - 1) }
      /^buffer pool/ { u = $6 / 1024; for (i = 1; i <= NF; i++) if ($i == "peak") p = $(i + 1) / 1024 }
      /^resident memory/ { for (i = 1; i <= NF; i++) if ($i == "model") r = $(i + 1) }
      END {
        printf "%7s %-10s %12s %16.1f %18.1f %20s", t, a, s, p, p - u, r
        if (one > 0) printf " %14.2f %10.2f", (p - u) / one, 1.15 / c
        printf "\n"
      }'
}
header() { printf "%7s %-10s %12s %16s %18s %20s%s\n" seq attention tokens/s "pool peak (MiB)" "activations (MiB)" \
  "resident peak (MiB)" "${1:+   / one rank       goal}"; }
declare -A one_rank  # one rank's fused activations (MiB) at each T
echo "== train_llama, one rank, float: --dmodel 64 --heads 4 --kv-heads 2 --layers 2 --batch 1 --vocab 256 --steps $steps"
header
for t in ${seqs//,/ }; do
  for attention in fused einsum; do
    if [[ $attention == einsum ]] && ((t > written_max)); then
      printf "%7s %-10s %12s\n" "$t" "$attention" "not run (T^2 memory; --written-max $written_max)"
      continue
    fi
    row=$(llama_row "$t" "$attention" 1 0 --attention "$attention")
    echo "$row"
    [[ $attention == fused ]] && one_rank[$t]=$(awk '{ print $5 }' <<<"$row")
  done
done
for c in ${contexts//,/ }; do
  way=ring
  ((2 % c == 0)) && way=all-to-all
  echo "== train_llama, --mesh context=$c ($way), float, the same sizes"
  header ratio
  for t in ${seqs//,/ }; do llama_row "$t" "$way" "$c" "${one_rank[$t]}" --mesh context="$c"; done
done
if [[ -n $goal ]]; then
  echo "== the memory goal: train_llama --seq 16384 --dmodel 256 --heads 8 --kv-heads 2 --layers 2 --batch 1 --mesh context=$goal"
  mpirun -np "$goal" "$bench_dir"/examples/train_llama --seq 16384 --dmodel 256 --heads 8 --kv-heads 2 --layers 2 \
    --batch 1 --vocab 256 --steps "$steps" --mesh context="$goal"
fi
echo "reproduce: bash bench/run_long_context.sh --seq $seqs --written-max $written_max --reps $reps --contexts $contexts${goal:+ --goal $goal}"
