#!/usr/bin/env bash
# Derived gradients against the backward written by hand with the public functions, in one run each: the step of
# a stack of transformer blocks (time and the buffer pool's peak) on 2 ranks, meshes
# {data, model} = {1, 2} and {2, 1}, and the tape's overhead per operator; then the lines of
# model code of examples/gpt_minimal.cpp. Extra arguments go to the benchmark.
#   bash bench/run_ad.sh [--dmodel 1024 --heads 16 --batch 8 --seq 256 --layers 2 --reps 5]
# OpenBLAS's kernels: bench/prepare.sh (SkylakeX only where the CPU has AVX-512).
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/prepare.sh
bench_build "libopenblas-dev" tshard_bench_ad
for mesh in model=2 data=2; do
  mpirun -np 2 "$bench_dir"/bench/tshard_bench_ad --mesh "$mesh" "$@"
done
# Model code of the GPT example: the Block and Gpt modules, blank lines and comments left out.
awk '/^template <class T>$/ { keep = 1 } /^struct Options/ { exit } keep' examples/gpt_minimal.cpp |
  grep -vE '^[[:space:]]*(//.*)?$' > /tmp/tshard_gpt_model_lines.txt
echo "gpt_minimal model code: $(wc -l < /tmp/tshard_gpt_model_lines.txt) lines" \
  "(nanoGPT model.py: ~330 lines, forward only; llm.c: ~1,100 with a hand-written backward)"
