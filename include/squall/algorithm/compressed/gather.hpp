// SPDX-License-Identifier: Apache-2.0
#pragma once
/// Gather-then-reduce: every rank encodes once, the payloads are gathered through the
/// topology's allgather schedule (sizes first unless fixed size, padded to the largest), and
/// every rank decodes all P and sums them in rank order, or counts a vote
/// (`aggregation::gather`): the per-hop compressors where the topology's schedule cannot be
/// walked per hop (or when asked), topk and threshold by default, sign_vote; and the
/// compressed allgather.

#include <squall/algorithm/compressed/overlap.hpp>
#include <squall/algorithm/compressed/payload.hpp>
#include <squall/algorithm/compressed/phases.hpp>
#include <squall/algorithm/detail/scratch.hpp>
#include <squall/backend/dispatch.hpp>
#include <squall/compress/state.hpp>
#include <squall/compress/traits.hpp>
#include <squall/core/buffer.hpp>
#include <squall/core/ops.hpp>
#include <squall/core/random.hpp>
#include <squall/detail/math.hpp>

#include <algorithm>  // max
#include <cstddef>
#include <cstdint>
#include <vector>

namespace squall::detail {

/// Every rank's payload (in the backend's memory) and size (on the host), and a vote's sums
/// of signs, kept between calls.
template <class Backend>
struct gather_workspace {
  scratch_bytes<Backend> gathered;   ///< every rank's payload, each at a multiple of 8 bytes
  std::vector<std::uint64_t> sizes;  ///< every rank's payload size (host bookkeeping)
  scratch_bytes<Backend> votes;      ///< a vote's sums of signs
};

/// Gathers every rank's payload (this rank's: the first `mine` bytes of `payload`) into
/// `w.gathered`: the sizes first (into `w.sizes`) unless `Inner`'s are fixed, each payload at
/// q x the stride returned (the largest size rounded up to 8 bytes).
template <class Inner, class Dense>
std::size_t gather_payloads(Dense& dense, gather_workspace<typename Dense::backend_type>& w,
                            const std::byte* payload, std::uint64_t mine) {
  const auto p = static_cast<std::size_t>(dense.size());
  dense.settle();
  w.sizes.assign(p, mine);
  if constexpr (!compression_traits<Inner>::fixed_size) {
    if (p > 1) dense.exchange(&mine, sizeof mine, w.sizes.data());
  }
  std::uint64_t largest = 0;
  for (const std::uint64_t n : w.sizes) largest = std::max(largest, n);
  const std::size_t stride = align_up(static_cast<std::size_t>(largest), 8);
  std::byte* all = w.gathered.reserve(dense.backend(), stride * p);
  dense.gather_blobs(payload, static_cast<std::size_t>(mine), stride, all);
  return stride;
}

/// Rank q's payload in `w.gathered` at `stride`.
template <class Backend>
buffer_view<const std::byte, typename Backend::memory_space> gathered_payload(
    gather_workspace<Backend>& w, std::size_t stride, std::size_t q) {
  return {w.gathered.data() + q * stride, static_cast<std::size_t>(w.sizes[q])};
}

// Per chunk of `plan` (the whole tensor without overlap): step 0: encode once; step 1:
// exchange sizes (unless fixed size) and gather every payload; step 2: decode each and sum in
// rank order (a vote: count signs, add magnitudes). Chunk k in slot k % 2 of the payloads
// (`pw`, `o.payload`) and of the gathered ones (`w`, `second`): `run_phases`.
template <class Dense, class C, class T>
void gather_allreduce(Dense& dense, const C& c, payload_workspace<typename Dense::backend_type>& pw,
                      gather_workspace<typename Dense::backend_type>& w,
                      overlap_workspace<typename Dense::backend_type>& o,
                      gather_workspace<typename Dense::backend_type>& second,
                      const chunk_plan& plan, buffer_view<T, typename Dense::memory_space> data,
                      compression_state<C, T, typename Dense::backend_type>& state,
                      phase_clock& clock) {
  using Backend = typename Dense::backend_type;
  using M = typename Dense::memory_space;
  const auto& b = dense.backend();
  const auto p = static_cast<std::size_t>(dense.size());
  payload_workspace<Backend>* const payloads[2] = {&pw, &o.payload};
  gather_workspace<Backend>* const gathered[2] = {&w, &second};
  std::size_t strides[2] = {0, 0};
  const auto encode = [&](std::size_t k) {
    const random_stream stream = chunk_stream(state.step(), dense.rank(), dense.size(), k);
    const buffer_view<const T, M> in(data.subview(plan.offset(k), plan.count_of(k)));
    return encode_chunk(b, c, *payloads[k % 2], stream, in, state, plan.offset(k),
                        range_agreement(dense, 1));
  };
  const auto transfer = [&](std::size_t k, std::size_t bytes) {
    strides[k % 2] = gather_payloads<inner_compressor_t<C>>(dense, *gathered[k % 2],
                                                            payloads[k % 2]->payload.data(), bytes);
  };
  const auto decode = [&](std::size_t k, std::size_t) {
    gather_workspace<Backend>& g = *gathered[k % 2];
    const std::size_t stride = strides[k % 2];
    const buffer_view<T, M> out = data.subview(plan.offset(k), plan.count_of(k));
    // a decoded payload's scratch, reserved only where a payload is decoded apart from the sum
    const auto decoded = [&] {
      return payloads[k % 2]->decoded.template elements<T>(b, out.count());
    };
    if constexpr (compression_traits<C>::majority_vote) {
      const buffer_view<T, M> one = decoded();
      const auto votes = g.votes.template elements<std::int32_t>(b, out.count());
      for (std::size_t q = 0; q < p; ++q) {
        c.decode(b, gathered_payload(g, stride, q), one);
        dispatch::vote_add_on(b, votes, out, buffer_view<const T, M>(one), q == 0);
      }
      dispatch::vote_finish_on(b, buffer_view<const std::int32_t, M>(votes), out);
    } else {
      c.decode(b, gathered_payload(g, stride, 0), out);
      for (std::size_t q = 1; q < p; ++q) {
        if constexpr (requires { c.decode_add(b, gathered_payload(g, stride, q), out); }) {
          // a sparse payload adds its k entries: no pass over the whole result per rank
          c.decode_add(b, gathered_payload(g, stride, q), out);
        } else {
          const buffer_view<T, M> one = decoded();
          c.decode(b, gathered_payload(g, stride, q), one);
          dispatch::reduce_into_on(b, sum_op{}, out, buffer_view<const T, M>(one));
        }
      }
    }
  };
  run_phases(plan, o, clock, encode, transfer, decode);
}

// step 0: encode; step 1: gather the payloads; step 2: decode rank q's into block q of `out`.
template <class Dense, class C, class T>
void compressed_allgather(Dense& dense, const C& c,
                          payload_workspace<typename Dense::backend_type>& pw,
                          gather_workspace<typename Dense::backend_type>& w,
                          buffer_view<const T, typename Dense::memory_space> in,
                          buffer_view<T, typename Dense::memory_space> out,
                          compression_state<C, T, typename Dense::backend_type>& state,
                          phase_clock& clock) {
  const auto& b = dense.backend();
  const std::size_t count = in.count();
  const std::size_t bytes =
      encode_payload(b, c, pw, dense.rank(), in, state, range_agreement(dense, 1));
  clock.mark(phase::encode);
  const std::size_t stride =
      gather_payloads<inner_compressor_t<C>>(dense, w, pw.payload.data(), bytes);
  clock.mark(phase::transfer);
  for (std::size_t q = 0; q < static_cast<std::size_t>(dense.size()); ++q) {
    c.decode(b, gathered_payload(w, stride, q), out.subview(q * count, count));
  }
}

}  // namespace squall::detail
