#!/usr/bin/env bash
# Scaling on one node: train_transformer at bench/run_transformer_step.sh's size (D 1024, 16 heads,
# 2 layers, seq 256, vocab 1024, 8 sequences per data rank: weak scaling over data, the same 8
# sequences under model) on 1, 4 and 16 ranks of data with ZeRO 0, 2 and 3, each with and
# without --overlap; model=4 and model=16; data=4,model=4. Per run: tokens/s, MFU against the
# sgemm rate with every rank busy (measured by each run), efficiency against one rank (tokens/s
# per rank over the one-rank run's), the gradient reduction not hidden, and the step split per rank
# into computing, waiting for the slowest rank and moving bytes (train_transformer --profile). Where a PyTorch >= 2
# with torch.distributed is importable, the same GPT (tests/reference/gpt_reference.py's model) as
# DDP and as DTensor tensor parallelism on the same cores (bench/pytorch_parallel_gpt.py).
# Sized for a 16-core machine in under 5 minutes; RANKS lists the data sizes (default "1 4 16";
# runs needing more ranks than the machine's cores are left out). For a machine without MPI or a
# compiler: TSHARD_BENCH_BUILD=DIR with prebuilt binaries, and Open MPI packed along
# (../shared/tools/mpi-pack OUT.tar.xz build/examples/train_transformer). TSHARD_BENCH_TINY=1:
# a toy size on 1 and 2 ranks (the suite runs it so).
#   bash bench/run_scaling.sh [--steps 3] [any train_transformer flag]
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/prepare.sh
bench_build "libopenblas-dev" train_transformer
cores=$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)
ranks=(${RANKS:-1 4 16})
size=(--dmodel 1024 --heads 16 --seq 256 --vocab 1024 --layers 2 --steps 3 --peak-n 384)
per_rank=8 models=(4 16) mixed=4
if [[ -n $bench_tiny ]]; then
  ranks=(1 2) models=(2) mixed="" cores=$((cores > 2 ? cores : 2))
  size=(--dmodel 32 --heads 2 --seq 8 --vocab 16 --layers 1 --steps 2 --peak-n 64)
  per_rank=2
fi
exe="$bench_dir"/examples/train_transformer
one=""  # the one-rank tokens/s
# run N MESH [flags]: prints tokens/s, MFU, efficiency, reduction not hidden
run() {
  local n=$1 mesh=$2 data=$3; shift 3
  ((n <= cores)) || { echo "  $mesh $*: skipped ($n ranks > $cores cores)"; return 0; }
  local out
  out=$(mpirun -np "$n" "$exe" --mesh "$mesh" --batch $((per_rank * data)) "${size[@]}" --profile "$@" | grep -E '^mesh|^time per step')
  local tps mfu hidden
  tps=$(grep '^mesh' <<< "$out" | sed -E 's/.*: ([0-9.]+) tokens\/s.*/\1/')
  mfu=$(grep '^mesh' <<< "$out" | sed -E 's/.*MFU ([0-9.]+)%.*/\1/')
  hidden=$(grep -oE 'not hidden [0-9.]+ ms/step' <<< "$out" | grep -oE '[0-9.]+' || echo 0)
  [[ -n $one ]] || one=$tps
  awk -v m="$mesh $*" -v t="$tps" -v f="$mfu" -v h="$hidden" -v o="$one" -v n="$n" 'BEGIN {
    printf "  %-34s %9.0f tokens/s  MFU %5.1f%%  efficiency %5.1f%%  reduction not hidden %7.1f ms/step\n", m, t, f, 100 * t / (n * o), h }'
  grep '^time per step' <<< "$out" | sed 's/^/      /' || true
}
echo "train_transformer, $per_rank sequences per data rank, ${size[*]}, $cores cores"
for n in "${ranks[@]}"; do
  for zero in 0 2 3; do
    for overlap in "" --overlap; do
      ((n > 1)) || [[ -z $overlap && $zero == 0 ]] || continue
      run "$n" "data=$n" "$n" --zero "$zero" $overlap
    done
  done
done
for m in "${models[@]}"; do run "$m" "model=$m" 1; done
if [[ -n $mixed ]]; then
  run $((mixed * mixed)) "data=$mixed,model=$mixed" "$mixed"
  run $((mixed * mixed)) "data=$mixed,model=$mixed" "$mixed" --overlap
fi
# PyTorch beside it, where a version with DTensor is there
if python3 -c 'import torch, torch.distributed as d, sys; sys.exit(0 if int(torch.__version__.split(".")[0]) >= 2 and d.is_available() else 1)' 2> /dev/null; then
  for n in "${ranks[@]}"; do
    ((n <= cores)) || continue
    python3 -m torch.distributed.run --standalone --nproc_per_node "$n" bench/pytorch_parallel_gpt.py --mode ddp \
      --batch $((per_rank * n)) "${size[@]}"
  done
  for m in "${models[@]}"; do
    ((m <= cores)) || continue
    python3 -m torch.distributed.run --standalone --nproc_per_node "$m" bench/pytorch_parallel_gpt.py --mode tp \
      --batch "$per_rank" "${size[@]}"
  done
else
  echo "PyTorch >= 2 with torch.distributed is not importable here: its DDP and tensor-parallel runs are left out"
fi
