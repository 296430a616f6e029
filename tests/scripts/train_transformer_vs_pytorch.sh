#!/usr/bin/env bash
# train_transformer against an independent PyTorch GPT (tests/reference/gpt_reference.py), in
# double: train_transformer writes its initial weights (--save at step 0) and its synthetic task
# as a token file (--write-data); it resumes from those weights on data=2,model=2 and the
# reference reads them, both train on the file, and every step's loss agrees to 1e-12 relative.
# Then packed documents (--eod 3: a document ends at each token 3) on context=2,model=2, the
# sequence split over context, against the reference's block-diagonal causal mask; and with the
# position embeddings restarting at each document (--reset-position-ids) on stage=2,data=2.
# Skipped (exit 77) where python3-torch or python3-numpy is missing.
#   bash tests/scripts/train_transformer_vs_pytorch.sh path/to/train_transformer workdir
set -euo pipefail
exe=$1
work=$2/transformer_vs_pytorch
here=$(cd "$(dirname "$0")/../.." && pwd)
if ! /usr/bin/python3 -c 'import torch, numpy' 2> /dev/null; then
  echo "python3-torch is not installed: the PyTorch comparison is skipped"
  exit 77
fi
rm -rf "$work" && mkdir -p "$work" && cd "$work"
losses() { grep '^step' | awk '{print $2, $4}'; }
size=(--layers 2 --dmodel 30 --heads 4 --hidden 48 --seq 12 --batch 5 --vocab 13 --lr 1e-2 --clip 0.1)
"$exe" "${size[@]}" --double --steps 0 --save init > /dev/null
"$exe" "${size[@]}" --write-data tokens.npy --sequences 20 > /dev/null
mpirun -np 4 --oversubscribe "$exe" --mesh data=2,model=2 "${size[@]}" --double --steps 10 --resume init \
  --data tokens.npy | losses > tshard.txt
/usr/bin/python3 "$here/tests/reference/gpt_reference.py" --init init --data tokens.npy "${size[@]}" --double \
  --steps 10 | losses > torch.txt
[[ $(wc -l < tshard.txt) == 10 && $(wc -l < torch.txt) == 10 ]] || { echo "FAILED: missing steps"; paste tshard.txt torch.txt; exit 1; }
paste tshard.txt torch.txt | awk '{ d = ($2 - $4) / $4; if (d < 0) d = -d; if (d > w) w = d }
  END { printf "train_transformer against PyTorch, 10 steps in double: largest relative difference %.2e\n", w; exit (w > 1e-12) }'

mpirun -np 4 --oversubscribe "$exe" --mesh context=2,model=2 "${size[@]}" --double --steps 10 --resume init \
  --data tokens.npy --eod 3 | losses > tshard_eod.txt
/usr/bin/python3 "$here/tests/reference/gpt_reference.py" --init init --data tokens.npy "${size[@]}" --double \
  --steps 10 --eod 3 | losses > torch_eod.txt
[[ $(wc -l < tshard_eod.txt) == 10 && $(wc -l < torch_eod.txt) == 10 ]] || { echo "FAILED: missing --eod steps"; paste tshard_eod.txt torch_eod.txt; exit 1; }
paste tshard.txt tshard_eod.txt | awk '{ d = ($2 - $4) / $4; if (d < 0) d = -d; if (d > w) w = d } END { exit (w < 1e-6) }' ||
  { echo "FAILED: --eod 3 left the losses as they were"; exit 1; }
paste tshard_eod.txt torch_eod.txt | awk '{ d = ($2 - $4) / $4; if (d < 0) d = -d; if (d > w) w = d }
  END { printf "train_transformer --eod 3 on context=2,model=2 against PyTorch, 10 steps in double: largest relative difference %.2e\n", w; exit (w > 1e-12) }'

mpirun -np 4 --oversubscribe "$exe" --mesh stage=2,data=2 --microbatches 5 "${size[@]}" --double --steps 10 --resume init \
  --data tokens.npy --eod 3 --reset-position-ids | losses > tshard_reset.txt
/usr/bin/python3 "$here/tests/reference/gpt_reference.py" --init init --data tokens.npy "${size[@]}" --double \
  --steps 10 --eod 3 --reset-position-ids | losses > torch_reset.txt
[[ $(wc -l < tshard_reset.txt) == 10 && $(wc -l < torch_reset.txt) == 10 ]] || { echo "FAILED: missing --reset-position-ids steps"; paste tshard_reset.txt torch_reset.txt; exit 1; }
paste tshard_eod.txt tshard_reset.txt | awk '{ d = ($2 - $4) / $4; if (d < 0) d = -d; if (d > w) w = d } END { exit (w < 1e-6) }' ||
  { echo "FAILED: --reset-position-ids left the losses as they were"; exit 1; }
paste tshard_reset.txt torch_reset.txt | awk '{ d = ($2 - $4) / $4; if (d < 0) d = -d; if (d > w) w = d }
  END { printf "train_transformer --eod 3 --reset-position-ids on stage=2,data=2 against PyTorch, 10 steps in double: largest relative difference %.2e\n", w; exit (w > 1e-12) }'
