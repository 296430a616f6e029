#!/usr/bin/env bash
# train_llama --hf and --save-hf on directories made here as transformers lays them out
# (tests/reference/make_llama_dir.py: config.json, model.safetensors, tokenizer.json):
#  1. the prompt's ids are HF's (tests/data/tokenizer_expected.json, made by tokenizers.js), the
#     greedy tokens and their text are the same on every mesh as on one rank, and an EOS id from
#     generation_config.json ends a generation;
#  2. --save-hf without training writes the directory back bitwise (F32 and BF16), and a model
#     of flags alone writes one that --hf reads into the same curve;
#  3. --text through the tokenizer gives the one-rank curve on model, data (ZeRO-3), stage and
#     context meshes (--check, double, 1e-9), and so does fine-tuning with a warm-up and cosine
#     schedule, accumulation and a directory saved every 2 steps under ZeRO-3; a tied head over
#     pipeline stages (the last stage's copy of the embedding) gives the one-rank curve with
#     clipping on, and the directory the one-rank run writes;
#  4. config variants (tied head, eps and theta, "llama3" rope in transformers 4 and 5 forms, a
#     head dim apart from hidden/heads, MQA, BF16 and F16 weights) give the losses of an
#     independent PyTorch Llama (tests/reference/llama_reference.py) to 1e-9, where torch is;
#  5. what the Llama does not implement is one error naming it, on every rank.
#   bash tests/scripts/train_llama_hf.sh path/to/train_llama workdir
set -euo pipefail
exe=$1
work=$2/llama_hf
here=$(cd "$(dirname "$0")/../.." && pwd)
rm -rf "$work" && mkdir -p "$work" && cd "$work"
mpi() { local n=$1; shift; mpirun -np "$n" --oversubscribe "$@"; }
py=/usr/bin/python3
make_dir() { "$py" "$here/tests/reference/make_llama_dir.py" "$@"; }
line() { grep "^$1" | head -1; }
make_dir base --tokenizer "$here/tests/data/tokenizer_llama3.json" --eos 557

