// SPDX-License-Identifier: Apache-2.0
#pragma once
/// `direct_topology`: one-shot allreduce, each rank reduces its own slice from every peer.

#include <squall/topology/schedule.hpp>

#include <cstddef>  // size_t
#include <string_view>

namespace squall {

/// One shot: rank r reduces block r of P from every rank, then every rank collects every
/// block. On a `direct_transport` (shared memory) the executor runs it through the peers'
/// windows: each rank publishes its data, reduces its block straight out of the peers'
/// windows and copies the reduced blocks back, two barriers per window-sized round. On a
/// `peer_memory_transport` its allreduce, reduce-scatter, allgather and broadcast (all marked
/// `one_shot`) go straight through the peers' own buffers. On other transports it runs as
/// messages: P-1 sends and receives per half.
struct direct_topology {
  static constexpr std::string_view name = "direct";
  /// Its allreduce schedule suits per-hop requantization (algorithm/detail/requantize.hpp).
  static constexpr bool per_hop_schedule = true;

  schedule allreduce_schedule(int rank, int size, std::size_t /*bytes*/) const {
    schedule s = reduce_scatter_schedule(rank, size);
    for (const step& st : allgather_schedule(rank, size).steps) s.steps.push_back(st);
    s.one_shot = true;
    return s;
  }
  // step k (1..P-1): send block r+k to rank r+k, reduce block r from rank r-k.
  schedule reduce_scatter_schedule(int rank, int size) const {
    schedule s{.name = name, .one_shot = true};
    for (int k = 1; k < size; ++k) {
      const int to = detail::wrap(rank + k, size);
      s.steps.push_back({.send_to = to,
                         .send = block(to, size),
                         .recv_from = detail::wrap(rank - k, size),
                         .recv = block(rank, size),
                         .action = step_action::reduce});
    }
    return s;
  }
  // step k (1..P-1): send block r to rank r+k, copy block r-k from rank r-k.
  schedule allgather_schedule(int rank, int size) const {
    schedule s{.name = name, .one_shot = true};
    for (int k = 1; k < size; ++k) {
      const int from = detail::wrap(rank - k, size);
      s.steps.push_back({.send_to = detail::wrap(rank + k, size),
                         .send = block(rank, size),
                         .recv_from = from,
                         .recv = block(from, size),
                         .action = step_action::copy});
    }
    return s;
  }
  // flat: the root sends to every other rank.
  schedule broadcast_schedule(int rank, int size, int root) const {
    schedule s{.name = name, .one_shot = true};
    for (int k = 1; k < size; ++k) {
      if (rank == root) {
        s.steps.push_back(send_step(detail::wrap(root + k, size), whole_buffer));
      } else if (rank == detail::wrap(root + k, size)) {
        s.steps.push_back(recv_step(root, whole_buffer, step_action::copy));
      }
    }
    return s;
  }
  // flat: every other rank sends to the root, which reduces them in rank order from root+1.
  schedule reduce_schedule(int rank, int size, int root) const {
    schedule s{.name = name};
    for (int k = 1; k < size; ++k) {
      const int from = detail::wrap(root + k, size);
      if (rank == root) {
        s.steps.push_back(recv_step(from, whole_buffer, step_action::reduce));
      } else if (rank == from) {
        s.steps.push_back(send_step(root, whole_buffer));
      }
    }
    return s;
  }

 private:
  static constexpr block_range block(int b, int size) {
    return {
        .first = static_cast<std::size_t>(b), .count = 1, .parts = static_cast<std::size_t>(size)};
  }
};

}  // namespace squall
