#!/usr/bin/env bash
# train_llama's files, end to end:
#  1. weights written with --save-safetensors (on model=3) and read back with --init (on
#     data=2 and pipelined on stage=2) give the seed's curve on that mesh again, bitwise;
#  2. runs saving a checkpoint every step (--save-every 1) are killed with SIGKILL at random
#     moments on a random rank; each resumes with --resume on another mesh and ZeRO stage and
#     goes on along the one-rank curve (--check: every step to 1e-9), to the end;
#  3. an --init file without a tensor the model needs is an IoError naming it, on every rank;
#  4. where python3-torch is installed, an independent PyTorch Llama (tests/reference/
#     llama_reference.py) from the same safetensors weights gives the same losses to 1e-9, with
#     packed documents (--eod) too.
#   bash tests/scripts/train_llama_files.sh path/to/train_llama workdir
set -euo pipefail
exe=$1
work=$2/llama_files
here=$(cd "$(dirname "$0")/../.." && pwd)
rm -rf "$work" && mkdir -p "$work" && cd "$work"
mpi() { local n=$1; shift; mpirun -np "$n" --oversubscribe "$@"; }
size=(--layers 2 --dmodel 16 --heads 4 --kv-heads 2 --hidden 24 --seq 12 --batch 5 --double --text "$here/README.md")
losses() { grep '^step' | awk '{print $2, $4}'; }

# 1. safetensors out and in.
mpi 3 "$exe" --mesh model=3 "${size[@]}" --steps 0 --save-safetensors w.safetensors > /dev/null
for m in "data=2" "stage=2 --microbatches 1"; do
  # shellcheck disable=SC2086
  mpi 2 "$exe" --mesh $m "${size[@]}" --steps 4 | losses > seed.txt
  # shellcheck disable=SC2086
  mpi 2 "$exe" --mesh $m "${size[@]}" --steps 4 --init w.safetensors | losses > init.txt
  cmp -s seed.txt init.txt || { echo "FAILED: on $m, --init of the saved weights changes the curve"; paste seed.txt init.txt; exit 1; }
done
echo "1. --save-safetensors then --init: the seed's curve, bitwise"

# 2. kill -9 at random moments, resume elsewhere.
steps=60
for trial in 1 2 3; do
  rm -rf ckpt ckpt.tmp ckpt.old
  # mpirun itself (not a shell function) in the background, so that $! is mpirun's pid
  mpirun -np 2 --oversubscribe "$exe" --mesh data=2 --zero 2 "${size[@]}" --steps $steps --save ckpt --save-every 1 > run.txt 2>&1 &
  runner=$!
  # Kill once training runs: Open MPI 4.1's mpirun can deadlock when a rank dies inside MPI_Init
  # (a PMIx "UNREACHABLE" error, then mpirun waits forever), which says nothing about tshard.
  for _ in $(seq 300); do { grep -q '^step' run.txt 2> /dev/null || ! kill -0 $runner 2> /dev/null; } && break; sleep 0.1; done
  sleep "0.$((RANDOM % 10))"
  victim=$(pgrep -f -- "^$exe --mesh data=2 --zero 2" | shuf -n 1 || true)
  [[ -n "$victim" ]] && kill -KILL "$victim" 2> /dev/null || true
  # The same runtime can also hang in its own clean-up: give it 60 s, then end what is left.
  for _ in $(seq 600); do kill -0 $runner 2> /dev/null || break; sleep 0.1; done
  if kill -0 $runner 2> /dev/null; then
    echo "   (mpirun did not exit after its rank was killed: ended by this script)"
    kill -KILL $runner 2> /dev/null || true
    pkill -KILL -f -- "^$exe --mesh data=2 --zero 2" || true
  fi
  wait $runner || true
  resume=()
  [[ -d ckpt || -d ckpt.old ]] && resume=(--resume ckpt)
  mesh=("--mesh model=3 --zero 0" "--mesh data=3 --zero 3" "--mesh stage=3 --microbatches 1")
  # shellcheck disable=SC2206
  m=(${mesh[$((trial - 1))]})
  mpi 3 "$exe" "${m[@]}" "${size[@]}" --steps $steps "${resume[@]}" --save ckpt --check > resumed.txt 2>&1 ||
    { echo "FAILED: trial $trial"; cat run.txt resumed.txt; exit 1; }
  first=$(grep -m1 '^step' resumed.txt | awk '{print $2}')
  grep -q "^step $((steps - 1)) " resumed.txt || { echo "FAILED: trial $trial did not reach the end"; cat resumed.txt; exit 1; }
  echo "2.$trial killed after $(grep -c '^step' run.txt) steps; resumed at step $first on ${m[*]}: $(grep largest resumed.txt)"
done

# 3. a missing tensor.
# the same bytes with the name changed in the header (same length: the offsets stay right)
perl -0777 -pe 's/"lm_head\.weight"/"lm_head.weighX"/' w.safetensors > broken.safetensors
if mpi 2 "$exe" --mesh model=2 "${size[@]}" --steps 1 --init broken.safetensors > bad.txt 2>&1; then
  echo "FAILED: an --init file without lm_head.weight was accepted"; exit 1
fi
grep -q 'has no tensor "lm_head.weight"' bad.txt || { echo "FAILED: the error does not name the tensor"; cat bad.txt; exit 1; }
echo "3. a missing tensor: $(grep -m1 'no tensor' bad.txt)"

# 4. against PyTorch.
if /usr/bin/python3 -c 'import torch, numpy' 2> /dev/null; then
  mpi 4 "$exe" --mesh data=2,model=2 "${size[@]}" --steps 6 --init w.safetensors | losses > tshard.txt
  /usr/bin/python3 "$here/tests/reference/llama_reference.py" --init w.safetensors $(printf "%s " "${size[@]}" | sed "s/--double//") --steps 6 | losses > torch.txt
  paste tshard.txt torch.txt | awk '{ d = ($2 - $4) / $4; if (d < 0) d = -d; if (d > w) w = d }
    END { printf "4. against PyTorch: largest relative difference %.2e\n", w; exit (w > 1e-9) }'
  # Packed documents (each line of the text one: --eod 10), the sequence over context.
  mpi 4 "$exe" --mesh context=2,model=2 "${size[@]}" --steps 4 --init w.safetensors --eod 10 | losses > tshard_eod.txt
  /usr/bin/python3 "$here/tests/reference/llama_reference.py" --init w.safetensors $(printf "%s " "${size[@]}" | sed "s/--double//") --steps 4 --eod 10 | losses > torch_eod.txt
  paste tshard_eod.txt torch_eod.txt | awk '{ d = ($2 - $4) / $4; if (d < 0) d = -d; if (d > w) w = d }
    END { printf "4. packed documents against PyTorch: largest relative difference %.2e\n", w; exit (w > 1e-9) }'
  paste <(head -4 tshard.txt) tshard_eod.txt | awk '{ d = ($2 - $4) / $4; if (d < 0) d = -d; if (d > w) w = d } END { exit (w < 1e-6) }' ||
    { echo "FAILED: --eod 10 left the losses as they were"; exit 1; }
else
  echo "4. python3-torch is not installed: the PyTorch comparison is skipped"
fi
