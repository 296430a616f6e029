#!/usr/bin/env bash
# Builds and runs the HPC benchmarks: CG at 128^3 (40 iterations, median of 5 interleaved runs) on
# meshes 1x1x1, 1x1x2 and 2x1x1, tshard as written and ts::solvers::cg against hand-written MPI.
#   bash bench/run_hpc.sh [--n 128] [--iters 40] [--rounds 5]
# Later arguments go to every run (a later --n wins over the default).
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/prepare.sh
bench_build "" tshard_bench_cg
for mesh in 1,1,1 1,1,2 2,1,1; do
  IFS=, read -r px py pz <<< "$mesh"
  mpirun -np $((px * py * pz)) "$bench_dir"/bench/tshard_bench_cg --n 128 --iters 40 --rounds 5 --mesh "$mesh" "$@"
done
