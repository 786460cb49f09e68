// SPDX-License-Identifier: Apache-2.0
#pragma once
// Topologies as every collective test gives them to a communicator (threads, shm processes,
// MPI ranks): hierarchical ones with 2 ranks per node (threads and processes of one host share
// its name), automatic with a fixed measured model (tree small, direct middle, ring large, as
// shared memory once measured), so that a test's sizes reach several of its schedules and no
// test depends on timing.

#include <squall/algorithm/communicator.hpp>

#include <cstddef>

namespace squall::test {

template <class Topology>
Topology make_topology(int size) {
  Topology t{};
  if constexpr (squall::detail::has_node_map<Topology>) {
    for (int q = 0; q < size; ++q) t.node_of.push_back(q / 2);
  }
  if constexpr (squall::detail::has_cost_model<Topology>) {
    auto& m = t.model.measured;
    m[0] = {{64, 9e-6}, {4096, 10e-6}, {1 << 20, 1.0e-3}};
    m[1] = {{64, 2e-6}, {4096, 12e-6}, {1 << 20, 4.0e-3}};
    m[2] = {{64, 3e-6}, {4096, 5e-6}, {1 << 20, 2.0e-3}};
    m[3] = {{64, 8e-6}, {4096, 11e-6}, {1 << 20, 1.5e-3}};
    t.model.ranks = size;
  }
  return t;
}

}  // namespace squall::test
