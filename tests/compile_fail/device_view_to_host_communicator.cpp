// SPDX-License-Identifier: Apache-2.0
// Must not compile: device memory handed to a communicator whose backend is the host (issue
// 21, item 4). The collectives take the backend's memory space in their views' type.
#include <squall/algorithm/communicator.hpp>
#include <squall/topology/ring.hpp>
#include <squall/transport/inproc.hpp>

void f(squall::communicator<squall::inproc_transport, squall::ring_topology>& comm,
       squall::device_view<float> grad) {
  comm.allreduce(grad);
}
