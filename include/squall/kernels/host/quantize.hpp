// SPDX-License-Identifier: Apache-2.0
#pragma once
/// The loops of the bucketed quantizers (compress/quantize.hpp): a scale per bucket, a code per
/// element (deterministic or stochastic rounding to `levels` steps, or a sign bit), and bit
/// packing. The per-element math (`quantize_code`, `dequantize_code`) is `SQUALL_HOST_DEVICE`,
/// shared with the CUDA twin (kernels/cuda/quantize.cuh), so the host tests pin the device math.

#include <squall/backend/host.hpp>
#include <squall/core/config.hpp>
#include <squall/core/float8.hpp>
#include <squall/core/random.hpp>
#include <squall/kernels/host/copy.hpp>  // prefetch_lines, stream_copy

#include <algorithm>  // max, fill_n
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

namespace squall::kernels {

/// How a bucket's scale is computed from its elements.
enum class bucket_scale : std::uint8_t {
  max_abs,   ///< max |v| (int8, TernGrad)
  l2_norm,   ///< sqrt(sum v^2) (QSGD)
  mean_abs,  ///< sum |v| / n (scaled sign, EF-SignSGD)
};

/// A quantization scheme. Codes are `width` bits: for `levels` s, an element becomes a signed
/// level q in [-s, s] stored as q + s; `sign_only` codes are 1 bit, 1 for negative. With
/// `float8` (1: OFP8 E4M3, 2: E5M2; issue 17) the code is instead the 8-bit float of
/// v x s / scale, s being the format's largest finite value (448 or 57344), rounded to
/// nearest even or stochastically: the bucket's largest |v| maps to the format's largest value.
struct quantize_scheme {
  std::uint32_t levels;
  unsigned width;  ///< bits per code: 1, 2, 4 or 8
  bucket_scale scale;
  bool stochastic;  ///< stochastic rounding between neighbouring levels (unbiased)
  bool sign_only;
  std::uint8_t float8 = 0;  ///< 0: integer levels; 1: E4M3 codes; 2: E5M2 codes
};

/// The code of 0 (what a bucket holding a NaN or an Inf sends).
SQUALL_HOST_DEVICE constexpr std::uint8_t zero_code(quantize_scheme q) {
  return q.sign_only || q.float8 != 0 ? std::uint8_t{0} : static_cast<std::uint8_t>(q.levels);
}

/// Whether `code` is one an encoder writes: a level (at most 2s), a sign bit, or a finite
/// 8-bit float. Anything else is a corrupt payload.
SQUALL_HOST_DEVICE constexpr bool valid_code(quantize_scheme q, std::uint8_t code) {
  if (q.sign_only) return code <= 1u;
  if (q.float8 == 1) return (code & 0x7fu) <= squall::detail::e4m3_format::max_finite;
  if (q.float8 == 2) return (code & 0x7fu) <= squall::detail::e5m2_format::max_finite;
  return code <= 2u * q.levels;
}

/// A bucket's scale and whether all its elements were finite.
struct bucket_stats {
  double scale;
  bool finite;
};

/// The code of `v` in a bucket whose finite, positive scale gives `inverse` = levels / scale:
/// |v| x inverse rounded to a level (to nearest, ties away from zero; or, stochastically, up
/// with probability equal to the fraction, from the uniform `word`), with v's sign. Every input
/// gives a code below 2^width (never UB: the level is clamped to [0, s] before any conversion).
template <class T>
SQUALL_HOST_DEVICE SQUALL_FORCEINLINE std::uint8_t quantize_code(quantize_scheme q, T v, T inverse,
                                                                 std::uint32_t word) {
  // Branch-free selects on 32-bit integers, so the host loop vectorizes.
  const std::int32_t negative = v < T(0);
  if (q.sign_only) return static_cast<std::uint8_t>(negative);
  if (q.float8 != 0) {  // |v x inverse| <= s up to rounding; the conversion saturates
    const auto x = static_cast<float>(v * inverse);
    using e4m3 = squall::detail::e4m3_format;
    using e5m2 = squall::detail::e5m2_format;
    if (q.stochastic) {
      return q.float8 == 1 ? squall::detail::float_to_float8_stochastic<e4m3>(x, word)
                           : squall::detail::float_to_float8_stochastic<e5m2>(x, word);
    }
    return q.float8 == 1 ? squall::detail::float_to_float8<e4m3>(x)
                         : squall::detail::float_to_float8<e5m2>(x);
  }
  const T s = static_cast<T>(q.levels);
  T x = (negative ? -v : v) * inverse;
  x = x > T(0) ? x : T(0);  // NaN -> 0
  x = x < s ? x : s;        // rounding above s -> s
  std::int32_t level;
  if (q.stochastic) {
    const auto low = static_cast<std::int32_t>(x);  // floor, x >= 0
    const T fraction = x - static_cast<T>(low);
    if constexpr (std::is_same_v<T, float>) {
      // 24 random bits against the fraction: P(up) = ceil(fraction x 2^24) / 2^24
      level =
          low + (static_cast<float>(static_cast<std::int32_t>(word >> 8)) < fraction * 16777216.0f);
    } else {
      level = low + (static_cast<double>(word) < fraction * 4294967296.0);
    }
  } else {
    level = static_cast<std::int32_t>(x + T(0.5));  // nearest, ties away from zero; <= s
  }
  // low == s has fraction 0, so level never exceeds s
  const auto s32 = static_cast<std::int32_t>(q.levels);
  return static_cast<std::uint8_t>(negative ? s32 - level : s32 + level);
}

/// The value of `code` in a bucket of `scale`; a NaN scale (a bucket that had a NaN or Inf)
/// gives that NaN itself, so the host and the device give the same bits (a GPU's arithmetic
/// on a NaN gives its canonical NaN, x86's the operand's).
template <class T>
SQUALL_HOST_DEVICE SQUALL_FORCEINLINE T dequantize_code(quantize_scheme q, std::uint8_t code,
                                                        T scale) {
  T value;
  if (q.sign_only) {
    value = code ? -scale : scale;
  } else if (q.float8 != 0) {
    const float x = q.float8 == 1
                        ? squall::detail::float8_to_float<squall::detail::e4m3_format>(code)
                        : squall::detail::float8_to_float<squall::detail::e5m2_format>(code);
    value = static_cast<T>(x) * scale * (T(1) / static_cast<T>(q.levels));
  } else {
    // q x scale first, so a subnormal scale loses no more than its own spacing
    value = static_cast<T>(static_cast<std::int32_t>(code) - static_cast<std::int32_t>(q.levels)) *
            scale * (T(1) / static_cast<T>(q.levels));
  }
  return scale != scale ? scale : value;  // NOLINT(misc-redundant-expression): NaN test
}

namespace detail {

/// Elements per inner block of the host loops (codes and random words stay in L1).
inline constexpr std::size_t quantize_block = 1024;

/// Element k's draw, unit k of `stochastic_draw_unit<T>` in the bytes of the Philox words
/// `draws` (read in place, as hq does), as the word the rounding reads (`draw_as_word`).
template <class T>
SQUALL_FORCEINLINE std::uint32_t draw_at(const unsigned char* draws, std::size_t k) {
  stochastic_draw_unit<T> unit;
  std::memcpy(&unit, draws + k * sizeof unit, sizeof unit);
  return draw_as_word<T>(unit);
}

/// Buckets up to this size have their successors prefetched (`quantize`).
inline constexpr std::size_t prefetch_bucket_bytes = std::size_t{16} << 10;

/// The order of a bucket's sum (QSGD's l2 norm, the scaled sign's mean): lane t adds
/// elements t, t + 256, t + 512, ... in turn, then the lanes are added pairwise, lane t taking
/// lane t + s for s = 128, 64, ..., 1; each square and each sum rounded once (no fused
/// multiply-add). The CUDA twin follows the same order (a warp per bucket, 8 lanes' sums in
/// each thread, then shuffles), so a float64 bucket's sum, and so its scale and codes, are
/// the host's bit for bit.
inline constexpr std::size_t bucket_sum_lanes = 256;

/// A float type's bit patterns (shared with the CUDA twin): a magnitude's pattern orders as
/// the magnitude does, one at or above `exponent` is an Inf or a NaN, and `quiet_nan` is
/// std::numeric_limits' quiet NaN, which a non-finite bucket sends as its scale.
template <class T>
struct float_bits {
  using type = std::conditional_t<sizeof(T) == 4, std::uint32_t, std::uint64_t>;
  static constexpr type exponent =
      static_cast<type>(sizeof(T) == 4 ? 0x7f800000ull : 0x7ff0000000000000ull);
  static constexpr type magnitude =
      static_cast<type>(sizeof(T) == 4 ? 0x7fffffffull : 0x7fffffffffffffffull);
  static constexpr type quiet_nan =
      static_cast<type>(sizeof(T) == 4 ? 0x7fc00000ull : 0x7ff8000000000000ull);
};

/// The scale of a bucket and whether it is finite: the largest |v| is the
/// largest of the magnitudes' bit patterns (an integer max, which vectorizes without fast-math),
/// and a pattern at or above the exponent mask is an Inf or a NaN; sums in the order of
/// `bucket_sum_lanes`.
template <bucket_scale S, class T>
SQUALL_NO_TRAPPING_MATH SQUALL_HOST_CLONES_AVX512 bucket_stats
bucket_stats_of(const T* SQUALL_RESTRICT v, std::size_t n) {
  using bits_t = typename float_bits<T>::type;
  constexpr bits_t exponent = float_bits<T>::exponent;
  constexpr bits_t magnitude = float_bits<T>::magnitude;
  const auto magnitude_of = [](T x) {
    bits_t b;
    std::memcpy(&b, &x, sizeof b);
    return static_cast<bits_t>(b & magnitude);
  };
  // the largest magnitude, in any order: 8 lanes in registers
  constexpr std::size_t max_lanes = 8;
  bits_t top[max_lanes] = {};
  const std::size_t whole = n - n % max_lanes;
  for (std::size_t i = 0; i < whole; i += max_lanes) {
    for (std::size_t j = 0; j < max_lanes; ++j) {
      const bits_t b = magnitude_of(v[i + j]);
      top[j] = top[j] > b ? top[j] : b;
    }
  }
  for (std::size_t i = whole; i < n; ++i) top[0] = std::max(top[0], magnitude_of(v[i]));
  bits_t largest = 0;
  for (const bits_t t : top) largest = largest > t ? largest : t;
  double sum = 0;
  // where it sums, a second pass over the bucket (now in L1) in the order of `bucket_sum_lanes`
  if constexpr (S != bucket_scale::max_abs) {
    constexpr std::size_t lanes = bucket_sum_lanes;
    alignas(64) double acc[lanes] = {};
    const auto add = [&](std::size_t j, T x) {
      const double a = std::fabs(static_cast<double>(x));
      const double term = S == bucket_scale::l2_norm ? a * a : a;  // rounded before the sum
      acc[j] += term;
    };
    const std::size_t rows = n - n % lanes;
    for (std::size_t i = 0; i < rows; i += lanes) {
      for (std::size_t j = 0; j < lanes; ++j) add(j, v[i + j]);
    }
    for (std::size_t i = rows; i < n; ++i) add(i - rows, v[i]);
    for (std::size_t half = lanes / 2; half > 0; half /= 2) {
      for (std::size_t t = 0; t < half; ++t) acc[t] += acc[t + half];
    }
    sum = acc[0];
  }
  const bool finite = largest < exponent;
  if constexpr (S == bucket_scale::max_abs) {
    T m;
    std::memcpy(&m, &largest, sizeof m);
    return {static_cast<double>(m), finite};
  } else if constexpr (S == bucket_scale::l2_norm) {
    return {std::sqrt(sum), finite};
  } else {
    return {n ? sum / static_cast<double>(n) : 0.0, finite};
  }
}

/// The 8-bit float codes of a block: integer selects only, so it needs no
/// `SQUALL_NO_TRAPPING_MATH`, under which g++ 12 does not inline the conversion into the
/// loop and leaves it scalar (1.2 GB/s before, docs/performance.md).
template <quantize_scheme Q, class T>
SQUALL_HOST_CLONES_AVX512 void quantize_float8_loop(const T* SQUALL_RESTRICT in, std::size_t n,
                                                    T inverse,
                                                    const unsigned char* SQUALL_RESTRICT draws,
                                                    std::uint8_t* SQUALL_RESTRICT codes) {
  for (std::size_t k = 0; k < n; ++k)
    codes[k] = quantize_code(Q, in[k], inverse, Q.stochastic ? draw_at<T>(draws, k) : 0u);
}

#if defined(SQUALL_HAS_AVX2_PHILOX)
/// `quantize_code`'s 8-bit float codes of floats, 16 a register in AVX-512: to nearest
/// (`float_to_float8`'s operations on the same operands: the normal result rebiased and rounded
/// in integers, the subnormal one from the float adder, both for every lane and one kept) or
/// stochastically from 16-bit draws (`float_to_float8_stochastic`'s: a normal result in
/// integers only, the draw against the dropped bits shifted to the word's top; the float path
/// of a subnormal result only for a register holding one, below 2^-6 / 448 of the bucket's
/// largest for E4M3, 2^-14 / 57344 for E5M2). So the same codes for every float
/// (tests/compress), where g++'s vector form of the loop, 64 elements a pass, spilled registers
/// to the stack (1.47x the stochastic encode, 1.19-1.25x to nearest, docs/performance.md).
/// Codes the whole registers of `n` and returns how many elements that is.
template <class Format, bool Stochastic>
__attribute__((target("avx512f"))) inline std::size_t float8_codes_avx512(
    const float* SQUALL_RESTRICT in, std::size_t n, float inverse,
    const unsigned char* SQUALL_RESTRICT draws, std::uint8_t* SQUALL_RESTRICT codes) {
  constexpr int shift = 23 - Format::man_bits;
  const __m512 scale = _mm512_set1_ps(inverse);
  const __m512i magnitude_mask = _mm512_set1_epi32(0x7fffffff);
  const __m512i rebias = _mm512_set1_epi32(static_cast<int>(Format::rebias));
  const __m512i smallest_normal = _mm512_set1_epi32(static_cast<int>(Format::smallest_normal));
  const __m512i max_finite = _mm512_set1_epi32(Format::max_finite);
  const __m512i quiet_nan = _mm512_set1_epi32(Format::quiet_nan);
  const __m512i infinity = _mm512_set1_epi32(0x7f800000);
  const __m512i sign_bit = _mm512_set1_epi32(0x80);
  const __m512i one = _mm512_set1_epi32(1);
  // to nearest: half a step less one (the lowest kept bit is added apart), and the float whose
  // ulp is the subnormal step
  const __m512i half_less_one = _mm512_set1_epi32((1 << (shift - 1)) - 1);
  const __m512i adder = _mm512_set1_epi32((127 + 24 - Format::bias - Format::man_bits) << 23);
  // stochastic: value / subnormal step, and the draw's word over 2^32
  const __m512 per_step_sub =
      _mm512_set1_ps(static_cast<float>(1u << (Format::bias - 1 + Format::man_bits)));
  const __m512 per_word = _mm512_set1_ps(0x1p-32f);
  // zero-masked forms with every lane selected, as core/random.hpp's (g++ 12's unmasked ones
  // start from an undefined register, which -Wmaybe-uninitialized flags once inlined)
  constexpr __mmask16 all = 0xffff;
  std::size_t k = 0;
  for (; k + 16 <= n; k += 16) {
    const __m512i bits =
        _mm512_castps_si512(_mm512_maskz_mul_ps(all, _mm512_loadu_ps(in + k), scale));
    const __m512i magnitude = _mm512_maskz_and_epi32(all, bits, magnitude_mask);
    const __m512i rebiased = _mm512_maskz_sub_epi32(all, magnitude, rebias);
    const __mmask16 subnormal = _mm512_cmplt_epu32_mask(magnitude, smallest_normal);
    __m512i out;
    if constexpr (Stochastic) {
      const __m512i random = _mm512_maskz_slli_epi32(
          all,
          _mm512_maskz_cvtepu16_epi32(
              all, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(draws + 2 * k))),
          16);
      __m512i lower = _mm512_maskz_srli_epi32(all, rebiased, shift);
      // the dropped bits over 2^shift against the draw over 2^32
      __mmask16 up =
          _mm512_cmplt_epu32_mask(random, _mm512_maskz_slli_epi32(all, magnitude, 32 - shift));
      if (subnormal != 0) {
        const __m512 scaled =
            _mm512_maskz_mul_ps(all, _mm512_castsi512_ps(magnitude), per_step_sub);
        const __m512i sub_code = _mm512_maskz_cvttps_epi32(all, scaled);
        const __m512 fraction =
            _mm512_maskz_sub_ps(all, scaled, _mm512_maskz_cvtepi32_ps(all, sub_code));
        const __m512 threshold =
            _mm512_maskz_mul_ps(all, _mm512_maskz_cvtepu32_ps(all, random), per_word);
        const __mmask16 sub_up = _mm512_cmp_ps_mask(threshold, fraction, _CMP_LT_OQ);
        lower = _mm512_mask_mov_epi32(lower, subnormal, sub_code);
        up = static_cast<__mmask16>((up & ~subnormal) | (sub_up & subnormal));
      }
      out = _mm512_mask_add_epi32(lower, up, lower, one);
    } else {
      const __m512i lowest =
          _mm512_maskz_and_epi32(all, _mm512_maskz_srli_epi32(all, magnitude, shift), one);
      const __m512i normal = _mm512_maskz_srli_epi32(
          all,
          _mm512_maskz_add_epi32(all, _mm512_maskz_add_epi32(all, rebiased, half_less_one), lowest),
          shift);
      const __m512i sub = _mm512_maskz_sub_epi32(
          all,
          _mm512_castps_si512(
              _mm512_maskz_add_ps(all, _mm512_castsi512_ps(magnitude), _mm512_castsi512_ps(adder))),
          adder);
      out = _mm512_mask_mov_epi32(normal, subnormal, sub);
    }
    // a code at or above the largest finite one (an infinity's too) stays it (never up)
    out = _mm512_maskz_min_epu32(all, out, max_finite);
    out = _mm512_mask_mov_epi32(out, _mm512_cmpgt_epu32_mask(magnitude, infinity), quiet_nan);
    out = _mm512_maskz_or_epi32(
        all, out, _mm512_maskz_and_epi32(all, _mm512_maskz_srli_epi32(all, bits, 24), sign_bit));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(codes + k), _mm512_maskz_cvtepi32_epi8(all, out));
  }
  return k;
}

