// SPDX-License-Identifier: Apache-2.0
// Must not compile: a compressor that says its payloads add (aggregation::linear) but
// does not say where the summable body lies (no linear_body), paired with a topology that
// would add them. The diagnostic names both policies.
#include <squall/algorithm/communicator.hpp>
#include <squall/transport/inproc.hpp>

#include <string_view>
#include <utility>
#include <vector>

struct summable_but_opaque : squall::identity_compressor {
  static constexpr std::string_view name = "summable_but_opaque";
};

void run(squall::inproc_transport t) {
  squall::communicator<squall::inproc_transport, squall::ring_topology, summable_but_opaque> comm(
      std::move(t), {}, summable_but_opaque{});
  auto state = comm.make_state<float>(4);
  std::vector<float> data(4);
  comm.allreduce(squall::host_view<float>(data), state);
}
