// SPDX-License-Identifier: Apache-2.0
#pragma once
/// The encode every compressed algorithm but per-hop requantization starts with: this rank's
/// payload, through the residual with error feedback, with this step's stream.

#include <squall/algorithm/detail/scratch.hpp>
#include <squall/backend/host.hpp>
#include <squall/compress/state.hpp>
#include <squall/core/buffer.hpp>
#include <squall/core/random.hpp>
#include <squall/core/types.hpp>

#include <cstddef>  // byte, size_t
#include <vector>

namespace squall::detail {

/// A compressed collective's own payload and a scratch of decoded elements, kept between calls.
struct payload_workspace {
  std::vector<std::byte> payload;  ///< this rank's payload
  std::vector<std::byte> decoded;  ///< a decoded payload, or error feedback's scratch
};

/// Encodes `in` into `w.payload` with rank `rank`'s stream of `state`'s step (through the
/// residual with error feedback, which keeps what the payload left out); returns the
/// payload's size.
template <class C, class T>
std::size_t encode_payload(const C& c, payload_workspace& w, int rank, host_view<const T> in,
                           compression_state<C, T>& state) {
  const std::size_t capacity = c.max_payload_bytes(dtype_of<T>, in.count());
  if (w.payload.size() < capacity) w.payload.resize(capacity);
  const host_view<std::byte> out(w.payload.data(), capacity);
  const random_stream stream = state.stream(rank);
  if constexpr (is_error_feedback<C>) {
    const host_view<T> scratch(elements_of<T>(w.decoded, in.count()), in.count());
    return c.encode(host_backend{}, state.residual(), in, out, scratch, stream);
  } else if constexpr (requires { c.encode(host_backend{}, in, out, stream); }) {
    return c.encode(host_backend{}, in, out, stream);
  } else {
    return c.encode(host_backend{}, in, out);
  }
}

}  // namespace squall::detail
