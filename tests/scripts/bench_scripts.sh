#!/usr/bin/env bash
# Runs every bench/run_*.sh at a tiny size against the test build's own targets, so a benchmark
# script that crashes (a BLAS kernel the CPU lacks, a renamed flag, a binary's bad exit) fails
# the suite. A script whose benchmark was not built here (an optional dependency missing:
# ScaLAPACK, PyTorch) reports itself skipped.
#   bash tests/scripts/bench_scripts.sh BUILD_DIR
set -uo pipefail
build=$(cd "$1" && pwd)
cd "$(dirname "$0")/../.."
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
export TSHARD_BENCH_BUILD=$build TSHARD_BENCH_TINY=1
declare -A args=(
  [run_all_reduce]="--min 0.25 --max 0.5 --reps 1"
  [run_ad]="--dmodel 32 --heads 2 --batch 2 --seq 8 --layers 1 --reps 1"
  [run_bf16]="--B 8 --D 16 --H 32 --n 32 --reps 1"
  [run_conv]="--n 2 --c 4 --o 4 --h 8 --w 8 --reps 1"
  [run_dispatch]=""
  [run_gemm_backends]=""
  [run_cost_model]="--max-bytes 4096 --reps 1"
  [run_heat2d]="--n 64 --iters 2 --rounds 1"
  [run_hpc]="--n 13 --iters 3 --rounds 1"
  [run_io]="--n 64 --reps 1 --dir $scratch"
  [run_llama]=""
  [run_long_context]=""
  [run_matmul]="--n 64 --reps 1"
  [run_mlp_step]="--B 8 --D 16 --H 32 --reps 1 --steps 1 --peak-n 64"
  [run_overhead]="--n 8 --calls 10 --reps 1"
  [run_pipeline]=""
  [run_reduce_scatter]="--max 65536 --reps 1"
  [run_scaling]=""
  [run_reshard]="--n 64 --reps 1 --warmup 0"
  [run_tokenizer]=""
  [run_transformer_step]=""
  [run_vs_pytorch]="--steps 2"
)
failed=() skipped=() passed=()
for script in bench/run_*.sh; do
  name=$(basename "$script" .sh)
  # (the simulation build's part of the suite runs the simulated ones: examples/CMakeLists.txt)
  [[ $name == run_simulated_* ]] && continue
  if [[ ! -v "args[$name]" ]]; then
    echo "tests/scripts/bench_scripts.sh has no tiny size for $script: add one"
    failed+=("$name")
    continue
  fi
  # shellcheck disable=SC2086
  bash "$script" ${args[$name]} > "$scratch/$name.log" 2>&1
  rc=$?
  if ((rc == 77)); then
    skipped+=("$name ($(grep -m1 '^skipped' "$scratch/$name.log"))")
  elif ((rc != 0)) || ! grep -q '^OpenBLAS kernels: ' "$scratch/$name.log"; then
    echo "== $script ${args[$name]} failed (exit $rc):"
    tail -n 30 "$scratch/$name.log"
    failed+=("$name")
  else
    passed+=("$name")
  fi
done
echo "bench scripts run at a tiny size: ${passed[*]}"
((${#skipped[@]})) && printf 'skipped: %s\n' "${skipped[@]}"
((${#failed[@]} == 0)) || { echo "FAILED: ${failed[*]}"; exit 1; }
