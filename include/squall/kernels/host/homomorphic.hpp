// SPDX-License-Identifier: Apache-2.0
#pragma once
/// The loops of homomorphic quantization (compress/homomorphic.hpp, after THC): a randomized
/// Hadamard rotation in blocks, stochastic rounding of every rotated value to a code in
/// [0, 2L] against a scale all ranks agreed, and the codes packed into fields of 64-bit words
/// wide enough that the words of P ranks add as integers without a carry crossing a field.
/// The per-element math (`hq_code`, the field widths) is `SQUALL_HOST_DEVICE`, shared with the
/// CUDA twins (kernels/cuda/homomorphic.cuh, in phases of kernels/host/homomorphic_phases.hpp).

#include <squall/backend/host.hpp>
#include <squall/core/config.hpp>
#include <squall/core/random.hpp>
#include <squall/kernels/host/copy.hpp>
#include <squall/kernels/host/select.hpp>  // first_non_finite

#include <algorithm>  // min, fill
#include <bit>        // bit_width
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>  // memcpy
#include <limits>
#include <type_traits>

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

/// The fields' layout: words in groups of `hq_group_words`, each group holding F x 8 elements
/// (F fields per word); element r of a group sits in field r / 8 of the group's word r % 8.
/// Eight consecutive elements share a field position across the eight words (one cache line),
/// so a group packs and unpacks as 8-lane vectors, one shift per field.
inline constexpr std::size_t hq_group_words = 8;

/// Where element `i` sits: its word and the field's index in it (shift = field x width).
struct hq_place {
  std::size_t word;
  unsigned field;
};
SQUALL_HOST_DEVICE constexpr hq_place hq_place_of(std::size_t i, unsigned per_word) {
  const std::size_t group = std::size_t{per_word} * hq_group_words;
  const std::size_t r = i % group;
  return {i / group * hq_group_words + r % hq_group_words,
          static_cast<unsigned>(r / hq_group_words)};
}

/// 64-bit words holding `n` elements of F = `per_word` fields a word: whole groups, then as
/// many words of the last group as its elements reach (at most 8).
SQUALL_HOST_DEVICE constexpr std::size_t hq_words_for(std::size_t n, unsigned per_word) {
  const std::size_t group = std::size_t{per_word} * hq_group_words;
  const std::size_t rest = n % group;
  return n / group * hq_group_words + (rest < hq_group_words ? rest : hq_group_words);
}

/// The stochastic code of `scaled` (a rotated value divided by the step s / L): shifted to
/// [0, 2L], clamped there (a NaN becomes 0), and rounded down or up with the probability that
/// keeps the mean, from `draw`, uniform in [0, 2^stochastic_draw_bits<A>). Branch-free selects, so
/// the host loop vectorizes.
template <class A>
SQUALL_HOST_DEVICE SQUALL_FORCEINLINE std::uint8_t hq_code(A scaled, std::uint32_t levels,
                                                           std::uint32_t draw) {
  const A top = static_cast<A>(2 * levels);
  A x = scaled + static_cast<A>(levels);
  x = x > A(0) ? x : A(0);  // NaN -> 0
  x = x < top ? x : top;
  const auto low = static_cast<std::int32_t>(x);  // floor, x >= 0
  const A fraction = x - static_cast<A>(low);
  std::int32_t up;
  if constexpr (std::is_same_v<A, float>) {
    up = static_cast<float>(static_cast<std::int32_t>(draw)) < fraction * 65536.0f;  // exact
  } else {
    up = static_cast<double>(draw) < fraction * 4294967296.0;
  }
  return static_cast<std::uint8_t>(low + up);  // low == 2L has fraction 0
}

namespace detail {

/// The first three stages (butterflies at distances 1, 2 and 4) on each group of 8 of `n`
/// values, as written: the sums and differences of `hq_hadamard` in its order.
template <class A>
void hq_hadamard8(A* SQUALL_RESTRICT v, std::size_t n) {
  for (std::size_t i = 0; i < n; i += 8) {
    A* g = v + i;
    const A a0 = g[0] + g[1], a1 = g[0] - g[1], a2 = g[2] + g[3], a3 = g[2] - g[3];
    const A a4 = g[4] + g[5], a5 = g[4] - g[5], a6 = g[6] + g[7], a7 = g[6] - g[7];
    const A b0 = a0 + a2, b1 = a1 + a3, b2 = a0 - a2, b3 = a1 - a3;
    const A b4 = a4 + a6, b5 = a5 + a7, b6 = a4 - a6, b7 = a5 - a7;
    g[0] = b0 + b4, g[1] = b1 + b5, g[2] = b2 + b6, g[3] = b3 + b7;
    g[4] = b0 - b4, g[5] = b1 - b5, g[6] = b2 - b6, g[7] = b3 - b7;
  }
}

/// Where a rotation (`hq_rotate`) reads a block from: floats as they are, floats with the
/// rotation's random signs (`hq_apply_signs`' products), or the sums of a payload's fields as
/// `hq_values` turns them into values.
enum class hq_source { values, signed_values, sums };

#if defined(SQUALL_HAS_AVX2_PHILOX)
/// The first three stages on the 8 floats of one AVX register: each stage swaps the partners
/// within the register and blends x + partner (lower lane of the pair) with partner - x (upper
/// lane), the same operations on the same operands as `hq_hadamard8`, so the same bits.
/// With `Flip`, partner + x with the upper lane's x negated (a sign flip, then one add where
/// the blend of a sum and a difference took three operations): the same bits, but for the sign
/// of a NaN, which an encode's codes do not see (a NaN codes to 0).
template <bool Flip = false>
__attribute__((target("avx2"), always_inline)) inline __m256 hq_stages8_avx2(__m256 x) {
  if constexpr (Flip) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 p = _mm256_permute_ps(x, 0xb1);  // distance 1
    x = _mm256_add_ps(p, _mm256_xor_ps(x, _mm256_blend_ps(_mm256_setzero_ps(), sign, 0xaa)));
    p = _mm256_permute_ps(x, 0x4e);  // distance 2
    x = _mm256_add_ps(p, _mm256_xor_ps(x, _mm256_blend_ps(_mm256_setzero_ps(), sign, 0xcc)));
    p = _mm256_permute2f128_ps(x, x, 1);  // distance 4
    return _mm256_add_ps(p, _mm256_xor_ps(x, _mm256_blend_ps(_mm256_setzero_ps(), sign, 0xf0)));
  } else {
    __m256 p = _mm256_permute_ps(x, 0xb1);  // distance 1
    x = _mm256_blend_ps(_mm256_add_ps(x, p), _mm256_sub_ps(p, x), 0xaa);
    p = _mm256_permute_ps(x, 0x4e);  // distance 2
    x = _mm256_blend_ps(_mm256_add_ps(x, p), _mm256_sub_ps(p, x), 0xcc);
    p = _mm256_permute2f128_ps(x, x, 1);  // distance 4
    return _mm256_blend_ps(_mm256_add_ps(x, p), _mm256_sub_ps(p, x), 0xf0);
  }
}

/// The same three stages in AVX registers (g++ keeps the scalar form scalar).
__attribute__((target("avx2"))) inline void hq_hadamard8_avx2(float* v, std::size_t n) {
  for (std::size_t i = 0; i < n; i += 8)
    _mm256_storeu_ps(v + i, hq_stages8_avx2(_mm256_loadu_ps(v + i)));
}
__attribute__((target("avx2"))) inline void hq_hadamard8_avx2(double* v, std::size_t n) {
  for (std::size_t i = 0; i < n; i += 8) {
    __m256d x = _mm256_loadu_pd(v + i);
    __m256d y = _mm256_loadu_pd(v + i + 4);
    __m256d p = _mm256_permute_pd(x, 0x5);  // distance 1
    __m256d q = _mm256_permute_pd(y, 0x5);
    x = _mm256_blend_pd(_mm256_add_pd(x, p), _mm256_sub_pd(p, x), 0xa);
    y = _mm256_blend_pd(_mm256_add_pd(y, q), _mm256_sub_pd(q, y), 0xa);
    p = _mm256_permute2f128_pd(x, x, 1);  // distance 2
    q = _mm256_permute2f128_pd(y, y, 1);
    x = _mm256_blend_pd(_mm256_add_pd(x, p), _mm256_sub_pd(p, x), 0xc);
    y = _mm256_blend_pd(_mm256_add_pd(y, q), _mm256_sub_pd(q, y), 0xc);
    _mm256_storeu_pd(v + i, _mm256_add_pd(x, y));  // distance 4: two registers
    _mm256_storeu_pd(v + i + 4, _mm256_sub_pd(x, y));
  }
}

