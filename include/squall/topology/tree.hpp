// SPDX-License-Identifier: Apache-2.0
#pragma once
/// `tree_topology`: pipelined binary tree, reduce up then broadcast down, for latency.

#include <squall/topology/schedule.hpp>

#include <cstddef>  // size_t
#include <string_view>

namespace squall {

/// A heap-ordered binary tree (children of v: 2v+1, 2v+2): 2 log2 P steps deep. The executor
/// pipelines each half in pieces of `chunk_bytes`: the pieces stream up to the root, then down.
struct tree_topology {
  static constexpr std::string_view name = "tree";
  /// Its allreduce schedule suits per-hop requantization (algorithm/detail/requantize.hpp).
  static constexpr bool per_hop_schedule = true;

  // up: reduce each child's partial, send to the parent; down: copy from the parent, send to
  // each child. Rooted at rank 0.
  schedule allreduce_schedule(int rank, int size, std::size_t /*bytes*/) const {
    schedule s{.name = name, .steps = detail::tree_reduce_steps(rank, size, 0)};
    for (const step& st : detail::tree_broadcast_steps(rank, size, 0)) s.steps.push_back(st);
    return s;
  }
  schedule reduce_schedule(int rank, int size, int root) const {
    return {.name = name, .steps = detail::tree_reduce_steps(rank, size, root)};
  }
  schedule broadcast_schedule(int rank, int size, int root) const {
    return {.name = name, .steps = detail::tree_broadcast_steps(rank, size, root)};
  }
};

}  // namespace squall
