#!/usr/bin/env bash
# Builds everything and runs the whole test suite (1, 2, 3, 4 and 6 ranks): bash scripts/test.sh
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
source scripts/env.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DTSHARD_BUILD_TESTS=ON -DTSHARD_BUILD_EXAMPLES=ON > /dev/null
cmake --build build -j "$jobs"
cd build
ctest -j "$jobs" --output-on-failure --timeout 300