/// `float8_codes_avx512`'s stochastic codes in AVX2 registers, 8 a register, for CPUs without
/// AVX-512: unsigned comparisons as signed ones of the operands with their top bit flipped,
/// selects as blends, the draw's float as the 16-bit draw times 2^-16 (the same value), and the
/// codes narrowed by two saturating packs. The same codes for every float (tests/compress).
/// (To nearest, an AVX2 twin measured 0.98-1.08x of g++'s loop: not kept.) Codes the whole
/// registers of `n` and returns how many elements that is.
template <class Format>
__attribute__((target("avx2"))) inline std::size_t float8_stochastic_avx2(
    const float* SQUALL_RESTRICT in, std::size_t n, float inverse,
    const unsigned char* SQUALL_RESTRICT draws, std::uint8_t* SQUALL_RESTRICT codes) {
  constexpr int shift = 23 - Format::man_bits;
  const __m256 scale = _mm256_set1_ps(inverse);
  const __m256i magnitude_mask = _mm256_set1_epi32(0x7fffffff);
  const __m256i rebias = _mm256_set1_epi32(static_cast<int>(Format::rebias));
  const __m256i smallest_normal = _mm256_set1_epi32(static_cast<int>(Format::smallest_normal));
  const __m256i max_finite = _mm256_set1_epi32(Format::max_finite);
  const __m256i quiet_nan = _mm256_set1_epi32(Format::quiet_nan);
  const __m256i infinity = _mm256_set1_epi32(0x7f800000);
  const __m256i sign_bit = _mm256_set1_epi32(0x80);
  const __m256i flip = _mm256_set1_epi32(static_cast<int>(0x80000000u));
  const __m256 per_step_sub =
      _mm256_set1_ps(static_cast<float>(1u << (Format::bias - 1 + Format::man_bits)));
  const __m256 per_draw = _mm256_set1_ps(0x1p-16f);
  std::size_t k = 0;
  for (; k + 8 <= n; k += 8) {
    const __m256i bits = _mm256_castps_si256(_mm256_mul_ps(_mm256_loadu_ps(in + k), scale));
    const __m256i draw =
        _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(draws + 2 * k)));
    const __m256i magnitude = _mm256_and_si256(bits, magnitude_mask);
    __m256i lower = _mm256_srli_epi32(_mm256_sub_epi32(magnitude, rebias), shift);
    // all ones where up: the draw at the word's top below the dropped bits there, unsigned
    __m256i up =
        _mm256_cmpgt_epi32(_mm256_xor_si256(_mm256_slli_epi32(magnitude, 32 - shift), flip),
                           _mm256_xor_si256(_mm256_slli_epi32(draw, 16), flip));
    const __m256i subnormal = _mm256_cmpgt_epi32(smallest_normal, magnitude);  // both < 2^31
    if (!_mm256_testz_si256(subnormal, subnormal)) {
      const __m256 scaled = _mm256_mul_ps(_mm256_castsi256_ps(magnitude), per_step_sub);
      const __m256i sub_code = _mm256_cvttps_epi32(scaled);
      const __m256 fraction = _mm256_sub_ps(scaled, _mm256_cvtepi32_ps(sub_code));
      const __m256 threshold = _mm256_mul_ps(_mm256_cvtepi32_ps(draw), per_draw);
      const __m256i sub_up = _mm256_castps_si256(_mm256_cmp_ps(threshold, fraction, _CMP_LT_OQ));
      lower = _mm256_blendv_epi8(lower, sub_code, subnormal);
      up = _mm256_blendv_epi8(up, sub_up, subnormal);
    }
    // a code at or above the largest finite one (an infinity's too) stays it, never up
    __m256i out = _mm256_min_epu32(_mm256_sub_epi32(lower, up), max_finite);
    out = _mm256_blendv_epi8(out, quiet_nan, _mm256_cmpgt_epi32(magnitude, infinity));
    out = _mm256_or_si256(out, _mm256_and_si256(_mm256_srli_epi32(bits, 24), sign_bit));
    const __m128i halves =
        _mm_packus_epi32(_mm256_castsi256_si128(out), _mm256_extracti128_si256(out, 1));
    _mm_storel_epi64(reinterpret_cast<__m128i*>(codes + k), _mm_packus_epi16(halves, halves));
  }
  return k;
}
#endif

