#!/usr/bin/env bash
# tshard against PyTorch on this CPU: the Llama of examples/train_llama.cpp on 2 ranks against
# the same model written as ordinary PyTorch (tests/reference/llama_reference.py: Debian's
# python3-torch, 2 threads, the same OpenBLAS), started from the same weights (a safetensors
# file train_llama writes) on the same bytes of text, float. Prints both tokens/s, their ratio,
# and the losses side by side. The size of bench/run_transformer_step.sh (D 1024, 16 heads,
# batch 8 x 256 tokens, 2 layers), with the bytes of README.md (vocab 256).
# Then the same for the GPT of examples/train_transformer.cpp against tests/reference/
# gpt_reference.py: train_transformer writes its initial weights (a --save checkpoint, which its
# run on 2 ranks resumes from at step 0 and the reference reads) and a token file of its
# synthetic task (--write-data) that both train on (--data); the size of run_transformer_step.sh
# exactly (vocab 1024). For the GPT it also prints both sides' peak memory (resident, above what
# the process held before the model was built) and tshard's with --activation-checkpoint.
#   bash bench/run_vs_pytorch.sh [--steps 6] [--mesh data=2]
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/prepare.sh
bench_build "libopenblas-dev python3-torch python3-numpy" train_llama train_transformer
if [[ -n "${TSHARD_BENCH_BUILD:-}" ]] && ! { bench_has python3-torch && bench_has python3-numpy; }; then
  echo "skipped: PyTorch (python3-torch, python3-numpy) is not installed"
  exit 77
fi
steps=6
mesh=model=2
while (($#)); do
  case $1 in
    --steps) steps=$2; shift 2 ;;
    --mesh) mesh=$2; shift 2 ;;
    *) echo "run_vs_pytorch.sh: unknown option $1"; exit 2 ;;
  esac
done
# tokens/s from tshard's and from PyTorch's output.
ours_tokens() { grep '^mesh' "$1" | sed -E 's/.*: ([0-9.]+) tokens\/s.*/\1/'; }
theirs_tokens() { grep '^pytorch.*tokens/s' "$1" | sed -E 's/.*: ([0-9.]+) tokens\/s.*/\1/'; }
# The losses of both runs side by side, then both tokens/s and their ratio; `model` prefixes the
# lines ("" for the Llama, whose lines keep their first form).
side_by_side() {
  local model=$1 ours_file=$2 theirs_file=$3 ours theirs
  ours=$(ours_tokens "$ours_file")
  theirs=$(theirs_tokens "$theirs_file")
  echo "${model:+$model }losses (tshard $mesh | PyTorch):"
  paste <(grep '^step' "$ours_file") <(grep '^step' "$theirs_file" | awk '{print $4}') |
    awk '{printf "  step %s  %.7f  %.7f  (relative difference %.1e)\n", $2, $4, $5, ($4 - $5) / $5}'
  echo "${model:+$model: }tshard on 2 ranks ($mesh): $ours tokens/s; PyTorch, 2 threads: $theirs tokens/s; ratio $(echo "$ours $theirs" | awk '{printf "%.2f", $1 / $2}')"
}
size=(--layers 2 --dmodel 1024 --heads 16 --kv-heads 16 --hidden 4096 --seq 256 --batch 8 --lr 3e-4 --text README.md)
[[ -n $bench_tiny ]] && size=(--layers 1 --dmodel 32 --heads 4 --kv-heads 2 --hidden 64 --seq 8 --batch 2 --lr 3e-4 --text README.md)
weights=$(mktemp -d)/llama.safetensors
"$bench_dir"/examples/train_llama "${size[@]}" --steps 0 --save-safetensors "$weights" > /dev/null
mpirun -np 2 "$bench_dir"/examples/train_llama --mesh "$mesh" "${size[@]}" --steps "$steps" --init "$weights" > /tmp/tshard_vs_torch_ours.txt
OMP_NUM_THREADS=2 OPENBLAS_NUM_THREADS=2 /usr/bin/python3 tests/reference/llama_reference.py --init "$weights" "${size[@]}" \
  --steps "$steps" --float --time --threads 2 > /tmp/tshard_vs_torch_theirs.txt
