#!/usr/bin/env bash
# The long mode for many ranks: the operator tests (mesh, tensor, reshard, halo, ops, model ops,
# products) and the differential fuzzer on 8, 12 and 16 ranks, oversubscribed (several minutes
# per rank count on 2 cores; not part of the suite, which runs 1, 2, 3, 4 and 6).
#   bash scripts/many_ranks.sh [--ranks "8 12 16"] [--chains 500]
set -euo pipefail
cd "$(dirname "$0")/.."
ranks="8 12 16" chains=500
while [ $# -gt 0 ]; do
  case "$1" in
    --ranks) ranks=$2; shift 2 ;;
    --chains) chains=$2; shift 2 ;;
    *) echo "many_ranks.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
source scripts/env.sh
if [ ! -x build/tests/tshard_tests ] || [ ! -x build/tests/tshard_differential ]; then
  cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DTSHARD_BUILD_TESTS=ON > /dev/null
  cmake --build build --target tshard_tests tshard_differential -j "$jobs"
fi
# A rank stuck in a collective ends the run instead of hanging it; the test main's own whole-run
# watchdog (100 s by default) is far too short for 16 ranks on 2 cores.
export TSHARD_TIMEOUT=300 TSHARD_TEST_WATCHDOG=3000
status=0
for np in $ranks; do
  echo "== $np ranks"
  mpirun -np "$np" --oversubscribe -x TSHARD_TIMEOUT -x TSHARD_TEST_WATCHDOG build/tests/tshard_tests --filenames-as-tags \
    "[#test_mesh]~[failure],[#test_tensor],[#test_reshard],[#test_halo],[#test_ops],[#test_model_ops],[#test_products]" \
    2>&1 | tail -3 || status=1
  mpirun -np "$np" --oversubscribe -x TSHARD_TIMEOUT build/tests/tshard_differential --chains "$chains" --first $((np * 100000)) ||
    status=1
done
exit $status
