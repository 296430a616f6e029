#!/usr/bin/env bash
# bfloat16 against float on RANKS ranks (default 2):
#  1. bench/bf16_bench.cpp: an MLP training step's time, bytes sent and optimizer memory, an
#     all-gather, and the local GEMM;
#  2. train_transformer (the GPT) with --dtype bf16 against float on data=2 with ZeRO-2, the same
#     steps side by side: tokens/s, bytes sent per step, memory per rank, the buffer pool's peak
#     (activations) and the last loss.
#   bash bench/run_bf16.sh [--B 256] [--D 1024] [--H 4096] [--n 1024] [--reps 7]
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/prepare.sh
bench_build "libopenblas-dev" tshard_bench_bf16 train_transformer
ranks=${RANKS:-2}
mpirun -np "$ranks" "$bench_dir"/bench/tshard_bench_bf16 "$@"
size=(--dmodel 512 --heads 8 --batch 8 --seq 128 --vocab 512 --layers 2 --steps 8 --peak-n 1024)
[[ -n $bench_tiny ]] && size=(--dmodel 32 --heads 2 --batch 2 --seq 8 --vocab 16 --layers 1 --steps 2 --peak-n 64)
echo "== train_transformer --mesh data=2 --zero 2 ${size[*]}, float against bf16"
out=$(mktemp -d)
for dtype in float bf16; do
  mpirun -np 2 "$bench_dir"/examples/train_transformer --mesh data=2 --zero 2 --dtype "$dtype" "${size[@]}" --report \
    > "$out/$dtype.txt"
done
# tokens/s, bytes sent per step on rank 0, memory total per rank, pool peak, last loss
summary() {
  awk '/^mesh/ { for (i = 1; i <= NF; i++) if ($i == "tokens/s,") t = $(i - 1) }
       /calls,/ { for (i = 1; i <= NF; i++) if ($i == "B,") b += $(i - 1) }
       /^memory per rank/ { for (i = 1; i <= NF; i++) if ($i == "total") m = $(i + 1) }
       /^buffer pool/ { for (i = 1; i <= NF; i++) if ($i == "peak") p = $(i + 1) }
       /^step/ { l = $4 }
       END { print t, b, m, p, l }' "$1"
}
read -r tf bf mf pf lf < <(summary "$out/float.txt")
read -r th bh mh ph lh < <(summary "$out/bf16.txt")
printf "%-6s %10s %16s %18s %18s %12s\n" dtype tokens/s "bytes/step" "params+grads+state" "pool peak (KiB)" "last loss"
printf "%-6s %10s %16s %18s %18s %12.6f\n" float "$tf" "$bf" "$mf KiB" "$pf" "$lf"
printf "%-6s %10s %16s %18s %18s %12.6f\n" bf16 "$th" "$bh" "$mh KiB" "$ph" "$lh"
awk -v tf="$tf" -v th="$th" -v bf="$bf" -v bh="$bh" -v mf="$mf" -v mh="$mh" -v pf="$pf" -v ph="$ph" -v lf="$lf" -v lh="$lh" \
  'BEGIN { printf "bf16/float: tokens/s %.2f, bytes %.2f, parameter memory %.2f, pool peak %.2f, last loss %+.1e relative\n",
           th / tf, bh / bf, mh / mf, ph / pf, (lh - lf) / lf }'
echo "reproduce: bash bench/run_bf16.sh (RANKS=$ranks)"
rm -rf "$out"
