#!/usr/bin/env bash
# Each program's --help on 2 ranks: exit 0, its usage once on standard output, nothing on
# standard error, --steps among the flags listed.
#   bash tests/scripts/help.sh path/to/program...
set -euo pipefail
for exe in "$@"; do
  name=$(basename "$exe")
  err=$(mktemp)
  out=$(mpirun -np 2 --oversubscribe "$exe" --help 2> "$err") || { echo "FAILED: $name --help exits non-zero"; cat "$err"; exit 1; }
  [[ -s "$err" ]] && { echo "FAILED: $name --help writes to standard error:"; cat "$err"; exit 1; }
  rm -f "$err"
  count=$(grep -c "^usage: $name" <<< "$out" || true)
  [[ $count == 1 ]] || { echo "FAILED: $name --help prints its usage $count times"; echo "$out"; exit 1; }
  grep -q -- "--steps" <<< "$out" || { echo "FAILED: $name --help does not list --steps"; echo "$out"; exit 1; }
  echo "$name --help: $(wc -l <<< "$out") lines"
done
