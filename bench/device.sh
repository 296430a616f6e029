#!/usr/bin/env bash
# The long-context measurements on a lent 16-core machine (Intel, AVX-512, PyTorch >= 2, no MPI, no
# compiler), prepared here so that one call there does them all.
#   bash bench/device.sh pack    here: builds tshard_bench_attention and train_llama in build-device
#                                for x86-64-v4 and packs them with Open MPI into .device/pack.tar.xz
#                                (../shared/tools/mpi-pack); carry ".device" to the machine
#   bash bench/device.sh run     there: unpacks and runs, in about four minutes,
#                                bench/run_long_context.sh --goal 4 (fused attention against the
#                                written-out one and PyTorch's SDPA, one thread; train_llama on 1, 2
#                                and 4 ranks; the Llama at T 16384 on 4) and the grouped-query shape
#                                (B 1, 8 heads over 2 key-value heads, Dh 32) of the same benchmark
# Extra arguments of run go to run_long_context.sh (defaults: --seq 1024,2048,4096,8192,16384
# --written-max 4096 --reps 3 --contexts 2,4 --goal 4).
set -euo pipefail
cd "$(dirname "$0")/.."
pack=.device/pack.tar.xz
case ${1:-} in
  pack)
    source scripts/env.sh
    cmake -S . -B build-device -DCMAKE_BUILD_TYPE=Release -DTSHARD_BUILD_BENCH=ON -DTSHARD_BUILD_EXAMPLES=ON \
      -DTSHARD_BUILD_TESTS=OFF -DTSHARD_BENCH_ARCH=x86-64-v4 -DCMAKE_CXX_FLAGS=-march=x86-64-v4 > /dev/null
    cmake --build build-device --target tshard_bench_attention train_llama -j "$jobs"
    mkdir -p .device
    ../shared/tools/mpi-pack "$pack" build-device/bench/tshard_bench_attention build-device/examples/train_llama
    echo "packed at $(git rev-parse --short HEAD)$(git diff --quiet HEAD || echo ' (with uncommitted changes)')"
    echo "next, with the device tool: run 'bash bench/device.sh run' with carry [\".device\"]"
    ;;
  run)
    shift
    [[ -f $pack ]] || { echo "bench/device.sh: no $pack here; run 'bash bench/device.sh pack' first" >&2; exit 2; }
    grep -qw avx512f /proc/cpuinfo || { echo "bench/device.sh: this CPU has no AVX-512; the pack is x86-64-v4" >&2; exit 2; }
    root=$(mktemp -d)
    tar xJf "$pack" -C "$root"
    source "$root/root/env.sh"
    # run_long_context.sh reads prebuilt binaries from DIR/bench and DIR/examples.
    mkdir -p "$root/tree/bench" "$root/tree/examples"
    ln -s "$root/root/bin/tshard_bench_attention" "$root/tree/bench/"
    ln -s "$root/root/bin/train_llama" "$root/tree/examples/"
    echo "== $(grep -m1 'model name' /proc/cpuinfo | sed 's/.*: //'), $(env -u OMP_NUM_THREADS nproc) cores;" \
      "$(python3 -c 'import torch; print("PyTorch", torch.__version__)' 2>/dev/null || echo 'no PyTorch')"
    export TSHARD_BENCH_BUILD=$root/tree
    args=("$@")
    ((${#args[@]})) || args=(--goal 4)
    bash bench/run_long_context.sh "${args[@]}"
    echo "== grouped-query attention: B 1, 8 heads over 2 key-value heads, Dh 32"
    gqa=(--batch 1 --heads 8 --kv-heads 2 --dh 32 --seq 2048,8192 --written-max 2048 --reps 3)
    out=$(mktemp)
    mpirun -np 1 "$root/tree/bench/tshard_bench_attention" "${gqa[@]}" | tee "$out"
    python3 bench/sdpa_bench.py "${gqa[@]}" --against "$out" || (($? == 77))
    ;;
  *)
    echo "usage: bash bench/device.sh pack | run [run_long_context.sh options]" >&2
    exit 2
    ;;
esac
