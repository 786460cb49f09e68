// SPDX-License-Identifier: Apache-2.0
#pragma once
/// `homomorphic_compressor` ("hq:<bits>"): homomorphic integer quantization after THC (Li et
/// al., "THC: Accelerating Distributed Deep Learning Using Tensor Homomorphic Compression",
/// NSDI 2024). The ranks first agree one scale (a max over ranks of two numbers, `agreed_range`);
/// every rank then rounds its (rotated) values stochastically to integer codes against that
/// scale, and the codes are summed as integers by any topology's reduce-scatter and allgather:
/// a linear compressor, decoded once at the end, so no requantization error accumulates hop by
/// hop as it does for per-hop int8.
///
/// Overflow is impossible by construction: a `bits`-bit code is at most 2L = 2^bits - 2, so the
/// sum of P codes is below 2^(bits + ceil(log2 P)); each code sits in a field that wide
/// (`kernels::hq_field_bits`), floor(64 / width) fields to a 64-bit word, and the words of the
/// ranks add as 64-bit integers: a field's sum never reaches the next field, nor the top of the
/// word. The number of payloads summed is itself a word of the body (1 in each rank's
/// payload), so a summed payload says how many codes each field holds.
///
/// Payload (docs/compressors.md): the 16-byte header (parameter 0), then
///   offset 16  u8 bits   u8 field width   u8 rotate (0|1)   u8 reserved (0)   u32 ranks P
///   offset 24  u64 seed of the rotation's signs     offset 32  u64 step of the rotation
///   offset 40  f64 scale s (a level is s / L)
///   offset 48  the body, u64 words: the number of payloads summed, then ceil(padded /
///              floor(64 / width)) words of fields, element i in field i % F of word i / F.
/// Element i decodes to the inverse rotation of (field - n L) x s / L.

#include <squall/compress/payload.hpp>
#include <squall/concepts.hpp>
#include <squall/core/buffer.hpp>
#include <squall/core/error.hpp>
#include <squall/core/random.hpp>
#include <squall/core/types.hpp>
#include <squall/kernels/host/homomorphic.hpp>
#include <squall/kernels/host/reduce.hpp>

#include <cmath>
#include <concepts>  // same_as
#include <cstddef>   // byte, size_t
#include <cstdint>
#include <cstring>  // memcpy
#include <limits>
#include <string>
#include <string_view>

namespace squall {

/// What the ranks of a homomorphic compressor agree before encoding: the largest |y| and the
/// largest root mean square of y over ranks (y the rotated input), and how many ranks sum.
/// Combined by a maximum (a NaN anywhere gives NaN).
struct agreed_range {
  double max_abs = 0;
  double rms = 0;
  std::uint32_t ranks = 1;
};

/// A compressor whose ranks agree a range before they encode (`homomorphic_compressor`):
/// `local_range(b, in)` is this rank's, and `encode(b, in, payload, stream, agreed)` encodes
/// against the agreed one. The compressed algorithms combine the ranks' ranges
/// (algorithm/compressed/payload.hpp) before calling `encode`.
template <class C, class T, class B>
concept range_agreeing = requires(const C& c, const B& b,
                                  buffer_view<const T, typename B::memory_space> in,
                                  buffer_view<std::byte, typename B::memory_space> payload,
                                  random_stream stream, agreed_range agreed) {
  { c.local_range(b, in) } -> std::same_as<agreed_range>;
  { c.encode(b, in, payload, stream, agreed) } -> std::same_as<std::size_t>;
};

/// Homomorphic integer quantization (see the file comment). Runtime parameters: `bits` per
/// rank's code (2 to 8: L = 2^(bits-1) - 1 levels each side), `rotate` (a randomized Hadamard
/// rotation in blocks of 1024 before quantizing, which spreads a gradient's outliers over its
/// block so that a scale fits all), `clip` (the scale is min(M, clip x rms(y)) with the
/// agreed M and rms, M = max |y|, or with a clip a bound on it: `local_range`; 0 for max |y|
/// alone, which makes the compressor unbiased; negative, the default, for the clip that
/// minimizes a Gaussian's error at these bits), `seed` (the rotation's signs and the
/// rounding's draws) and `check_finite`.
///
/// Error: unbiased without clipping (each code is a stochastic rounding between neighbouring
/// levels, and the rotation is orthonormal); per rank the variance of an element is at most
/// (s / L)^2 / 4, so ||C(x) - x||^2 <= padded x (s / L)^2 / 4. With clipping, elements of
/// |y| > s are sent as +-s (biased; error feedback keeps what they lose).
///
/// Bytes: (bits + ceil(log2 P)) bits per element, rounded to whole fields of 64-bit words
/// (hq:4 at P = 4: 6-bit fields, 10 to a word, 6.4 bits an element: 5.0x fewer than float32),
/// plus 56 bytes, plus the padding of the last rotation block to a power of two.
struct homomorphic_compressor {
  static constexpr std::string_view name = "hq";
  static constexpr aggregation_set aggregations{aggregation::linear, aggregation::gather};
  static constexpr bool fixed_size = true;
  static constexpr payload_kind kind = payload_kind::hq;
  static constexpr std::size_t body_offset = payload_header::bytes + 32;
  /// The most ranks a payload is sized for (field widths up to bits + 20).
  static constexpr std::uint32_t max_ranks = 1u << 20;

