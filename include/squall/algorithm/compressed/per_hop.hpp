// SPDX-License-Identifier: Apache-2.0
#pragma once
/// Per-hop requantization on the ring or tree (CGX): decode, add and re-encode at every hop;
/// the hops themselves are in algorithm/detail/requantize.hpp.

#include <squall/algorithm/compressed/phases.hpp>
#include <squall/algorithm/detail/requantize.hpp>
#include <squall/compress/state.hpp>
#include <squall/core/buffer.hpp>

namespace squall::detail {

/// Walks the topology's own allreduce schedule for the payload's bytes (`per_hop_runs` allows
/// topologies declaring `per_hop_schedule`); error feedback through the state's residual.
/// Encoding and decoding happen at every hop, between messages: all of it counts as transfer.
template <class Dense, class C, class T>
void per_hop_allreduce(Dense& dense, const C& c,
                       requantize_buffers<typename Dense::backend_type>& w,
                       buffer_view<T, typename Dense::memory_space> data,
                       compression_state<C, T, typename Dense::backend_type>& state,
                       phase_clock& clock) {
  using Transport = typename Dense::transport_type;
  using Backend = typename Dense::backend_type;
  dense.settle();
  requantize_hops<Transport, Backend, inner_compressor_t<C>, T> hops{.link = dense.wire(),
                                                                     .backend = dense.backend(),
                                                                     .c = inner_of(c),
                                                                     .buffers = w,
                                                                     .step = state.step()};
  if constexpr (is_error_feedback<C>) hops.residual = state.residual().residual().data();
  const std::size_t bytes = inner_of(c).max_payload_bytes(dtype_of<T>, data.count());
  const auto schedule_of = [&](int rank) {
    return dense.schedules().allreduce_schedule(rank, dense.size(), bytes);
  };
  hops.walk(schedule_of(dense.rank()), schedule_of, data.data(), data.count());
  clock.mark(phase::transfer);
}

}  // namespace squall::detail
