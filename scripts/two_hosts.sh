#!/usr/bin/env bash
# Runs the operator tests with the MPI ranks split over two "hosts": two network namespaces joined
# by a veth pair, each with its own hostname, OpenMPI over TCP only (no shared memory anywhere).
#   bash scripts/two_hosts.sh [TEST_BINARY [CATCH_TEST_SPEC...]]
# Defaults: build/tests/tshard_tests, the operator tests (reshard, ops, halo, products), 4 ranks
# (TSHARD_TWO_HOSTS_RANKS), placed round-robin: even ranks on host a, odd ranks on host b.
# File names are tags too ([#test_reshard]). Over the veth pair on 2 busy cores: 2.5-3 min.
# Needs root (CAP_NET_ADMIN, CAP_SYS_ADMIN); exits 77 (skip) where namespaces cannot be made.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bin=${1:-$root/build/tests/tshard_tests}
if (($# > 0)); then shift; fi
spec=("$@")
# Default: the operator tests, less the HaloExchange's 1000 exchanges (a test of allocations: ~12 s of
# latency here).
((${#spec[@]})) || spec=('[#test_reshard],[ops],[halo]~*1000 exchanges*,[#test_products]')
np=${TSHARD_TWO_HOSTS_RANKS:-4}
limit=${TSHARD_TWO_HOSTS_TIMEOUT:-270}   # seconds before mpirun ends the test run
ns_a=tshard_2h_a ns_b=tshard_2h_b        # namespaces; the veth ends carry the same names
host_a=tshard-host-a host_b=tshard-host-b
addr_a=10.77.0.1 addr_b=10.77.0.2 subnet=10.77.0.0/24

skip() { echo "two_hosts: SKIP: $*" >&2; exit 77; }
[[ -x $bin ]] || { echo "two_hosts: no test binary at $bin" >&2; exit 1; }
for tool in ip unshare mpirun; do
  command -v "$tool" > /dev/null || skip "'$tool' is not installed"
done

# One run at a time: the namespace names are fixed so that a later run can remove leftovers.
exec 9< "${BASH_SOURCE[0]}"
if command -v flock > /dev/null; then flock -w 600 9; fi

tmp=$(mktemp -d "${TMPDIR:-/tmp}/tshard_two_hosts.XXXXXX")
remove_namespaces() {
  local ns pids
  for ns in "$ns_a" "$ns_b"; do
    pids=$(ip netns pids "$ns" 2> /dev/null || true)   # daemons or ranks left by a killed run
    if [[ -n $pids ]]; then kill -9 $pids 2> /dev/null || true; fi
    ip netns del "$ns" 2> /dev/null || true
  done
}
cleanup() { remove_namespaces; rm -rf "$tmp"; }
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

remove_namespaces
((EUID == 0)) || echo "two_hosts: not root; trying anyway (needs CAP_NET_ADMIN and CAP_SYS_ADMIN)" >&2
ip netns add "$ns_a" 2> "$tmp/err" || skip "cannot create a network namespace: $(< "$tmp/err")"
ip netns add "$ns_b" 2> "$tmp/err" || skip "cannot create a network namespace: $(< "$tmp/err")"
ip link add "$ns_a" netns "$ns_a" type veth peer name "$ns_b" netns "$ns_b" 2> "$tmp/err" ||
  skip "cannot create a veth pair between the namespaces: $(< "$tmp/err")"
ip -n "$ns_a" addr add "$addr_a/24" dev "$ns_a"
ip -n "$ns_b" addr add "$addr_b/24" dev "$ns_b"
for ns in "$ns_a" "$ns_b"; do
  ip -n "$ns" link set lo up
  ip -n "$ns" link set "$ns" up
done

# A hostname of its own per host (a UTS namespace), so that OpenMPI sees two nodes by name too.
uts=""
if unshare --uts true 2> /dev/null; then uts="unshare --uts"; else
  echo "two_hosts: no UTS namespace here; both hosts keep the machine's hostname" >&2
fi

# rsh-style agent: mpirun calls `agent HOST COMMAND...` to start its daemon on HOST.
cat > "$tmp/rsh_agent" << EOF
#!/bin/sh
host=\$1; shift
case \$host in
  $addr_a) ns=$ns_a name=$host_a ;;
  $addr_b) ns=$ns_b name=$host_b ;;
  *) echo "rsh agent: unknown host \$host" >&2; exit 1 ;;
esac
if [ -n "$uts" ]; then exec ip netns exec "\$ns" $uts sh -c "hostname \$name && \$*"; fi
exec ip netns exec "\$ns" sh -c "\$*"
EOF
chmod +x "$tmp/rsh_agent"
# One slot per host: two slots for the two cores, so --oversubscribe makes idle ranks yield.
printf '%s slots=1\n' "$addr_a" "$addr_b" > "$tmp/hosts"

source "$root/scripts/env.sh"
export TSHARD_TEST_WATCHDOG=${TSHARD_TEST_WATCHDOG:-$limit} SHELL=/bin/sh
mpi=(mpirun --allow-run-as-root --oversubscribe -np "$np" --hostfile "$tmp/hosts" --map-by node
     --timeout "$limit" --mca plm_rsh_agent "$tmp/rsh_agent" --mca plm_rsh_no_tree_spawn 1
     --mca routed direct --mca pml ob1 --mca btl self,tcp --mca coll ^sm
     --mca btl_tcp_if_include "$subnet" --mca oob_tcp_if_include "$subnet"
     -x OPENBLAS_NUM_THREADS -x OMP_NUM_THREADS -x TSHARD_TEST_WATCHDOG -x TSHARD_TEST_NODES=2)
# mpirun itself runs in namespace a, as host a (without the lock's descriptor: a daemon left
# behind must not hold the next run's lock).
in_a() {
  if [[ -n $uts ]]; then ip netns exec "$ns_a" $uts sh -c 'hostname "$0" && exec "$@"' "$host_a" "$@"
  else ip netns exec "$ns_a" "$@"; fi
} 9<&-

echo "== where the $np ranks run (hostname, network namespace, address)"
where='echo "rank $OMPI_COMM_WORLD_RANK: host $(hostname), netns $(ip netns identify), address $(ip -4 -o addr |
  grep -o "10\.77\.0\.[0-9]*" | head -n 1), node rank $OMPI_COMM_WORLD_LOCAL_RANK of $OMPI_COMM_WORLD_LOCAL_SIZE"'
in_a "${mpi[@]}" sh -c "$where" |
  sort -n -k2 | tee "$tmp/placement"
for ns in "$ns_a" "$ns_b"; do
  grep -q "netns $ns," "$tmp/placement" || { echo "two_hosts: no rank ran in namespace $ns" >&2; exit 1; }
done
[[ $(grep -c '^rank ' "$tmp/placement") == "$np" ]] || { echo "two_hosts: not every rank reported" >&2; exit 1; }

echo "== $(basename "$bin") ${spec[*]} on $np ranks over TCP between $ns_a and $ns_b"
in_a "${mpi[@]}" "$bin" --filenames-as-tags "${spec[@]}" &   # in the background: a signal ends
wait $!                                                       # the run at once, through cleanup