  unsigned bits = 4;
  bool rotate = true;
  double clip = -1;
  std::uint64_t seed = 0;
  bool check_finite = false;

  /// The clip that minimizes the relative error of a standard normal's quantization at
  /// `bits` (measured: 1.0 x rms at 2 bits up to 3.75 x rms at 8).
  static double default_clip(unsigned bits) {
    constexpr double table[9] = {0, 0, 1.0, 1.75, 2.25, 2.75, 3.25, 3.5, 3.75};
    return bits < 9 ? table[bits] : 0;
  }
  /// The clip in use (`clip`, or `default_clip` where negative).
  double clip_in_use() const { return clip < 0 ? default_clip(bits) : clip; }

  /// Rounding depends on the whole tensor's agreed scale: chunks would agree their own.
  std::size_t chunk_alignment() const { return 0; }

  /// The payload's size for `count` elements on up to `max_ranks` ranks; throws
  /// `invalid_argument` for another type than float32 or float64, bits outside 2 to 8, or
  /// overflow.
  std::size_t max_payload_bytes(dtype type, std::size_t count) const {
    require_type(type);
    return payload_bytes(count, max_ranks);
  }

  /// The payload's size for `count` elements summed over `ranks` ranks (what the linear
  /// aggregation sends on `ranks` ranks; the gathered one, for 1).
  std::size_t max_payload_bytes(dtype type, std::size_t count, std::uint32_t ranks) const {
    require_type(type);
    if (ranks == 0 || ranks > max_ranks) {
      throw invalid_argument({.operation = name}, "a sum over " + std::to_string(ranks) +
                                                      " ranks (1 to " + std::to_string(max_ranks) +
                                                      ")");
    }
    return payload_bytes(count, ranks);
  }

  /// This rank's range: rms(y) and max |y| of its rotated `in`; with a clip, a bound on max |y|
  /// that needs no rotation (`kernels::hq_range`: min(||x||_1 / sqrt(B), ||x||_2) per block),
  /// since the clip decides the scale unless every |y| is below clip x rms (and then the
  /// bound keeps every element unclipped all the same).
  template <class B, real_gradient T>
  agreed_range local_range(const B& backend, buffer_view<const T, typename B::memory_space> in,
                           std::uint64_t step = 0) const {
    agreed_range r;
    hq_range(backend, shape(in.count(), 1, step), in.data(), clip_in_use() > 0, r.max_abs, r.rms);
    return r;
  }

