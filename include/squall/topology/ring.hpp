// SPDX-License-Identifier: Apache-2.0
#pragma once
/// `ring_topology`: bandwidth-optimal allreduce as a ring reduce-scatter then a ring allgather.

#include <squall/topology/schedule.hpp>

#include <cstddef>  // size_t
#include <string_view>

namespace squall {

/// The ring: 2(P-1) steps, each rank sends 2(P-1)/P of the data whatever P is; pipelined by
/// the executor in pieces of `chunk_bytes` per block. Broadcast and reduce run along a
/// pipelined chain from the root.
struct ring_topology {
  static constexpr std::string_view name = "ring";
  /// Its allreduce schedule suits per-hop requantization (algorithm/detail/requantize.hpp).
  static constexpr bool per_hop_schedule = true;

  // step k < P-1: send block r-k-1 to r+1, reduce block r-k-2 from r-1 (reduce-scatter);
  // step P-1+k: send block r-k to r+1, copy block r-k-1 from r-1 (allgather).
  schedule allreduce_schedule(int rank, int size, std::size_t /*bytes*/) const {
    schedule s{.name = name, .steps = detail::ring_reduce_scatter_steps(rank, size)};
    for (const step& st : detail::ring_allgather_steps(rank, size)) s.steps.push_back(st);
    return s;
  }
  /// Rank r ends with block r of `size` blocks, reduced.
  schedule reduce_scatter_schedule(int rank, int size) const {
    return {.name = name, .steps = detail::ring_reduce_scatter_steps(rank, size)};
  }
  /// Rank r starts with block r of `size` blocks; every rank ends with all of them.
  schedule allgather_schedule(int rank, int size) const {
    return {.name = name, .steps = detail::ring_allgather_steps(rank, size)};
  }
  // chain root -> root+1 -> ... : receive from the previous rank, send to the next.
  schedule broadcast_schedule(int rank, int size, int root) const {
    schedule s{.name = name};
    const int v = detail::wrap(rank - root, size);
    if (v > 0)
      s.steps.push_back(recv_step(detail::wrap(rank - 1, size), whole_buffer, step_action::copy));
    if (v + 1 < size) s.steps.push_back(send_step(detail::wrap(rank + 1, size), whole_buffer));
    return s;
  }
  // chain root-1 -> ... -> root+1 -> root: reduce what the next rank sends, pass it on.
  schedule reduce_schedule(int rank, int size, int root) const {
    schedule s{.name = name};
    const int v = detail::wrap(rank - root, size);
    if (v + 1 < size) {
      s.steps.push_back(recv_step(detail::wrap(rank + 1, size), whole_buffer, step_action::reduce));
    }
    if (v > 0) s.steps.push_back(send_step(detail::wrap(rank - 1, size), whole_buffer));
    return s;
  }
};

}  // namespace squall
