#!/usr/bin/env bash
# Builds and runs the heat2d benchmark on 2 ranks: bash bench/run_heat2d.sh [--n 4096] [--iters 10] [--rounds 7]
# The PETSc DMDA comparison is built only where PETSc is found (apt-get install petsc-dev).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
cmake -S . -B build-bench -DCMAKE_BUILD_TYPE=Release -DTSHARD_BUILD_BENCH=ON -DTSHARD_BUILD_TESTS=OFF \
  -DTSHARD_BUILD_EXAMPLES=ON > /dev/null
cmake --build build-bench --target tshard_bench_heat2d -j "$jobs"
mpirun -np "${RANKS:-2}" --oversubscribe --allow-run-as-root ./build-bench/bench/tshard_bench_heat2d "$@"
