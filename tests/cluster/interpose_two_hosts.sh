#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# ctest collective.mpi_interpose_cluster: libsquall_mpi.so across 2 emulated hosts
# (scripts/cluster.sh: network namespaces, Open MPI's TCP between them), 2 ranks per host. The
# interposer finds the hosts itself (MPI_COMM_TYPE_SHARED, no SQUALL_RANKS_PER_NODE) and runs
# each allreduce, reduce_scatter_block, allgather and (SQUALL_MPI_COLLECTIVES=all) broadcast in
# tiers: shared memory inside a host, MPI across (the non-blocking forms too: the suite asks
# MPI_THREAD_MULTIPLE). The interposer suite checks every call
# against PMPI_* in the same run and that those on MPI_COMM_WORLD ran in tiers
# (SQUALL_TEST_NODE_WIDTH=2). Exit 77 (skipped) where not root or without namespaces.
#   interpose_two_hosts.sh SQUALL_INTERPOSE_TESTS
set -uo pipefail
tests=$1
cluster=$(cd "$(dirname "$0")/../.." && pwd)/scripts/cluster.sh
export SQUALL_CLUSTER=sqci SQUALL_CLUSTER_SUBNET=10.213.8

[ "$(id -u)" = 0 ] || { echo "skipped: needs root"; exit 77; }
ip netns add sqci-probe 2>/dev/null || { echo "skipped: no network namespaces here"; exit 77; }
ip netns delete sqci-probe
trap '"$cluster" down' EXIT

"$cluster" up -n 2 --rate 10gbit || exit 1
"$cluster" run -n 4 --per-host 2 env SQUALL_MPI_MIN_BYTES=4096 SQUALL_TEST_NODE_WIDTH=2 \
  SQUALL_MPI_COLLECTIVES=all SQUALL_TEST_THREAD_MULTIPLE=1 SQUALL_MPI_VERBOSE=1 "$tests" || { echo "FAILED: the interposer suite across the hosts" >&2; exit 1; }
echo "collective.mpi_interpose_cluster: passed"
