#!/usr/bin/env bash
# save/load of a 1 GiB float tensor on 2 ranks, .npy and HDF5, against plain
# MPI_File_write_at_all / read_at_all of the same bytes (bench/io_bench.cpp). Goal: ratio <= 1.2.
#   bash bench/run_io.sh [--n 16384] [--reps 5] [--dir /tmp]
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/prepare.sh
bench_build "libhdf5-openmpi-dev" tshard_bench_io
mpirun -np 2 "$bench_dir"/bench/tshard_bench_io "$@"