  /// Encodes `in` as one rank's payload of a sum over `agreed.ranks` ranks, against the agreed
  /// scale; returns the payload's size. Throws `invalid_argument` for too small a payload,
  /// `agreed.ranks` of 0 or above `max_ranks`, or (with `check_finite`) a NaN or infinite
  /// element.
  template <class B, real_gradient T>
  std::size_t encode(const B& backend, buffer_view<const T, typename B::memory_space> in,
                     buffer_view<std::byte, typename B::memory_space> payload, random_stream stream,
                     agreed_range agreed) const {
    const std::size_t count = in.count();
    const std::size_t size = max_payload_bytes(dtype_of<T>, count, agreed.ranks);
    if (payload.count() < size) {
      throw invalid_argument({.operation = name}, "payload buffer of " +
                                                      std::to_string(payload.count()) +
                                                      " bytes for " + std::to_string(size));
    }
    require_payload_alignment(name, payload.data(), alignof(std::uint64_t));
    const kernels::hq_shape s = shape(count, agreed.ranks, stream.step);
    const double c = clip_in_use();
    const double clipped = c * agreed.rms;
    const double scale = c > 0 && clipped < agreed.max_abs ? clipped : agreed.max_abs;
    std::byte head[body_offset + 8] = {};
    write_payload_header({.kind = kind, .type = dtype_of<T>, .count = count}, head);
    write_prefix(head, s, agreed.ranks, scale);
    const std::uint64_t one = 1;  // this payload holds one rank's codes
    std::memcpy(head + body_offset, &one, 8);
    store_bytes(backend, payload.data(), head, sizeof head);
    auto* words = reinterpret_cast<std::uint64_t*>(payload.data() + body_offset + 8);
    const std::size_t bad =
        hq_encode(backend, s, in.data(), scale, seed, stream, check_finite, words);
    if (check_finite && bad != count) throw_not_finite(name, bad, "NaN or infinite");
    return size;
  }

  /// Encodes `in` as the only rank of a sum (its own range, one rank).
  template <class B, real_gradient T>
  std::size_t encode(const B& backend, buffer_view<const T, typename B::memory_space> in,
                     buffer_view<std::byte, typename B::memory_space> payload,
                     random_stream stream = {}) const {
    return encode(backend, in, payload, stream, local_range(backend, in, stream.step));
  }

