#!/usr/bin/env bash
# The multi-node path on the emulated cluster (scripts/cluster.sh): Open MPI
# launches on separate hosts (network and UTS namespaces, tcp between them),
# dpkit finds the nodes by MPI_COMM_TYPE_SHARED, and the hierarchical
# collectives, split and the fault tests run over real sockets at 2x2, 4x1
# and 3x2; allreduce_perf checks every algorithm's results (#wrong) at 2x2,
# launched by mpirun and, over Gloo, without it (cluster.sh launch).
# Exits 77 (skip) where network namespaces cannot be made (no root or no
# CAP_NET_ADMIN). Runs its own cluster (prefix dpt, 10.78.0.0/24, its own
# state directory), so a user's cluster may be up beside it.
#   cluster_test.sh <scripts/cluster.sh> <test_mpi_hierarchical> <allreduce_perf>
set -uo pipefail
CL=$1 HIER=$2 PERF=$3
export DPKIT_CLUSTER_DIR=/run/dpkit-cluster-test.$$ DPKIT_CLUSTER_PREFIX=dpt DPKIT_CLUSTER_NET=10.78.0
export ASAN_OPTIONS=detect_leaks=0
cleanup() { "$CL" down >/dev/null 2>&1 || true; }
trap cleanup EXIT
fail=0
up() {
  "$CL" up "$@"
  local rc=$?
  if [ $rc -eq 77 ]; then echo "cluster_test: SKIP (no network namespaces here)"; exit 77; fi
  [ $rc -eq 0 ] || { echo "cluster_test: cluster.sh up $* failed ($rc)"; exit 1; }
}
step() { # step <what> <command...>
  local what=$1
  shift
  echo "== $what"
  if ! timeout 600 "$@"; then echo "cluster_test: FAILED: $what"; fail=1; fi
}
up 2 --slots 2
step "2x2: hosts seen by Open MPI" bash -c "'$CL' run -np 4 hostname | sort | uniq -c | awk '{print} \$1 != 2 {bad=1} END {exit bad || NR != 2}'"
step "2x2: topology, split, hierarchical all-reduce and broadcast, faults" \
  env DPKIT_TEST_RANKS_PER_HOST=2 "$CL" run -np 4 "$HIER"
step "2x2: allreduce_perf -A all, results checked" \
  "$CL" run -np 4 "$PERF" -b 8 -e 16M -f 16 -A all -c 1 -n 2 -w 1
# without MPI: env:// variables, the tcp:// store on node 0, nodes found
# through the store; the table must say 2 hosts and hier, and #wrong 0
step "2x2 without mpirun (cluster.sh launch): allreduce_perf -A all over gloo, results checked" \
  bash -c "'$CL' launch -n 2 --port 29517 '$PERF' -b 8 -e 16M -f 16 -A all -c 1 -n 2 -w 1 > /tmp/cluster_launch.\$\$ &&
    grep -q '^# Algorithm: hier' /tmp/cluster_launch.\$\$ && grep -c 'on  *dpt-node1' /tmp/cluster_launch.\$\$ | grep -qx 2 &&
    ! grep -E '^ +[0-9]+ +[0-9]+ +float' /tmp/cluster_launch.\$\$ | awk '\$9 != 0 || \$13 != 0 {bad=1} END {exit !bad}';
    rc=\$?; cat /tmp/cluster_launch.\$\$; rm -f /tmp/cluster_launch.\$\$; exit \$rc"
cleanup
up 4 --slots 2
step "4x1: topology (one rank per host: the flat algorithms), split, faults" \
  env DPKIT_TEST_RANKS_PER_HOST=1 "$CL" run -np 4 --map-by node "$HIER"
step "3x2 (slots fill the first three hosts): topology, split, hierarchical all-reduce and broadcast, faults" \
  env DPKIT_TEST_RANKS_PER_HOST=2 "$CL" run -np 6 "$HIER"
exit $fail
