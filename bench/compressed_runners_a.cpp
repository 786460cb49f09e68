// SPDX-License-Identifier: Apache-2.0
// squall-bench's compressed runners over the ring, tree and direct topologies.
#include "compressed_runners.hpp"

SQUALL_BENCH_COMPRESSED_FOR(squall::ring_topology)
SQUALL_BENCH_COMPRESSED_FOR(squall::tree_topology)
SQUALL_BENCH_COMPRESSED_FOR(squall::direct_topology)