template <quantize_scheme Q, class T>
SQUALL_NO_TRAPPING_MATH SQUALL_HOST_CLONES_AVX512 void quantize_block_loop(
    const T* SQUALL_RESTRICT in, std::size_t n, T inverse,
    const unsigned char* SQUALL_RESTRICT draws, std::uint8_t* SQUALL_RESTRICT codes) {
  if constexpr (Q.float8 != 0) {
    quantize_float8_loop<Q>(in, n, inverse, draws, codes);
  } else {
    for (std::size_t k = 0; k < n; ++k)
      codes[k] = quantize_code(Q, in[k], inverse, Q.stochastic ? draw_at<T>(draws, k) : 0u);
  }
}

/// The widest registers the CPU has for `float8_codes_avx512` and `float8_stochastic_avx2`.
enum class float8_isa : std::uint8_t { generic, avx2, avx512 };
inline float8_isa float8_isa_here() {
#if defined(SQUALL_HAS_AVX2_PHILOX)
  if (squall::detail::cpu_has_avx512f()) return float8_isa::avx512;
  if (squall::detail::cpu_has_avx2()) return float8_isa::avx2;
#endif
  return float8_isa::generic;
}

/// A block's codes: for 8-bit floats from floats the whole registers in
/// `float8_codes_avx512` or (stochastic) `float8_stochastic_avx2` as `isa` says, the rest, and
/// every other scheme, in `quantize_block_loop` (the same codes).
template <quantize_scheme Q, class T>
void quantize_codes(const T* SQUALL_RESTRICT in, std::size_t n, T inverse,
                    const unsigned char* SQUALL_RESTRICT draws, std::uint8_t* SQUALL_RESTRICT codes,
                    [[maybe_unused]] float8_isa isa) {
  std::size_t done = 0;
#if defined(SQUALL_HAS_AVX2_PHILOX)
  if constexpr (Q.float8 != 0 && std::is_same_v<T, float>) {
    using format = squall::detail::float8_format_of<Q.float8>;
    if (isa == float8_isa::avx512) {
      done = float8_codes_avx512<format, Q.stochastic>(in, n, inverse, draws, codes);
    } else if (isa == float8_isa::avx2) {
      if constexpr (Q.stochastic)
        done = float8_stochastic_avx2<format>(in, n, inverse, draws, codes);
    }
  }
#endif
  if (done < n) {
    quantize_block_loop<Q>(in + done, n - done, inverse,
                           draws + done * sizeof(stochastic_draw_unit<T>), codes + done);
  }
}