/// +1 or -1 for elements j to j + 7 (j a multiple of 8) by sign bits j to j + 7 of `signs`:
/// the factors (1 - 2 bit) of `hq_apply_signs`.
__attribute__((target("avx2"), always_inline)) inline __m256 hq_signs8_avx2(
    const std::uint32_t* signs, std::size_t j) {
  const __m256i lane_bits = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
  const __m256i bits =
      _mm256_and_si256(_mm256_set1_epi32(static_cast<int>(signs[j / 32] >> (j % 32))), lane_bits);
  const __m256 negate = _mm256_castsi256_ps(_mm256_cmpeq_epi32(bits, lane_bits));
  return _mm256_blendv_ps(_mm256_set1_ps(1.0f), _mm256_set1_ps(-1.0f), negate);
}

/// Floats j to j + 7 of a rotation's source (`hq_source`): as they are; with their signs
/// flipped by sign bits j to j + 7 of `signs` (`hq_apply_signs`' x (1 - 2 bit), but for a
/// NaN's sign: the encode's source); or (float(sum) - n L) x step of the sums (`hq_values`;
/// every sum is below 2^31).
template <hq_source From>
__attribute__((target("avx2"), always_inline)) inline __m256 hq_load8_avx2(
    const void* src, std::size_t j, const std::uint32_t* signs, __m256 offsets, __m256 steps) {
  if constexpr (From == hq_source::sums) {
    const auto* sums = static_cast<const std::uint32_t*>(src) + j;
    const __m256i s = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(sums));
    return _mm256_mul_ps(_mm256_sub_ps(_mm256_cvtepi32_ps(s), offsets), steps);
  } else {
    const __m256 x = _mm256_loadu_ps(static_cast<const float*>(src) + j);
    if constexpr (From == hq_source::values) {
      return x;
    } else {
      // sign bit j + l of `signs` moved to bit 31 of lane l, flipping x's sign: x (1 - 2 bit)
      // but for a NaN's sign (an encode's, which its codes do not see)
      const __m256i word = _mm256_set1_epi32(static_cast<int>(signs[j / 32] >> (j % 32)));
      const __m256i up = _mm256_sllv_epi32(word, _mm256_setr_epi32(31, 30, 29, 28, 27, 26, 25, 24));
      return _mm256_xor_ps(x,
                           _mm256_castsi256_ps(_mm256_and_si256(up, _mm256_set1_epi32(INT32_MIN))));
    }
  }
}

/// One butterfly between two registers: a + b into a, a - b into b.
__attribute__((target("avx2"), always_inline)) inline void hq_butterfly_avx2(__m256& a, __m256& b) {
  const __m256 sum = _mm256_add_ps(a, b);
  b = _mm256_sub_ps(a, b);
  a = sum;
}

/// The first six stages (distances 1 to 32) of the rotation of `n` values (a multiple of 64)
/// into `dst`, 64 at a time in eight AVX registers: the three within a register as
/// `hq_stages8_avx2`, the three between registers as a + b and a - b of whole registers. One
/// pass over the block where the separate sign pass, the first three stages and the radix-4
/// pass at distances 8 and 16 took three (and the value pass of a decode, a fourth); the same
/// operations on the same operands in the same order, so the same bits. `dst` may be `src`.
template <hq_source From>
__attribute__((target("avx2"))) void hq_hadamard64_avx2(float* dst, const void* src, std::size_t n,
                                                        const std::uint32_t* signs = nullptr,
                                                        float offset = 0, float step = 0) {
  const __m256 offsets = _mm256_set1_ps(offset);
  const __m256 steps = _mm256_set1_ps(step);
  constexpr bool flip = From == hq_source::signed_values;  // an encode's: NaN signs unseen
  for (std::size_t i = 0; i < n; i += 64) {
    __m256 r0 = hq_stages8_avx2<flip>(hq_load8_avx2<From>(src, i, signs, offsets, steps));
    __m256 r1 = hq_stages8_avx2<flip>(hq_load8_avx2<From>(src, i + 8, signs, offsets, steps));
    __m256 r2 = hq_stages8_avx2<flip>(hq_load8_avx2<From>(src, i + 16, signs, offsets, steps));
    __m256 r3 = hq_stages8_avx2<flip>(hq_load8_avx2<From>(src, i + 24, signs, offsets, steps));
    __m256 r4 = hq_stages8_avx2<flip>(hq_load8_avx2<From>(src, i + 32, signs, offsets, steps));
    __m256 r5 = hq_stages8_avx2<flip>(hq_load8_avx2<From>(src, i + 40, signs, offsets, steps));
    __m256 r6 = hq_stages8_avx2<flip>(hq_load8_avx2<From>(src, i + 48, signs, offsets, steps));
    __m256 r7 = hq_stages8_avx2<flip>(hq_load8_avx2<From>(src, i + 56, signs, offsets, steps));
    hq_butterfly_avx2(r0, r1), hq_butterfly_avx2(r2, r3), hq_butterfly_avx2(r4, r5),
        hq_butterfly_avx2(r6, r7);  // distance 8
    hq_butterfly_avx2(r0, r2), hq_butterfly_avx2(r1, r3), hq_butterfly_avx2(r4, r6),
        hq_butterfly_avx2(r5, r7);  // 16
    hq_butterfly_avx2(r0, r4), hq_butterfly_avx2(r1, r5), hq_butterfly_avx2(r2, r6),
        hq_butterfly_avx2(r3, r7);  // 32
    _mm256_storeu_ps(dst + i, r0);
    _mm256_storeu_ps(dst + i + 8, r1);
    _mm256_storeu_ps(dst + i + 16, r2);
    _mm256_storeu_ps(dst + i + 24, r3);
    _mm256_storeu_ps(dst + i + 32, r4);
    _mm256_storeu_ps(dst + i + 40, r5);
    _mm256_storeu_ps(dst + i + 48, r6);
    _mm256_storeu_ps(dst + i + 56, r7);
  }
}

// The AVX-512 forms below take their zero-masked forms with every lane selected where g++ 12's
// unmasked ones start from `_mm512_undefined_*()` (flagged by -Wuninitialized once inlined; as
// core/random.hpp's).
#define SQUALL_HQ_AVX512 __attribute__((target("avx512f"), always_inline)) inline

/// One stage of the first four on the 16 floats of an AVX-512 register: `p` is x with the
/// partners swapped; lanes of `Upper` get p - x, the others x + p (`hq_stages8_avx2`'s
/// operations on the same operands, so the same bits, NaNs included). With `Fused`, one fused
/// multiply-add, x times -1 (lanes of `Upper`) or +1 plus p, where the add and the masked
/// subtraction took two operations: the product is exact, so the same sum or difference
/// rounded once, the same bits, but for which NaN a lane keeps where x and p are both NaN (a
/// decode's sums are NaN all alike or not at all, and an encode's NaNs code to 0). (The mask
/// a template argument: the +-1 vector is then a constant, where a blend of it ran every pass.)
template <bool Fused, __mmask16 Upper>
SQUALL_HQ_AVX512 __m512 hq_stage16_avx512(__m512 x, __m512 p) {
  if constexpr (Fused) {
    float signs[16];
    for (unsigned l = 0; l < 16; ++l) signs[l] = (Upper >> l) & 1u ? -1.0f : 1.0f;
    return _mm512_fmadd_ps(x, _mm512_loadu_ps(signs), p);
  } else {
    return _mm512_mask_sub_ps(_mm512_add_ps(x, p), Upper, p, x);
  }
}

/// The first four stages (distances 1, 2, 4 and 8) on the 16 floats of one AVX-512 register:
/// `hq_stages8_avx2`'s three, then the butterfly between two of its registers at distance 8
/// (a + b in the lower half, a - b in the upper), the same bits (`hq_stage16_avx512`).
template <bool Fused>
SQUALL_HQ_AVX512 __m512 hq_stages16_avx512(__m512 x) {
  x = hq_stage16_avx512<Fused, 0xaaaa>(x, _mm512_maskz_permute_ps(0xffff, x, 0xb1));        // 1
  x = hq_stage16_avx512<Fused, 0xcccc>(x, _mm512_maskz_permute_ps(0xffff, x, 0x4e));        // 2
  x = hq_stage16_avx512<Fused, 0xf0f0>(x, _mm512_maskz_shuffle_f32x4(0xffff, x, x, 0xb1));  // 4
  return hq_stage16_avx512<Fused, 0xff00>(x, _mm512_maskz_shuffle_f32x4(0xffff, x, x, 0x4e));
}

