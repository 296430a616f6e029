#!/usr/bin/env bash
# Builds everything and runs the whole test suite (1, 2, 3, 4 and 6 ranks, then the simulation
# build's part on up to 64 simulated ranks): bash scripts/test.sh
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh --simulation
source scripts/env.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DTSHARD_BUILD_TESTS=ON -DTSHARD_BUILD_EXAMPLES=ON > /dev/null
cmake --build build -j "$jobs"
(cd build && ctest -j "$jobs" --output-on-failure --timeout 300)
# The simulation build's part (docs/simulation.md): the reshard, halo, operator and product tests
# and the GPT on up to 64 ranks simulated by SimGrid's SMPI, against one rank.
cmake -S . -B build-sim -DCMAKE_BUILD_TYPE=Release -DTSHARD_SIMULATE=ON -DTSHARD_BUILD_TESTS=ON \
  -DTSHARD_BUILD_EXAMPLES=ON > /dev/null
cmake --build build-sim -j "$jobs" --target tshard_platforms tshard_calibrate_host tshard_tests train_transformer
cd build-sim
ctest -j "$jobs" --output-on-failure --timeout 600 -R '^simulated'
