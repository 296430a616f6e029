#!/usr/bin/env bash
# train_transformer --dtype bf16 against float on data=2 with ZeRO-2, 200 steps of the synthetic
# task: every step's loss within 1e-2 relative of float's, half the bytes sent per step, and
# ZeRO's mixed-precision formula equal to the memory it measures. Then a bad combination
# (--save with bf16) is refused with a message.
#   bash tests/scripts/train_transformer_bf16.sh path/to/train_transformer workdir
set -euo pipefail
exe=$1
work=$2/transformer_bf16
rm -rf "$work" && mkdir -p "$work" && cd "$work"
run() { mpirun -np 2 --oversubscribe "$exe" --mesh data=2 --zero 2 --steps 200 --report "$@"; }
run > float.txt
run --dtype bf16 > bf16.txt
paste <(grep '^step' float.txt) <(grep '^step' bf16.txt) | awk '{ d = ($8 - $4) / $4; if (d < 0) d = -d; if (d > w) w = d; n++ }
  END { printf "bf16 against float over %d steps: largest relative difference %.2e\n", n, w; exit (n != 200 || w > 1e-2) }'
bytes() { awk '/calls,/ { for (i = 1; i <= NF; i++) if ($i == "B,") b += $(i - 1) } END { print b }' "$1"; }
echo "bytes sent per step on rank 0: float $(bytes float.txt), bf16 $(bytes bf16.txt)"
awk -v f="$(bytes float.txt)" -v h="$(bytes bf16.txt)" 'BEGIN { r = h / f; exit (r < 0.49 || r > 0.51) }'
grep '^memory' bf16.txt | sed -E 's/.*total ([0-9.]+) KiB; ZeRO-2 formula ([0-9.]+) KiB.*/\1 \2/' |
  awk '{ printf "bf16 memory per rank %s KiB, ZeRO-2 mixed-precision formula %s KiB\n", $1, $2; exit ($1 != $2) }'
if mpirun -np 2 --oversubscribe "$exe" --mesh data=2 --dtype bf16 --save ck > refused.txt 2>&1; then
  echo "FAILED: --save with --dtype bf16 ran"; exit 1
fi
grep -q "not --dtype bf16" refused.txt
