// SPDX-License-Identifier: Apache-2.0
#pragma once
/// Per-hop requantization on the ring or tree (CGX): decode, add and re-encode at every hop;
/// the hops themselves are in algorithm/detail/requantize.hpp.

#include <squall/algorithm/detail/requantize.hpp>
#include <squall/compress/state.hpp>
#include <squall/core/buffer.hpp>
#include <squall/topology/ring.hpp>

#include <concepts>  // same_as

namespace squall::detail {

/// Runs the ring's hops on `ring_topology`, the tree's otherwise (`uses_per_hop` allows only
/// those two); error feedback through the state's residual.
template <class Dense, class C, class T>
void per_hop_allreduce(Dense& dense, const C& c, requantize_buffers& w, host_view<T> data,
                       compression_state<C, T>& state) {
  using Transport = typename Dense::transport_type;
  dense.settle();
  requantize_hops<Transport, inner_compressor_t<C>, T> hops{
      .transport = dense.transport(),
      .c = inner_of(c),
      .buffers = w,
      .sent = dense.counters().bytes_sent,
      .received = dense.counters().bytes_received,
      .step = state.step()};
  if constexpr (is_error_feedback<C>) hops.residual = state.residual().residual().data();
  if constexpr (std::same_as<typename Dense::topology_type, ring_topology>) {
    hops.ring(data.data(), data.count());
  } else {
    hops.tree(data.data(), data.count());
  }
}

}  // namespace squall::detail
