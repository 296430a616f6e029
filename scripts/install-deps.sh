#!/usr/bin/env bash
# Installs the Debian packages tshard's build, tests and demo need, only where missing.
set -euo pipefail
# BLIS: the local products' BLAS where found (docs/performance.md); OpenBLAS beside it, which
# ScaLAPACK and the benchmarks' comparisons use.
packages=(cmake g++ make libeigen3-dev libboost-mpi-dev libopenmpi-dev openmpi-bin catch2 ccache libblis-dev
          libopenblas-dev libhdf5-openmpi-dev libpcre2-dev python3-numpy python3-h5py iproute2 procps
          libscalapack-openmpi-dev)  # ScaLAPACK: the matmul benchmark's baseline, built and run tiny in the suite
# --simulation (the suite): SimGrid's SMPI as well, for the simulation build's part (docs/simulation.md).
if [[ ${1:-} == --simulation ]]; then packages+=(libsimgrid-dev); fi
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
echo "installing: ${missing[*]}"
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
