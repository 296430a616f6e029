#!/usr/bin/env bash
# Builds and runs the MLP training-step benchmark on 2 ranks:
#   bash bench/run_mlp_step.sh [--B 256] [--D 1024] [--H 4096] [--reps 7] [--steps 3] [--peak-n 4096]
# OpenBLAS's kernels: bench/prepare.sh (SkylakeX only where the CPU has AVX-512).
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/prepare.sh
bench_build "libopenblas-dev" tshard_bench_mlp_step
mpirun -np "${RANKS:-2}" --oversubscribe --allow-run-as-root \
  "$bench_dir"/bench/tshard_bench_mlp_step "$@"
