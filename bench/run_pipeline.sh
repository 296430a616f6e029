#!/usr/bin/env bash
# Pipelines and experts, measured by train_transformer on 2 ranks (float, a size where GEMMs
# dominate):
#  1. the bubble (1 - busy / step, per stage) on stage=2 for M = 1..8 micro-batches of two
#     sequences (GPipe; 1F1B at 1, 2, 4, 8),
#     next to GPipe's (K-1)/(M+K-1);
#  2. peak activation memory per stage for GPipe, 1F1B and remat at M = 8, next to M*A,
#     min(K-s, M)*A and M*input + A (A: one micro-batch's activations on the stage);
#  3. the experts' all-to-all bytes per step next to the analytic count, and the step time with
#     4 experts (top-2, capacity factor 1, each expert half as wide) against the dense model of
#     the same FLOPs, on data=2, side by side.
# Any extra arguments go to train_transformer.
#   bash bench/run_pipeline.sh [--steps 4]
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/prepare.sh
bench_build "libopenblas-dev" train_transformer
run() { mpirun -np 2 "$bench_dir"/examples/train_transformer "$@"; }
size=(--dmodel 512 --heads 8 --batch 16 --seq 128 --vocab 64 --layers 4 --steps 4 --peak-n 2048)
dense=(--dmodel 512 --heads 8 --batch 16 --seq 128 --vocab 512 --layers 4 --steps 6 --peak-n 2048)
gpipe_m="1 2 3 4 5 6 7 8" onef1b_m="1 2 4 8" rounds="1 2"
if [[ -n $bench_tiny ]]; then
  size=(--dmodel 32 --heads 2 --batch 16 --seq 8 --vocab 16 --layers 2 --steps 1 --peak-n 64)
  dense=(--dmodel 32 --heads 2 --batch 4 --seq 8 --vocab 16 --layers 2 --steps 1 --peak-n 64)
  gpipe_m="1 2" onef1b_m="2" rounds="1"
fi
echo "== bubble on stage=2"
for schedule in gpipe 1f1b; do
  for m in $( [ "$schedule" = gpipe ] && echo "$gpipe_m" || echo "$onef1b_m" ); do
    # two sequences per micro-batch, so every M divides the batch
    run --mesh stage=2 --microbatches "$m" --schedule "$schedule" "${size[@]}" --batch $((2 * m)) "$@" | grep -E "^pipeline|^mesh" |
      sed -e 's/(sgemm.*//'
  done
done
echo "== activation memory on stage=2, 8 micro-batches"
for variant in "--schedule gpipe" "--schedule 1f1b" "--schedule gpipe --remat" "--schedule 1f1b --remat"; do
  # shellcheck disable=SC2086
  run --mesh stage=2 --microbatches 8 $variant "${size[@]}" "$@" | grep -E "^pipeline|^memory per stage"
done
echo "== experts against the dense model of the same FLOPs, data=2"
for round in $rounds; do
  echo "round $round"
  run --mesh data=2 "${dense[@]}" --hidden $((4 * ${dense[1]})) "$@" | grep -E "^mesh" | sed -e 's/^/dense: /'
  run --mesh data=2 "${dense[@]}" --hidden $((2 * ${dense[1]})) --experts 4 --capacity-factor 1 "$@" | grep -E "^mesh|^experts" |
    sed -e 's/^/experts: /'
done
