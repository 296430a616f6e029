#!/usr/bin/env bash
# bfloat16 against float (bench/bf16_bench.cpp) on RANKS ranks (default 2): an MLP training step's
# time, bytes sent and optimizer memory, an all-gather, and the local GEMM.
#   bash bench/run_bf16.sh [--B 256] [--D 1024] [--H 4096] [--n 1024] [--reps 7]
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/prepare.sh
bench_build "libopenblas-dev" tshard_bench_bf16
mpirun -np "${RANKS:-2}" "$bench_dir"/bench/tshard_bench_bf16 "$@"