/// Floats j to j + 15 of a rotation's source, as `hq_load8_avx2`: as they are; with their
/// signs flipped by sign bits j to j + 15 of `signs` (a masked xor: the bits of AVX2's flip);
/// or (float(sum) - n L) x step.
template <hq_source From>
SQUALL_HQ_AVX512 __m512 hq_load16_avx512(const void* src, std::size_t j, const std::uint32_t* signs,
                                         __m512 offsets, __m512 steps) {
  if constexpr (From == hq_source::sums) {
    const __m512i s = _mm512_loadu_si512(static_cast<const std::uint32_t*>(src) + j);
    return _mm512_mul_ps(_mm512_sub_ps(_mm512_maskz_cvtepi32_ps(0xffff, s), offsets), steps);
  } else {
    const __m512 x = _mm512_loadu_ps(static_cast<const float*>(src) + j);
    if constexpr (From == hq_source::values) {
      return x;
    } else {
      const auto flip = static_cast<__mmask16>(signs[j / 32] >> (j % 32));
      const __m512i bits = _mm512_castps_si512(x);
      return _mm512_castsi512_ps(
          _mm512_mask_xor_epi32(bits, flip, bits, _mm512_set1_epi32(INT32_MIN)));
    }
  }
}

#undef SQUALL_HQ_AVX512

/// `hq_hadamard64_avx2` in AVX-512 registers: 64 values in four, the first four stages within
/// a register (`hq_stages16_avx512`), distances 16 and 32 between registers; the same
/// operations on the same operands in the same order, so the same bits (an encode's NaN signs
/// aside, which AVX2's flips and this pass's subtractions may set apart). About half the
/// operations a value.
template <hq_source From>
__attribute__((target("avx512f"))) void hq_hadamard64_avx512(float* dst, const void* src,
                                                             std::size_t n,
                                                             const std::uint32_t* signs = nullptr,
                                                             float offset = 0, float step = 0) {
  const __m512 offsets = _mm512_set1_ps(offset);
  const __m512 steps = _mm512_set1_ps(step);
  constexpr bool fused = From != hq_source::values;  // (`hq_stage16_avx512`)
  for (std::size_t i = 0; i < n; i += 64) {
    __m512 r0 = hq_stages16_avx512<fused>(hq_load16_avx512<From>(src, i, signs, offsets, steps));
    __m512 r1 =
        hq_stages16_avx512<fused>(hq_load16_avx512<From>(src, i + 16, signs, offsets, steps));
    __m512 r2 =
        hq_stages16_avx512<fused>(hq_load16_avx512<From>(src, i + 32, signs, offsets, steps));
    __m512 r3 =
        hq_stages16_avx512<fused>(hq_load16_avx512<From>(src, i + 48, signs, offsets, steps));
    __m512 sum = _mm512_add_ps(r0, r1);  // distance 16
    r1 = _mm512_sub_ps(r0, r1);
    r0 = sum;
    sum = _mm512_add_ps(r2, r3);
    r3 = _mm512_sub_ps(r2, r3);
    r2 = sum;
    _mm512_storeu_ps(dst + i, _mm512_add_ps(r0, r2));  // distance 32
    _mm512_storeu_ps(dst + i + 16, _mm512_add_ps(r1, r3));
    _mm512_storeu_ps(dst + i + 32, _mm512_sub_ps(r0, r2));
    _mm512_storeu_ps(dst + i + 48, _mm512_sub_ps(r1, r3));
  }
}

/// The stages at distances 64 to 512 of a block of `hq_max_block` floats, scaled by `norm`,
/// in one pass of AVX-512 registers: for each 16 columns j to j + 15 (j below 64), the 16
/// registers of elements j + 64 t, four stages between them. `hq_hadamard_wide`'s sums in its
/// order (each stage's a + b and a - b of the same operands), so the same bits, in one pass
/// over the block where its radix-4 passes took two, and a third fewer operations (the loads,
/// stores and products by 1 of the pass between).
__attribute__((target("avx512f"))) inline void hq_hadamard_wide1024_avx512(float* v, float norm) {
  static_assert(hq_max_block == 1024);
  const __m512 scale = _mm512_set1_ps(norm);
  for (std::size_t j = 0; j < 64; j += 16) {
    __m512 r[16];
#pragma GCC unroll 16
    for (std::size_t t = 0; t < 16; ++t) r[t] = _mm512_loadu_ps(v + j + 64 * t);
#pragma GCC unroll 4
    for (std::size_t h = 1; h < 16; h *= 2) {  // distance 64 h
#pragma GCC unroll 16
      for (std::size_t t = 0; t < 16; ++t) {
        if ((t & h) == 0) {
          const __m512 a = r[t];
          r[t] = _mm512_add_ps(a, r[t + h]);
          r[t + h] = _mm512_sub_ps(a, r[t + h]);
        }
      }
    }
#pragma GCC unroll 16
    for (std::size_t t = 0; t < 16; ++t)
      _mm512_storeu_ps(v + j + 64 * t, _mm512_mul_ps(r[t], scale));
  }
}

/// Elements `from` to `to` (multiples of 8) of `hq_apply_signs(dst, src, n, signs)` with
/// non-temporal stores, for `dst` on 16 bytes: the same products (x (1 - 2 bit),
/// `hq_signs8_avx2`), streamed out as they are made.
__attribute__((target("avx2"))) inline void hq_stream_signs_avx2(float* dst, const float* src,
                                                                 std::size_t from, std::size_t to,
                                                                 const std::uint32_t* signs) {
  for (std::size_t j = from; j < to; j += 8) {
    const __m256 v = _mm256_mul_ps(_mm256_loadu_ps(src + j), hq_signs8_avx2(signs, j));
    _mm_stream_ps(dst + j, _mm256_castps256_ps128(v));
    _mm_stream_ps(dst + j + 4, _mm256_extractf128_ps(v, 1));
  }
}

#endif

/// The stages at distances h, 2h, ... up to n / 2, two a pass (radix 4: the same sums in the
/// same order as one stage at a time, half the passes over the block), the last pass scaled
/// by `norm`; scales alone where no stage is left.
template <class A>
SQUALL_HOST_CLONES_AVX512 void hq_hadamard_wide(A* SQUALL_RESTRICT v, std::size_t n, std::size_t h,
                                                A norm) {
  const bool scale_alone = h == n;  // no stage left (n = 1, or 8 after the first three)
  for (; 4 * h <= n; h *= 4) {
    const A scale = 4 * h == n ? norm : A(1);  // times 1 is exact
    for (std::size_t i = 0; i < n; i += 4 * h) {
      A* SQUALL_RESTRICT p0 = v + i;
      A* SQUALL_RESTRICT p1 = v + i + h;
      A* SQUALL_RESTRICT p2 = v + i + 2 * h;
      A* SQUALL_RESTRICT p3 = v + i + 3 * h;
      for (std::size_t j = 0; j < h; ++j) {
        const A a = p0[j] + p1[j], b = p0[j] - p1[j], c = p2[j] + p3[j], d = p2[j] - p3[j];
        p0[j] = (a + c) * scale;
        p1[j] = (b + d) * scale;
        p2[j] = (a - c) * scale;
        p3[j] = (b - d) * scale;
      }
    }
  }
  if (2 * h == n) {  // one stage left
    for (std::size_t j = 0; j < h; ++j) {
      const A a = v[j];
      const A b = v[j + h];
      v[j] = (a + b) * norm;
      v[j + h] = (a - b) * norm;
    }
  } else if (scale_alone) {
    for (std::size_t j = 0; j < n; ++j) v[j] *= norm;
  }
}

}  // namespace detail

