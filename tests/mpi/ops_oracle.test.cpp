// SPDX-License-Identifier: Apache-2.0
// Oracle test of the host kernels: every rank gathers every rank's input, reduces the P
// inputs serially with squall's kernels, and compares with MPI_Allreduce of the same data.
// Runs under mpiexec with 1 to 4 ranks (label collective).

#include <squall/kernels/host/reduce.hpp>

#include <doctest/doctest.h>
#include <mpi.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "../support/data.hpp"
#include "../support/mpi_types.hpp"

namespace {

using squall::test::mpi_op;
using squall::test::mpi_type;

template <class T, class Op>
void check_against_mpi(std::size_t count) {
  int rank = 0;
  int size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  const auto mine = squall::test::random_values<T>(count, 1000 * count + rank);

  std::vector<T> expected(count);
  MPI_Allreduce(mine.data(), expected.data(), static_cast<int>(count), mpi_type<T>(), mpi_op<Op>(),
                MPI_COMM_WORLD);

  std::vector<T> all(count * size);
  MPI_Allgather(mine.data(), static_cast<int>(count), mpi_type<T>(), all.data(),
                static_cast<int>(count), mpi_type<T>(), MPI_COMM_WORLD);
  std::vector<T> got(all.begin(), all.begin() + count);
  for (int r = 1; r < size; ++r) {
    squall::kernels::reduce_into(squall::host_backend{}, Op{}, squall::host_view<T>(got),
                                 squall::host_view<const T>(all.data() + r * count, count));
  }
  squall::kernels::finalize(squall::host_backend{}, Op{}, squall::host_view<T>(got), size);

  for (std::size_t i = 0; i < count; ++i) {
    if constexpr (std::is_floating_point_v<T> && std::is_same_v<Op, squall::sum_op>) {
      // Reassociation bound: (P - 1) eps sum |x_r|.
      double magnitude = 0;
      for (int r = 0; r < size; ++r)
        magnitude += std::fabs(static_cast<double>(all[r * count + i]));
      const double bound = (size - 1) * std::numeric_limits<T>::epsilon() * magnitude;
      REQUIRE(std::fabs(static_cast<double>(got[i]) - static_cast<double>(expected[i])) <= bound);
    } else {
      REQUIRE(got[i] == expected[i]);
    }
  }
}

}  // namespace

TEST_SUITE("mpi_oracle") {
  TEST_CASE_TEMPLATE("host kernels reduce as MPI_Allreduce does", T, float, double, std::int32_t,
                     std::int64_t) {
    for (const std::size_t count :
         {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{100003}}) {
      CAPTURE(count);
      check_against_mpi<T, squall::sum_op>(count);
      check_against_mpi<T, squall::min_op>(count);
      check_against_mpi<T, squall::max_op>(count);
    }
  }
}