/// The lanes of the least-squares fit's sums (`fit_block`): element k of a bucket goes to lane
/// k mod 32, one warp's lanes in the CUDA twin.
inline constexpr std::size_t fit_lanes = 32;

/// The least-squares fit of a bucket's scale to its codes (`quantize`'s `fit`): adds each
/// element's q x v and q^2 (q = code - s, the signed level) of one block of the host loop
/// (`quantize_block` elements from a multiple of it in the bucket, or fewer at its end) to
/// `dot` and `square`, element k to lane k mod `fit_lanes`. A lane's products are summed in T
/// over the block's rows first (float: each product and sum rounded to float; q^2 in 32-bit
/// integers, exact), then added to its double sums. The CUDA twin (`fit_scales_kernel`) sums
/// in this order.
template <quantize_scheme Q, class T>
SQUALL_NO_TRAPPING_MATH SQUALL_HOST_CLONES void fit_block(const T* SQUALL_RESTRICT in,
                                                          const std::uint8_t* SQUALL_RESTRICT codes,
                                                          std::size_t n,
                                                          double* SQUALL_RESTRICT dot,
                                                          double* SQUALL_RESTRICT square) {
  alignas(64) T part[fit_lanes] = {};
  alignas(64) std::int32_t part_square[fit_lanes] = {};
  for (std::size_t row = 0; row < n; row += fit_lanes) {
    const std::size_t m = n - row < fit_lanes ? n - row : fit_lanes;
    for (std::size_t j = 0; j < m; ++j) {
      const std::int32_t q =
          static_cast<std::int32_t>(codes[row + j]) - static_cast<std::int32_t>(Q.levels);
      part[j] += static_cast<T>(q) * in[row + j];
      part_square[j] += q * q;
    }
  }
  for (std::size_t j = 0; j < fit_lanes; ++j) {
    dot[j] += static_cast<double>(part[j]);
    square[j] += static_cast<double>(part_square[j]);
  }
}