namespace detail {

/// The rotation's scale, 1 / sqrt(n), in A (the host's and the CUDA kernels' argument).
template <class A>
A hq_norm(std::size_t n) {
  return static_cast<A>(1) / std::sqrt(static_cast<A>(n));
}

/// The first six stages fused with the read of `src` (as `From` says) into `dst`, where that
/// path runs (floats, a CPU with AVX2, `n` a multiple of 64): then the stages left from
/// distance 64 on, and true; else nothing, and false.
template <hq_source From, class A>
bool hq_rotate_fused(A* dst, const void* src, std::size_t n, const std::uint32_t* signs, A offset,
                     A step) {
#if defined(SQUALL_HAS_AVX2_PHILOX)
  if constexpr (std::is_same_v<A, float>) {
    if (n >= 64 && n % 64 == 0 && squall::detail::cpu_has_avx512f()) {
      hq_hadamard64_avx512<From>(dst, src, n, signs, offset, step);
      if (n == hq_max_block) {
        hq_hadamard_wide1024_avx512(dst, hq_norm<A>(n));
      } else {
        hq_hadamard_wide(dst, n, 64, hq_norm<A>(n));
      }
      return true;
    }
    if (n >= 64 && n % 64 == 0 && squall::detail::cpu_has_avx2()) {
      hq_hadamard64_avx2<From>(dst, src, n, signs, offset, step);
      hq_hadamard_wide(dst, n, 64, hq_norm<A>(n));
      return true;
    }
  }
#endif
  (void)dst, (void)src, (void)n, (void)signs, (void)offset, (void)step;
  return false;
}

/// A rotated block of a streamed decode whose signs and stores are still to come: its values
/// before the signs (`src`, a block buffer), its place in the output and its sign words. It
/// leaves in parts between the next block's passes (`drain`), so that the non-temporal stores
/// drain to memory while the core computes, where a block streamed at once waited on them
/// and memory idled through the next block's passes.
template <class A>
struct hq_pending_block {
  A* dst = nullptr;
  const A* src = nullptr;
  const std::uint32_t* signs = nullptr;
  std::size_t n = 0;
  std::size_t done = 0;

  /// Whether a block of `n` values into `to` can wait (floats, a CPU with AVX2, `to` on 16
  /// bytes, `n` a multiple of 8).
  static bool can_wait(const A* to, std::size_t n) {
#if defined(SQUALL_HAS_AVX2_PHILOX)
    if constexpr (std::is_same_v<A, float>) {
      return n % 8 == 0 && reinterpret_cast<std::uintptr_t>(to) % 16 == 0 &&
             squall::detail::cpu_has_avx2();
    }
#endif
    (void)to, (void)n;
    return false;
  }

  /// Streams the block's values up to `parts` quarters of it (all of it at 4).
  void drain(unsigned parts) {
    const std::size_t to = parts >= 4 ? n : (n * parts / 4) / 8 * 8;
#if defined(SQUALL_HAS_AVX2_PHILOX)
    if constexpr (std::is_same_v<A, float>) {
      if (to > done) hq_stream_signs_avx2(dst, src, done, to, signs);
    }
#endif
    done = to > done ? to : done;
  }
};

}  // namespace detail

/// In-place fast Walsh-Hadamard transform of `n` (a power of two) values, scaled by
/// 1 / sqrt(n) so that it is orthonormal and its own inverse. Floats from 64 values on run
/// their first six stages in one pass of AVX registers (`detail::hq_hadamard64_avx2`), else
/// the first three run together on groups of 8 (in AVX registers where the CPU has AVX2);
/// the others two a pass over contiguous quarters, which vectorize; the scale rides on the
/// last pass. Every path computes the same bits.
template <class A>
void hq_hadamard(A* SQUALL_RESTRICT v, std::size_t n) {
  if (detail::hq_rotate_fused<detail::hq_source::values>(v, v, n, nullptr, A{}, A{})) return;
  std::size_t h = 1;
  if (n >= 8) {
#if defined(SQUALL_HAS_AVX2_PHILOX)
    if (squall::detail::cpu_has_avx2()) {
      detail::hq_hadamard8_avx2(v, n);
    } else {
      detail::hq_hadamard8(v, n);
    }
#else
    detail::hq_hadamard8(v, n);
#endif
    h = 8;
  }
  detail::hq_hadamard_wide(v, n, h, detail::hq_norm<A>(n));
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
  /// 64-bit words of fields (`hq_words_for`).
  std::size_t words() const { return hq_words_for(padded(), hq_fields_per_word(field)); }
};

namespace detail {

/// Rotation blocks whose sign words `hq_signs` makes in one `philox_fill`: 8 blocks are 64
/// Philox blocks, one pass of the AVX-512 Philox's four groups, where the 8 of one block went
/// through a single group whose ten dependent rounds left the multipliers idle.
inline constexpr std::size_t hq_sign_batch = 8;

/// The Rademacher sign words of the rotation blocks of `s`: block k's word i / 32 is word
/// k x hq_max_block / 32 + i / 32 of the shared stream (seed, step, `shared_rank`), the same on
/// every rank; bit i % 32 set means element i is negated. Made `hq_sign_batch` blocks at a
/// time, held until a block outside them is asked for. 1 KiB: on the caller's stack.
class hq_signs {
 public:
  explicit hq_signs(const hq_shape& s) : s_(s) {}

  /// Block k's sign words (enough for its padded length), valid until the next call.
  const std::uint32_t* of(std::size_t k) {
    if (k < first_ || k >= first_ + held_) {
      first_ = k;
      held_ = std::min(hq_sign_batch, s_.blocks() - k);
      // blocks wholly inside the tensor take 8 Philox blocks each; the last one its length's
      const std::size_t last = first_ + held_ - 1;
      const std::size_t philox_blocks = 8 * (held_ - 1) + (s_.block_length(last) + 127) / 128;
      philox_fill(s_.seed, {s_.step, shared_rank}, first_ * (hq_max_block / 128), philox_blocks,
                  words_);
    }
    return words_ + (k - first_) * (hq_max_block / 32);
  }

