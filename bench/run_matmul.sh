#!/usr/bin/env bash
# Builds and runs the matmul benchmark on 2 ranks: bash bench/run_matmul.sh [--n 2048] [--reps 7] [--type fp64|fp32]
# OpenBLAS 0.3.21 picks slower AVX2 kernels on this CPU; SkylakeX kernels are set for this
# command alone (never in tests or CI).
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/prepare.sh
bench_build "libscalapack-openmpi-dev libopenblas-dev" tshard_bench_matmul
OPENBLAS_CORETYPE="${OPENBLAS_CORETYPE:-SkylakeX}" mpirun -np "${RANKS:-2}" --oversubscribe --allow-run-as-root \
  ./build-bench/bench/tshard_bench_matmul "$@"