/// The lanes' sums of `fit_block` added pairwise (lane t taking lane t + h, h = 16 ... 1, a
/// warp's shuffles in the CUDA twin), then the fitted scale s x dot / square: the scale whose
/// decoded values (q x scale / s) are nearest the bucket's values in L2 for these codes.
/// `sent` is kept where it is not a finite positive scale, where every code is the zero level,
/// or where the fit is not finite in T.
template <quantize_scheme Q, class T>
T fitted_scale(double* dot, double* square, T sent) {
  for (std::size_t half = fit_lanes / 2; half > 0; half /= 2) {
    for (std::size_t t = 0; t < half; ++t) {
      dot[t] += dot[t + half];
      square[t] += square[t + half];
    }
  }
  if (!(sent > T(0)) || !std::isfinite(sent) || !(square[0] > 0)) return sent;
  const auto fitted = static_cast<T>(static_cast<double>(Q.levels) * dot[0] / square[0]);
  return fitted > T(0) && std::isfinite(fitted) ? fitted : sent;
}

/// The same for a bucket whose levels / scale overflows T (a subnormal scale): values and
/// scale go through double multiplied by 2^600 (exact), where levels / scale is finite.
template <quantize_scheme Q, class T>
void quantize_block_wide(const T* in, std::size_t n, double scale, const unsigned char* draws,
                         std::uint8_t* codes) {
  constexpr double up = 0x1p600;
  const double inverse = static_cast<double>(Q.levels) / (scale * up);
  for (std::size_t k = 0; k < n; ++k) {
    codes[k] = quantize_code(Q, static_cast<double>(in[k]) * up, inverse,
                             Q.stochastic ? draw_at<T>(draws, k) : 0u);
  }
}

#if defined(SQUALL_HAS_AVX2_PHILOX)
/// `float8_to_float` times `scale` then `inverse` (the generic loop's products, in its order)
/// for 16 codes a register: a normal code's bits moved and rebiased, a subnormal one's
/// fraction converted and times the step, a code above the largest finite one NaN (or, E5M2's
/// S.11111.00, infinity). Decodes the whole registers of `n` and returns how many elements that
/// is; `valid` is cleared if one of them was above the largest finite code.
template <class Format>
__attribute__((target("avx512f"))) inline std::size_t float8_decode_avx512(
    const std::uint8_t* SQUALL_RESTRICT codes, std::size_t n, float scale, float inverse,
    float* SQUALL_RESTRICT out, bool& valid) {
  constexpr int m = Format::man_bits;
  const __m512i magnitude_mask = _mm512_set1_epi32(0x7f);
  const __m512i rebias = _mm512_set1_epi32(static_cast<int>(Format::rebias));
  const __m512 unit = _mm512_set1_ps(squall::detail::bit_cast<float>(
      static_cast<std::uint32_t>(127 + 1 - Format::bias - m) << 23));
  const __m512i subnormal_end = _mm512_set1_epi32(1 << m);
  const __m512i max_finite = _mm512_set1_epi32(Format::max_finite);
  const __m512i infinity_code = _mm512_set1_epi32(static_cast<int>(Format::infinity_code));
  const __m512i quiet_nan = _mm512_set1_epi32(0x7fc00000);
  const __m512i infinity = _mm512_set1_epi32(0x7f800000);
  const __m512 by_scale = _mm512_set1_ps(scale);
  const __m512 by_inverse = _mm512_set1_ps(inverse);
  constexpr __mmask16 all = 0xffff;  // zero-masked forms, as `float8_codes_avx512`'s
  __mmask16 over = 0;
  std::size_t k = 0;
  for (; k + 16 <= n; k += 16) {
    const __m512i code = _mm512_maskz_cvtepu8_epi32(
        all, _mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + k)));
    const __m512i magnitude = _mm512_maskz_and_epi32(all, code, magnitude_mask);
    __m512i bits =
        _mm512_maskz_add_epi32(all, _mm512_maskz_slli_epi32(all, magnitude, 23 - m), rebias);
    const __m512 subnormal =
        _mm512_maskz_mul_ps(all, _mm512_maskz_cvtepi32_ps(all, magnitude), unit);
    bits = _mm512_mask_mov_epi32(bits, _mm512_cmplt_epu32_mask(magnitude, subnormal_end),
                                 _mm512_castps_si512(subnormal));
    const __mmask16 beyond = _mm512_cmpgt_epu32_mask(magnitude, max_finite);
    over = static_cast<__mmask16>(over | beyond);
    const __m512i special = _mm512_mask_mov_epi32(
        quiet_nan, _mm512_cmpeq_epi32_mask(magnitude, infinity_code), infinity);
    bits = _mm512_mask_mov_epi32(bits, beyond, special);
    bits = _mm512_maskz_or_epi32(
        all, bits,
        _mm512_maskz_slli_epi32(all, _mm512_maskz_andnot_epi32(all, magnitude_mask, code), 24));
    const __m512 value = _mm512_maskz_mul_ps(all, _mm512_castsi512_ps(bits), by_scale);
    _mm512_storeu_ps(out + k, _mm512_maskz_mul_ps(all, value, by_inverse));
  }
  if (over != 0) valid = false;
  return k;
}

