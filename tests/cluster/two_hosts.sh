#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# ctest cluster.two_hosts: scripts/cluster.sh end to end (issue 16). Brings up 2 emulated hosts
# on 200 Mbit/s links, checks that every rank runs on its own host name and that both ends of
# every link are shaped, runs squall-bench over MPI across the hosts (2 ranks per host: every
# topology, hierarchical with shared memory inside a host and the two hosts found by name,
# each result checked, beside MPI_Allreduce; the bench exits non-zero on a wrong result),
# then tears the hosts down and
# checks that nothing stays behind: also after an interrupted run and after an `up` that fails
# half way. Exit 77 (skipped) where it is not root, or namespaces or Open MPI are missing.
#   two_hosts.sh SQUALL_BENCH
set -uo pipefail
bench=$1
here=$(cd "$(dirname "$0")/../.." && pwd)
cluster=$here/scripts/cluster.sh
export SQUALL_CLUSTER=sqct SQUALL_CLUSTER_SUBNET=10.213.7

skip() {
  echo "skipped: $*"
  exit 77
}
[ "$(id -u)" = 0 ] || skip "needs root (network namespaces, tc)"
command -v mpirun.openmpi >/dev/null || skip "needs Open MPI's mpirun.openmpi"
ip netns add sqct-probe 2>/dev/null || skip "cannot create a network namespace here"
ip netns delete sqct-probe

fail() {
  echo "FAILED: $*" >&2
  "$cluster" down
  exit 1
}
trap '"$cluster" down' EXIT

# nothing of this cluster exists: namespaces, name files, state
left_behind() {
  local what=""
  what+=$(ip netns list | grep -E '^sqct-' || true)
  what+=$(ls -d /etc/netns/sqct-* 2>/dev/null || true)
  what+=$(ls -d /run/squall-cluster/sqct 2>/dev/null || true)
  what+=$(pgrep -f 'sleep 31\.5' || true)
  echo "$what"
}

"$cluster" up -n 2 --rate 200mbit || fail "up"
# every rank on its own host, by name
names=$("$cluster" run -n 2 hostname | sort | tr '\n' ' ')
[ "$names" = "sqct-h0 sqct-h1 " ] || fail "ranks ran on '$names', want 'sqct-h0 sqct-h1'"
# both directions of every link shaped: the host's eth0 and the switch's port
for i in 0 1; do
  ip netns exec "sqct-h$i" tc qdisc show dev eth0 | grep -q 'tbf .*rate 200Mbit' ||
    fail "host $i sends unshaped"
  ip netns exec sqct-sw tc qdisc show dev "p$i" | grep -q 'tbf .*rate 200Mbit' ||
    fail "host $i receives unshaped"
done
# squall across the hosts, every topology, 2 ranks per host; messages between the hosts travel
# in 32 KiB pieces (mpi_transport's network pieces), within a host whole; hierarchical's node
# discovery finds the two hosts by name: ranks 0, 1 on host 0 and 2, 3 on host 1
out=$("$cluster" run -n 4 --per-host 2 "$bench" --transport mpi -b 1K -e 512K -f 8 --iters 3 \
  --warmup 1) || fail "squall-bench across the hosts: $out"
echo "$out"
echo "$out" | grep -q '^# hierarchical: 2 nodes, node of each rank: 0 0 2 2$' ||
  fail "node discovery did not find the two hosts"
# an interrupted run leaves no process once the cluster is down
"$cluster" run -n 2 sleep 31.5 &
runner=$!
sleep 2
kill -INT "$runner" 2>/dev/null
wait "$runner" 2>/dev/null
"$cluster" down || fail "down"
left=$(left_behind)
[ -z "$left" ] || fail "down left behind: $left"

# refusals leave nothing: a bad rate, a bad host count
"$cluster" up -n 2 --rate 1gbps 2>/dev/null && fail "up accepted the rate 1gbps"
"$cluster" up -n 0 2>/dev/null && fail "up accepted 0 hosts"
left=$(left_behind)
[ -z "$left" ] || fail "a refused up left behind: $left"
# an up that fails half way (host 1's namespace is taken) removes what it made
ip netns add sqct-h1
"$cluster" up -n 3 2>/dev/null && fail "up succeeded over a taken namespace"
left=$(left_behind)
[ -z "$left" ] || fail "a failed up left behind: $left"
echo "cluster.two_hosts: passed"
