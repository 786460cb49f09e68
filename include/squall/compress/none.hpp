// SPDX-License-Identifier: Apache-2.0
#pragma once
/// `identity_compressor`: the default. The payload is the elements' own bytes, so the
/// compressed collective is the plain one.

#include <squall/concepts.hpp>
#include <squall/core/buffer.hpp>
#include <squall/core/error.hpp>
#include <squall/core/random.hpp>
#include <squall/detail/bytes.hpp>
#include <squall/kernels/host/reduce.hpp>

#include <cstddef>  // byte, size_t
#include <limits>
#include <string>
#include <string_view>

namespace squall {

/// Sends elements as they are. Linear (payloads add as the elements do) and fixed-size.
struct identity_compressor {
  static constexpr std::string_view name = "none";
  static constexpr aggregation_set aggregations{aggregation::linear};
  static constexpr bool fixed_size = true;

  /// `count` elements of `type` take `count * size_of(type)` bytes; throws `invalid_argument`
  /// if that overflows.
  std::size_t max_payload_bytes(dtype type, std::size_t count) const {
    const std::size_t size = size_of(type);
    if (size == 0 || count > std::numeric_limits<std::size_t>::max() / size) {
      throw invalid_argument({.operation = "identity_compressor"},
                             "payload size of " + std::to_string(count) + " elements overflows");
    }
    return count * size;
  }

  /// Copies the bytes of `in` to the front of `payload`; returns their number. Throws
  /// `invalid_argument` if `payload` is too small.
  template <class B, element T>
  std::size_t encode(const B& backend, buffer_view<const T, typename B::memory_space> in,
                     buffer_view<std::byte, typename B::memory_space> payload,
                     random_stream /*stream*/ = {}) const {
    const auto bytes = detail::as_bytes(in);
    if (payload.count() < bytes.count()) {
      throw invalid_argument({.operation = "identity_compressor encode"},
                             "payload buffer of " + std::to_string(payload.count()) +
                                 " bytes for " + std::to_string(bytes.count()));
    }
    copy(backend, payload.subview(0, bytes.count()), bytes);
    return bytes.count();
  }

  /// Copies a payload back into `out`; throws `invalid_argument` unless it holds exactly
  /// `out.count()` elements.
  template <class B, element T>
  void decode(const B& backend, buffer_view<const std::byte, typename B::memory_space> payload,
              buffer_view<T, typename B::memory_space> out) const {
    if (payload.count() != out.size_bytes()) {
      throw invalid_argument({.operation = "identity_compressor decode"},
                             "payload of " + std::to_string(payload.count()) + " bytes for " +
                                 std::to_string(out.count()) + " elements");
    }
    copy(backend, detail::as_writable_bytes(out), payload);
  }
};
static_assert(compressor<identity_compressor>);

}  // namespace squall
