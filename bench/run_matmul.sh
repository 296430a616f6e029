#!/usr/bin/env bash
# Builds and runs the matmul benchmark on 2 ranks: bash bench/run_matmul.sh [--n 2048] [--reps 7] [--type fp64|fp32]
# OpenBLAS's kernels: bench/prepare.sh (SkylakeX only where the CPU has AVX-512).
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/prepare.sh
bench_build "libscalapack-openmpi-dev libopenblas-dev" tshard_bench_matmul
mpirun -np "${RANKS:-2}" --oversubscribe --allow-run-as-root \
  "$bench_dir"/bench/tshard_bench_matmul "$@"
