#!/usr/bin/env bash
# The differential fuzzer's long mode: random operator chains through the typed API against
# serial Eigen (tests/differential/differential.cpp), CHAINS per rank count, each rank count on
# its own chains. The suite runs a fast slice of 300 chains on 1, 2, 3, 4 and 6 ranks.
#   bash scripts/differential.sh [--chains 1250] [--seed 1] [--length 10] [--ranks "1 2 3 4 5 6 7 8"] [--grad]
# --grad differentiates the chains instead (ts::ad::value_and_grad against one rank and central
# differences; the suite runs 300 such chains per rank count).
# 1250 chains on each of 1..8 ranks is 10,000 chains; add 12 and 16 to --ranks for many ranks
# (oversubscribed). A failure prints the chain and its replay command; the exit status is non-zero.
set -euo pipefail
cd "$(dirname "$0")/.."
chains=1250 seed=1 length=10 ranks="1 2 3 4 5 6 7 8" grad=()
while [ $# -gt 0 ]; do
  case "$1" in
    --chains) chains=$2; shift 2 ;;
    --seed) seed=$2; shift 2 ;;
    --length) length=$2; shift 2 ;;
    --ranks) ranks=$2; shift 2 ;;
    --grad) grad=(--grad); shift ;;
    *) echo "differential.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
source scripts/env.sh
if [ ! -x build/tests/tshard_differential ]; then
  cmake -S . -B build -DCMAKE_BUILD_TYPE=Release > /dev/null
  cmake --build build --target tshard_differential -j 2
fi
failed=0 first=0
for np in $ranks; do
  # TSHARD_TIMEOUT: a rank stuck in a collective (one rank threw) ends the run instead of hanging.
  if ! TSHARD_TIMEOUT=60 mpirun -np "$np" --oversubscribe -x TSHARD_TIMEOUT build/tests/tshard_differential \
      --chains "$chains" --first "$first" --seed "$seed" --length "$length" "${grad[@]}"; then
    failed=1
  fi
  first=$((first + chains))
done
exit $failed