# 1. prompt ids, greedy tokens on every mesh
prompt="The quick brown fox jumps over the lazy dog."
want=$("$py" -c "import json; print(' '.join(map(str, json.load(open('$here/tests/data/tokenizer_expected.json'))['llama3'][0]['ids'])))")
mpi 1 "$exe" --hf base --steps 0 --prompt "$prompt" --generate 12 > one.txt
[[ "$(line "prompt ids" < one.txt)" == "prompt ids: $want" ]] || { echo "FAILED: prompt ids"; line "prompt ids" < one.txt; echo "want $want"; exit 1; }
for m in "2 model=2" "2 data=2 --zero 3" "2 stage=2" "2 context=2" "4 context=2,model=2"; do
  # shellcheck disable=SC2086
  mpi ${m%% *} "$exe" --hf base --mesh ${m#* } --steps 0 --prompt "$prompt" --generate 12 > m.txt
  for key in "prompt ids" "tokens" "sample"; do
    [[ "$(line "$key" < m.txt)" == "$(line "$key" < one.txt)" ]] || { echo "FAILED: $key on $m"; cat one.txt m.txt; exit 1; }
  done
done
# generation_config.json's EOS ends the generation once made (the same weights: the same seed)
first=$(line tokens < one.txt | awk '{print $2}')
make_dir eos --tokenizer "$here/tests/data/tokenizer_llama3.json" --eos "$first"
mpi 2 "$exe" --hf eos --mesh model=2 --steps 0 --prompt "$prompt" --generate 12 > eos.txt
[[ "$(line tokens < eos.txt)" == "tokens: $first" ]] || { echo "FAILED: generation did not stop at EOS $first"; cat eos.txt; exit 1; }
echo "1. prompt ids = HF's; $(line tokens < one.txt) on 1 rank and five meshes; EOS ends a generation"

# 2. --save-hf: bitwise without training; a directory of flags alone reads back
for dtype in float32 bfloat16; do
  make_dir "in_$dtype" --dtype "$dtype" --tokenizer "$here/tests/data/tokenizer_llama3.json"
  mpi 2 "$exe" --hf "in_$dtype" --mesh model=2 --steps 0 --save-hf "out_$dtype" > /dev/null
  for f in model.safetensors config.json tokenizer.json; do
    cmp -s "in_$dtype/$f" "out_$dtype/$f" || { echo "FAILED: --save-hf changed $f ($dtype)"; exit 1; }
  done
done
flags=(--vocab 560 --dmodel 32 --heads 4 --kv-heads 2 --hidden 40 --layers 2 --seq 12 --batch 4 --double)
mpi 2 "$exe" --mesh data=2 "${flags[@]}" --steps 2 --save-hf flags_dir | grep '^step' > flags_run.txt
"$py" -c "import json; c = json.load(open('flags_dir/config.json')); assert c['model_type'] == 'llama' and c['hidden_size'] == 32, c"
mpi 1 "$exe" --hf flags_dir --seq 12 --batch 4 --double --steps 2 --lr 0 | grep '^step' > reread.txt
mpi 1 "$exe" "${flags[@]}" --steps 2 --init flags_dir --lr 0 | grep '^step' > init.txt
cmp -s reread.txt init.txt || { echo "FAILED: --hf of a flags model's --save-hf differs from --init"; paste reread.txt init.txt; exit 1; }
echo "2. --save-hf: F32 and BF16 directories written back bitwise; a flags model's directory reads back"

# 3. --text through the tokenizer, the one-rank curve on several meshes
for m in "model=2" "data=2 --zero 3" "stage=2 --microbatches 2" "context=2"; do
  # shellcheck disable=SC2086
  mpi 2 "$exe" --hf base --mesh $m --text "$here/README.md" --seq 12 --batch 4 --steps 3 --double --check --eval-every 3 > t.txt ||
    { echo "FAILED: --text on $m"; cat t.txt; exit 1; }
done
# fine-tuning: warm-up and cosine decay, accumulation over micro-steps, a directory saved every 2
# steps under ZeRO-3 (the parameters gathered for it mid-run), the curve still the one-rank curve
mpi 2 "$exe" --hf base --mesh data=2 --zero 3 --text "$here/README.md" --seq 12 --batch 4 --steps 5 --double --check \
  --lr 1e-2 --warmup 2 --min-lr 1e-3 --microbatches 2 --save-hf tuned --save-every 2 > ft.txt || { echo "FAILED: fine-tuning"; cat ft.txt; exit 1; }
mpi 2 "$exe" --hf tuned --mesh model=2 --steps 0 --prompt "$prompt" --generate 4 | grep -q '^sample: ' || { echo "FAILED: tuned/ does not load"; exit 1; }
echo "3. --text with the tokenizer: $(grep largest t.txt) (and on model, data, stage); fine-tuning with a schedule: $(grep largest ft.txt)"
# a tied head over stages: the embedding's copy on the last stage takes the summed gradient, and
# the norm counts it once (--clip 0.5 clips here)
make_dir tied_dir --tie
tied=(--hf tied_dir --seq 12 --batch 6 --steps 3 --double --clip 0.5)
mpi 1 "$exe" "${tied[@]}" --save-hf tied_one --prompt "$prompt" --generate 6 > one.txt
for m in "2 stage=2" "3 stage=3 --microbatches 3" "4 data=2,stage=2 --zero 2 --overlap" "4 data=2,stage=2 --zero 3"; do
  # shellcheck disable=SC2086
  mpi ${m%% *} "$exe" "${tied[@]}" --mesh ${m#* } --check --save-hf tied_out --prompt "$prompt" --generate 6 > t.txt ||
    { echo "FAILED: a tied head on $m"; cat t.txt; exit 1; }
  [[ "$(line tokens < t.txt)" == "$(line tokens < one.txt)" ]] || { echo "FAILED: tokens of a tied head on $m"; cat one.txt t.txt; exit 1; }
  cmp -s tied_one/model.safetensors tied_out/model.safetensors || { echo "FAILED: --save-hf of a tied head on $m"; exit 1; }
done
echo "   a tied head over stages (2, 3, data=2 x stage=2 ZeRO-2 overlapped and ZeRO-3): $(grep largest t.txt)"

# 4. config variants against PyTorch
if "$py" -c 'import torch, numpy' 2> /dev/null; then
  "$py" -c "import numpy as np; np.save('ids.npy', np.random.default_rng(3).integers(0, 560, size=(16, 13)).astype(np.int32))"
  variant() {
    local name=$1; shift
    make_dir "$name" "$@"
    mpi 2 "$exe" --hf "$name" --mesh model=2 --data ids.npy --seq 12 --batch 4 --steps 3 --double | grep '^step' | awk '{print $4}' > t.txt
    "$py" "$here/tests/reference/llama_reference.py" --hf "$name" --data ids.npy --seq 12 --batch 4 --steps 3 | awk '{print $4}' > r.txt
    paste t.txt r.txt | awk -v n="$name" '{ d = ($1 - $2) / $2; if (d < 0) d = -d; if (d > w) w = d }
      END { printf "   %-10s largest relative difference from PyTorch %.2e\n", n, w; exit (NR != 3 || w > 1e-9) }'
  }
  variant plain
  variant tied --tie
  variant eps_theta --eps 1e-6 --theta 500000
  variant llama3_v5 --rope llama3 --theta 500000
  variant llama3_v4 --rope llama3 --theta 500000 --form 4
  variant head_dim --head-dim 12
  variant mqa --kv-heads 1
  variant bf16 --dtype bfloat16
  variant f16 --dtype float16
  echo "4. config variants = PyTorch"
else
  echo "4. python3-torch is not installed: the PyTorch comparison is skipped"
fi

# 5. what is not implemented
expect_error() {
  local what=$1 pattern=$2; shift 2
  if mpi 2 "$exe" "$@" --steps 1 > err.txt 2>&1; then echo "FAILED: $what was accepted"; exit 1; fi
  grep -q -- "$pattern" err.txt || { echo "FAILED: $what: the error does not say '$pattern'"; cat err.txt; exit 1; }
  [[ $(grep -c -- "$pattern" err.txt) -eq 1 ]] || { echo "FAILED: $what: the error is not printed once"; cat err.txt; exit 1; }
}
make_dir mistral --set model_type='"mistral"'
expect_error "model_type mistral" '"model_type" is "mistral"' --hf mistral
make_dir yarn --set rope_parameters='{"rope_type": "yarn", "rope_theta": 10000.0}'
expect_error "rope type yarn" 'rope type "yarn"' --hf yarn
make_dir biased --set attention_bias=true
expect_error "attention_bias" '"attention_bias" is true' --hf biased
expect_error "--dmodel with --hf" '--dmodel comes from base with --hf' --hf base --dmodel 64
expect_error "--text without a tokenizer" 'needs tied_dir/tokenizer.json' --hf tied_dir --text "$here/README.md"
echo "5. unsupported configs: one error each, naming the field"
