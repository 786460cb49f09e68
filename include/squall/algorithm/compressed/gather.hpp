// SPDX-License-Identifier: Apache-2.0
#pragma once
/// Gather-then-reduce: every rank encodes once, the payloads are gathered through the
/// topology's allgather schedule (sizes first unless fixed size, padded to the largest), and
/// every rank decodes all P and sums them in rank order, or counts a vote
/// (`aggregation::gather`): the per-hop compressors where the topology's schedule cannot be
/// walked per hop (or when asked), topk and threshold by default, sign_vote; and the
/// compressed allgather.

#include <squall/algorithm/compressed/payload.hpp>
#include <squall/algorithm/detail/scratch.hpp>
#include <squall/backend/host.hpp>
#include <squall/compress/state.hpp>
#include <squall/compress/traits.hpp>
#include <squall/core/buffer.hpp>
#include <squall/core/ops.hpp>
#include <squall/detail/math.hpp>
#include <squall/kernels/host/reduce.hpp>

#include <algorithm>  // max
#include <cstddef>
#include <cstdint>
#include <vector>

namespace squall::detail {

/// Every rank's payload and size, and a vote's sums of signs, kept between calls.
struct gather_workspace {
  std::vector<std::byte> gathered;   ///< every rank's payload, each at a multiple of 8 bytes
  std::vector<std::uint64_t> sizes;  ///< every rank's payload size
  std::vector<std::byte> votes;      ///< a vote's sums of signs
};

/// Gathers every rank's payload (this rank's: the first `mine` bytes of `payload`) into
/// `w.gathered`: the sizes first (into `w.sizes`) unless `Inner`'s are fixed, each payload at
/// q x the stride returned (the largest size rounded up to 8 bytes).
template <class Inner, class Dense>
std::size_t gather_payloads(Dense& dense, gather_workspace& w, const std::byte* payload,
                            std::uint64_t mine) {
  const auto p = static_cast<std::size_t>(dense.size());
  dense.settle();
  w.sizes.assign(p, mine);
  if constexpr (!compression_traits<Inner>::fixed_size) {
    if (p > 1) dense.exchange(&mine, sizeof mine, w.sizes.data());
  }
  std::uint64_t largest = 0;
  for (const std::uint64_t n : w.sizes) largest = std::max(largest, n);
  const std::size_t stride = align_up(static_cast<std::size_t>(largest), 8);
  if (w.gathered.size() < stride * p) w.gathered.resize(stride * p);
  dense.gather_blobs(payload, static_cast<std::size_t>(mine), stride, w.gathered.data());
  return stride;
}

/// Rank q's payload in `w.gathered` at `stride`.
inline host_view<const std::byte> gathered_payload(const gather_workspace& w, std::size_t stride,
                                                   std::size_t q) {
  return host_view<const std::byte>(w.gathered.data() + q * stride,
                                    static_cast<std::size_t>(w.sizes[q]));
}

// step 0: encode once; step 1: exchange sizes (unless fixed size) and gather every payload;
// step 2: decode each and sum in rank order (a vote: count signs, add magnitudes).
template <class Dense, class C, class T>
void gather_allreduce(Dense& dense, const C& c, payload_workspace& pw, gather_workspace& w,
                      host_view<T> data, compression_state<C, T>& state) {
  const std::size_t count = data.count();
  const auto p = static_cast<std::size_t>(dense.size());
  const std::size_t bytes =
      encode_payload(c, pw, dense.rank(), host_view<const T>(data.data(), count), state);
  const std::size_t stride =
      gather_payloads<inner_compressor_t<C>>(dense, w, pw.payload.data(), bytes);
  const host_backend b{};
  T* out = data.data();
  T* decoded = elements_of<T>(pw.decoded, count);
  const host_view<T> d(decoded, count);
  if constexpr (compression_traits<C>::majority_vote) {
    std::int32_t* votes = elements_of<std::int32_t>(w.votes, count);
    for (std::size_t q = 0; q < p; ++q) {
      c.decode(b, gathered_payload(w, stride, q), d);
      for (std::size_t i = 0; i < count; ++i) {
        const T x = decoded[i];
        const std::int32_t v =
            static_cast<std::int32_t>(x > T(0)) - static_cast<std::int32_t>(x < T(0));
        const T magnitude = x < T(0) ? -x : x;
        votes[i] = q == 0 ? v : votes[i] + v;
        out[i] = q == 0 ? magnitude : out[i] + magnitude;
      }
    }
    for (std::size_t i = 0; i < count; ++i) {
      out[i] = votes[i] > 0 ? out[i] : votes[i] < 0 ? -out[i] : T(0) * out[i];
    }
  } else {
    c.decode(b, gathered_payload(w, stride, 0), data);
    for (std::size_t q = 1; q < p; ++q) {
      c.decode(b, gathered_payload(w, stride, q), d);
      kernels::reduce_into(b, sum_op{}, data, host_view<const T>(decoded, count));
    }
  }
}

// step 0: encode; step 1: gather the payloads; step 2: decode rank q's into block q of `out`.
template <class Dense, class C, class T>
void compressed_allgather(Dense& dense, const C& c, payload_workspace& pw, gather_workspace& w,
                          host_view<const T> in, host_view<T> out, compression_state<C, T>& state) {
  const std::size_t count = in.count();
  const std::size_t bytes = encode_payload(c, pw, dense.rank(), in, state);
  const std::size_t stride =
      gather_payloads<inner_compressor_t<C>>(dense, w, pw.payload.data(), bytes);
  for (std::size_t q = 0; q < static_cast<std::size_t>(dense.size()); ++q) {
    c.decode(host_backend{}, gathered_payload(w, stride, q),
             host_view<T>(out.data() + q * count, count));
  }
}

}  // namespace squall::detail
