// SPDX-License-Identifier: Apache-2.0
#pragma once
/// `linear_body<C>`: where the part of a linear compressor's payload that adds lies, so that
/// a topology reduces payloads as arrays of numbers (DESIGN, "How compression composes with
/// a topology": linear payloads go through the topology's own allreduce schedule).
///
/// A specialization says, for `count` input elements of `T`, the body's byte `offset` in the
/// payload, its element count, and its element type `element<T>`; the bytes before the
/// offset (header, seed, step, shape) are the same on every rank that encodes the same
/// step, and are not reduced. A compressor declaring `aggregation::linear` without a
/// specialization does not compile in a compressed allreduce (a `static_assert` in the
/// communicator names it and the topology); other classes gather their payloads.
///
/// | compressor | offset | elements | element |
/// |---|---|---|---|
/// | `identity_compressor` | 0 | count | T |
/// | `cast_compressor<To>` | 16 | count | To (float16 or bfloat16; summed per hop in float, rounded
/// to To) |
/// | `randomk_compressor` | 40 | k = entries(count) | T |
/// | `count_sketch_compressor<R, C>` | 40 | R x C | T |
/// | `fetchsgd_compressor<R, C>` | 40 | R x C | T |
/// | `homomorphic_compressor` | 48 | 1 + words of fields (from the payload's size) | int64 |
///
/// PowerSGD is linear in its factors but not in its payload (P is orthogonalized between the
/// two sums), so the communicator runs it on its own path.

#include <squall/compress/cast.hpp>
#include <squall/compress/fetchsgd.hpp>
#include <squall/compress/homomorphic.hpp>
#include <squall/compress/none.hpp>
#include <squall/compress/payload.hpp>
#include <squall/compress/sketch.hpp>
#include <squall/compress/sparsify.hpp>
#include <squall/core/types.hpp>

#include <cstddef>  // size_t
#include <cstdint>

namespace squall {

/// Where the summable body of a payload lies: `offset` bytes in, `count` elements.
struct linear_body_range {
  std::size_t offset = 0;
  std::size_t count = 0;
};

/// Not specialized: the compressor's payloads are not reduced in place (see the file comment).
template <class C>
struct linear_body;

template <>
struct linear_body<identity_compressor> {
  template <class T>
  using element = T;
  template <class T>
  static linear_body_range of(const identity_compressor& /*c*/, std::size_t count) {
    return {0, count};
  }
};

template <float16_like To>
struct linear_body<cast_compressor<To>> {
  template <class T>
  using element = To;
  template <class T>
  static linear_body_range of(const cast_compressor<To>& /*c*/, std::size_t count) {
    return {payload_header::bytes, count};
  }
};

template <>
struct linear_body<randomk_compressor> {
  template <class T>
  using element = T;
  template <class T>
  static linear_body_range of(const randomk_compressor& c, std::size_t count) {
    return {payload_header::bytes + 24, c.entries(count)};
  }
};

template <std::size_t Rows, std::size_t Cols>
struct linear_body<count_sketch_compressor<Rows, Cols>> {
  template <class T>
  using element = T;
  template <class T>
  static linear_body_range of(const count_sketch_compressor<Rows, Cols>& /*c*/,
                              std::size_t /*count*/) {
    return {count_sketch_compressor<Rows, Cols>::body_offset, Rows * Cols};
  }
};

/// FetchSGD sends count sketch's payload: its body.
template <std::size_t Rows, std::size_t Cols>
struct linear_body<fetchsgd_compressor<Rows, Cols>> {
  using sketch_body = linear_body<count_sketch_compressor<Rows, Cols>>;
  template <class T>
  using element = typename sketch_body::template element<T>;
  template <class T>
  static linear_body_range of(const fetchsgd_compressor<Rows, Cols>& c, std::size_t count) {
    return sketch_body::template of<T>(c.sketch(), count);
  }
};

/// hq: the summed count and the fields, 64-bit words added as integers (wrapping, which the
/// field widths make impossible); how many depends on the agreed ranks, so it is read from
/// the encoded size.
template <>
struct linear_body<homomorphic_compressor> {
  template <class T>
  using element = std::int64_t;
  template <class T>
  static linear_body_range of(const homomorphic_compressor& /*c*/, std::size_t /*count*/,
                              std::size_t bytes) {
    return {homomorphic_compressor::body_offset, homomorphic_compressor::body_words(bytes)};
  }
};

/// Where the body of `c`'s payload of `bytes` bytes for `count` elements lies.
template <class T, class C>
linear_body_range linear_body_of(const C& c, std::size_t count, std::size_t bytes) {
  if constexpr (requires { linear_body<C>::template of<T>(c, count, bytes); }) {
    return linear_body<C>::template of<T>(c, count, bytes);
  } else {
    return linear_body<C>::template of<T>(c, count);
  }
}

/// Whether `C`'s payloads are reduced in place through a topology (a specialization exists).
template <class C>
concept has_linear_body = requires {
  sizeof(linear_body<C>);
};

}  // namespace squall
