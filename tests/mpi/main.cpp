// SPDX-License-Identifier: Apache-2.0
// doctest main for tests run under mpiexec: MPI is initialised around the run, and only rank
// 0 prints doctest's report unless a rank fails (a failing rank reports for itself).

#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>
#include <mpi.h>

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  doctest::Context context(argc, argv);
  if (rank != 0) context.setOption("minimal", true);
  const int failed = context.run();
  int any_failed = 0;
  MPI_Allreduce(&failed, &any_failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return any_failed != 0 ? 1 : 0;
}
