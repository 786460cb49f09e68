// SPDX-License-Identifier: Apache-2.0
#pragma once
/// `hierarchical_topology<Intra, Inter>`: reduce inside each node, allreduce across the
/// nodes' leaders, broadcast inside each node.

#include <squall/core/error.hpp>
#include <squall/topology/direct.hpp>
#include <squall/topology/ring.hpp>
#include <squall/topology/schedule.hpp>

#include <cstddef>  // size_t
#include <string>
#include <string_view>
#include <vector>

namespace squall {

/// Two levels: `Intra` reduces to each node's leader (its lowest rank) and broadcasts back,
/// `Inter` runs the allreduce among the leaders. Most bytes then stay inside a node; only
/// one rank per node crosses the slow link. `node_of[r]` is the node of rank r; the
/// communicator fills it at construction (from `SQUALL_RANKS_PER_NODE`, else the host names)
/// when it is empty, so two or more "nodes" can be tested on one host.
template <class Intra = direct_topology, class Inter = ring_topology>
struct hierarchical_topology {
  static constexpr std::string_view name = "hierarchical";

  std::vector<int> node_of{};
  Intra intra{};
  Inter inter{};

  // step 0: Intra's reduce to the local leader; step 1: Inter's allreduce among leaders;
  // step 2: Intra's broadcast from the leader. Each a phase of its own.
  schedule allreduce_schedule(int rank, int size, std::size_t bytes) const {
    if (node_of.size() != static_cast<std::size_t>(size)) {
      throw invalid_argument({.operation = "hierarchical_topology", .rank = rank},
                             "node_of has " + std::to_string(node_of.size()) + " entries for " +
                                 std::to_string(size) + " ranks");
    }
    std::vector<int> members;  // the ranks of this rank's node, ascending
    std::vector<int> leaders;  // the lowest rank of every node, ascending
    int local = 0;
    int node_index = 0;
    for (int q = 0; q < size; ++q) {
      const int node = node_of[static_cast<std::size_t>(q)];
      if (node == node_of[static_cast<std::size_t>(rank)]) {
        if (q == rank) local = static_cast<int>(members.size());
        members.push_back(q);
      }
      bool first = true;
      for (int e = 0; e < q && first; ++e) first = node_of[static_cast<std::size_t>(e)] != node;
      if (first) {
        if (node == node_of[static_cast<std::size_t>(rank)])
          node_index = static_cast<int>(leaders.size());
        leaders.push_back(q);
      }
    }
    const int width = static_cast<int>(members.size());
    schedule s{.name = name};
    detail::append_mapped(s.steps, intra.reduce_schedule(local, width, 0).steps, members);
    if (local == 0 && leaders.size() > 1) {
      const std::size_t at = s.steps.size();
      detail::append_mapped(
          s.steps,
          inter.allreduce_schedule(node_index, static_cast<int>(leaders.size()), bytes).steps,
          leaders);
      if (at < s.steps.size()) s.steps[at].new_phase = true;
    }
    const std::size_t at = s.steps.size();
    detail::append_mapped(s.steps, intra.broadcast_schedule(local, width, 0).steps, members);
    if (at < s.steps.size()) s.steps[at].new_phase = true;
    return s;
  }
};

}  // namespace squall