  /// Decodes a payload (one rank's, or the sum of n ranks' payloads of one agreement) into
  /// `out`: checks the header, the prefix (bits, field width for the ranks, reserved bytes,
  /// a scale that is not negative; a NaN one, from a NaN on some rank, decodes to NaN), the
  /// size, the number of payloads summed (1 to P) and that every field is at most n x 2L.
  /// Throws `invalid_argument` naming the first inconsistency.
  template <class B, real_gradient T>
  void decode(const B& backend, buffer_view<const std::byte, typename B::memory_space> payload,
              buffer_view<T, typename B::memory_space> out) const {
    const error_context where{.operation = name};
    const std::size_t count = out.count();
    std::byte head[body_offset + 8] = {};
    load_bytes(backend, head, payload.data(),
               payload.count() < sizeof head ? payload.count() : sizeof head);
    read_payload_header(name, head, payload.count(), kind, dtype_of<T>, count);
    if (payload.count() < sizeof head) {
      throw invalid_argument(
          where, "payload of " + std::to_string(payload.count()) + " bytes ends inside its prefix");
    }
    std::uint32_t ranks = 0;
    std::uint64_t rotation[2] = {};
    double scale = 0;
    std::uint64_t summed = 0;
    std::memcpy(&ranks, head + 20, 4);
    std::memcpy(rotation, head + 24, 16);
    std::memcpy(&scale, head + 40, 8);
    std::memcpy(&summed, head + body_offset, 8);
    const auto byte = [&](std::size_t at) { return static_cast<unsigned>(head[at]); };
    if (byte(16) != bits) {
      throw invalid_argument(where, "payload of " + std::to_string(byte(16)) + "-bit codes where " +
                                        std::to_string(bits) + " are expected");
    }
    if (ranks == 0 || ranks > max_ranks || byte(17) != kernels::hq_field_bits(bits, ranks)) {
      throw invalid_argument(where, "payload's field of " + std::to_string(byte(17)) +
                                        " bits does not hold " + std::to_string(ranks) +
                                        " ranks' codes of " + std::to_string(bits) + " bits");
    }
    if (byte(18) != (rotate ? 1u : 0u) || byte(19) != 0) {
      throw invalid_argument(where, "payload's rotate byte " + std::to_string(byte(18)) +
                                        " or reserved byte is not what this compressor writes");
    }
    if (!(scale >= 0) && !std::isnan(scale)) {
      throw invalid_argument(where, "payload's scale " + std::to_string(scale) + " is negative");
    }
    if (summed == 0 || summed > ranks) {
      throw invalid_argument(where, "payload sums " + std::to_string(summed) +
                                        " ranks' codes, sized for 1 to " + std::to_string(ranks));
    }
    const std::size_t size = payload_bytes(count, ranks);
    if (payload.count() != size) {
      throw invalid_argument(where, "payload of " + std::to_string(payload.count()) +
                                        " bytes where " + std::to_string(size) + " are expected");
    }
    require_payload_alignment(name, payload.data(), alignof(std::uint64_t));
    kernels::hq_shape s = shape(count, ranks, rotation[1]);
    s.seed = rotation[0];
    const auto* words = reinterpret_cast<const std::uint64_t*>(payload.data() + body_offset + 8);
    const std::size_t bad = hq_decode(backend, s, words, summed, scale, out.data());
    if (bad != count) {
      throw invalid_argument(where, "payload's field of element " + std::to_string(bad) +
                                        " is above " + std::to_string(summed) + " x 2L");
    }
  }

  /// The body's words after the prefix (the summed count and the fields) in a payload of
  /// `bytes` bytes (`linear_body`).
  static std::size_t body_words(std::size_t bytes) {
    return bytes < body_offset ? 0 : (bytes - body_offset) / 8;
  }

 private:
  void require_type(dtype type) const {
    if (type != dtype::float32 && type != dtype::float64) {
      throw invalid_argument({.operation = name}, "takes float32 or float64 elements, not " +
                                                      std::string(to_string(type)));
    }
  }

  kernels::hq_shape shape(std::size_t count, std::uint32_t ranks, std::uint64_t step) const {
    if (bits < 2 || bits > 8) {
      throw invalid_argument({.operation = name},
                             "codes of " + std::to_string(bits) + " bits (2 to 8)");
    }
    return {.count = count,
            .rotate = rotate,
            .seed = seed,
            .step = step,
            .bits = bits,
            .field = kernels::hq_field_bits(bits, ranks)};
  }

  void write_prefix(std::byte* head, const kernels::hq_shape& s, std::uint32_t ranks,
                    double scale) const {
    head[16] = static_cast<std::byte>(s.bits);
    head[17] = static_cast<std::byte>(s.field);
    head[18] = static_cast<std::byte>(s.rotate ? 1 : 0);
    std::memcpy(head + 20, &ranks, 4);
    std::memcpy(head + 24, &s.seed, 8);
    std::memcpy(head + 32, &s.step, 8);
    std::memcpy(head + 40, &scale, 8);
  }

  /// 56 bytes (header, prefix, summed count) and the words of `count` elements' fields for a
  /// sum over `ranks`; throws on overflow.
  std::size_t payload_bytes(std::size_t count, std::uint32_t ranks) const {
    if (count > std::numeric_limits<std::size_t>::max() / 16) {
      throw invalid_argument({.operation = name},
                             "payload size of " + std::to_string(count) + " elements overflows");
    }
    return body_offset + 8 + 8 * shape(count, ranks, 0).words();
  }
};
static_assert(compressor<homomorphic_compressor>);

}  // namespace squall
