// SPDX-License-Identifier: Apache-2.0
// squall-bench's compressed runners over the shared-memory transport, every topology.
#include "compressed_runners.hpp"

SQUALL_BENCH_COMPRESSED_OVER(squall::shm_transport)
