#!/usr/bin/env bash
# Tokenizer speed: bench/tokenizer_bench.cpp on tests/data's GPT-2, Llama 3 and SmolLM shaped
# tokenizer.json files (or --tokenizer FILES), on 1 and 2 ranks (every rank encoding its own
# copy, as train_llama --text does): MB of text per second per rank, encode and decode; and, where
# Python's HF tokenizers is importable, tokenizers' own encode (one thread) of the same text.
#   bash bench/run_tokenizer.sh [--mb 8] [--reps 3] [--ranks 1,2] [--tokenizer a.json,b.json]
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/prepare.sh
bench_build "libopenblas-dev libpcre2-dev" tshard_bench_tokenizer
mb=8 reps=3 ranks=1,2
tokenizers=tests/data/tokenizer_gpt2.json,tests/data/tokenizer_llama3.json,tests/data/tokenizer_smollm.json
[[ -n $bench_tiny ]] && mb=0.05 reps=1 ranks=1
while (($#)); do
  case $1 in
    --mb) mb=$2; shift 2 ;;
    --reps) reps=$2; shift 2 ;;
    --ranks) ranks=$2; shift 2 ;;
    --tokenizer) tokenizers=$2; shift 2 ;;
    *) echo "run_tokenizer.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
text=README.md,docs/architecture.md,docs/scaling.md,examples/train_llama.cpp
for n in ${ranks//,/ }; do
  mpirun -np "$n" "$bench_dir"/bench/tshard_bench_tokenizer --text "$text" --mb "$mb" --reps "$reps" --tokenizer "$tokenizers"
done
if python3 -c 'import tokenizers' 2> /dev/null; then
  RAYON_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false python3 - "$text" "$mb" "$tokenizers" <<'PY'
import sys, time, tokenizers
paths, mb, files = sys.argv[1].split(","), float(sys.argv[2]), sys.argv[3].split(",")
source = "".join(open(p, encoding="utf-8").read() for p in paths)
text = source
while len(text.encode()) < mb * 1e6:
    text += source
for f in files:
    tok = tokenizers.Tokenizer.from_file(f)
    t0 = time.perf_counter()
    ids = tok.encode(text, add_special_tokens=False).ids
    s = time.perf_counter() - t0
    print("HF tokenizers %-22s encode %.2f MB/s (one thread), %d ids" % (f.split("/")[-1], len(text.encode()) / s / 1e6, len(ids)))
PY
else
  echo "HF tokenizers (python) is not importable here: its column is skipped"
fi
