// SPDX-License-Identifier: Apache-2.0
// Every compressor's compressed communicator over MPI (compressed.hpp).
#include <squall/transport/mpi.hpp>

#include "compressed.hpp"

namespace squall::python {

std::unique_ptr<compressed_base> compressed_over_mpi(const compressor_choice& choice) {
  return compressed_over<mpi_transport>(choice, [] { return mpi_transport(MPI_COMM_WORLD); });
}

}  // namespace squall::python
