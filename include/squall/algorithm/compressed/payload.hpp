// SPDX-License-Identifier: Apache-2.0
#pragma once
/// The encode every compressed algorithm but per-hop requantization starts with: this rank's
/// payload, through the residual with error feedback, with this step's stream.

#include <squall/algorithm/detail/scratch.hpp>
#include <squall/compress/state.hpp>
#include <squall/core/buffer.hpp>
#include <squall/core/random.hpp>
#include <squall/core/types.hpp>

#include <cstddef>  // byte, size_t

namespace squall::detail {

/// A compressed collective's own payload and a scratch of decoded elements, in the backend's
/// memory, kept between calls.
template <class Backend>
struct payload_workspace {
  scratch_bytes<Backend> payload;  ///< this rank's payload
  scratch_bytes<Backend> decoded;  ///< a decoded payload, or error feedback's scratch
};

/// Encodes `in` into `w.payload` on backend `b` with rank `rank`'s stream of `state`'s step
/// (through the residual with error feedback, which keeps what the payload left out); returns
/// the payload's size.
template <class Backend, class C, class T>
std::size_t encode_payload(const Backend& b, const C& c, payload_workspace<Backend>& w, int rank,
                           buffer_view<const T, typename Backend::memory_space> in,
                           compression_state<C, T, Backend>& state) {
  using M = typename Backend::memory_space;
  const std::size_t capacity = c.max_payload_bytes(dtype_of<T>, in.count());
  const buffer_view<std::byte, M> out(w.payload.reserve(b, capacity), capacity);
  const random_stream stream = state.stream(rank);
  if constexpr (is_error_feedback<C>) {
    return c.encode(b, state.residual(), in, out, w.decoded.template elements<T>(b, in.count()),
                    stream);
  } else if constexpr (requires { c.encode(b, in, out, stream); }) {
    return c.encode(b, in, out, stream);
  } else {
    return c.encode(b, in, out);
  }
}

}  // namespace squall::detail
