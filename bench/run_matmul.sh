#!/usr/bin/env bash
# Builds and runs the matmul benchmark on 2 ranks: bash bench/run_matmul.sh [--n 2048] [--reps 7] [--type fp64|fp32]
# OpenBLAS 0.3.21 picks slower AVX2 kernels on this CPU; SkylakeX kernels are set for this
# command alone (never in tests or CI).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
dpkg-query -W -f='${Status}' libscalapack-openmpi-dev 2>/dev/null | grep -q "install ok installed" ||
  apt-get install -y -qq libscalapack-openmpi-dev libopenblas-dev
cmake -S . -B build-bench -DCMAKE_BUILD_TYPE=Release -DTSHARD_BUILD_BENCH=ON -DTSHARD_BUILD_TESTS=OFF \
  -DTSHARD_BUILD_EXAMPLES=OFF > /dev/null
cmake --build build-bench --target tshard_bench_matmul -j "$jobs"
OPENBLAS_CORETYPE="${OPENBLAS_CORETYPE:-SkylakeX}" mpirun -np "${RANKS:-2}" --oversubscribe --allow-run-as-root \
  ./build-bench/bench/tshard_bench_matmul "$@"
