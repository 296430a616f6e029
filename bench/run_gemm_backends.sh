#!/usr/bin/env bash
# BLIS against OpenBLAS on one core, float and double GEMMs of the examples' shapes, alternated in
# one run (bench/gemm_backend_bench.cpp): OpenBLAS with OPENBLAS_CORETYPE as bench/prepare.sh sets
# it (SkylakeX on AVX-512 CPUs) and unset (what a user's program gets), BLIS choosing alone and
# with the kernels tshard gives it. Prints each library's medians over the rounds and the ratio of
# the BLIS tshard runs to each OpenBLAS: TSHARD_BLAS=auto takes BLIS where it is found.
#   bash bench/run_gemm_backends.sh [--rounds 3] [--reps 5]
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/prepare.sh
bench_build "libblis-dev libopenblas-dev" tshard_bench_gemm_blis tshard_bench_gemm_openblas
rounds=3 reps=5
while (($#)); do
  case $1 in
    --rounds) rounds=$2; shift 2 ;;
    --reps) reps=$2; shift 2 ;;
    *) echo "run_gemm_backends.sh: unknown option $1"; exit 2 ;;
  esac
done
tiny=()
[[ -n $bench_tiny ]] && tiny=(--tiny) rounds=1 reps=1
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
coretype=${OPENBLAS_CORETYPE:-}
for ((r = 0; r < rounds; r++)); do
  OPENBLAS_CORETYPE=$coretype "$bench_dir"/bench/tshard_bench_gemm_openblas --reps "$reps" "${tiny[@]}" >> "$out/openblas_set"
  env -u OPENBLAS_CORETYPE "$bench_dir"/bench/tshard_bench_gemm_openblas --reps "$reps" "${tiny[@]}" >> "$out/openblas_unset"
  env -u BLIS_ARCH_TYPE "$bench_dir"/bench/tshard_bench_gemm_blis --reps "$reps" "${tiny[@]}" >> "$out/blis_own"
  env -u BLIS_ARCH_TYPE "$bench_dir"/bench/tshard_bench_gemm_blis --tshard-kernels --reps "$reps" "${tiny[@]}" >> "$out/blis_tshard"
done
# Median sgemm and dgemm per shape of one file: "m n k s d" lines.
medians() {
  grep -E '^ *[0-9]' "$1" | awk '{ key = $1 " " $2 " " $3; s[key] = s[key] " " $5; d[key] = d[key] " " $7; if (!(key in seen)) { seen[key] = 1; order[n++] = key } }
    function median(list,   v, c, i, j, t) { c = split(list, v, " "); for (i = 1; i <= c; i++) for (j = i + 1; j <= c; j++) if (v[j] < v[i]) { t = v[i]; v[i] = v[j]; v[j] = t } return v[int((c + 1) / 2)] }
    END { for (i = 0; i < n; i++) print order[i], median(s[order[i]]), median(d[order[i]]) }'
}
for f in openblas_set openblas_unset blis_own blis_tshard; do medians "$out/$f" > "$out/$f.med"; done
echo "one core, GFLOP/s, medians of $rounds rounds (best of $reps calls each):"
printf '  %-16s %-38s %-38s %-38s %s\n' "m n k" "OpenBLAS, OPENBLAS_CORETYPE=${coretype:-unset}" "OpenBLAS, OPENBLAS_CORETYPE unset" \
  "BLIS alone" "BLIS, tshard's kernels"
echo "  (kernels: $(head -1 "$out/openblas_set" | sed 's/local products: //') | $(head -1 "$out/openblas_unset" | sed 's/local products: //') | $(head -1 "$out/blis_own" | sed 's/local products: //') | $(head -1 "$out/blis_tshard" | sed 's/local products: //'))"
paste "$out/openblas_set.med" "$out/openblas_unset.med" "$out/blis_own.med" "$out/blis_tshard.med" |
  awk '{ printf "  %5d %5d %5d    s %6.1f d %6.1f                 s %6.1f d %6.1f                 s %6.1f d %6.1f                 s %6.1f d %6.1f   BLIS/OpenBLAS: s %.2fx d %.2fx (unset: s %.2fx d %.2fx)\n",
           $1, $2, $3, $4, $5, $9, $10, $14, $15, $19, $20, $19 / $4, $20 / $5, $19 / $9, $20 / $10 }'
