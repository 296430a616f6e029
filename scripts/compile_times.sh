#!/usr/bin/env bash
# Compile time of single translation units with the flags the build uses (-O3, BLAS on), one at a
# time, best of --reps. Usage: scripts/compile_times.sh [--reps N] [file.cpp ...]
# Defaults: examples/quickstart.cpp and the largest test files.
set -euo pipefail
cd "$(dirname "$0")/.."
reps=1
files=()
while [ $# -gt 0 ]; do
  case "$1" in
    --reps) reps="$2"; shift 2 ;;
    *) files+=("$1"); shift ;;
  esac
done
[ ${#files[@]} -gt 0 ] || files=(examples/quickstart.cpp tests/mpi/test_halo.cpp tests/mpi/test_ops.cpp
                                  tests/mpi/test_model_ops.cpp tests/differential/differential.cpp)
cxx=${CXX:-c++}
flags=(-O3 -DNDEBUG -std=gnu++20 -DTSHARD_USE_BLAS=1 -Iinclude -Itests/support
       -isystem /usr/lib/x86_64-linux-gnu/openmpi/include -isystem /usr/lib/x86_64-linux-gnu/openmpi/include/openmpi
       -isystem /usr/include/eigen3)
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
printf '%-40s %8s\n' file seconds
for f in "${files[@]}"; do
  best=
  for _ in $(seq "$reps"); do
    t0=$EPOCHREALTIME
    "$cxx" "${flags[@]}" -c "$f" -o "$out/x.o"
    t=$(awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN { print b - a }')
    if [ -z "$best" ] || awk -v t="$t" -v b="$best" 'BEGIN { exit !(t < b) }'; then best=$t; fi
  done
  printf '%-40s %8.1f\n' "$f" "$best"
done
