#!/usr/bin/env bash
# conv2d forward + backward of one 3x3 layer, H split over 2 ranks: tshard (ts::nn::conv2d under
# ts::ad::vjp) against the hand-written MPI + Eigen layer (bench/conv_bench.cpp), side by side;
# then PyTorch's CPU convolution (Debian's python3-torch, 2 threads) on the whole image, same
# sizes, float. Then the U-Net step (examples/train_unet) spatially partitioned (h=2) against
# data-parallel (data=2) at the same global batch.
#   bash bench/run_conv.sh [--n 8] [--c 64] [--o 64] [--h 64] [--w 64] [--reps 7]
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/prepare.sh
bench_build "python3-torch" tshard_bench_conv train_unet
mpirun -np 2 "$bench_dir"/bench/tshard_bench_conv "$@"
n=8 c=64 o=64 h=64 w=64 reps=7
while (($#)); do
  case $1 in --n) n=$2 ;; --c) c=$2 ;; --o) o=$2 ;; --h) h=$2 ;; --w) w=$2 ;; --reps) reps=$2 ;; esac
  shift 2
done
if ! bench_has python3-torch; then
  echo "PyTorch's convolution: skipped (python3-torch is not installed)"
else
/usr/bin/python3 - "$n" "$c" "$o" "$h" "$w" "$reps" <<'PY'
import sys, time, torch
n, c, o, h, w, reps = map(int, sys.argv[1:])
torch.set_num_threads(2)
x = torch.rand(n, c, h, w, requires_grad=True); k = (torch.rand(o, c, 3, 3) * 0.1).requires_grad_(True)
dy = torch.rand(n, o, h, w)
times = []
for r in range(reps + 2):
    t0 = time.perf_counter()
    y = torch.nn.functional.conv2d(x, k, padding=1); y.backward(dy)
    times.append(time.perf_counter() - t0)
t = sorted(times[2:])[len(times[2:]) // 2]
flops = 3 * 2.0 * n * o * h * w * c * 9
print("PyTorch %s, 2 threads, whole image: %.2f ms (%.1f GFLOP/s)" % (torch.__version__, 1e3 * t, flops / t / 1e9))
PY
fi
unet=(--size 96 --batch 8 --channels 16 --steps 6)
[[ -n $bench_tiny ]] && unet=(--size 12 --batch 2 --channels 2 --steps 1)
echo "== the U-Net step at the same global batch: spatially partitioned (h=2) against data-parallel (data=2)"
for mesh in h=2 data=2; do
  mpirun -np 2 "$bench_dir"/examples/train_unet --mesh "$mesh" "${unet[@]}" | grep -E '^halo|^mesh'
done
