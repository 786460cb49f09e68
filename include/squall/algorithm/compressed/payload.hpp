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

/// Encodes `in`, elements `offset` to `offset + in.count()` of `state`'s tensor, into
/// `w.payload` on backend `b` with draws `stream` (through the same elements of the residual
/// with error feedback, which keeps what the payload left out); returns the payload's size.
/// A chunk of the tensor (`in` shorter than the state's count) needs the residual in the
/// backend's memory, as every backend that overlaps has it (the host's).
template <class Backend, class C, class T>
std::size_t encode_chunk(const Backend& b, const C& c, payload_workspace<Backend>& w,
                         random_stream stream,
                         buffer_view<const T, typename Backend::memory_space> in,
                         compression_state<C, T, Backend>& state, std::size_t offset) {
  using M = typename Backend::memory_space;
  const std::size_t capacity = c.max_payload_bytes(dtype_of<T>, in.count());
  const buffer_view<std::byte, M> out(w.payload.reserve(b, capacity), capacity);
  if constexpr (is_error_feedback<C>) {
    const buffer_view<T, M> scratch = w.decoded.template elements<T>(b, in.count());
    if (in.count() == state.count()) return c.encode(b, state.residual(), in, out, scratch, stream);
    return c.encode(b, state.residual().residual().subview(offset, in.count()), in, out, scratch,
                    stream);
  } else if constexpr (requires { c.encode(b, in, out, stream); }) {
    return c.encode(b, in, out, stream);
  } else {
    return c.encode(b, in, out);
  }
}

/// Encodes the whole of `in` with rank `rank`'s stream of `state`'s step (`encode_chunk`).
template <class Backend, class C, class T>
std::size_t encode_payload(const Backend& b, const C& c, payload_workspace<Backend>& w, int rank,
                           buffer_view<const T, typename Backend::memory_space> in,
                           compression_state<C, T, Backend>& state) {
  return encode_chunk(b, c, w, state.stream(rank), in, state, 0);
}

}  // namespace squall::detail
