// SPDX-License-Identifier: Apache-2.0
// squall-bench's compressed runners over the MPI transport, every topology (built where MPI is).
#include "compressed_runners.hpp"

#if SQUALL_BENCH_WITH_MPI
SQUALL_BENCH_COMPRESSED_OVER(squall::mpi_transport)
#endif
