// SPDX-License-Identifier: Apache-2.0
#pragma once
/// The compressed allreduce of linear compressors (cast, randomk, count_sketch): payloads add,
/// so their bodies are reduced through the topology's own allreduce schedule.

#include <squall/algorithm/compressed/payload.hpp>
#include <squall/algorithm/compressed/phases.hpp>
#include <squall/compress/linear_body.hpp>
#include <squall/compress/state.hpp>
#include <squall/core/buffer.hpp>
#include <squall/core/error.hpp>

#include <cstddef>
#include <string>

namespace squall::detail {

/// A linear compressor pairs with a topology through `linear_body<Compressor>`: the topology
/// adds payload bodies as numbers. Without one the pairing is impossible, and the
/// instantiation of `linear_pairing<Compressor, Topology>` (named in the diagnostic above the
/// error) fails with what to do.
template <class Compressor, class Topology>
struct linear_pairing {
  static_assert(has_linear_body<Compressor>,
                "squall: this Compressor allows aggregation::linear but has no "
                "squall::linear_body<Compressor>, so the Topology cannot add its payloads: "
                "specialize linear_body (where the summable body lies), or allow "
                "aggregation::gather only (payloads gathered, decoded and summed)");
  static constexpr bool possible = true;
};

// step 0: encode; step 1: allreduce the payload's body (elements E) with the topology's
// schedule, the header fields being equal on every rank; step 2: decode the sum.
template <class Dense, class C, class T>
void linear_allreduce(Dense& dense, const C& c, payload_workspace<typename Dense::backend_type>& w,
                      buffer_view<T, typename Dense::memory_space> data,
                      compression_state<C, T, typename Dense::backend_type>& state,
                      phase_clock& clock) {
  using Inner = inner_compressor_t<C>;
  using E = typename linear_body<Inner>::template element<T>;
  using M = typename Dense::memory_space;
  const auto& b = dense.backend();
  const linear_body_range body = linear_body<Inner>::template of<T>(inner_of(c), data.count());
  const std::size_t bytes =
      encode_payload(b, c, w, dense.rank(), buffer_view<const T, M>(data), state);
  clock.mark(phase::encode);
  if (body.offset > bytes || body.count > (bytes - body.offset) / sizeof(E)) {
    throw error(make_error_code(errc::internal), {.operation = "compressed allreduce"},
                "a payload of " + std::to_string(bytes) + " bytes has no body of " +
                    std::to_string(body.count) + " elements at " + std::to_string(body.offset));
  }
  dense.sum_in_place(reinterpret_cast<E*>(w.payload.data() + body.offset), body.count);
  clock.mark(phase::transfer);
  c.decode(b, buffer_view<const std::byte, M>(w.payload.data(), bytes), data);
}

}  // namespace squall::detail
