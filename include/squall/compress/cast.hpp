// SPDX-License-Identifier: Apache-2.0
#pragma once
/// `cast_compressor<To>`: sends floating-point gradients as `float16` or `bfloat16`, rounded
/// to nearest even (the mixed-precision all-reduce of Micikevicius et al. 2018, and bfloat16
/// as Kalamkar et al. 2019 use it). Payload: the 16-byte header, then `count` 16-bit values.

#include <squall/compress/payload.hpp>
#include <squall/concepts.hpp>
#include <squall/core/buffer.hpp>
#include <squall/core/error.hpp>
#include <squall/core/random.hpp>
#include <squall/core/types.hpp>
#include <squall/kernels/host/convert.hpp>
#include <squall/kernels/host/reduce.hpp>

#include <cstddef>  // byte, size_t
#include <cstring>  // memcpy
#include <limits>
#include <string>
#include <string_view>
#include <type_traits>

namespace squall {

/// Elements a cast compressor takes: float, double, or the 16-bit types themselves.
template <class T>
concept castable = std::same_as<T, float> || std::same_as<T, double> || float16_like<T>;

/// Rounds each element to `To` (`float16` or `bfloat16`, nearest even; NaN stays NaN, values
/// beyond `To`'s range become infinities, as the IEEE cast does) and back. Linear: the sum of
/// two decoded payloads is the sum of the inputs up to one rounding each, so topologies reduce
/// cast payloads as they are. Fixed size: 16 + 2 x count bytes, 16 bits per element plus
/// 128 / count for the header.
template <float16_like To>
struct cast_compressor {
  static constexpr std::string_view name = std::same_as<To, float16>
                                               ? std::string_view("cast_float16")
                                               : std::string_view("cast_bfloat16");
  static constexpr aggregation_set aggregations{aggregation::linear, aggregation::gather};
  static constexpr bool fixed_size = true;
  static constexpr payload_kind kind =
      std::same_as<To, float16> ? payload_kind::cast_float16 : payload_kind::cast_bfloat16;

  /// Element by element: any chunk encodes as the whole tensor does.
  std::size_t chunk_alignment() const { return 1; }

  /// 16 + 2 x `count` bytes; throws `invalid_argument` if that overflows.
  std::size_t max_payload_bytes(dtype /*type*/, std::size_t count) const {
    if (count > (std::numeric_limits<std::size_t>::max() - payload_header::bytes) / sizeof(To)) {
      throw invalid_argument({.operation = name},
                             "payload size of " + std::to_string(count) + " elements overflows");
    }
    return payload_header::bytes + count * sizeof(To);
  }

  /// Writes the header and `in` rounded to `To`; returns the payload's size. Throws
  /// `invalid_argument` if `payload` is too small or not 2-byte aligned.
  template <class B, castable T>
  std::size_t encode(const B& backend, buffer_view<const T, typename B::memory_space> in,
                     buffer_view<std::byte, typename B::memory_space> payload,
                     random_stream /*stream*/ = {}) const {
    const std::size_t size = max_payload_bytes(dtype_of<T>, in.count());
    if (payload.count() < size) {
      throw invalid_argument({.operation = name}, "payload buffer of " +
                                                      std::to_string(payload.count()) +
                                                      " bytes for " + std::to_string(size));
    }
    require_payload_alignment(name, payload.data(), alignof(To));
    // the header is built on the host and stored into the payload (host or device memory)
    std::byte head[payload_header::bytes];
    write_payload_header({.kind = kind, .type = dtype_of<T>, .count = in.count()}, head);
    store_bytes(backend, payload.data(), head, sizeof head);
    To* body = reinterpret_cast<To*>(payload.data() + payload_header::bytes);
    convert(backend, in.data(), body, in.count());
    return size;
  }

  /// Reads a payload back into `out`: validates the header (kind, version, element type,
  /// count), the size and the address (2-byte aligned), then widens. Throws `invalid_argument` on
  /// any inconsistency.
  template <class B, castable T>
  void decode(const B& backend, buffer_view<const std::byte, typename B::memory_space> payload,
              buffer_view<T, typename B::memory_space> out) const {
    std::byte head[payload_header::bytes] = {};  // copied to the host and checked there
    load_bytes(backend, head, payload.data(),
               payload.count() < sizeof head ? payload.count() : sizeof head);
    read_payload_header(name, head, payload.count(), kind, dtype_of<T>, out.count());
    if (payload.count() != payload_header::bytes + out.count() * sizeof(To)) {
      throw invalid_argument({.operation = name}, "payload of " + std::to_string(payload.count()) +
                                                      " bytes for " + std::to_string(out.count()) +
                                                      " elements");
    }
    require_payload_alignment(name, payload.data(), alignof(To));
    const To* body = reinterpret_cast<const To*>(payload.data() + payload_header::bytes);
    convert(backend, body, out.data(), out.count());
  }
};
static_assert(compressor<cast_compressor<float16>>);
static_assert(compressor<cast_compressor<bfloat16>>);

}  // namespace squall
