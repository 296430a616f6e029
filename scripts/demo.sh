#!/usr/bin/env bash
# Builds and runs the main demo under mpirun: bash scripts/demo.sh [ranks] [--rows N --cols N]
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
source scripts/env.sh
ranks="${1:-4}"
shift || true
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DTSHARD_BUILD_TESTS=OFF -DTSHARD_BUILD_EXAMPLES=ON > /dev/null
cmake --build build --target reshard_tour -j "$jobs"
mpirun -np "$ranks" --oversubscribe --allow-run-as-root ./build/examples/reshard_tour "$@"
