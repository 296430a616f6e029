#!/usr/bin/env bash
# tshard's reduce-scatter against Open MPI's MPI_Reduce_scatter_block, MPI_Allreduce, a ring and
# the all-at-once exchange on the same buffers (bench/reduce_scatter_bench.cpp), on RANKS ranks
# (default 2; more than the cores measures oversubscription, not the algorithms).
#   bash bench/run_reduce_scatter.sh [--max 4194304] [--reps 9] [--segment 262144]
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/prepare.sh
bench_build "" tshard_bench_reduce_scatter
mpirun -np "${RANKS:-2}" "$bench_dir"/bench/tshard_bench_reduce_scatter "$@"
