#!/usr/bin/env bash
# Fits the cost model (alpha, beta, gamma of include/tshard/comm/cost.hpp) from timed
# collectives on RANKS ranks (default 2) and prints `export TSHARD_COST_MODEL=...`:
#   RANKS=16 bash bench/run_cost_model.sh [--max-bytes 16777216] [--reps 5]
# On a cluster, run it with the job's ranks and hosts (mpirun --hostfile, srun) and put the line
# in the job script: the reshard planner and einsum then choose by the cluster's own figures.
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/prepare.sh
bench_build "" tshard_bench_cost_model
mpirun -np "${RANKS:-2}" --oversubscribe --allow-run-as-root "$bench_dir"/bench/tshard_bench_cost_model "$@"