 private:
  const hq_shape& s_;
  std::size_t first_ = 0;
  std::size_t held_ = 0;
  std::uint32_t words_[hq_sign_batch * hq_max_block / 32];
};

/// dst[j] = src[j] with its sign flipped where sign bit j of `words` is set, for `length`
/// elements (`dst` may be `src`: in place). (Cloned: the per-lane variable shift vectorizes
/// with AVX2.)
template <class T>
SQUALL_HOST_CLONES void hq_apply_signs(T* dst, const T* src, std::size_t length,
                                       const std::uint32_t* SQUALL_RESTRICT words) {
  for (std::size_t w = 0; w * 32 < length; ++w) {  // a word at a time: the shift varies by lane
    const std::uint32_t word = words[w];
    const std::size_t n = length - w * 32 < 32 ? length - w * 32 : 32;
    T* x = dst + w * 32;
    const T* y = src + w * 32;
    for (std::size_t b = 0; b < n; ++b) {
      x[b] = y[b] * (static_cast<T>(1) - static_cast<T>(2 * ((word >> b) & 1u)));
    }
  }
}

/// |x| statistics of `n` values: the largest, the sum and the sum of squares, and whether all
/// were finite (a NaN or infinity makes the sum so). In 32-byte vectors (GCC's vector
/// extension, which g++ and clang lower to what the target has): the largest in T, the sums in
/// double lanes (no float overflow or underflow of a square); the caller adds the blocks.
struct hq_block_sums {
  double largest = 0;
  double l1 = 0;
  double l2 = 0;
  bool finite = true;
};
template <class T>
SQUALL_NO_TRAPPING_MATH SQUALL_HOST_CLONES hq_block_sums hq_sums_wide(const T* SQUALL_RESTRICT x,
                                                                      std::size_t n) {
  // (typedef: g++ drops the attribute from an alias of a dependent type)
  typedef T values __attribute__((vector_size(32)));
  typedef double doubles __attribute__((vector_size(32)));
  typedef T halves __attribute__((vector_size(16)));
  constexpr std::size_t lanes = 32 / sizeof(T);
  values largest = {};
  // (named vectors, no arrays of them: g++ keeps arrays of vectors on the stack)
  doubles l1a = {};
  doubles l1b = {};
  doubles l2a = {};
  doubles l2b = {};
  const std::size_t whole = n / lanes * lanes;
  for (std::size_t j = 0; j < whole; j += lanes) {
    values v;
    std::memcpy(&v, x + j, sizeof v);
    const values a = v < T(0) ? -v : v;
    largest = a > largest ? a : largest;  // NaN: not taken (the sums carry it)
    if constexpr (sizeof(T) == 4) {
      const halves lo = {a[0], a[1], a[2], a[3]};
      const halves hi = {a[4], a[5], a[6], a[7]};
      const auto dlo = __builtin_convertvector(lo, doubles);
      const auto dhi = __builtin_convertvector(hi, doubles);
      l1a += dlo, l1b += dhi;
      l2a += dlo * dlo, l2b += dhi * dhi;
    } else {
      l1a += a;
      l2a += a * a;
    }
  }
  hq_block_sums out;
  for (std::size_t j = whole; j < n; ++j) {
    const auto a = static_cast<double>(std::fabs(x[j]));
    out.largest = a > out.largest ? a : out.largest;
    out.l1 += a;
    out.l2 += a * a;
  }
  for (std::size_t t = 0; t < lanes; ++t) {
    const auto a = static_cast<double>(largest[t]);
    out.largest = a > out.largest ? a : out.largest;
  }
  for (std::size_t t = 0; t < 4; ++t) {
    out.l1 += l1a[t] + l1b[t];
    out.l2 += l2a[t] + l2b[t];
  }
  out.finite = std::isfinite(out.l1);
  return out;
}

/// The same for at most `hq_max_block` floats with the sums in float lanes (16 of them: at most
/// 64 additions a lane, a relative error of about 4e-6, enough for a range), widened to double
/// at the end: float to double conversions cost this CPU class more than the memory read
/// (measured 2.3-4.7 GB/s with them, 9-13 GB/s without, 16 Mi floats in blocks of 1024).
/// Exact only while the squares stay normal floats and the sums finite: the caller checks the
/// largest.
SQUALL_NO_TRAPPING_MATH SQUALL_HOST_CLONES inline hq_block_sums hq_sums_narrow(
    const float* SQUALL_RESTRICT x, std::size_t n) {
  typedef float values __attribute__((vector_size(32)));
  // (named vectors, no arrays of them: g++ keeps arrays of vectors on the stack)
  values largest = {};
  values l1a = {};
  values l1b = {};
  values l2a = {};
  values l2b = {};
  const std::size_t whole = n / 16 * 16;
  for (std::size_t j = 0; j < whole; j += 16) {
    values u;
    values v;
    std::memcpy(&u, x + j, sizeof u);
    std::memcpy(&v, x + j + 8, sizeof v);
    const values a = u < 0.0f ? -u : u;
    const values b = v < 0.0f ? -v : v;
    largest = a > largest ? a : largest;  // NaN: not taken (the sums carry it)
    largest = b > largest ? b : largest;
    l1a += a;
    l1b += b;
    l2a += a * a;
    l2b += b * b;
  }
  hq_block_sums out;
  for (std::size_t t = 0; t < 8; ++t) {
    const auto a = static_cast<double>(largest[t]);
    out.largest = a > out.largest ? a : out.largest;
    out.l1 += static_cast<double>(l1a[t]) + static_cast<double>(l1b[t]);
    out.l2 += static_cast<double>(l2a[t]) + static_cast<double>(l2b[t]);
  }
  for (std::size_t j = whole; j < n; ++j) {
    const auto a = static_cast<double>(std::fabs(x[j]));
    out.largest = a > out.largest ? a : out.largest;
    out.l1 += a;
    out.l2 += a * a;
  }
  out.finite = std::isfinite(out.l1);
  return out;
}

/// `hq_sums_wide`, or for floats `hq_sums_narrow` where the block's largest |x| is 0 or in
/// [2^-60, 2^60) (squares normal, 1024 of them summed below float's largest); any other block
/// (tiny values, huge ones, an infinity) is summed again in double lanes.
template <class T>
hq_block_sums hq_sums(const T* SQUALL_RESTRICT x, std::size_t n) {
  if constexpr (std::is_same_v<T, float>) {
    if (n <= hq_max_block) {
      const hq_block_sums narrow = hq_sums_narrow(x, n);
      if (narrow.largest == 0 || (narrow.largest >= 0x1p-60 && narrow.largest < 0x1p60)) {
        return narrow;
      }
    }
  }
  return hq_sums_wide(x, n);
}

/// Block `k` of `in` (zero-padded past its end), sign-flipped by `signs.of(k)` and rotated,
/// into `out`; returns its padded length.
template <class T>
std::size_t hq_rotated_block(const hq_shape& s, const T* in, std::size_t k, hq_signs& signs,
                             T* out) {
  const std::size_t first = k * hq_max_block;
  const std::size_t length = s.block_length(k);
  const std::size_t n = std::min(length, s.count - first);
  const T* from = in + first;
  if (n < length || !s.rotate) {  // the last block, zero padded; or no rotation: a copy
    for (std::size_t j = 0; j < n; ++j) out[j] = in[first + j];
    std::fill(out + n, out + length, T{0});
    from = out;
  }
  if (!s.rotate) return length;
  const std::uint32_t* const words = signs.of(k);
  if (hq_rotate_fused<hq_source::signed_values>(out, from, length, words, T{}, T{})) return length;
  hq_apply_signs(out, from, length, words);  // the copy and the signs in one pass
  hq_hadamard(out, length);
  return length;
}

}  // namespace detail

