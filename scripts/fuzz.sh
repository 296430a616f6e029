#!/usr/bin/env bash
# Fuzzes the .npy header parser with libFuzzer (clang, -fsanitize=fuzzer,address,undefined),
# seeded with headers tshard and numpy write; the suite runs a seeded mutation test instead.
#   bash scripts/fuzz.sh [runs]        (default 1000000)
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-1000000}
command -v clang++ > /dev/null || { echo "fuzz.sh: clang++ is not installed (apt-get install clang)"; exit 2; }
out=build-fuzz
mkdir -p "$out/corpus"
clang++ -std=c++20 -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -Iinclude \
  tests/fuzz/npy_header_fuzzer.cpp -o "$out/npy_header_fuzzer"
# Seeds: valid preambles of every dtype, ranks 0-3, both orders, and a version 2 header.
printf '\x93NUMPY\x01\x00v\x00{'"'"'descr'"'"': '"'"'<f8'"'"', '"'"'fortran_order'"'"': False, '"'"'shape'"'"': (3, 4), }' > "$out/corpus/c_order"
printf '\x93NUMPY\x01\x00v\x00{'"'"'descr'"'"': '"'"'<c16'"'"', '"'"'fortran_order'"'"': True, '"'"'shape'"'"': (7,), }' > "$out/corpus/one_d"
printf '\x93NUMPY\x02\x00\x40\x00\x00\x00{"descr": "<i8", "fortran_order": True, "shape": (), }' > "$out/corpus/v2_scalar"
"$out/npy_header_fuzzer" -runs="$runs" -max_len=512 -print_final_stats=1 "$out/corpus" 2>&1 | tail -12
