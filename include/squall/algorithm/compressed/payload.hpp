// SPDX-License-Identifier: Apache-2.0
#pragma once
/// The encode every compressed algorithm but per-hop requantization starts with: this rank's
/// payload, through the residual with error feedback, with this step's stream.

#include <squall/algorithm/detail/scratch.hpp>
#include <squall/compress/homomorphic.hpp>
#include <squall/compress/state.hpp>
#include <squall/core/buffer.hpp>
#include <squall/core/random.hpp>
#include <squall/core/types.hpp>

#include <cmath>    // isnan
#include <cstddef>  // byte, size_t
#include <cstdint>
#include <vector>

namespace squall::detail {

/// A compressed collective's own payload and a scratch of decoded elements, in the backend's
/// memory, kept between calls.
template <class Backend>
struct payload_workspace {
  scratch_bytes<Backend> payload;  ///< this rank's payload
  scratch_bytes<Backend> decoded;  ///< a decoded payload, or error feedback's scratch
};

/// How the ranks of `dense` agree a range (`range_agreeing` compressors): every rank's
/// `agreed_range` is exchanged (16 bytes each) and the largest max |y| and rms are kept (NaN
/// if any rank's is), with `ranks`, the number of payloads the aggregation sums per field
/// (P for linear, 1 where payloads are decoded one by one).
template <class Dense>
auto range_agreement(Dense& dense, std::uint32_t ranks) {
  return [&dense, ranks](agreed_range mine) {
    const double local[2] = {mine.max_abs, mine.rms};
    std::vector<double> all(2 * static_cast<std::size_t>(dense.size()));
    dense.settle();
    if (dense.size() > 1) {
      dense.exchange(local, sizeof local, all.data());
    } else {
      all = {local[0], local[1]};
    }
    agreed_range r{.max_abs = 0, .rms = 0, .ranks = ranks};
    for (std::size_t q = 0; q < all.size(); q += 2) {
      const auto top = [](double a, double b) { return std::isnan(a) || b > a ? b : a; };
      r.max_abs = std::isnan(r.max_abs) ? r.max_abs : top(r.max_abs, all[q]);
      r.rms = std::isnan(r.rms) ? r.rms : top(r.rms, all[q + 1]);
    }
    return r;
  };
}

/// Encodes `in`, elements `offset` to `offset + in.count()` of `state`'s tensor, into
/// `w.payload` on backend `b` with draws `stream` (through the same elements of the residual
/// with error feedback, which keeps what the payload left out); returns the payload's size.
/// A compressor whose ranks agree a range (`range_agreeing`: hq) gets the range `agree`
/// (`range_agreement`) makes of its local one, computed from what it encodes (the
/// compensated residual with error feedback). A chunk of the tensor (`in` shorter than the
/// state's count) needs the residual in the backend's memory, as every backend that overlaps
/// has it (the host's).
template <class Backend, class C, class T, class Agree>
std::size_t encode_chunk(const Backend& b, const C& c, payload_workspace<Backend>& w,
                         random_stream stream,
                         buffer_view<const T, typename Backend::memory_space> in,
                         compression_state<C, T, Backend>& state, std::size_t offset,
                         Agree&& agree) {
  using M = typename Backend::memory_space;
  using Inner = inner_compressor_t<C>;
  const std::size_t capacity = c.max_payload_bytes(dtype_of<T>, in.count());
  const buffer_view<std::byte, M> out(w.payload.reserve(b, capacity), capacity);
  if constexpr (range_agreeing<Inner, T, Backend>) {
    const Inner& inner = inner_of(c);
    const auto agreed = [&](buffer_view<const T, M> x) -> std::size_t {
      return inner.encode(b, x, out, stream, agree(inner.local_range(b, x, stream.step)));
    };
    if constexpr (is_error_feedback<C>) {
      const buffer_view<T, M> scratch = w.decoded.template elements<T>(b, in.count());
      return c.encode_through(b, state.residual().residual().subview(offset, in.count()), in,
                              scratch, agreed, out);
    } else {
      return agreed(in);
    }
  } else if constexpr (is_error_feedback<C>) {
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
template <class Backend, class C, class T, class Agree>
std::size_t encode_payload(const Backend& b, const C& c, payload_workspace<Backend>& w, int rank,
                           buffer_view<const T, typename Backend::memory_space> in,
                           compression_state<C, T, Backend>& state, Agree&& agree) {
  return encode_chunk(b, c, w, state.stream(rank), in, state, 0, agree);
}

}  // namespace squall::detail
