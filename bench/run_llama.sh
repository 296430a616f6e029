#!/usr/bin/env bash
# The Llama of examples/train_llama.cpp measured on 2 ranks, float, at the size of
# bench/run_transformer_step.sh (D 1024, 16 heads, batch 8 x 256 tokens, vocab 1024, 2 layers):
#  1. the training step's tokens/s and GFLOP/s on {data, model} = {1, 2} and {2, 1}, next to the
#     GPT of train_transformer at the same size in the same run (MFU against the sgemm peak that
#     train_transformer measures); the Llama with --kv-heads 4 (GQA) too;
#  2. sampling tokens/s with the KV cache and with a whole forward per token;
#  3. safetensors save and load against plain MPI-IO on the same bytes: bash bench/run_io.sh.
# Any extra arguments go to both programs.   bash bench/run_llama.sh [--steps 4]
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/prepare.sh
bench_build "libopenblas-dev" train_llama train_transformer
size=(--dmodel 1024 --heads 16 --batch 8 --seq 256 --vocab 1024 --layers 2 --steps 4)
generate=128 kv_heads="16 4"
[[ -n $bench_tiny ]] && size=(--dmodel 32 --heads 4 --batch 2 --seq 8 --vocab 16 --layers 1 --steps 1) generate=4 kv_heads="4 2"
for mesh in model=2 data=2; do
  gpt=$(mpirun -np 2 "$bench_dir"/examples/train_transformer --mesh "$mesh" "${size[@]}" --peak-n "$([[ -n $bench_tiny ]] && echo 64 || echo 4096)" "$@" | grep '^mesh')
  peak=$(echo "$gpt" | sed -E 's/.*MFU [0-9.]+% of ([0-9.]+) GFLOP\/s.*/\1/')
  echo "GPT   $mesh: $(echo "$gpt" | sed -E 's/^mesh [^:]*: //; s/ \(sgemm.*//')"
  for kv in $kv_heads; do
    llama=$(mpirun -np 2 "$bench_dir"/examples/train_llama --mesh "$mesh" "${size[@]}" --kv-heads $kv "$@" | grep '^mesh')
    rate=$(echo "$llama" | sed -E 's/.*, ([0-9.]+) GFLOP\/s.*/\1/')
    echo "Llama $mesh kv-heads $kv: $(echo "$llama" | sed -E 's/^mesh [^:]*: //'), MFU $(echo "$rate $peak" | awk '{printf "%.1f", 100 * $1 / $2}')% of $peak GFLOP/s"
  done
done
echo "== sampling 128 tokens after a 16-byte prompt, model=2 (untrained weights, greedy)"
for cache in "" --no-kv-cache; do
  # shellcheck disable=SC2086
  mpirun -np 2 "$bench_dir"/examples/train_llama --mesh model=2 "${size[@]}" --steps 0 --generate "$generate" \
    --prompt "sixteen bytes..." $cache "$@" | grep '^sampling'
done
