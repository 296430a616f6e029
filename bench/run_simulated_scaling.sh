#!/usr/bin/env bash
# Weak scaling of train_transformer on simulated clusters (SimGrid's SMPI: docs/simulation.md),
# at bench/run_scaling.sh's size (D 1024, 16 heads, 2 layers, seq 256, vocab 1024, 8 sequences
# per data rank), on NODES nodes of 16 ranks of a platform (xeon-cluster: 200 Gb/s fat tree;
# xeon-ethernet: 25 Gb/s), in the simulation's timing mode (scripts/simulate.sh --timing: rank 0
# computes for real, the others take its kernel times). Rows per node count:
#   data=P in two levels (node, then across nodes) and flat (TSHARD_RANKS_PER_NODE=1), each with
#   and without --overlap; ZeRO 2 and 3 (two levels, overlap); model=16 inside each node x
#   data=NODES across them; stage=NODES x data=16 with 1F1B (8 layers, 2 x NODES micro-batches),
#   beside its bubble formula (K-1)/(M+K-1).
# Columns: simulated tokens/s, efficiency (tokens/s per rank against the same row at its first
# node count: one node, two for stage),
# the gradient reduction not hidden (ms/step), rank 0's bytes sent per step (every collective)
# against the cost model's for the gradient reduction alone (comm/cost.hpp's terms, G the rank's
# gradient bytes: flat 2 G (P-1)/P; two levels 2 G (L-1)/L + 2 (G/L)(N-1)/N, L ranks a node, N
# nodes), and the wall time the simulation took.
#   bash bench/run_simulated_scaling.sh [--platform xeon-ethernet] [--steps 3]
#   NODES="1 2 8 32" bash bench/run_simulated_scaling.sh
#   ROWS="ZeRO|stage" NODES=4 bash bench/run_simulated_scaling.sh   # the rows whose label matches
#   ROW_LIMIT=600 NODES="1 2 4 8" bash bench/run_simulated_scaling.sh  # a row stopped after 600 s of wall time
# TSHARD_BENCH_TINY=1: a toy model on 1 and 2 nodes (16 and 32 ranks), a few seconds: the suite
# runs it so. TSHARD_SIM_BUILD=DIR: the simulation build tree (default build-sim, configured and
# built here when it lacks the programs).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
platform=xeon-cluster steps=3
while (($#)); do
  case $1 in
    --platform) platform=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    *) echo "run_simulated_scaling.sh: unknown option $1 (--platform NAME, --steps N)" >&2; exit 2 ;;
  esac
done
build=${TSHARD_SIM_BUILD:-build-sim}
exe=$build/examples/train_transformer
if [[ ! -x $exe || ! -f $build/simulation/libtshard_platforms.so ]]; then
  cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DTSHARD_SIMULATE=ON -DTSHARD_BUILD_EXAMPLES=ON > /dev/null
  cmake --build "$build" -j "$jobs" --target train_transformer tshard_platforms tshard_calibrate_host > /dev/null
fi
nodes=(${NODES:-1 2 8 32 128 256})
size=(--dmodel 1024 --heads 16 --seq 256 --vocab 1024 --steps "$steps" --peak-n 384)
layers=2 stage_layers=8 per_rank=8 L=16
if [[ -n ${TSHARD_BENCH_TINY:-} ]]; then
  nodes=(1 2)
  size=(--dmodel 64 --heads 4 --seq 16 --vocab 64 --steps 2 --peak-n 64)
  layers=2 stage_layers=2 per_rank=2
