#!/usr/bin/env bash
# The test programs under AddressSanitizer + UndefinedBehaviorSanitizer (build-asan/, -O1 -g),
# and the MPI-free core tests under valgrind's memcheck:
#   bash scripts/sanitizers.sh [--ranks "1 3"] [--skip-valgrind]
# OpenMPI's own allocations kept until exit are suppressed (tests/sanitizers/lsan.supp); any
# other leak, a bad access or undefined behaviour fails the run. Takes ~20 min on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
ranks="1 3" valgrind=1
while [ $# -gt 0 ]; do
  case "$1" in
    --ranks) ranks=$2; shift 2 ;;
    --skip-valgrind) valgrind=0; shift ;;
    *) echo "sanitizers.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
source scripts/env.sh
flags="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer -g -O1"
cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DTSHARD_BUILD_TESTS=ON -DTSHARD_BUILD_EXAMPLES=ON \
  -DCMAKE_CXX_FLAGS="$flags" -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined" > /dev/null
targets="tshard_core_tests tshard_tests tshard_differential tshard_failure_modes train_transformer"
grep -q tshard_hdf5_tests build-asan/tests/Makefile 2> /dev/null && targets="$targets tshard_hdf5_tests"
cmake --build build-asan -j "${jobs:-2}" --target $targets
# OpenMPI's plug-ins stay loaded (no dlclose), so leak reports name them and lsan.supp applies.
cc -shared -fPIC -o build-asan/libno_dlclose.so tests/sanitizers/no_dlclose.c
export LD_PRELOAD="$PWD/build-asan/libno_dlclose.so"
export ASAN_OPTIONS="detect_leaks=1:abort_on_error=0:halt_on_error=1:detect_stack_use_after_return=0:verify_asan_link_order=0"
export LSAN_OPTIONS="suppressions=$PWD/tests/sanitizers/lsan.supp:print_suppressions=0"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
export TSHARD_TIMEOUT=300 TSHARD_TEST_WATCHDOG=3000  # sanitized runs are slow: the test main's 100 s is too short
status=0
run() {  # run NAME COMMAND...: its last lines, and the status kept
  echo "== $1"
  shift
  if ! "$@" > build-asan/last.log 2>&1; then
    status=1
    tail -40 build-asan/last.log
  else
    tail -2 build-asan/last.log | head -1
  fi
}
mpi() {
  mpirun -np "$1" --oversubscribe -x LD_PRELOAD -x ASAN_OPTIONS -x LSAN_OPTIONS -x UBSAN_OPTIONS -x TSHARD_TIMEOUT \
    -x TSHARD_TEST_WATCHDOG "${@:2}"
}
run "core tests (no MPI)" build-asan/tests/tshard_core_tests
for np in $ranks; do
  run "tshard_tests on $np ranks" mpi "$np" build-asan/tests/tshard_tests
  run "differential fuzzer on $np ranks" mpi "$np" build-asan/tests/tshard_differential --chains 300
  [ -x build-asan/tests/tshard_hdf5_tests ] && run "hdf5 tests on $np ranks" mpi "$np" build-asan/tests/tshard_hdf5_tests
  run "train_transformer on $np ranks" mpi "$np" build-asan/examples/train_transformer --steps 3 --double --check \
    --layers 2 --batch 6 --seq 5 --dmodel 12 --heads 3 --vocab 13 --dropout 0.1 --peak-n 64
done
run "failure_modes complete on 3 ranks" mpi 3 build-asan/tests/tshard_failure_modes complete
if [ "$valgrind" = 1 ]; then
  if command -v valgrind > /dev/null; then
    cmake -S . -B build-valgrind -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTSHARD_BUILD_TESTS=ON > /dev/null
    cmake --build build-valgrind -j "${jobs:-2}" --target tshard_core_tests
    run "core tests under valgrind" env -u LD_PRELOAD valgrind --error-exitcode=1 --leak-check=full --errors-for-leak-kinds=definite,indirect \
      build-valgrind/tests/tshard_core_tests
  else
    echo "== valgrind is not installed (apt-get install valgrind): skipped"
  fi
fi
[ $status = 0 ] && echo "sanitizers: all clean" || echo "sanitizers: FAILED (above)"
exit $status
