#!/usr/bin/env bash
# The transformer training step's MFU (achieved FLOP/s over the machine's GEMM peak: sgemm
# n=4096 on every rank at once, summed, measured in the same run) on 2 ranks at a size where
# GEMMs dominate, on the meshes {data, model} = {1, 2} and {2, 1}, ZeRO 0, 2 and 3 (ZeRO-3
# prefetched or not), gradient reduction overlapped with backward or not; then the MLP step benchmark (nn layers against
# the hand-written step). Any extra arguments go to train_transformer.
#   bash bench/run_transformer_step.sh [--layers 2] [--steps 4]
# OpenBLAS's kernels: bench/prepare.sh (SkylakeX only where the CPU has AVX-512).
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/prepare.sh
bench_build "libopenblas-dev" train_transformer tshard_bench_mlp_step
size=(--dmodel 1024 --heads 16 --batch 8 --seq 256 --vocab 1024 --layers 2 --steps 4 --peak-n 4096)
mlp=(--reps 7)
if [[ -n $bench_tiny ]]; then
  size=(--dmodel 32 --heads 2 --batch 2 --seq 8 --vocab 16 --layers 1 --steps 2 --peak-n 64)
  mlp=(--B 8 --D 16 --H 32 --reps 1 --steps 1 --peak-n 64)
fi
for run in "model=2" "data=2" "data=2 --overlap" "data=2 --zero 2" "data=2 --zero 3" "data=2 --zero 3 --prefetch"; do
  mesh=${run%% *}
  rest=${run#"$mesh"}
  # shellcheck disable=SC2086
  mpirun -np 2 "$bench_dir"/examples/train_transformer --mesh "$mesh" $rest "${size[@]}" "$@" | grep -E "^mesh|^memory|^buffer|^ZeRO-3"
done
mpirun -np 2 "$bench_dir"/bench/tshard_bench_mlp_step "${mlp[@]}" | grep -E "^GEMM|^check|^step"
