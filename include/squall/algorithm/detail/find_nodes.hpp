// SPDX-License-Identifier: Apache-2.0
#pragma once
/// Node discovery for `hierarchical_topology`: which ranks share a node.

#include <squall/core/error.hpp>

#include <array>
#include <cstddef>
#include <cstdlib>  // getenv, strtol
#include <string>
#include <unistd.h>  // gethostname
#include <vector>

namespace squall {

/// The environment variable that sets how many consecutive ranks form one node for
/// `hierarchical_topology` (so that "nodes" can be tested on one host).
inline constexpr const char* ranks_per_node_env_var = "SQUALL_RANKS_PER_NODE";

namespace detail {

/// The node of every rank, a collective call: SQUALL_RANKS_PER_NODE consecutive ranks per
/// node if set, else ranks with the same host name share a node (numbered by their first
/// rank). `exchange(mine, bytes, all)` gives every rank every rank's `bytes` at `mine`.
template <class Exchange>
std::vector<int> find_nodes(int rank, int size, Exchange&& exchange) {
  std::vector<int> node_of(static_cast<std::size_t>(size));
  if (const char* text = std::getenv(ranks_per_node_env_var); text != nullptr && *text) {
    char* end = nullptr;
    const long per = std::strtol(text, &end, 10);
    if (*end != '\0' || per <= 0) {
      throw invalid_argument(
          {.operation = "hierarchical_topology", .rank = rank},
          std::string(ranks_per_node_env_var) + "='" + text + "' is not a positive whole number");
    }
    for (int q = 0; q < size; ++q) node_of[static_cast<std::size_t>(q)] = q / static_cast<int>(per);
    return node_of;
  }
  std::array<char, 256> host{};
  gethostname(host.data(), host.size() - 1);
  std::vector<std::array<char, 256>> hosts(static_cast<std::size_t>(size));
  exchange(host.data(), host.size(), hosts.data());
  for (int q = 0; q < size; ++q) {
    int first = q;
    for (int e = 0; e < q; ++e) {
      if (hosts[static_cast<std::size_t>(e)] == hosts[static_cast<std::size_t>(q)]) {
        first = e;
        break;
      }
    }
    node_of[static_cast<std::size_t>(q)] = first;
  }
  return node_of;
}

}  // namespace detail
}  // namespace squall
