// SPDX-License-Identifier: Apache-2.0
#pragma once
/// The loops of homomorphic quantization (compress/homomorphic.hpp, after THC): a randomized
/// Hadamard rotation in blocks, stochastic rounding of every rotated value to a code in
/// [0, 2L] against a scale all ranks agreed, and the codes packed into fields of 64-bit words
/// wide enough that the words of P ranks add as integers without a carry crossing a field.
/// The per-element math (`hq_code`, `hq_value`, the rotation's signs and butterflies) is
/// `SQUALL_HOST_DEVICE`, for a CUDA twin.

#include <squall/backend/host.hpp>
#include <squall/core/config.hpp>
#include <squall/core/random.hpp>

#include <algorithm>  // min, fill
#include <bit>        // bit_width
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace squall::kernels {

/// The largest rotation block: 1024 elements (4 KiB of floats, in L1 while it is rotated).
inline constexpr std::size_t hq_max_block = 1024;

/// The levels L of `bits`-bit codes: codes 0..2L, the signed level q = code - L in [-L, L].
SQUALL_HOST_DEVICE constexpr std::uint32_t hq_levels(unsigned bits) {
  return (1u << (bits - 1)) - 1u;
}

/// The field width that holds the sum of `ranks` codes of `bits` bits: every code is at most
/// 2L = 2^bits - 2, so P codes sum to at most P (2^bits - 2) < 2^(bits + ceil(log2 P)).
SQUALL_HOST_DEVICE constexpr unsigned hq_field_bits(unsigned bits, std::uint32_t ranks) {
  unsigned extra = 0;
  while ((std::uint64_t{1} << extra) < ranks) ++extra;
  return bits + extra;
}

/// Fields per 64-bit word: floor(64 / width) (a field never straddles two words).
SQUALL_HOST_DEVICE constexpr unsigned hq_fields_per_word(unsigned field) { return 64u / field; }

/// Rademacher sign of element `i` of the rotation keyed by (seed, step): +1 or -1, the same
/// on every rank (the shared stream).
SQUALL_HOST_DEVICE inline bool hq_sign_negative(std::uint64_t seed, std::uint64_t step,
                                                std::uint64_t i) {
  const std::uint32_t word = random_word(seed, {step, shared_rank}, i / 32);
  return ((word >> (i % 32)) & 1u) != 0;
}

/// The stochastic code of `y` (already divided by the step s / L): clamp to [-L, L], shift to
/// [0, 2L], and round down or up with the probability that keeps the mean (`u` in [0, 1)).
template <class A>
SQUALL_HOST_DEVICE inline std::uint64_t hq_code(A scaled, std::uint32_t levels, A u) {
  const A l = static_cast<A>(levels);
  A v = scaled < -l ? -l : scaled;  // a NaN stays NaN through neither branch
  v = v > l ? l : v;
  const A shifted = v + l + u;  // in [0, 2L + 1)
  const A top = static_cast<A>(2 * levels);
  const A c = std::floor(shifted);
  return c >= top ? 2u * levels : c > 0 ? static_cast<std::uint64_t>(c) : 0u;  // NaN: 0
}

/// The rotated value a sum of `contributions` codes stands for: (sum - n L) x step.
template <class A>
SQUALL_HOST_DEVICE inline A hq_value(std::uint64_t sum, std::uint64_t contributions,
                                     std::uint32_t levels, A step) {
  return (static_cast<A>(static_cast<std::int64_t>(sum)) -
          static_cast<A>(static_cast<std::int64_t>(contributions * levels))) *
         step;
}

/// In-place fast Walsh-Hadamard transform of `n` (a power of two) values, scaled by
/// 1 / sqrt(n) so that it is orthonormal and its own inverse.
template <class A>
void hq_hadamard(A* SQUALL_RESTRICT v, std::size_t n) {
  for (std::size_t h = 1; h < n; h *= 2) {
    for (std::size_t i = 0; i < n; i += 2 * h) {
      for (std::size_t j = i; j < i + h; ++j) {
        const A a = v[j];
        const A b = v[j + h];
        v[j] = a + b;
        v[j + h] = a - b;
      }
    }
  }
  const A norm = static_cast<A>(1) / std::sqrt(static_cast<A>(n));
  for (std::size_t j = 0; j < n; ++j) v[j] *= norm;
}

/// Where an hq payload's rotation and codes come from: the tensor's count, its rotation
/// blocks (`hq_max_block` elements each but the last, which is the smallest power of two
/// holding what remains, zero padded; without rotation the last is what remains), the signs'
/// key (seed, step), the code bits and the field width.
struct hq_shape {
  std::size_t count = 0;  ///< elements of the tensor
  bool rotate = true;
  std::uint64_t seed = 0;
  std::uint64_t step = 0;
  unsigned bits = 4;
  unsigned field = 4;

  std::size_t blocks() const { return (count + hq_max_block - 1) / hq_max_block; }
  /// Elements of block `k` after padding.
  std::size_t block_length(std::size_t k) const {
    const std::size_t rest = count - k * hq_max_block;
    if (rest >= hq_max_block) return hq_max_block;
    return rotate ? std::bit_ceil(rest) : rest;
  }
  /// Elements after padding (the padding is rotated and sent with the rest).
  std::size_t padded() const {
    return count == 0 ? 0 : (blocks() - 1) * hq_max_block + block_length(blocks() - 1);
  }
  /// 64-bit words of fields.
  std::size_t words() const {
    const std::size_t f = hq_fields_per_word(field);
    return (padded() + f - 1) / f;
  }
};

namespace detail {

/// Block `k` of `in` (zero-padded past its end), sign-flipped and rotated, into `out`;
/// returns its padded length.
template <class T>
std::size_t hq_rotated_block(const hq_shape& s, const T* in, std::size_t k, T* out) {
  const std::size_t first = k * hq_max_block;
  const std::size_t length = s.block_length(k);
  const std::size_t n = std::min(length, s.count - first);
  for (std::size_t j = 0; j < n; ++j) out[j] = in[first + j];
  std::fill(out + n, out + length, T{0});
  if (!s.rotate) return length;
  for (std::size_t j = 0; j < length; ++j) {
    if (hq_sign_negative(s.seed, s.step, first + j)) out[j] = -out[j];
  }
  hq_hadamard(out, length);
  return length;
}

}  // namespace detail

/// max |y| and the root mean square of y = the rotation of `in` over the padded length; a NaN
/// or infinity anywhere makes max |y| NaN (never skipped).
template <class T>
void hq_range(const host_backend& /*b*/, const hq_shape& s, const T* in, double& max_abs,
              double& rms) {
  std::vector<T> buf(hq_max_block);
  double top = 0;
  double squares = 0;
  bool finite = true;
  for (std::size_t k = 0; k < s.blocks(); ++k) {
    const std::size_t length = detail::hq_rotated_block(s, in, k, buf.data());
    for (std::size_t j = 0; j < length; ++j) {
      const double a = std::fabs(static_cast<double>(buf[j]));
      finite = finite && std::isfinite(a);
      top = a > top ? a : top;
      squares += a * a;
    }
  }
  max_abs = finite ? top : std::nan("");
  rms = s.padded() == 0 ? 0 : std::sqrt(squares / static_cast<double>(s.padded()));
}

/// Writes the codes of the rotation of `in` against `scale` (the agreed range) into `words`
/// (s.words() of them): field i % F of word i / F holds element i's code, drawn from Philox
/// (seed, stream, i). Returns the first element whose value was not finite, or `count`.
template <class T>
std::size_t hq_encode(const host_backend& /*b*/, const hq_shape& s, const T* in, double scale,
                      std::uint64_t seed, random_stream stream, std::uint64_t* words) {
  const std::uint32_t levels = hq_levels(s.bits);
  const unsigned per_word = hq_fields_per_word(s.field);
  const T inverse_step = scale > 0 ? static_cast<T>(levels / scale) : T{0};
  std::fill(words, words + s.words(), std::uint64_t{0});
  std::vector<T> buf(hq_max_block);
  std::vector<std::uint32_t> draws(hq_max_block);  // first is a multiple of 1024: word j
  std::size_t bad = s.count;
  for (std::size_t k = 0; k < s.blocks(); ++k) {
    const std::size_t first = k * hq_max_block;
    const std::size_t length = detail::hq_rotated_block(s, in, k, buf.data());
    philox_fill(seed, stream, first / 4, (length + 3) / 4, draws.data());
    for (std::size_t j = 0; j < length; ++j) {
      const T y = buf[j];
      if (bad == s.count && first + j < s.count && !std::isfinite(in[first + j])) bad = first + j;
      const T u = static_cast<T>(unit_interval(draws[j]));
      const std::uint64_t code = hq_code<T>(y * inverse_step, levels, u);
      const std::size_t i = first + j;
      words[i / per_word] |= code << ((i % per_word) * s.field);
    }
  }
  return bad;
}

/// Decodes words holding the sums of `contributions` ranks' codes into `out` (count
/// elements): (field - n L) x scale / L, rotated back. Returns the first element whose field
/// is above n x 2L (no encoder writes it: a corrupt payload), or `count`.
template <class T>
std::size_t hq_decode(const host_backend& /*b*/, const hq_shape& s, const std::uint64_t* words,
                      std::uint64_t contributions, double scale, T* out) {
  const std::uint32_t levels = hq_levels(s.bits);
  const unsigned per_word = hq_fields_per_word(s.field);
  const std::uint64_t mask = s.field >= 64 ? ~std::uint64_t{0} : (std::uint64_t{1} << s.field) - 1;
  const std::uint64_t top = contributions * 2u * levels;
  const T step = static_cast<T>(scale / levels);
  std::vector<T> buf(hq_max_block);
  for (std::size_t k = 0; k < s.blocks(); ++k) {
    const std::size_t first = k * hq_max_block;
    const std::size_t length = s.block_length(k);
    for (std::size_t j = 0; j < length; ++j) {
      const std::size_t i = first + j;
      const std::uint64_t sum = (words[i / per_word] >> ((i % per_word) * s.field)) & mask;
      if (sum > top) return i < s.count ? i : s.count - 1;
      buf[j] = hq_value<T>(sum, contributions, levels, step);
    }
    if (s.rotate) {
      hq_hadamard(buf.data(), length);
      for (std::size_t j = 0; j < length; ++j) {
        if (hq_sign_negative(s.seed, s.step, first + j)) buf[j] = -buf[j];
      }
    }
    const std::size_t n = std::min(length, s.count - first);
    for (std::size_t j = 0; j < n; ++j) out[first + j] = buf[j];
  }
  return s.count;
}

}  // namespace squall::kernels