/// The top 16 bits of the floats of `Format`'s subnormal codes (and zero), by fraction, their
/// low and high bytes apart: `float8_decode_avx2`'s byte shuffles.
template <class Format>
struct float8_subnormal_tops {
  alignas(16) std::uint8_t low[16];
  alignas(16) std::uint8_t high[16];
  constexpr float8_subnormal_tops() : low{}, high{} {
    for (unsigned f = 0; f < (1u << Format::man_bits); ++f) {
      const std::uint32_t top =
          squall::detail::bit_cast<std::uint32_t>(
              squall::detail::float8_to_float<Format>(static_cast<std::uint8_t>(f))) >>
          16;
      low[f] = static_cast<std::uint8_t>(top);
      high[f] = static_cast<std::uint8_t>(top >> 8);
    }
  }
};
template <class Format>
inline constexpr float8_subnormal_tops<Format> float8_subnormal_tops_v{};

/// `float8_decode_avx512` in AVX2 registers, 16 codes a register in 16-bit lanes: every code's
/// float has its low 16 bits zero, so its top 16 are computed (a subnormal code's looked up by
/// its fraction in a 16-entry byte shuffle) and become the top halves of 32-bit lanes by
/// interleaving with zeros. The comparisons are signed (every operand is below 2^8).
template <class Format>
__attribute__((target("avx2"))) inline std::size_t float8_decode_avx2(
    const std::uint8_t* SQUALL_RESTRICT codes, std::size_t n, float scale, float inverse,
    float* SQUALL_RESTRICT out, bool& valid) {
  constexpr int m = Format::man_bits;
  constexpr const float8_subnormal_tops<Format>& tops = float8_subnormal_tops_v<Format>;
  const __m256i subnormal_low =
      _mm256_broadcastsi128_si256(_mm_load_si128(reinterpret_cast<const __m128i*>(tops.low)));
  const __m256i subnormal_high =
      _mm256_broadcastsi128_si256(_mm_load_si128(reinterpret_cast<const __m128i*>(tops.high)));
  const __m256i magnitude_mask = _mm256_set1_epi16(0x7f);
  const __m256i rebias = _mm256_set1_epi16(static_cast<short>(Format::rebias >> 16));
  const __m256i subnormal_end = _mm256_set1_epi16(1 << m);
  const __m256i max_finite = _mm256_set1_epi16(Format::max_finite);
  const __m256i infinity_code = _mm256_set1_epi16(static_cast<short>(Format::infinity_code));
  const __m256i quiet_nan = _mm256_set1_epi16(0x7fc0);
  const __m256i infinity = _mm256_set1_epi16(0x7f80);
  const __m256i zero = _mm256_setzero_si256();
  const __m256 by_scale = _mm256_set1_ps(scale);
  const __m256 by_inverse = _mm256_set1_ps(inverse);
  __m256i over = _mm256_setzero_si256();
  std::size_t k = 0;
  for (; k + 16 <= n; k += 16) {
    // codes 0-3, 8-11 | 4-7, 12-15, so that the interleaves below give 0-7 and 8-15
    const __m256i code = _mm256_permute4x64_epi64(
        _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + k))), 0xd8);
    const __m256i magnitude = _mm256_and_si256(code, magnitude_mask);
    __m256i top = _mm256_add_epi16(_mm256_slli_epi16(magnitude, 7 - m), rebias);
    const __m256i subnormal =
        _mm256_or_si256(_mm256_shuffle_epi8(subnormal_low, magnitude),
                        _mm256_slli_epi16(_mm256_shuffle_epi8(subnormal_high, magnitude), 8));
    top = _mm256_blendv_epi8(top, subnormal, _mm256_cmpgt_epi16(subnormal_end, magnitude));
    const __m256i beyond = _mm256_cmpgt_epi16(magnitude, max_finite);
    over = _mm256_or_si256(over, beyond);
    const __m256i special =
        _mm256_blendv_epi8(quiet_nan, infinity, _mm256_cmpeq_epi16(magnitude, infinity_code));
    top = _mm256_blendv_epi8(top, special, beyond);
    top = _mm256_or_si256(top, _mm256_slli_epi16(_mm256_andnot_si256(magnitude_mask, code), 8));
    const __m256 first = _mm256_castsi256_ps(_mm256_unpacklo_epi16(zero, top));
    const __m256 second = _mm256_castsi256_ps(_mm256_unpackhi_epi16(zero, top));
    _mm256_storeu_ps(out + k, _mm256_mul_ps(_mm256_mul_ps(first, by_scale), by_inverse));
    _mm256_storeu_ps(out + k + 8, _mm256_mul_ps(_mm256_mul_ps(second, by_scale), by_inverse));
  }
  if (!_mm256_testz_si256(over, over)) valid = false;
  return k;
}
#endif