namespace detail {

/// Where the fields of a width lie in a word's two 32-bit halves: fields 0 to `low_fields` - 1
/// within bits 0-31, one across bit 32 where 32 is no multiple of the width (then `high_from`
/// is `low_fields` + 1), and fields `high_from` to 64 / width - 1 within bits 32-63.
struct hq_halves {
  unsigned low_fields;
  unsigned high_from;
};
constexpr hq_halves hq_halves_of(unsigned width) {
  return {32 / width, 32 / width + (32 % width != 0 ? 1 : 0)};
}

/// Whole groups: the fields of `groups` x 8F elements, `width` bits each (F = 64 / width), into
/// `sums`; returns the largest. The group's 8 words are split once into their low and high
/// 32-bit halves, and each field position is then a shift and a mask of 32-bit lanes (two
/// shifts for the one across the middle), as `hq_code_groups` packs them; one function for
/// every width.
SQUALL_HOST_CLONES inline std::uint32_t hq_unpack_groups(const std::uint64_t* SQUALL_RESTRICT words,
                                                         std::size_t groups, unsigned width,
                                                         std::uint32_t* SQUALL_RESTRICT sums) {
  typedef std::uint32_t values __attribute__((vector_size(4 * hq_group_words)));
  const unsigned per_word = 64 / width;
  const auto [low_fields, high_from] = hq_halves_of(width);
  const values mask = values{} + ((std::uint32_t{1} << width) - 1);
  values top = {};
  const auto put = [&](std::uint32_t * out, const values& f) __attribute__((always_inline)) {
    top = f > top ? f : top;
    std::memcpy(out, &f, sizeof f);
  };
  for (std::size_t g = 0; g < groups; ++g) {
    values a;
    values b;
    std::memcpy(&a, words + g * hq_group_words, sizeof a);
    std::memcpy(&b, words + g * hq_group_words + 4, sizeof b);
    const values low_half = __builtin_shufflevector(a, b, 0, 2, 4, 6, 8, 10, 12, 14);
    const values high_half = __builtin_shufflevector(a, b, 1, 3, 5, 7, 9, 11, 13, 15);
    std::uint32_t* out = sums + g * per_word * hq_group_words;
    SQUALL_UNROLL_16
    for (unsigned at = 0; at < low_fields * width; at += width, out += hq_group_words) {
      put(out, (low_half >> at) & mask);
    }
    if (high_from != low_fields) {  // across the middle
      const unsigned at = low_fields * width;
      put(out, ((low_half >> at) | (high_half << (32 - at))) & mask);
      out += hq_group_words;
    }
    SQUALL_UNROLL_16
    for (unsigned at = high_from * width - 32; at + width <= 32;
         at += width, out += hq_group_words) {
      put(out, (high_half >> at) & mask);
    }
  }
  std::uint32_t largest = 0;
  for (std::size_t l = 0; l < hq_group_words; ++l) largest = top[l] > largest ? top[l] : largest;
  return largest;
}

/// Eight 32-bit lanes (a group's 8 words, or their halves).
typedef std::uint32_t hq_lanes __attribute__((vector_size(4 * hq_group_words)));

/// The codes of the 8 rotated values `y` into `code` (`hq_code`'s math in vectors, element j's
/// draw unit j of `draws`' bytes), below 2^W for a field of W bits. (An output argument: a
/// vector returned by value warns of the ABI where the target has no AVX.)
template <class T>
SQUALL_NO_TRAPPING_MATH SQUALL_FORCEINLINE void hq_code8(const T* SQUALL_RESTRICT y,
                                                         const unsigned char* SQUALL_RESTRICT draws,
                                                         T inverse_step, T shift_by, T top_at,
                                                         hq_lanes& code) {
  using D = stochastic_draw_unit<T>;
  typedef T reals __attribute__((vector_size(sizeof(T) * hq_group_words)));
  typedef D draw_lanes __attribute__((vector_size(sizeof(D) * hq_group_words)));
  typedef std::int32_t ints __attribute__((vector_size(4 * hq_group_words)));
  constexpr T draw_range = static_cast<T>(std::uint64_t{1} << stochastic_draw_bits<T>);
  const reals zero = {};
  reals v;
  std::memcpy(&v, y, sizeof v);
  draw_lanes d;
  std::memcpy(&d, draws, sizeof d);
  reals x = v * inverse_step + (zero + shift_by);
  x = x > zero ? x : zero;  // NaN -> 0
  x = x < zero + top_at ? x : zero + top_at;
  const ints low = __builtin_convertvector(x, ints);  // floor, x >= 0
  const reals fraction = x - __builtin_convertvector(low, reals);
  const ints up = __builtin_convertvector(__builtin_convertvector(d, reals) < fraction * draw_range,
                                          ints);  // -1 or 0
  code = __builtin_convertvector(low - up, hq_lanes);
}

/// Whole groups: the codes of `groups` x 8F rotated values `y` against 1 / step (`hq_code8`, on
/// the 8 elements of one field position at a time), for fields of `width` bits (F = 64 /
/// width), ORed into their words: the codes never leave the registers. The 8 lanes of a field
/// position are the group's 8 words, held as their low and high 32-bit halves: the fields
/// within the low half, the one across the middle (where 32 is no multiple of the width) and
/// those within the high half are three loops of a shift and an OR of 32-bit lanes each
/// (where 64-bit fields took a widening of each half and two shifts), and the halves are
/// interleaved into words once a group. One function for every width: unrolled at compile
/// time for each of the 27, the rotated encode was 1.02-1.07x faster (the unrotated one
/// slower) but every unit that encodes compiled 3 s more. With `ahead`, each field position asks
/// for the cache line of its elements' place in `ahead` (a line at a time keeps memory busy through
/// the pass without filling the core's queue of misses, where a block's 64 lines at once stalled
/// the loop on the prefetch).
template <class T>
SQUALL_NO_TRAPPING_MATH SQUALL_HOST_CLONES void hq_code_groups(
    const T* SQUALL_RESTRICT y, const unsigned char* SQUALL_RESTRICT draws, std::size_t groups,
    unsigned width, T inverse_step, std::uint32_t levels, std::uint64_t* SQUALL_RESTRICT words,
    const T* ahead) {
  using D = stochastic_draw_unit<T>;
  typedef std::uint64_t quad __attribute__((vector_size(32)));  // one AVX2 register
  static_assert(hq_group_words == 8);
  const unsigned per_word = 64 / width;
  const auto [low_fields, high_from] = hq_halves_of(width);
  const auto shift_by = static_cast<T>(levels);
  const auto top_at = static_cast<T>(2 * levels);
  const std::size_t group = std::size_t{per_word} * hq_group_words;
  for (std::size_t g = 0; g < groups; ++g) {
    const std::size_t base = g * group;
    hq_lanes low_half = {};
    hq_lanes high_half = {};
    hq_lanes code;
    std::size_t e = base;
    SQUALL_UNROLL_16
    for (unsigned at = 0; at < low_fields * width; at += width, e += hq_group_words) {
      if (ahead != nullptr) __builtin_prefetch(ahead + e, 0, 2);
      hq_code8(y + e, draws + e * sizeof(D), inverse_step, shift_by, top_at, code);
      low_half |= code << at;
    }
    if (high_from != low_fields) {  // across the middle: the low bits, then the rest
      const unsigned at = low_fields * width;
      if (ahead != nullptr) __builtin_prefetch(ahead + e, 0, 2);
      hq_code8(y + e, draws + e * sizeof(D), inverse_step, shift_by, top_at, code);
      low_half |= code << at;
      high_half |= code >> (32 - at);
      e += hq_group_words;
    }
    SQUALL_UNROLL_16
    for (unsigned at = high_from * width - 32; at + width <= 32; at += width, e += hq_group_words) {
      if (ahead != nullptr) __builtin_prefetch(ahead + e, 0, 2);
      hq_code8(y + e, draws + e * sizeof(D), inverse_step, shift_by, top_at, code);
      high_half |= code << at;
    }
    const hq_lanes first = __builtin_shufflevector(low_half, high_half, 0, 8, 1, 9, 2, 10, 3, 11);
    const hq_lanes second =
        __builtin_shufflevector(low_half, high_half, 4, 12, 5, 13, 6, 14, 7, 15);
    quad lo;
    quad hi;
    std::memcpy(&lo, words + g * hq_group_words, sizeof lo);
    std::memcpy(&hi, words + g * hq_group_words + 4, sizeof hi);
    quad add;
    std::memcpy(&add, &first, sizeof add);
    lo |= add;
    std::memcpy(&add, &second, sizeof add);
    hi |= add;
    std::memcpy(words + g * hq_group_words, &lo, sizeof lo);
    std::memcpy(words + g * hq_group_words + 4, &hi, sizeof hi);
  }
}

#if defined(SQUALL_HAS_AVX2_PHILOX)
/// `hq_code_groups` for floats in AVX-512 registers: two field positions a register (their 16
/// elements are consecutive), each lane's field moved into the low or high half of its word by
/// variable shifts (a count of 32 or more gives 0, so one loop serves the fields of either
/// half and the one across the middle; an odd last position fills the lower 8 lanes), the
/// halves folded and interleaved into words once a group. `hq_code8`'s codes for two
/// positions at once: the same x, its decision to round up made in integers from x 2^16 rounded
/// up (exact where `hq_code8` compares floats; below) (written in intrinsics: `hq_code8`'s
/// vector form at 16 lanes measured 0.92-0.96x of them). With `ahead`, each pair of
/// positions asks for the cache line of its elements' place in `ahead`.
__attribute__((target("avx512f"))) SQUALL_NO_TRAPPING_MATH inline void hq_code_groups_avx512(
    const float* SQUALL_RESTRICT y, const std::uint16_t* SQUALL_RESTRICT draws, std::size_t groups,
    unsigned width, float inverse_step, std::uint32_t levels, std::uint64_t* SQUALL_RESTRICT words,
    const float* ahead) {
  const unsigned per_word = 64 / width;
  const unsigned pairs = (per_word + 1) / 2;
  // each pair's shift counts (32 where a lane's field is not in that half, or past the
  // word's last field): into the low half, into the high half, down into the high half
  __m512i to_low[16];
  __m512i to_high[16];
  __m512i down_high[16];
  {
    const __m512i w = _mm512_set1_epi32(static_cast<int>(width));
    const __m512i half = _mm512_set1_epi32(32);
    const __m512i end = _mm512_set1_epi32(static_cast<int>(per_word * width));
    __m512i at = _mm512_maskz_mov_epi32(0xff00, w);  // lanes 8-15: the pair's second position
    for (unsigned q = 0; q < pairs; ++q) {
      const __mmask16 used = _mm512_cmplt_epu32_mask(at, end);
      const __mmask16 low = _mm512_mask_cmplt_epu32_mask(used, at, half);
      const __mmask16 high = static_cast<__mmask16>(used & ~low);
      const __mmask16 across = _mm512_mask_cmpgt_epu32_mask(low, _mm512_add_epi32(at, w), half);
      to_low[q] = _mm512_mask_mov_epi32(half, low, at);
      to_high[q] = _mm512_mask_sub_epi32(half, high, at, half);
      down_high[q] = _mm512_mask_sub_epi32(half, across, half, at);
      at = _mm512_add_epi32(at, _mm512_add_epi32(w, w));
    }
  }
  const __m512 scale = _mm512_set1_ps(inverse_step);
  const __m512 shift = _mm512_set1_ps(static_cast<float>(levels));
  const __m512 top = _mm512_set1_ps(static_cast<float>(2 * levels));
  const __m512 zero = _mm512_setzero_ps();
  const __m512 range = _mm512_set1_ps(static_cast<float>(1u << stochastic_draw_bits<float>));
  static_assert(stochastic_draw_bits<float> == 16);
  const __mmask16 every = 0xffff;
  // word w of the group from lane w of the low half (entries 0-7) and of the high (16-23)
  const __m512i interleave =
      _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
  const std::size_t group = std::size_t{per_word} * hq_group_words;
  for (std::size_t g = 0; g < groups; ++g) {
    const std::size_t base = g * group;
    __m512i low = _mm512_setzero_si512();
    __m512i high = _mm512_setzero_si512();
    for (unsigned q = 0; q < pairs; ++q) {
      const std::size_t e = base + 16 * q;
      if (ahead != nullptr) __builtin_prefetch(ahead + e, 0, 2);
      // (the last position alone fills the lower 8 lanes; the upper lanes' counts make them
      // vanish)
      const __mmask16 lanes = 2 * q + 1 < per_word ? 0xffff : 0x00ff;
      const __m512 v = _mm512_maskz_loadu_ps(lanes, y + e);
      const __m128i d_lo = _mm_loadu_si128(reinterpret_cast<const __m128i*>(draws + e));
      const __m128i d_hi = lanes == 0xffff
                               ? _mm_loadu_si128(reinterpret_cast<const __m128i*>(draws + e + 8))
                               : _mm_setzero_si128();
      // 2^16 - 1 - d
      const __m512i rest = _mm512_maskz_cvtepu16_epi32(
          0xffff, _mm256_xor_si256(_mm256_set_m128i(d_hi, d_lo), _mm256_set1_epi16(-1)));
      __m512 x = _mm512_add_ps(_mm512_mul_ps(v, scale), shift);
      x = _mm512_maskz_max_ps(0xffff, x, zero);  // x > 0 ? x : 0 (a NaN -> 0)
      x = _mm512_maskz_min_ps(0xffff, x, top);   // x < top ? x : top
      // x = c + f (c whole, f in [0, 1)) is rounded up where d < f 2^16 (`hq_code8`), that is
      // where d < e = ceil(f 2^16), an integer in [0, 2^16]; ceil(x 2^16) = c 2^16 + e (x 2^16
      // is exact and below 2^24: 2L < 2^8), so the code c + [d < e] is
      // (ceil(x 2^16) + 2^16 - 1 - d) / 2^16 rounded down, where a floor, a conversion back, a
      // subtraction, a product, the draw's conversion, a comparison and an add took seven
      // (the mask as a variable: at -O0 the intrinsic is a macro whose cast of a literal 0xffff
      // to a signed short warns)
      const __m512i ceiling = _mm512_maskz_cvt_roundps_epi32(
          every, _mm512_mul_ps(x, range), _MM_FROUND_TO_POS_INF | _MM_FROUND_NO_EXC);
      const __m512i code = _mm512_maskz_srli_epi32(0xffff, _mm512_add_epi32(ceiling, rest), 16);
      low = _mm512_or_si512(low, _mm512_maskz_sllv_epi32(0xffff, code, to_low[q]));
      high = _mm512_ternarylogic_epi32(high, _mm512_maskz_sllv_epi32(0xffff, code, to_high[q]),
                                       _mm512_maskz_srlv_epi32(0xffff, code, down_high[q]),
                                       0xfe);  // a | b | c
    }
    // the two positions' lanes of each word folded, then low and high halves interleaved
    const __m512i low8 = _mm512_or_si512(low, _mm512_maskz_shuffle_i32x4(0xffff, low, low, 0x4e));
    const __m512i high8 =
        _mm512_or_si512(high, _mm512_maskz_shuffle_i32x4(0xffff, high, high, 0x4e));
    const __m512i packed = _mm512_maskz_permutex2var_epi32(0xffff, low8, interleave, high8);
    std::uint64_t* const w = words + g * hq_group_words;
    _mm512_storeu_si512(w, _mm512_or_si512(_mm512_loadu_si512(w), packed));
  }
}
#endif

/// Calls `one(j)` for the elements of first .. first + n - 1 outside whole groups, and
/// `whole(j, groups)` once for the whole groups from element first + j.
/// (Fields of `width` bits: groups of 8 x floor(64 / width) elements.)
template <class One, class Whole>
SQUALL_FORCEINLINE void hq_walk_groups(unsigned width, std::size_t first, std::size_t n, One&& one,
                                       Whole&& whole) {
  const std::size_t group = std::size_t{64 / width} * hq_group_words;
  const std::size_t head = std::min(n, (group - first % group) % group);
  std::size_t j = 0;
  for (; j < head; ++j) one(j);
  const std::size_t groups = (n - head) / group;
  if (groups != 0) whole(j, groups);
  for (j += groups * group; j < n; ++j) one(j);
}

}  // namespace detail

