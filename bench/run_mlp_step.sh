#!/usr/bin/env bash
# Builds and runs the MLP training-step benchmark on 2 ranks:
#   bash bench/run_mlp_step.sh [--B 256] [--D 1024] [--H 4096] [--reps 7] [--steps 3] [--peak-n 4096]
# OpenBLAS 0.3.21 picks slower AVX2 kernels on this CPU; SkylakeX kernels are set for this
# command alone (never in tests or CI).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
dpkg-query -W -f='${Status}' libopenblas-dev 2>/dev/null | grep -q "install ok installed" ||
  apt-get install -y -qq libopenblas-dev
cmake -S . -B build-bench -DCMAKE_BUILD_TYPE=Release -DTSHARD_BUILD_BENCH=ON -DTSHARD_BUILD_TESTS=OFF \
  -DTSHARD_BUILD_EXAMPLES=OFF > /dev/null
cmake --build build-bench --target tshard_bench_mlp_step -j "$jobs"
OPENBLAS_CORETYPE="${OPENBLAS_CORETYPE:-SkylakeX}" mpirun -np "${RANKS:-2}" --oversubscribe --allow-run-as-root \
  ./build-bench/bench/tshard_bench_mlp_step "$@"
