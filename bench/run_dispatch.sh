#!/usr/bin/env bash
# The speed a plain build gets against -march=native, side by side in one run: train_llama at seq
# 2048 and train_transformer (D 1024, seq 256, batch 8) on 1 and 2 ranks, and the fused attention
# (tshard_bench_attention), each from
#   - the default build (build-bench: the hot kernels chosen at run time, docs/performance.md),
#   - the same binaries with TSHARD_CPU_CAPABILITY=baseline (every kernel at SSE2, BLIS's too),
#   - the -march=native build (build-bench-native, CMAKE_CXX_FLAGS=-march=native, TSHARD_BENCH_ARCH=native),
# alternated over --rounds, medians printed with the ratios default/native and default/baseline.
# With TSHARD_BENCH_BUILD (the suite's tiny run) the native column is TSHARD_BENCH_NATIVE_BUILD's,
# or left out.
#   bash bench/run_dispatch.sh [--rounds 3] [--steps 3]
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/prepare.sh
bench_build "libopenblas-dev" train_llama train_transformer tshard_bench_attention
rounds=3 steps=3
while (($#)); do
  case $1 in
    --rounds) rounds=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    *) echo "run_dispatch.sh: unknown option $1"; exit 2 ;;
  esac
done
native=${TSHARD_BENCH_NATIVE_BUILD:-}
if [[ -z ${TSHARD_BENCH_BUILD:-} ]]; then
  native=build-bench-native
  cmake -S . -B "$native" -DCMAKE_BUILD_TYPE=Release -DTSHARD_BUILD_BENCH=ON -DTSHARD_BUILD_TESTS=OFF \
    -DTSHARD_BUILD_EXAMPLES=ON -DCMAKE_CXX_FLAGS=-march=native -DTSHARD_BENCH_ARCH=native > /dev/null
  cmake --build "$native" --target train_llama train_transformer tshard_bench_attention -j "$jobs"
fi
llama=(--seq 2048 --dmodel 256 --heads 4 --kv-heads 4 --layers 2 --batch 1 --vocab 256 --steps "$steps")
gpt=(--dmodel 1024 --heads 16 --layers 2 --seq 256 --vocab 1024 --batch 8 --steps "$steps")
attention=(--seq 2048 --written-max 0 --reps 3)
if [[ -n $bench_tiny ]]; then
  llama=(--seq 16 --dmodel 16 --heads 2 --kv-heads 2 --layers 1 --batch 2 --vocab 16 --steps 1)
  gpt=(--dmodel 16 --heads 2 --layers 1 --seq 8 --vocab 16 --batch 2 --steps 1 --peak-n 64)
  attention=(--seq 64 --written-max 0 --reps 1 --batch 1)
  rounds=1
fi
runs=("llama.1rank|1|examples/train_llama ${llama[*]}"
      "llama.2ranks|2|examples/train_llama --mesh data=2 ${llama[*]} --batch 2"
      "gpt.1rank|1|examples/train_transformer ${gpt[*]}"
      "gpt.2ranks|2|examples/train_transformer --mesh data=2 ${gpt[*]}"
      "attention|1|bench/tshard_bench_attention ${attention[*]}")
[[ -n $bench_tiny ]] && runs[1]="llama.2ranks|2|examples/train_llama --mesh data=2 ${llama[*]}"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
# One figure of a run's output: tokens/s of a training program, GFLOP/s of the attention bench.
figure() { grep -E 'tokens/s|fused ' | sed -E 's/.*: ([0-9.]+) tokens\/s.*/\1/; s/.* ms, +([0-9.]+) GFLOP\/s.*/\1/' | tail -1; }
first=$(mpirun -np 1 "$bench_dir"/examples/train_llama --steps 0 --seq 8 --dmodel 8 --heads 2 --layers 1 --vocab 8 | head -1)
echo "default build: $first"
for ((r = 0; r < rounds; r++)); do
  for run in "${runs[@]}"; do
    IFS='|' read -r name np cmd <<<"$run"
    read -r -a argv <<<"$cmd"
    mpirun -np "$np" "$bench_dir/${argv[0]}" "${argv[@]:1}" | figure >> "$out/$name.default"
    TSHARD_CPU_CAPABILITY=baseline mpirun -np "$np" "$bench_dir/${argv[0]}" "${argv[@]:1}" | figure >> "$out/$name.baseline"
    [[ -n $native ]] && mpirun -np "$np" "$native/${argv[0]}" "${argv[@]:1}" | figure >> "$out/$name.native"
  done
done
median() { sort -g "$1" | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
echo "medians of $rounds rounds (tokens/s; the attention: fused forward + backward GFLOP/s at T ${attention[1]}):"
printf '  %-14s %10s %10s %10s   %s\n' run default baseline native "default/native  default/baseline"
for run in "${runs[@]}"; do
  name=${run%%|*}
  d=$(median "$out/$name.default") b=$(median "$out/$name.baseline") n=-
  [[ -n $native ]] && n=$(median "$out/$name.native")
  awk -v name="$name" -v d="$d" -v b="$b" -v n="$n" 'BEGIN {
    printf "  %-14s %10s %10s %10s   %s  %.2fx\n", name, d, b, n, (n == "-" ? "   -" : sprintf("%.3fx", d / n)), d / b }'
done
