#!/usr/bin/env bash
# Runs one program of the simulation build (cmake -DTSHARD_SIMULATE=ON) on simulated ranks of a
# simulated machine, with SimGrid's SMPI: every rank's computation runs here for real, timed and
# scaled to the platform's cores; messages are timed by SMPI's flow model of the platform
# (simulation/platforms.cpp: vm, xeon-node, xeon-cluster, xeon-ethernet; docs/simulation.md).
#   bash scripts/simulate.sh [--platform xeon-cluster] [--nodes N] [-np P] [--collectives ompi] [--timing]
#       [--cfg smpi/allreduce:lr ...] PROGRAM [ARGS...]
#   bash scripts/simulate.sh --platform xeon-cluster --nodes 128 -np 2048 \
#       build-sim/examples/train_transformer --mesh data=128,model=16 --check --double
# Ranks are placed node by node (rank r on node r / cores), so MPI_Comm_split_type and the
# two-level collectives see the nodes. --nodes defaults to the fewest that hold P ranks. Every
# argument after PROGRAM goes to it unchanged. Prints the simulated time and the wall time last.
# --collectives picks SMPI's collective algorithms: default (SMPI's own, with Open MPI's
# all-gather), or ompi / mpich (those libraries' selections), which in SimGrid 3.32 sum wrongly
# in tshard's partial-sum resolutions. (SMPI's own all-gather posts a message to every rank at
# once, which costs the simulator the square of the requests: one 8 KB all-reduce benchmark on
# 256 ranks took over 10 minutes of wall time, against 2.4 s with Open MPI's.)
# --cfg NAME:VALUE goes to smpirun as --cfg=NAME:VALUE (one collective's algorithm, say); it
# comes after the defaults set here, and overrides them.
# An MPI_Test costs 0.1 us of simulated time (Open MPI's MPI_Testall of 1-30 pending requests took
# 0.02-0.07 us on this machine), not SMPI's default 100 us growing by 100 us with every test that
# finds nothing, which the overlapped reductions' tests between kernels paid many times a step.
# --timing: timing mode (core/simulated_timing.hpp), for thousands of ranks: rank 0 runs for real;
# the other ranks share their floating-point tensors of 64 KiB and more, and put rank 0's latest
# times of their kernels on the simulated clock instead of running them; values are then
# meaningless (and --check refuses to run).
set -euo pipefail
platform=xeon-node nodes="" np="" collectives=default timing="" cfg=()
while (($#)); do
  case $1 in
    --platform) platform=$2; shift 2 ;;
    --nodes) nodes=$2; shift 2 ;;
    -np | -n) np=$2; shift 2 ;;
    --collectives) collectives=$2; shift 2 ;;
    --timing) timing=1; shift ;;
    --cfg) cfg+=("--cfg=$2"); shift 2 ;;
    -h | --help) sed -n '2,26p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "simulate.sh: unknown option $1 (before the program: --platform, --nodes, -np, --collectives, --cfg, --timing)" >&2; exit 2 ;;
    *) break ;;
  esac
done
(($#)) || { echo "simulate.sh: no program given (bash scripts/simulate.sh --help)" >&2; exit 2; }
program=$(readlink -f "$1") || true
shift
[[ -n $program && -f $program ]] || { echo "simulate.sh: no such program" >&2; exit 2; }
command -v smpirun > /dev/null || { echo "simulate.sh: smpirun not found (apt-get install libsimgrid-dev)" >&2; exit 2; }
# The build tree the program belongs to: its platforms and its host calibration.
build=$(dirname "$program")
while [[ $build != / && ! -f $build/CMakeCache.txt ]]; do build=$(dirname "$build"); done
grep -q '^TSHARD_SIMULATE:BOOL=ON' "$build/CMakeCache.txt" 2> /dev/null ||
  { echo "simulate.sh: $program is not from a simulation build (cmake -DTSHARD_SIMULATE=ON)" >&2; exit 2; }
platforms=$build/simulation/libtshard_platforms.so
[[ -f $platforms ]] || { echo "simulate.sh: $platforms is not built (cmake --build $build --target tshard_platforms)" >&2; exit 2; }
case $platform in
  vm) cores=2 max_nodes=1 ;;
  xeon-node) cores=16 max_nodes=1 ;;
  xeon-cluster | xeon-ethernet) cores=16 max_nodes=256 ;;
  *) echo "simulate.sh: no platform '$platform': vm, xeon-node, xeon-cluster or xeon-ethernet" >&2; exit 2 ;;
