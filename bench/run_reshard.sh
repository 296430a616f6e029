#!/bin/sh
# Builds tshard_bench_reshard in build-bench (Release, -O3 -march=native) and runs it on 2 ranks.
# Arguments go to the benchmark: bench/run_reshard.sh --n 2048 --reps 7
# NP=4 bench/run_reshard.sh runs it on 4 ranks; JOBS sets the build's parallelism (default 1).
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
build="$root/build-bench"
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DTSHARD_BUILD_BENCH=ON \
      -DTSHARD_BUILD_TESTS=OFF -DTSHARD_BUILD_EXAMPLES=ON >/dev/null
cmake --build "$build" -j"${JOBS:-1}" --target tshard_bench_reshard
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_btl_vader_single_copy_mechanism=none OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
exec mpirun -np "${NP:-2}" --oversubscribe "$build/bench/tshard_bench_reshard" "$@"