/// The fields of elements first, ..., first + n - 1 into `sums`; returns the largest.
inline std::uint64_t hq_unpack(const std::uint64_t* words, std::size_t first, std::size_t n,
                               unsigned field, std::uint32_t* sums) {
  const std::uint64_t mask = (std::uint64_t{1} << field) - 1;
  std::uint64_t largest = 0;
  detail::hq_walk_groups(
      field, first, n,
      [&](std::size_t j) {
        const hq_place p = hq_place_of(first + j, 64 / field);
        const std::uint64_t v = (words[p.word] >> (p.field * field)) & mask;
        sums[j] = static_cast<std::uint32_t>(v);
        largest = v > largest ? v : largest;
      },
      [&](std::size_t j, std::size_t groups) {
        const std::uint64_t v = detail::hq_unpack_groups(
            words + hq_place_of(first + j, 64 / field).word, groups, field, sums + j);
        largest = v > largest ? v : largest;
      });
  return largest;
}

/// The codes of the `n` rotated values `y` of elements first, first + 1, ... against
/// 1 / step (`hq_code`; element j's draw is unit j of `stochastic_draw_unit<T>` in the bytes of the
/// Philox words `random`, read in place; `random` starts at element first's draw, so first x
/// sizeof(stochastic_draw_unit<T>) is a multiple of 4), ORed into their fields of `words` (the
/// layout of `hq_place_of`): whole groups in vectors (`detail::hq_code_groups`), the elements
/// outside them one at a time. With `ahead` (n elements), the whole groups prefetch it as they
/// go (`detail::hq_code_groups`). Floats take AVX-512 registers where the CPU has them
/// (`detail::hq_code_groups_avx512`) unless `avx512` is false (the tests run both paths).
template <class T>
void hq_code_pack(const T* y, const std::uint32_t* random, std::size_t first, std::size_t n,
                  T inverse_step, std::uint32_t levels, unsigned field, std::uint64_t* words,
                  const T* ahead = nullptr, bool avx512 = true) {
  using D = stochastic_draw_unit<T>;
  (void)avx512;  // (read where the AVX-512 path is compiled)
  const auto* draws = reinterpret_cast<const unsigned char*>(random);
  detail::hq_walk_groups(
      field, first, n,
      [&](std::size_t j) {
        D draw;
        std::memcpy(&draw, draws + j * sizeof(D), sizeof draw);
        const hq_place p = hq_place_of(first + j, 64 / field);
        words[p.word] |= std::uint64_t{hq_code<T>(y[j] * inverse_step, levels, draw)}
                         << (p.field * field);
      },
      [&](std::size_t j, std::size_t groups) {
        std::uint64_t* const at = words + hq_place_of(first + j, 64 / field).word;
        const T* const next = ahead == nullptr ? nullptr : ahead + j;
#if defined(SQUALL_HAS_AVX2_PHILOX)
        if constexpr (std::is_same_v<T, float>) {
          if (avx512 && squall::detail::cpu_has_avx512f()) {
            detail::hq_code_groups_avx512(y + j, reinterpret_cast<const std::uint16_t*>(draws) + j,
                                          groups, field, inverse_step, levels, at, next);
            return;
          }
        }
#endif
        detail::hq_code_groups<T>(y + j, draws + j * sizeof(D), groups, field, inverse_step, levels,
                                  at, next);
      });
}

/// rotated value j = (sums[j] - n L) x step, for `n` sums (vectorizes).
template <class T>
SQUALL_HOST_CLONES void hq_values(const std::uint32_t* SQUALL_RESTRICT sums, std::size_t n,
                                  T offset, T step, T* SQUALL_RESTRICT out) {
  for (std::size_t j = 0; j < n; ++j) out[j] = (static_cast<T>(sums[j]) - offset) * step;
}

