#!/usr/bin/env bash
# Builds and runs the heat2d benchmark on 2 ranks: bash bench/run_heat2d.sh [--n 4096] [--iters 10] [--rounds 7]
# The PETSc DMDA comparison is built only where PETSc is found (apt-get install petsc-dev).
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/prepare.sh
bench_build "" tshard_bench_heat2d
mpirun -np "${RANKS:-2}" "$bench_dir"/bench/tshard_bench_heat2d "$@"
