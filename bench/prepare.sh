# Sourced by the bench/run_*.sh scripts: the environment mpirun needs (scripts/env.sh), the
# Debian packages a benchmark names, and its targets built in build-bench (Release, examples
# on so train_transformer can be timed too).
#   bench_build "libopenblas-dev ..." target...
source "$(dirname "${BASH_SOURCE[0]}")/../scripts/env.sh"
bench_build() {
  local packages=$1 missing=()
  shift
  for p in $packages; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if ((${#missing[@]})); then apt-get install -y -qq "${missing[@]}"; fi
  cmake -S . -B build-bench -DCMAKE_BUILD_TYPE=Release -DTSHARD_BUILD_BENCH=ON -DTSHARD_BUILD_TESTS=OFF \
    -DTSHARD_BUILD_EXAMPLES=ON > /dev/null
  cmake --build build-bench --target "$@" -j "$jobs"
}