esac
[[ -n $np ]] || np=$cores
[[ -n $nodes ]] || nodes=$(((np + cores - 1) / cores))
((nodes > 16)) && ((nodes % 16)) && nodes=$(((nodes + 15) / 16 * 16))
if ((nodes > max_nodes)); then
  echo "simulate.sh: $platform has $((max_nodes * cores)) cores ($max_nodes nodes of $cores), fewer than $np ranks" >&2
  exit 2
fi
if ((np > nodes * cores)); then
  echo "simulate.sh: $nodes nodes of $platform have $((nodes * cores)) cores, fewer than $np ranks" >&2
  exit 2
fi
# This machine's sgemm rate, measured once per build tree (simulation/calibrate_host.cpp).
hostfile=$(mktemp)
trap 'rm -f "$hostfile"' EXIT
calibration=$build/simulation/host_flops
if [[ ! -s $calibration ]]; then
  echo node-0:16 > "$hostfile"
  TSHARD_SIM_PLATFORM=xeon-node TSHARD_SIM_NODES=1 smpirun -np 1 -platform "$platforms" -hostfile "$hostfile" \
    --log=root.thres:warning "$build/simulation/tshard_calibrate_host" > "$calibration.new"
  mv "$calibration.new" "$calibration"
fi
host_flops=$(< "$calibration")
for ((i = 0; i < nodes; i++)); do echo "node-$i:$cores"; done > "$hostfile"
export TSHARD_SIM_PLATFORM=$platform TSHARD_SIM_NODES=$nodes TSHARD_SIM_HOST_FLOPS=$host_flops
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
if [[ -n $timing ]]; then
  export TSHARD_SIM_TIMING=1
  echo "timing mode: ranks but 0 share their tensors and take rank 0's kernel times (median of ${TSHARD_SIM_SAMPLES:-5} runs) instead of running: values are meaningless"
else
  unset TSHARD_SIM_TIMING
fi
allgather=()
[[ $collectives == default ]] && allgather=(--cfg=smpi/allgather:ompi)
log=$(mktemp)
trap 'rm -f "$hostfile" "$log"' EXIT
start=$(date +%s.%N)
status=0
# (SMPI's own report, its "Simulated time" line among them, goes to the log; its warnings and the
# program's stderr to stderr.)
smpirun -np "$np" -platform "$platforms" -hostfile "$hostfile" \
  --cfg=smpi/host-speed:"${host_flops}f" --cfg=smpi/coll-selector:"$collectives" "${allgather[@]}" \
  --cfg=smpi/test:1e-7 --cfg=smpi/grow-injected-times:no --cfg=smpi/display-timing:yes "${cfg[@]}" \
  --log=root.thres:warning --log=smpi_utils.thres:info \
  "$program" "$@" 2> >(tee "$log" | grep -v 'smpi_utils/INFO\|^The simulation took\|seconds were actual computation\|^You may want to use sampling\|^Generated unrolled hostfile\|^Execution failed\|^/.*--cfg=smpi/privatization' >&2) || status=$?
wait
# (smpirun exits 0 when the simulator finds the ranks deadlocked, and when a rank returns non-zero.)
if ((status == 0)) && grep -q 'Deadlock detected\|SMPI process did not return 0\|Execution failed' "$log"; then status=1; fi
wall=$(awk -v s="$start" -v e="$(date +%s.%N)" 'BEGIN { printf "%.1f", e - s }')
simulated=$(grep -oE 'Simulated time: [0-9.e+-]+' "$log" | grep -oE '[0-9.e+-]+$' || echo "?")
echo "simulated on $platform: $np ranks on $nodes nodes, simulated time $simulated s, wall time $wall s (host speed $host_flops flop/s)"
exit $status