fi
declare -A one  # a row's tokens/s per rank at its first node count
# run LABEL NODES P REDUCTION ENV [train_transformer flags]: one row. REDUCTION is how the cost
# model's gradient bytes are counted: two (two levels over P), flat (over P), across (flat over
# the nodes), node (flat over one node's 16); ENV is an environment assignment or "".
run() {
  local label=$1 n=$2 p=$3 reduction=$4 rows_env=$5; shift 5
  [[ $label =~ ${ROWS:-.} ]] || return 0
  local out tps hidden bytes wall line psi predicted
  local status=0
  out=$(env $rows_env timeout "${ROW_LIMIT:-0}" bash scripts/simulate.sh --timing --platform "$platform" --nodes "$n" \
    -np "$p" "$exe" "${size[@]}" --report "$@" 2>&1) || status=$?
  if ((status == 124)); then  # (timeout ends the simulator with it: one process group)
    rm -f smpitmp-hostf*
    printf '| %-28s | %4d | %5d | not run: stopped after %s s of wall time | | | | | |\n' "$label" "$n" "$p" "$ROW_LIMIT"
    return 0
  fi
  ((status == 0)) || { echo "  $label on $n nodes: failed"; echo "$out" | tail -5; return 0; }
  line=$(grep '^mesh' <<< "$out" | tail -1)
  tps=$(sed -E 's/.*: ([0-9.]+) tokens\/s.*/\1/' <<< "$line")
  hidden=$(grep -oE 'not hidden [0-9.]+ ms/step' <<< "$line" | grep -oE '[0-9.]+' || echo 0)
  bytes=$(awk -F', ' '/^  .*calls, [0-9.]+ B, / { for (i = 1; i <= NF; ++i) if ($i ~ / B$/) { sub(/ B$/, "", $i); s += $i } } END { printf "%.0f", s }' <<< "$out")
  wall=$(grep -oE 'wall time [0-9.]+ s' <<< "$out" | grep -oE '[0-9.]+' || echo "?")
  # G: the rank's local parameters (float), as the program reports them (Psi)
  psi=$(grep -oE 'Psi = [0-9.]+ KiB' <<< "$out" | grep -oE '[0-9.]+' | head -1)
  predicted=$(awk -v g="${psi:-0}" -v p="$p" -v n="$n" -v L="$L" -v r="$reduction" 'BEGIN { g *= 1024
    if (r == "across") p = n; else if (r == "node") p = L
    if (r == "two" && n > 1) printf "%.0f", 2 * g * (L - 1) / L + 2 * (g / L) * (n - 1) / n
    else printf "%.0f", 2 * g * (p - 1) / p }')
  [[ -n ${one[$label]:-} ]] || one[$label]=$(awk -v t="$tps" -v p="$p" 'BEGIN { print t / p }')
  awk -v l="$label" -v n="$n" -v p="$p" -v t="$tps" -v o="${one[$label]}" -v h="$hidden" -v b="$bytes" -v m="$predicted" -v w="$wall" 'BEGIN {
    printf "| %-28s | %4d | %5d | %10.0f | %5.1f %% | %7.1f | %10.4g | %10.4g | %6s |\n", l, n, p, t, 100 * t / (p * o), h, b, m, w }'
  grep -E '^pipeline:' <<< "$out" | sed 's/^/    /' || true
}
echo "train_transformer on $platform, $per_rank sequences per data rank, ${size[*]} --layers $layers, 16 ranks a node, timing mode"
echo "| row | nodes | ranks | tokens/s | efficiency | reduction not hidden ms | rank 0 bytes sent/step | cost model gradient bytes | wall s |"
echo "|---|---|---|---|---|---|---|---|---|"
for n in "${nodes[@]}"; do
  p=$((n * L))
  flags=(--layers "$layers" --mesh "data=$p" --batch $((per_rank * p)))
  run "data, two levels" "$n" "$p" two "" "${flags[@]}"
  run "data, two levels, overlap" "$n" "$p" two "" "${flags[@]}" --overlap
  run "data, flat" "$n" "$p" flat TSHARD_RANKS_PER_NODE=1 "${flags[@]}"
  run "data, flat, overlap" "$n" "$p" flat TSHARD_RANKS_PER_NODE=1 "${flags[@]}" --overlap
  run "ZeRO-2, two levels, overlap" "$n" "$p" two "" "${flags[@]}" --zero 2 --overlap
  run "ZeRO-3, two levels, overlap" "$n" "$p" two "" "${flags[@]}" --zero 3 --overlap
  run "model=16 x data=nodes" "$n" "$p" across "" --layers "$layers" --mesh "data=$n,model=16" --batch $((per_rank * n))
  if ((n > 1 && n <= stage_layers)); then
    run "stage=nodes x data=16, 1F1B" "$n" "$p" node "" --layers "$stage_layers" --mesh "stage=$n,data=16" \
      --batch $((per_rank * 16)) --schedule 1f1b --microbatches $((2 * n))
  fi
done
