#!/usr/bin/env bash
# tshard's per-call bookkeeping (plan caches, operator labels, shape checks) on tensors so small
# that the work is nothing, against the same work by hand, on 2 ranks (bench/overhead_bench.cpp).
#   bash bench/run_overhead.sh [--n 16] [--calls 2000] [--reps 7]
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/prepare.sh
bench_build "" tshard_bench_overhead
mpirun -np "${RANKS:-2}" "$bench_dir"/bench/tshard_bench_overhead "$@"
