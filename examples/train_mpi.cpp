// SPDX-License-Identifier: Apache-2.0
// train_fashion_mnist's runs on the ranks mpiexec started, over the MPI transport (built where
// MPI is).
#include <squall/transport/mpi.hpp>

#include "fashion_mnist/train.hpp"

namespace fashion_mnist {

int train_over_mpi(const settings& s, const dataset& data, std::size_t train_count,
                   std::size_t test_count) {
  int status = 0;
  for (const auto& choice : s.compressors) {
    int rank = 0, size = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    const auto make = [](std::string_view) { return squall::mpi_transport(MPI_COMM_WORLD); };
    const rank_of_job<squall::mpi_transport, decltype(make)> me{rank, size, make};
    const int code = squall::visit_compressor(choice, [&](auto c) {
      return train(me, std::move(c), choice, s, data, train_count, test_count);
    });
    if (code != 0) status = code;  // the same on every rank: decided from allreduced values
  }
  return status;
}

}  // namespace fashion_mnist
