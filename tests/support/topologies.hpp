// SPDX-License-Identifier: Apache-2.0
#pragma once
// Topologies as the process tests give them to a communicator: hierarchical with 2 ranks per
// node, automatic calibrated on its ranks up to 64 KiB only (short).

#include <squall/algorithm/communicator.hpp>

#include <cstddef>

namespace squall::test {

template <class Topology>
Topology make_topology(int size) {
  Topology t{};
  if constexpr (squall::detail::has_node_map<Topology>) {
    for (int q = 0; q < size; ++q) t.node_of.push_back(q / 2);
  }
  if constexpr (squall::detail::has_cost_model<Topology>) t.calibrate_up_to = std::size_t{64} << 10;
  return t;
}

}  // namespace squall::test