/// The range of `in`'s rotation y: its root mean square over the padded length (the rotation
/// keeps the norm, so it is computed on `in`), and max |y|, exactly (each block rotated) or,
/// with `bound_only`, a bound that needs no rotation: per block min(||x||_1 / sqrt(B),
/// ||x||_2), which no |y_j| exceeds (y_j is a +-1 combination of x over sqrt(B); Cauchy-
/// Schwarz). Without rotation y = x and the max is exact either way. A NaN or infinity
/// anywhere makes max |y| NaN (never skipped).
template <class T>
void hq_range(const host_backend& /*b*/, const hq_shape& s, const T* in, bool bound_only,
              double& max_abs, double& rms) {
  alignas(64) T buf[hq_max_block];  // one block, on the stack: no allocation per call
  detail::hq_signs signs(s);
  double top = 0;
  double squares = 0;
  bool finite = true;
  for (std::size_t k = 0; k < s.blocks(); ++k) {
    const std::size_t first = k * hq_max_block;
    const std::size_t length = s.block_length(k);
    const std::size_t n = std::min(length, s.count - first);
    if (s.count - first >= 3 * hq_max_block) {  // the block after next (1.06x the encode)
      prefetch_lines(in + first + 2 * hq_max_block, hq_max_block * sizeof(T));
    }
    const detail::hq_block_sums b = detail::hq_sums(in + first, n);
    const double largest = b.largest;
    const double l1 = b.l1;
    const double l2 = b.l2;
    finite = finite && b.finite;
    squares += l2;
    if (!s.rotate) {
      top = largest > top ? largest : top;
    } else if (bound_only) {
      const double bound = std::min(l1 / std::sqrt(static_cast<double>(length)), std::sqrt(l2));
      top = bound > top ? bound : top;
    } else {
      detail::hq_rotated_block(s, in, k, signs, buf);
      for (std::size_t j = 0; j < length; ++j) {
        const double a = std::fabs(static_cast<double>(buf[j]));
        top = a > top ? a : top;
      }
    }
  }
  max_abs = finite ? top : std::nan("");
  rms = s.padded() == 0 ? 0 : std::sqrt(squares / static_cast<double>(s.padded()));
}

/// Writes the codes of the rotation of `in` against `scale` (the agreed range) into `words`
/// (s.words() of them, the layout of `hq_place_of`), element i's code drawn from Philox
/// (seed, stream): unit i of `stochastic_draw_unit<T>` in its words (16 bits for float, 32 for
/// double). With `find_bad`, returns the first element whose value was not finite; else, or with
/// none, `count`.
///
/// A block at a time: its rotation (or, unrotated, the input as it is, no copy), its draws and
/// its codes. The input is read from memory ahead of those passes: the codes of each block
/// ask for the block after next as they go (`hq_code_pack`'s `ahead`; the hardware prefetcher
/// has no misses to follow while the draws and codes run in L1). Each block zeroes the words
/// its groups reach just before it ORs codes into them (a group may straddle two blocks: the
/// words before `zeroed` hold an earlier block's).
template <class T>
std::size_t hq_encode(const host_backend& /*b*/, const hq_shape& s, const T* in, double scale,
                      std::uint64_t seed, random_stream stream, bool find_bad,
                      std::uint64_t* words) {
  const std::uint32_t levels = hq_levels(s.bits);
  const T inverse_step = scale > 0 ? static_cast<T>(levels / scale) : T{0};
  const std::size_t total_words = s.words();
  const std::size_t group = std::size_t{hq_fields_per_word(s.field)} * hq_group_words;
  std::size_t zeroed = 0;
  alignas(64) T buf[hq_max_block];  // one block, on the stack: no allocation per call
  detail::hq_signs signs(s);
  // element j's draw: unit j of stochastic_draw_unit<T> in the stream's words (`hq_code_pack`,
  // `stochastic_draws_fill`); first is a multiple of 1024
  alignas(64) std::uint32_t random[hq_max_block * sizeof(stochastic_draw_unit<T>) / 4];
  std::size_t bad = s.count;
  for (std::size_t k = 0; k < s.blocks(); ++k) {
    const std::size_t first = k * hq_max_block;
    const T* y = in + first;  // unrotated: coded where it lies
    std::size_t length = s.block_length(k);
    if (s.rotate) {
      length = detail::hq_rotated_block(s, in, k, signs, buf);
      y = buf;
    }
    const std::size_t reach =
        std::min((first + length + group - 1) / group * hq_group_words, total_words);
    if (reach > zeroed) {
      std::fill(words + zeroed, words + reach, std::uint64_t{0});
      zeroed = reach;
    }
    stochastic_draws_fill<T>(seed, stream, first, length, random);
    if (find_bad && bad == s.count) {  // (a scalar search here made the encode 1.6x as long)
      const std::size_t n = std::min(length, s.count - first);
      const std::size_t at = first_non_finite(host_backend{}, host_view<const T>(in + first, n));
      if (at != n) bad = first + at;
    }
    const bool full_ahead = s.count - first >= 3 * hq_max_block;  // block k + 2 is whole
    hq_code_pack(y, random, first, length, inverse_step, levels, s.field, words,
                 full_ahead ? in + first + 2 * hq_max_block : nullptr);
  }
  return bad;
}

/// Decodes words holding the sums of `contributions` ranks' codes into `out` (count
/// elements): (field - n L) x scale / L, rotated back. Returns the first element whose field
/// is above n x 2L (no encoder writes it: a corrupt payload), or `count`. Outputs of
/// `stream_from` bytes or more are written with non-temporal stores (`stream_output_bytes`;
/// the same values); there a rotated block of floats is signed and stored a block late, a
/// quarter between each of the next block's passes (`detail::hq_pending_block`).
template <class T>
std::size_t hq_decode(const host_backend& /*b*/, const hq_shape& s, const std::uint64_t* words,
                      std::uint64_t contributions, double scale, T* out,
                      std::size_t stream_from = stream_output_bytes) {
  const std::uint32_t levels = hq_levels(s.bits);
  const std::uint64_t top = contributions * 2u * levels;
  const T step = static_cast<T>(scale / levels);
  // (sum - n L) x step: n L is exact in T (at most 2^20 x 127)
  const auto offset = static_cast<T>(static_cast<double>(contributions * levels));
  // two blocks on the stack (no allocation per call): the one made, the one leaving
  alignas(64) T bufs[2][hq_max_block];
  std::uint32_t sums[hq_max_block];
  detail::hq_signs batch(s);  // the sign words, hq_sign_batch blocks at a time
  // the waiting block's words: the batch may move on while it still streams
  std::uint32_t pending_signs[hq_max_block / 32] = {};
  const bool streamed = s.count * sizeof(T) >= stream_from;
  detail::hq_pending_block<T> pending;  // the block before, streamed between this one's passes
  for (std::size_t k = 0; k < s.blocks(); ++k) {
    const std::size_t first = k * hq_max_block;
    const std::size_t length = s.block_length(k);
    T* const buf = bufs[k % 2];
    pending.drain(1);
    if (hq_unpack(words, first, length, s.field, sums) > top) {
      for (std::size_t j = 0; j < length; ++j) {
        if (sums[j] > top) return first + j < s.count ? first + j : s.count - 1;
      }
    }
    pending.drain(2);
    const std::size_t n = std::min(length, s.count - first);
    T* const to = streamed ? buf : out + first;
    if (s.rotate) {
      const std::uint32_t* const signs = batch.of(k);
      pending.drain(3);
      if (!detail::hq_rotate_fused<detail::hq_source::sums>(buf, sums, length, nullptr, offset,
                                                            step)) {
        hq_values(sums, length, offset, step, buf);
        hq_hadamard(buf, length);
      }
      pending.drain(4);
      if (streamed && pending.can_wait(out + first, n)) {  // the block before is all out
        std::memcpy(pending_signs, signs, (n + 31) / 32 * sizeof(std::uint32_t));
        pending = {.dst = out + first, .src = buf, .signs = pending_signs, .n = n};
        continue;
      }
      detail::hq_apply_signs(to, buf, n, signs);  // the signs and the copy out
    } else {
      hq_values(sums, n, offset, step, to);
    }
    pending.drain(4);
    if (streamed) {
      stream_copy(reinterpret_cast<std::byte*>(out + first),
                  reinterpret_cast<const std::byte*>(buf), n * sizeof(T), false);
    }
  }
  pending.drain(4);
  if (streamed) stream_fence();
  return s.count;
}

}  // namespace squall::kernels
