// SPDX-License-Identifier: Apache-2.0
// squall-bench's compressed runners over the halving-doubling, hierarchical and automatic
// topologies.
#include "compressed_runners.hpp"

SQUALL_BENCH_COMPRESSED_FOR(squall::halving_doubling_topology)
SQUALL_BENCH_COMPRESSED_FOR(squall::hierarchical_topology<>)
SQUALL_BENCH_COMPRESSED_FOR(squall::automatic_topology)
