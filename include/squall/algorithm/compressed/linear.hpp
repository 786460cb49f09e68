// SPDX-License-Identifier: Apache-2.0
#pragma once
/// The compressed allreduce of linear compressors (cast, randomk, count_sketch): payloads add,
/// so their bodies are reduced through the topology's own allreduce schedule.

#include <squall/algorithm/compressed/overlap.hpp>
#include <squall/algorithm/compressed/payload.hpp>
#include <squall/algorithm/compressed/phases.hpp>
#include <squall/compress/linear_body.hpp>
#include <squall/compress/state.hpp>
#include <squall/core/buffer.hpp>
#include <squall/core/error.hpp>
#include <squall/core/random.hpp>

#include <cstddef>
#include <cstdint>
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

/// Sums, over the ranks of `dense` and in place, the body of `c`'s payload at `payload`
/// (`bytes` long, for `count` elements of `T`) with the topology's allreduce schedule: the
/// payload's header fields are equal on every rank. Throws an internal error if the payload
/// has no such body.
template <class Dense, class C, class T>
void sum_linear_body(Dense& dense, const C& c, std::byte* payload, std::size_t count,
                     std::size_t bytes) {
  using E = typename linear_body<C>::template element<T>;
  const linear_body_range body = linear_body_of<T>(c, count, bytes);
  if (body.offset > bytes || body.count > (bytes - body.offset) / sizeof(E)) {
    throw error(make_error_code(errc::internal), {.operation = "compressed allreduce"},
                "a payload of " + std::to_string(bytes) + " bytes has no body of " +
                    std::to_string(body.count) + " elements at " + std::to_string(body.offset));
  }
  dense.sum_in_place(reinterpret_cast<E*>(payload + body.offset), body.count);
}

// Per chunk of `plan` (the whole tensor without overlap): step 0: encode; step 1: allreduce
// the payload's body (elements E) with the topology's schedule, the header fields being equal
// on every rank; step 2: decode the sum (a compressor that keeps a state of its own and
// decodes through it, FetchSGD, runs its step there: every rank on the same sum). Chunk k in
// payload slot k % 2 (`run_phases`).
template <class Dense, class C, class T>
void linear_allreduce(Dense& dense, const C& c, payload_workspace<typename Dense::backend_type>& w,
                      overlap_workspace<typename Dense::backend_type>& o, const chunk_plan& plan,
                      buffer_view<T, typename Dense::memory_space> data,
                      compression_state<C, T, typename Dense::backend_type>& state,
                      phase_clock& clock) {
  using Inner = inner_compressor_t<C>;
  using M = typename Dense::memory_space;
  const auto& b = dense.backend();
  payload_workspace<typename Dense::backend_type>* const slots[2] = {&w, &o.payload};
  const auto chunk = [&](std::size_t k) { return data.subview(plan.offset(k), plan.count_of(k)); };
  const auto encode = [&](std::size_t k) {
    const random_stream stream = chunk_stream(state.step(), dense.rank(), dense.size(), k);
    return encode_chunk(b, c, *slots[k % 2], stream, buffer_view<const T, M>(chunk(k)), state,
                        plan.offset(k),
                        range_agreement(dense, static_cast<std::uint32_t>(dense.size())));
  };
  const auto transfer = [&](std::size_t k, std::size_t bytes) {
    sum_linear_body<Dense, Inner, T>(dense, inner_of(c), slots[k % 2]->payload.data(),
                                     plan.count_of(k), bytes);
  };
  const auto decode = [&](std::size_t k, std::size_t bytes) {
    const buffer_view<const std::byte, M> sum(slots[k % 2]->payload.data(), bytes);
    if constexpr (requires { inner_of(c).decode(b, state.own(), sum, chunk(k)); }) {
      inner_of(c).decode(b, state.own(), sum, chunk(k));  // a step of its own state: FetchSGD
    } else {
      c.decode(b, sum, chunk(k));
    }
  };
  run_phases(plan, o, clock, encode, transfer, decode);
}
}  // namespace squall::detail
