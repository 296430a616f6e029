# Sourced by the bench/run_*.sh scripts: the environment mpirun needs (scripts/env.sh), the
# Debian packages a benchmark names, and its targets built in build-bench (Release, examples
# on so train_transformer can be timed too).
#   bench_build "libopenblas-dev ..." target...
# The test suite runs every script at a tiny size against its own build (tests/scripts/
# bench_scripts.sh), so that a script that crashes fails the suite:
#   TSHARD_BENCH_BUILD=DIR  use the targets already built in DIR: no apt, no configure; a
#                           target DIR lacks (a benchmark whose optional dependency is
#                           missing) skips the script with exit status 77
#   TSHARD_BENCH_TINY=1     the scripts' own fixed sizes shrink to seconds of work
source "$(dirname "${BASH_SOURCE[0]}")/../scripts/env.sh"
bench_dir=${TSHARD_BENCH_BUILD:-build-bench}
bench_tiny=${TSHARD_BENCH_TINY:-}
# Whether a Debian package is installed.
bench_has() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }
bench_build() {
  local packages=$1 missing=()
  shift
  if [[ -n "${TSHARD_BENCH_BUILD:-}" ]]; then
    local t
    for t in "$@"; do
      if [[ ! -x "$bench_dir/bench/$t" && ! -x "$bench_dir/examples/$t" ]]; then
        echo "skipped: $t is not built in $bench_dir"
        exit 77
      fi
    done
    return 0
  fi
  for p in $packages; do bench_has "$p" || missing+=("$p"); done
  if ((${#missing[@]})); then apt-get install -y -qq "${missing[@]}"; fi
  cmake -S . -B build-bench -DCMAKE_BUILD_TYPE=Release -DTSHARD_BUILD_BENCH=ON -DTSHARD_BUILD_TESTS=OFF \
    -DTSHARD_BUILD_EXAMPLES=ON > /dev/null
  cmake --build build-bench --target "$@" -j "$jobs"
}
# OpenBLAS 0.3.21 picks its slower Haswell kernels on AVX-512 CPUs it does not know; SkylakeX
# kernels are set there, for the benchmark alone. Never on a CPU without avx512f: every BLAS
# call would then die of SIGILL. A user's OPENBLAS_CORETYPE wins.
if [[ -z "${OPENBLAS_CORETYPE:-}" ]] && grep -qw avx512f /proc/cpuinfo 2>/dev/null; then
  export OPENBLAS_CORETYPE=SkylakeX
fi
echo "OpenBLAS kernels: ${OPENBLAS_CORETYPE:-chosen by OpenBLAS for $(grep -m1 'model name' /proc/cpuinfo 2>/dev/null | sed 's/.*: //')}"