side_by_side "" /tmp/tshard_vs_torch_ours.txt /tmp/tshard_vs_torch_theirs.txt
rm -rf "$(dirname "$weights")"
gpt=(--layers 2 --dmodel 1024 --heads 16 --hidden 4096 --seq 256 --batch 8 --vocab 1024 --lr 3e-4 --clip 1)
[[ -n $bench_tiny ]] && gpt=(--layers 1 --dmodel 32 --heads 4 --hidden 128 --seq 8 --batch 2 --vocab 16 --lr 3e-4 --clip 1)
gpt_dir=$(mktemp -d)
"$bench_dir"/examples/train_transformer "${gpt[@]}" --steps 0 --save "$gpt_dir"/init > /dev/null
"$bench_dir"/examples/train_transformer "${gpt[@]}" --write-data "$gpt_dir"/tokens.npy --sequences 64 > /dev/null
mpirun -np 2 "$bench_dir"/examples/train_transformer --mesh "$mesh" "${gpt[@]}" --steps "$steps" --resume "$gpt_dir"/init \
  --data "$gpt_dir"/tokens.npy > /tmp/tshard_vs_torch_gpt_ours.txt
OMP_NUM_THREADS=2 OPENBLAS_NUM_THREADS=2 /usr/bin/python3 tests/reference/gpt_reference.py --init "$gpt_dir"/init \
  --data "$gpt_dir"/tokens.npy "${gpt[@]}" --steps "$steps" --float --time --threads 2 > /tmp/tshard_vs_torch_gpt_theirs.txt
side_by_side GPT /tmp/tshard_vs_torch_gpt_ours.txt /tmp/tshard_vs_torch_gpt_theirs.txt
# Memory: each side's peak resident memory above what its process held before the model was
# built (weights, gradients, optimizer state, activations, workspaces), tshard's summed over its
# ranks; then tshard again with each block's activations recomputed in the backward.
ours_mib=$(grep '^resident memory' /tmp/tshard_vs_torch_gpt_ours.txt | sed -E 's/.*, ([0-9.]+) MiB over all.*/\1/')
theirs_mib=$(grep '^pytorch resident memory' /tmp/tshard_vs_torch_gpt_theirs.txt | sed -E 's/.* ([0-9.]+) MiB$/\1/')
echo "GPT: peak memory above the start: tshard $ours_mib MiB over 2 ranks; PyTorch $theirs_mib MiB; ratio $(echo "$ours_mib $theirs_mib" | awk '{printf "%.2f", $1 / $2}')"
for ac in selective full; do
  mpirun -np 2 "$bench_dir"/examples/train_transformer --mesh "$mesh" "${gpt[@]}" --steps "$steps" --resume "$gpt_dir"/init \
    --data "$gpt_dir"/tokens.npy --activation-checkpoint $ac > /tmp/tshard_vs_torch_gpt_ac.txt
  cmp -s <(grep '^step' /tmp/tshard_vs_torch_gpt_ac.txt) <(grep '^step' /tmp/tshard_vs_torch_gpt_ours.txt) || {
    echo "run_vs_pytorch.sh: --activation-checkpoint $ac changed the losses"; exit 1; }
  echo "GPT with --activation-checkpoint $ac (the same losses): tshard $(ours_tokens /tmp/tshard_vs_torch_gpt_ac.txt) tokens/s, $(grep '^resident memory' /tmp/tshard_vs_torch_gpt_ac.txt |
    sed -E 's/.*, ([0-9.]+) MiB over all.*/\1/') MiB over 2 ranks"
done
rm -rf "$gpt_dir"
# Both sides are bound by GEMM, so the ratio has a ceiling: each side's model FLOP rate (6 N +
# 12 L T D a token, PyTorch's at the FLOPs a token tshard counts) against what sgemm reaches on
# this machine with every core busy at once (train_transformer measures it at start; on a VM whose
# cores share FMA units that is well under cores x one core's rate).
peak=$(grep '^mesh' /tmp/tshard_vs_torch_gpt_ours.txt | sed -E 's/.* of ([0-9.]+) GFLOP\/s.*/\1/')
echo "sgemm on both cores at once: $peak GFLOP/s (train_transformer's measure)"
for model in Llama GPT; do
  ours_file=/tmp/tshard_vs_torch_ours.txt theirs_file=/tmp/tshard_vs_torch_theirs.txt
  [[ $model == GPT ]] && ours_file=/tmp/tshard_vs_torch_gpt_ours.txt theirs_file=/tmp/tshard_vs_torch_gpt_theirs.txt
  echo "$(ours_tokens "$ours_file") $(grep '^mesh' "$ours_file" | sed -E 's/.*tokens\/s, ([0-9.]+) GFLOP\/s.*/\1/') $(theirs_tokens "$theirs_file")" |
    awk -v model=$model -v peak="$peak" '{ theirs = $2 * $3 / $1;
      printf "%s: tshard %.1f GFLOP/s (%.0f%% of that), PyTorch %.1f GFLOP/s (%.0f%%): at 100%% tshard would be %.2fx PyTorch\n",
        model, $2, 100 * $2 / peak, theirs, 100 * theirs / peak, peak / theirs }'
done
