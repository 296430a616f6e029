#!/usr/bin/env bash
# tshard's gradient all-reduce against Open MPI's MPI_Allreduce (bench/all_reduce_bench.cpp) on
# RANKS ranks (default 2; more than the cores measures oversubscription, not the algorithms), and
# again with Open MPI's ring forced (coll_tuned algorithm 4). TSHARD_RANKS_PER_NODE=k adds the
# two-level form over nodes of k ranks. TSHARD_BENCH_TINY=1: 1-2 MB, 2 repetitions.
#   bash bench/run_all_reduce.sh [--min 1] [--max 512] [--reps 5] [--segment 262144]
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/prepare.sh
bench_build "" tshard_bench_all_reduce
args=("$@")
[[ "${TSHARD_BENCH_TINY:-0}" == 1 ]] && args=(--min 1 --max 2 --reps 2 "$@")
exe="$bench_dir"/bench/tshard_bench_all_reduce
mpirun -np "${RANKS:-2}" "$exe" "${args[@]}"
echo "with Open MPI's ring all-reduce (OMPI_MCA_coll_tuned_use_dynamic_rules=1, allreduce_algorithm=4):"
OMPI_MCA_coll_tuned_use_dynamic_rules=1 OMPI_MCA_coll_tuned_allreduce_algorithm=4 mpirun -np "${RANKS:-2}" "$exe" "${args[@]}" | tail -n +2
