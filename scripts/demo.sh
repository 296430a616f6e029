#!/usr/bin/env bash
# The main demo: builds examples/train_llama and trains a small Llama on a real text every Debian
# machine has (the GPL's text, else this README) on 4 ranks, {data, model} = {2, 2}, in well under
# a minute of training: how a few weights are split, the loss falling (every 50th step), the
# held-out loss, then a sample. bash scripts/demo.sh [ranks] [more train_llama options]
# (ranks 2: data=1,model=2; 4: data=2,model=2; other counts: data=ranks/2, model=2, or data only.)
# The reshard tour, the earlier demo: bash scripts/demo.sh tour [ranks]
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
source scripts/env.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DTSHARD_BUILD_TESTS=OFF -DTSHARD_BUILD_EXAMPLES=ON > /dev/null
if [[ "${1:-}" == tour ]]; then
  shift
  ranks="${1:-4}"
  shift || true
  cmake --build build --target reshard_tour -j "$jobs"
  exec mpirun -np "$ranks" --oversubscribe --allow-run-as-root ./build/examples/reshard_tour "$@"
fi
ranks="${1:-4}"
shift || true
cmake --build build --target train_llama -j "$jobs"
text=/usr/share/common-licenses/GPL-3
[[ -r "$text" ]] || text=README.md
if ((ranks % 2 == 0)); then mesh="data=$((ranks / 2)),model=2"; else mesh="data=$ranks"; fi
echo "== train_llama on $ranks ranks, mesh $mesh, text $text"
mpirun -np "$ranks" --oversubscribe --allow-run-as-root ./build/examples/train_llama --mesh "$mesh" --text "$text" \
  --steps 800 --seq 128 --batch 8 --dmodel 64 --heads 4 --kv-heads 2 --layers 2 --lr 4e-3 --eval-every 200 \
  --generate 120 --prompt "The licensee " --temperature 0.6 --top-k 8 --show-sharding "$@" |
  awk '!/^step/ || $2 % 50 == 0'
