#!/usr/bin/env bash
# Fuzzes the .npy and safetensors header parsers with libFuzzer (clang, -fsanitize=fuzzer,address,undefined),
# seeded with headers tshard and numpy write; the suite runs a seeded mutation test instead.
#   bash scripts/fuzz.sh [runs]        (default 1000000 each)
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
# safetensors: headers as tshard and Hugging Face's writer lay them out.
clang++ -std=c++20 -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -Iinclude \
  tests/fuzz/safetensors_header_fuzzer.cpp -o "$out/safetensors_header_fuzzer"
mkdir -p "$out/corpus_safetensors"
seed() { local json=$1; printf "$(printf '\\x%02x' "${#json}")\x00\x00\x00\x00\x00\x00\x00%s" "$json" > "$out/corpus_safetensors/$2"; }
seed '{"__metadata__":{"format":"pt"},"w":{"dtype":"F32","shape":[3,4],"data_offsets":[0,48]}}' meta
seed '{"a":{"dtype":"BF16","shape":[2,2],"data_offsets":[0,8]},"b":{"dtype":"I64","shape":[],"data_offsets":[8,16]}}' two
"$out/safetensors_header_fuzzer" -runs="$runs" -max_len=512 -print_final_stats=1 "$out/corpus_safetensors" 2>&1 | tail -12
