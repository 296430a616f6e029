#!/usr/bin/env bash
# Builds tshard_bench_reshard in build-bench (Release, -O3 -march=native) and runs it on 2 ranks.
# Arguments go to the benchmark: bench/run_reshard.sh --n 2048 --reps 7
# NP=4 bench/run_reshard.sh runs it on 4 ranks; JOBS sets the build's parallelism (default 1).
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/prepare.sh
bench_build "" tshard_bench_reshard
exec mpirun -np "${NP:-2}" "$bench_dir"/bench/tshard_bench_reshard "$@"