/// Decodes `n` 8-bit float codes (`float8_to_float`, selects only: it needs no
/// `SQUALL_NO_TRAPPING_MATH`, under which g++ 12 would not inline it); returns whether every
/// code is valid.
template <quantize_scheme Q, class T>
SQUALL_HOST_CLONES bool dequantize_float8_loop(const std::uint8_t* SQUALL_RESTRICT codes,
                                               std::size_t n, T scale, T* SQUALL_RESTRICT out) {
  using format = squall::detail::float8_format_of<Q.float8>;
  const T inverse = T(1) / static_cast<T>(Q.levels);
  unsigned over = 0;
  for (std::size_t k = 0; k < n; ++k) {  // the order of `dequantize_code`'s products
    over |= static_cast<unsigned>(!valid_code(Q, codes[k]));
    out[k] = static_cast<T>(squall::detail::float8_to_float<format>(codes[k])) * scale * inverse;
  }
  return over == 0;
}

/// Decodes `n` integer-level codes; returns whether every code is valid (`valid_code`).
template <quantize_scheme Q, class T>
SQUALL_NO_TRAPPING_MATH SQUALL_HOST_CLONES bool dequantize_block_loop(
    const std::uint8_t* SQUALL_RESTRICT codes, std::size_t n, T scale, T* SQUALL_RESTRICT out) {
  static_assert(Q.float8 == 0, "8-bit floats decode in dequantize_float8_loop");
  unsigned over = 0;
  for (std::size_t k = 0; k < n; ++k) {
    over |= static_cast<unsigned>(!valid_code(Q, codes[k]));
    out[k] = dequantize_code(Q, codes[k], scale);
  }
  return over == 0;
}

/// A block's decoded values: for 8-bit floats to floats the whole registers in
/// `float8_decode_avx512` or `float8_decode_avx2` as `isa` says and the rest in
/// `dequantize_float8_loop`, every other scheme in `dequantize_block_loop` (the same values).
/// Returns whether every code is valid.
template <quantize_scheme Q, class T>
bool dequantize_codes(const std::uint8_t* SQUALL_RESTRICT codes, std::size_t n, T scale,
                      T* SQUALL_RESTRICT out, [[maybe_unused]] float8_isa isa) {
  if constexpr (Q.float8 == 0) {
    return dequantize_block_loop<Q>(codes, n, scale, out);
  } else {
    std::size_t done = 0;
    bool valid = true;
#if defined(SQUALL_HAS_AVX2_PHILOX)
    if constexpr (std::is_same_v<T, float>) {
      using format = squall::detail::float8_format_of<Q.float8>;
      const float inverse = 1.0f / static_cast<float>(Q.levels);
      if (isa == float8_isa::avx512) {
        done = float8_decode_avx512<format>(codes, n, scale, inverse, out, valid);
      } else if (isa == float8_isa::avx2) {
        done = float8_decode_avx2<format>(codes, n, scale, inverse, out, valid);
      }
    }
#endif
    if (done < n && !dequantize_float8_loop<Q>(codes + done, n - done, scale, out + done))
      valid = false;
    return valid;
  }
}

/// Packs `n` codes of W bits, element k at bits [k W, (k + 1) W) of the stream, low bits first.
template <unsigned W>
SQUALL_HOST_CLONES_AVX512 void pack_codes(const std::uint8_t* SQUALL_RESTRICT codes, std::size_t n,
                                          std::uint8_t* SQUALL_RESTRICT out) {
  if constexpr (W == 8) {
    std::memcpy(out, codes, n);
  } else {
    constexpr unsigned per = 8 / W;
    const std::size_t full = n / per;
    for (std::size_t j = 0; j < full; ++j) {
      unsigned b = 0;
      for (unsigned t = 0; t < per; ++t) b |= static_cast<unsigned>(codes[j * per + t]) << (t * W);
      out[j] = static_cast<std::uint8_t>(b);
    }
    if (n % per != 0) {
      unsigned b = 0;
      for (std::size_t t = 0; t < n % per; ++t)
        b |= static_cast<unsigned>(codes[full * per + t]) << (t * W);
      out[full] = static_cast<std::uint8_t>(b);
    }
  }
}

/// The codes of every byte value, 8 / W of them per byte: a table built at compile time.
template <unsigned W>
struct code_table {
  static constexpr unsigned per = 8 / W;
  std::uint8_t codes[256][per];
  constexpr code_table() : codes{} {
    for (unsigned b = 0; b < 256; ++b) {
      for (unsigned t = 0; t < per; ++t)
        codes[b][t] = static_cast<std::uint8_t>((b >> (t * W)) & ((1u << W) - 1));
    }
  }
};
template <unsigned W>
inline constexpr code_table<W> code_table_v{};

template <unsigned W>
SQUALL_HOST_CLONES void unpack_codes(const std::uint8_t* SQUALL_RESTRICT in, std::size_t n,
                                     std::uint8_t* SQUALL_RESTRICT codes) {
  if constexpr (W == 8) {
    std::memcpy(codes, in, n);
  } else {
    constexpr unsigned per = 8 / W;
    const std::size_t full = n / per;
    for (std::size_t j = 0; j < full; ++j)
      std::memcpy(codes + j * per, code_table_v<W>.codes[in[j]], per);
    for (std::size_t k = full * per; k < n; ++k)
      codes[k] = code_table_v<W>.codes[in[full]][k - full * per];
  }
}

}  // namespace detail

