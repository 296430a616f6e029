#!/usr/bin/env bash
# Compile time of single translation units, one at a time on one core, best of --reps.
#   bash scripts/compile_times.sh [--reps N] [--opt -O2] [--kernels] [--pch] [--against DIR] [file.cpp ...]
#   bash scripts/compile_times.sh --profile [--opt -O2] file.cpp
# --opt: the optimisation flag (default -O3, the build's; the compile-time goals use -O2).
# --against DIR: also compile each file against another checkout (an older commit, say:
#   git worktree add /tmp/old 7a7d6a6) with that tree's headers and, where it has one, its own
#   copy of the file, and print the ratio this tree / that tree.
# --kernels: compile this tree's files as a program that links tshard::kernels does (with
#   TSHARD_PRECOMPILED_KERNELS: the descriptor-level kernels come compiled from src/kernels.cpp,
#   whose own one-off time is printed first); the other tree's header-only.
# --pch: also use a precompiled <tshard/tshard.hpp> for this tree's files, as
#   tshard_precompile_headers(target) gives (its one-off time is printed first).
# --profile: where the file's time goes, by template family (clang++ -ftime-trace, summed by
#   scripts/compile_profile.py): front end against back end, instantiation, optimisation and
#   machine code per family, typed code against code per element type.
# Defaults: the examples a user compiles first, the ViT of bench/compile and the largest tests.
set -euo pipefail
cd "$(dirname "$0")/.."
reps=1
opt=-O3
against=
profile=
kernels=
pch=
files=()
while [ $# -gt 0 ]; do
  case "$1" in
    --reps) reps="$2"; shift 2 ;;
    --opt) opt="$2"; shift 2 ;;
    --against) against="$(cd "$2" && pwd)"; shift 2 ;;
    --profile) profile=1; shift ;;
    --kernels) kernels=-DTSHARD_PRECOMPILED_KERNELS=1; shift ;;
    --pch) pch=1; shift ;;
    *) files+=("$1"); shift ;;
  esac
done
[ ${#files[@]} -gt 0 ] || files=(examples/quickstart.cpp examples/gpt_minimal.cpp bench/compile/vit.cpp
                                  examples/train_llama.cpp tests/mpi/test_ops.cpp tests/mpi/test_model_ops.cpp)
cxx=${CXX:-c++}
flags=("$opt" -DNDEBUG -std=gnu++20 -DTSHARD_USE_BLAS=1
       -isystem /usr/lib/x86_64-linux-gnu/openmpi/include -isystem /usr/lib/x86_64-linux-gnu/openmpi/include/openmpi
       -isystem /usr/include/eigen3)
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
if [ -n "$profile" ]; then
  command -v clang++ >/dev/null || { echo "--profile needs clang++ (apt-get install clang)" >&2; exit 1; }
  for f in "${files[@]}"; do
    echo "== $f ($opt)"
    clang++ "${flags[@]}" $kernels -I"$PWD/include" -I"$PWD/tests/support" -ftime-trace -ftime-trace-granularity=50 \
      -c "$f" -o "$out/x.o"
    python3 scripts/compile_profile.py "$out/x.json" "$out/x.o"
  done
  exit 0
fi
# best_time ROOT FILE [FLAG]: seconds to compile FILE with ROOT's headers (best of reps).
best_time() {
  local root=$1 f=$2 extra=${3:-} best= t t0
  for _ in $(seq "$reps"); do
    t0=$EPOCHREALTIME
    "$cxx" "${flags[@]}" $extra -I"$root/include" -I"$root/tests/support" -c "$f" -o "$out/x.o"
    t=$(awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN { print b - a }')
    if [ -z "$best" ] || awk -v t="$t" -v b="$best" 'BEGIN { exit !(t < b) }'; then best=$t; fi
  done
  echo "$best"
}
if [ -z "$against" ]; then
  printf '%-40s %8s\n' "file ($opt)" seconds
else
  printf '%-40s %8s %8s %7s\n' "file ($opt)" this that ratio
fi
mine_flags=$kernels
if [ -n "$pch" ]; then  # (GCC takes tshard.hpp.gch in place of the header where the flags agree)
  mkdir -p "$out/pch"
  echo '#include <tshard/tshard.hpp>' > "$out/pch/tshard.hpp"
  t0=$EPOCHREALTIME
  "$cxx" "${flags[@]}" $kernels -I"$PWD/include" -x c++-header "$out/pch/tshard.hpp" -o "$out/pch/tshard.hpp.gch"
  printf '%-40s %8.1f  (once per target: the precompiled header)\n' '<tshard/tshard.hpp>' \
    "$(awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN { print b - a }')"
  mine_flags="$kernels -include $out/pch/tshard.hpp -Winvalid-pch"
fi
[ -z "$kernels" ] || printf '%-40s %8.1f  (once per build: tshard::kernels)\n' src/kernels.cpp \
                         "$(best_time "$PWD" src/kernels.cpp)"
for f in "${files[@]}"; do
  mine=$(best_time "$PWD" "$f" "$mine_flags")
  if [ -z "$against" ]; then
    printf '%-40s %8.1f\n' "$f" "$mine"
  else
    other=$f
    [ -f "$against/$f" ] && other="$against/$f"
    theirs=$(best_time "$against" "$other")
    printf '%-40s %8.1f %8.1f %7.2f\n' "$f" "$mine" "$theirs" "$(awk -v a="$mine" -v b="$theirs" 'BEGIN { print a / b }')"
  fi
done
