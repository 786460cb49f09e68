// SPDX-License-Identifier: Apache-2.0
// What to do after a squall error on MPI (issue 15, item 11): end the job with MPI_Abort.
//
// The last rank skips the allreduce the others make (a bug a real program might have), so
// the others time out after 2 s with `timeout_error` naming the peer they waited on. They
// then call MPI_Abort, and mpiexec exits non-zero within a second. Without it this program
// exits 0 (checked by hand: the error is only a line on stderr, and a scheduler sees a
// success), and where large sends are still posted, MPI_Finalize may wait forever for
// receives no peer will post. Run: mpiexec -n 3 ./squall-mpi-error
#include <squall/algorithm/communicator.hpp>
#include <squall/transport/mpi.hpp>

#include <mpi.h>

#include <chrono>
#include <cstdio>
#include <vector>

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0;
  int size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  using namespace std::chrono_literals;
  squall::communicator<squall::mpi_transport> comm(
      squall::mpi_transport(MPI_COMM_WORLD, {.deadline = 2s}));
  std::vector<float> gradient(1 << 20, 1.0f);
  if (rank != size - 1 || size == 1) {
    try {
      comm.allreduce(squall::host_view<float>(gradient));
      std::printf("rank %d: allreduce done\n", rank);
    } catch (const squall::error& e) {
      std::fprintf(stderr, "rank %d: %s\n", rank, e.what());
      std::fflush(stderr);
      MPI_Abort(MPI_COMM_WORLD, 1);  // not MPI_Finalize: the peers may never answer
    }
  }
  MPI_Barrier(MPI_COMM_WORLD);  // the skipping rank waits here until the abort ends it
  MPI_Finalize();
  return 0;
}