/// Encodes `count` elements in buckets of `bucket` (a multiple of 8, except a single bucket
/// covering all): `scales[b]` gets bucket b's scale (NaN if the bucket holds a NaN or Inf,
/// whose codes are then the zero level) and `codes` the packed codes,
/// ceil(count x width / 8) bytes. Stochastic draws are `stochastic_draw<T>(seed, stream, element)`.
/// Returns the index of the first non-finite element, or `count` if all are finite (the host
/// finds it whatever `find_non_finite`, which spares the device twin its wait when false).
/// With `fit` (integer levels only), each usable bucket's scale is then refitted to its codes
/// by least squares (`detail::fitted_scale`): the codes are unchanged, the decoded bucket is
/// nearer the input than with the unfitted scale, and nearer than 0 whenever a code is not the
/// zero level (a contraction, biased; docs/compressors.md).
template <quantize_scheme Q, class T>
std::size_t quantize(const host_backend& /*backend*/, const T* in, std::size_t count,
                     std::size_t bucket, T* scales, std::uint8_t* codes, std::uint64_t seed,
                     random_stream stream, bool /*find_non_finite*/ = true, bool fit = false) {
  static_assert(detail::quantize_block % detail::fit_lanes == 0);
  std::size_t first_bad = count;
  std::uint8_t block_codes[detail::quantize_block];
  // a block's Philox words, element k's draw unit k of their bytes (`detail::draw_at`)
  alignas(64) std::uint32_t random[detail::quantize_block * sizeof(stochastic_draw_unit<T>) / 4];
  const auto* draws = reinterpret_cast<const unsigned char*>(random);
  alignas(64) double dot[detail::fit_lanes];
  alignas(64) double square[detail::fit_lanes];
  const detail::float8_isa isa = detail::float8_isa_here();
  // Small buckets alternate a read of the bucket from memory (its scale) with a pass in L1
  // (its codes), during which the hardware prefetcher has no misses to follow; asking for the
  // bucket after next at each bucket keeps memory busy through the second pass (1.4x the
  // encode of 512-element buckets on the 2-core Xeon, docs/performance.md).
  const bool prefetch = bucket * sizeof(T) <= detail::prefetch_bucket_bytes;
  for (std::size_t begin = 0, b = 0; begin < count; begin += bucket, ++b) {
    const std::size_t n = count - begin < bucket ? count - begin : bucket;
    if (prefetch && count - begin > 2 * bucket) {
      const std::size_t ahead =
          count - begin - 2 * bucket < bucket ? count - begin - 2 * bucket : bucket;
      prefetch_lines(in + begin + 2 * bucket, ahead * sizeof(T));
    }
    const bucket_stats stats = detail::bucket_stats_of<Q.scale>(in + begin, n);
    const T scale = static_cast<T>(stats.scale);
    const bool usable = stats.finite && scale > T(0) && std::isfinite(scale);
    const T inverse = static_cast<T>(static_cast<double>(Q.levels) / stats.scale);
    const T sent = stats.finite ? scale : std::numeric_limits<T>::quiet_NaN();
    std::memcpy(scales + b, &sent, sizeof sent);  // payloads need not be aligned
    if (!stats.finite && first_bad == count) {
      for (std::size_t k = 0; k < n; ++k) {
        if (!std::isfinite(in[begin + k])) {
          first_bad = begin + k;
          break;
        }
      }
    }
    const bool fitting = Q.float8 == 0 && !Q.sign_only && fit && usable;
    if (fitting) {
      std::fill_n(dot, detail::fit_lanes, 0.0);
      std::fill_n(square, detail::fit_lanes, 0.0);
    }
    for (std::size_t off = 0; off < n; off += detail::quantize_block) {
      const std::size_t m = n - off < detail::quantize_block ? n - off : detail::quantize_block;
      const std::size_t first = begin + off;  // a multiple of 8 unless it is element 0's bucket
      if (!usable) {
        std::memset(block_codes, zero_code(Q), m);
      } else {
        if constexpr (Q.stochastic) {
          stochastic_draws_fill<T>(seed, stream, first, m, random);
        }
        if (std::isfinite(inverse)) {
          detail::quantize_codes<Q>(in + first, m, inverse, draws, block_codes, isa);
        } else {
          detail::quantize_block_wide<Q>(in + first, m, stats.scale, draws, block_codes);
        }
      }
      // 8-bit codes too go through the block in L1 and a copy: written in place, int8's
      // encode ran 0.81-0.85x and E4M3 fp8's 0.84x as fast (docs/performance.md)
      detail::pack_codes<Q.width>(block_codes, m, codes + first * Q.width / 8);
      if (fitting) detail::fit_block<Q>(in + first, block_codes, m, dot, square);
    }
    if (fitting) {
      const T fitted = detail::fitted_scale<Q>(dot, square, sent);
      std::memcpy(scales + b, &fitted, sizeof fitted);
    }
  }
  return first_bad;
}

/// Decodes what `quantize` wrote: `count` elements from `scales` and packed `codes`. Returns
/// the index of the first element whose code is not valid (above 2s: a corrupt payload, as
/// 2s + 1 levels need not fill the code width; or an 8-bit float NaN or infinity), or
/// `count` if all are. Outputs of `stream_from` bytes or more are written with non-temporal
/// stores (`stream_output_bytes`; the same values).
template <quantize_scheme Q, class T>
std::size_t dequantize(const host_backend& /*backend*/, const T* scales, const std::uint8_t* codes,
                       std::size_t count, std::size_t bucket, T* out,
                       std::size_t stream_from = stream_output_bytes) {
  std::size_t first_bad = count;
  std::uint8_t block_codes[detail::quantize_block];
  alignas(64) T values[detail::quantize_block];  // a block's values, when streamed out
  const bool streamed = count * sizeof(T) >= stream_from;
  const detail::float8_isa isa = detail::float8_isa_here();
  for (std::size_t begin = 0, b = 0; begin < count; begin += bucket, ++b) {
    const std::size_t n = count - begin < bucket ? count - begin : bucket;
    for (std::size_t off = 0; off < n; off += detail::quantize_block) {
      const std::size_t m = n - off < detail::quantize_block ? n - off : detail::quantize_block;
      const std::size_t first = begin + off;
      // 8-bit codes are read in place
      const std::uint8_t* const unpacked = Q.width == 8 ? codes + first : block_codes;
      if constexpr (Q.width != 8) {
        detail::unpack_codes<Q.width>(codes + first * Q.width / 8, m, block_codes);
      }
      T scale;
      std::memcpy(&scale, scales + b, sizeof scale);  // payloads need not be aligned
      if (!detail::dequantize_codes<Q>(unpacked, m, scale, streamed ? values : out + first, isa) &&
          first_bad == count) {
        std::size_t k = 0;
        while (valid_code(Q, unpacked[k])) ++k;
        first_bad = first + k;
      }
      if (streamed) {
        stream_copy(reinterpret_cast<std::byte*>(out + first),
                    reinterpret_cast<const std::byte*>(values), m * sizeof(T), false);
      }
    }
  }
  if (streamed) stream_fence();
  return first_bad;
}

}  // namespace squall::kernels
