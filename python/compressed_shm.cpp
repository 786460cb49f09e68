// SPDX-License-Identifier: Apache-2.0
// Every compressor's compressed communicator over shared memory (compressed.hpp).
#include "compressed.hpp"

namespace squall::python {

std::unique_ptr<compressed_base> compressed_over_shm(const compressor_choice& choice,
                                                     const shm_job& job) {
  return compressed_over<shm_transport>(choice, [&] { return shm_transport(job); });
}

}  // namespace squall::python
