// SPDX-License-Identifier: Apache-2.0
#pragma once
/// The random numbers of the stochastic compressors: Random123's Philox4x32-10 (Salmon et al.,
/// "Parallel Random Numbers: As Easy as 1, 2, 3", SC 2011; Debian's librandom123-dev), a
/// counter-based generator, so the number drawn for an element is a pure function of
/// (seed, step, rank, element) and the same on the host and in a CUDA kernel.
///
/// Keying (docs/compressors.md): key = (seed low 32 bits, seed high 32 bits); counter =
/// (block low 32 bits, block high 32 bits, step's low 32 bits, rank), where block = element / 4 and
/// the element takes word element % 4 of the block's four outputs. `step` counts the calls on one
/// tensor (the caller's state advances it); `rank` separates the ranks' streams. A compressor
/// whose payloads must agree across ranks (randomk's indices, count_sketch's hashes) draws
/// with `rank = shared_rank`, the same on every rank.

#include <squall/core/config.hpp>

#include <Random123/philox.h>
#include <cstddef>
#include <cstdint>
#include <type_traits>  // conditional_t, is_same_v

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__CUDACC__)
#include <immintrin.h>  // the AVX2 Philox of philox_fill
#define SQUALL_HAS_AVX2_PHILOX 1
#endif

namespace squall {

/// Which call of which rank an encode is: with the compressor's seed, it keys every draw.
struct random_stream {
  std::uint64_t step = 0;
  std::uint32_t rank = 0;
};

/// The `rank` word used for draws every rank must make alike.
inline constexpr std::uint32_t shared_rank = 0xffffffffu;

/// The four 32-bit words Philox4x32-10 gives for `block` of the stream (seed, step, rank).
struct philox_block {
  std::uint32_t word[4];
};

SQUALL_HOST_DEVICE inline philox_block philox(std::uint64_t seed, random_stream stream,
                                              std::uint64_t block) {
  const r123::Philox4x32::key_type key = {
      {static_cast<std::uint32_t>(seed), static_cast<std::uint32_t>(seed >> 32)}};
  const r123::Philox4x32::ctr_type counter = {
      {static_cast<std::uint32_t>(block), static_cast<std::uint32_t>(block >> 32),
       static_cast<std::uint32_t>(stream.step), stream.rank}};
  const r123::Philox4x32::ctr_type r = r123::Philox4x32{}(counter, key);
  return {{r.v[0], r.v[1], r.v[2], r.v[3]}};
}

namespace detail {

#if defined(SQUALL_HAS_AVX2_PHILOX)
/// Blocks per pass of the AVX2 Philox: Groups independent groups of eight, interleaved so that
/// the ten dependent rounds of one group overlap the others' (a round's multiply has a latency
/// of several cycles; one group alone leaves the multipliers idle).
inline constexpr std::size_t philox_avx2_groups = 4;
inline constexpr std::size_t philox_avx2_blocks = 8 * philox_avx2_groups;

/// `philox_avx2_blocks` Philox4x32-10 blocks in AVX2 registers, lane l of group g's c0..c3
/// holding word 0..3 of block first + 8 g + l. `_mm256_mul_epu32` multiplies the even 32-bit
/// lanes into 64-bit products; the odd lanes go through a shuffle; blends put each
/// product's high and low words back in their lanes. The round is Random123's (philox.h, with
/// its multipliers and key increments): (hi0, lo0) = M0 x c0, (hi1, lo1) = M1 x c2,
/// c = (hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0), then k += (W0, W1), ten times.
/// Needs the block numbers to share their high 32 bits (the caller checks). `G` groups of
/// eight: `philox_avx2_groups` for long runs, 1 for what is left of them in eights (a
/// rotation block's 32 sign words are eight blocks).
template <std::size_t G = philox_avx2_groups>
__attribute__((target("avx2"))) void philox_blocks_avx2(std::uint64_t seed, random_stream stream,
                                                        std::uint64_t first, std::uint32_t* words) {
  const __m256i m0 = _mm256_set1_epi64x(PHILOX_M4x32_0);
  const __m256i m1 = _mm256_set1_epi64x(PHILOX_M4x32_1);
  const __m256i low = _mm256_set1_epi32(static_cast<int>(static_cast<std::uint32_t>(first)));
  __m256i c0[G], c1[G], c2[G], c3[G];
  for (std::size_t g = 0; g < G; ++g) {
    const int base = static_cast<int>(8 * g);
    c0[g] = _mm256_add_epi32(low, _mm256_setr_epi32(base, base + 1, base + 2, base + 3, base + 4,
                                                    base + 5, base + 6, base + 7));
    c1[g] = _mm256_set1_epi32(static_cast<int>(static_cast<std::uint32_t>(first >> 32)));
    c2[g] = _mm256_set1_epi32(static_cast<int>(static_cast<std::uint32_t>(stream.step)));
    c3[g] = _mm256_set1_epi32(static_cast<int>(stream.rank));
  }
  std::uint32_t k0 = static_cast<std::uint32_t>(seed);
  std::uint32_t k1 = static_cast<std::uint32_t>(seed >> 32);
  for (int round = 0; round < 10; ++round) {
    const __m256i key0 = _mm256_set1_epi32(static_cast<int>(k0));
    const __m256i key1 = _mm256_set1_epi32(static_cast<int>(k1));
    for (std::size_t g = 0; g < G; ++g) {
      // word moves by shuffles (0xf5: words 1, 1, 3, 3; 0xa0: words 0, 0, 2, 2), which run
      // beside the multiplies rather than on their ports as 64-bit shifts would
      const __m256i even0 = _mm256_mul_epu32(c0[g], m0);
      const __m256i odd0 = _mm256_mul_epu32(_mm256_shuffle_epi32(c0[g], 0xf5), m0);
      const __m256i even1 = _mm256_mul_epu32(c2[g], m1);
      const __m256i odd1 = _mm256_mul_epu32(_mm256_shuffle_epi32(c2[g], 0xf5), m1);
      const __m256i hi0 = _mm256_blend_epi32(_mm256_shuffle_epi32(even0, 0xf5), odd0, 0xaa);
      const __m256i lo0 = _mm256_blend_epi32(even0, _mm256_shuffle_epi32(odd0, 0xa0), 0xaa);
      const __m256i hi1 = _mm256_blend_epi32(_mm256_shuffle_epi32(even1, 0xf5), odd1, 0xaa);
      const __m256i lo1 = _mm256_blend_epi32(even1, _mm256_shuffle_epi32(odd1, 0xa0), 0xaa);
      c0[g] = _mm256_xor_si256(_mm256_xor_si256(hi1, c1[g]), key0);
      c2[g] = _mm256_xor_si256(_mm256_xor_si256(hi0, c3[g]), key1);
      c1[g] = lo1;
      c3[g] = lo0;
    }
    k0 += PHILOX_W32_0;
    k1 += PHILOX_W32_1;
  }
  // transpose each group to block order: (c0, c1, c2, c3) of its block 0, then block 1, ...
  auto* out = reinterpret_cast<__m256i*>(words);
  for (std::size_t g = 0; g < G; ++g) {
    const __m256i a = _mm256_unpacklo_epi32(c0[g], c1[g]);  // blocks 0, 1 | 4, 5: words 0, 1
    const __m256i b = _mm256_unpacklo_epi32(c2[g], c3[g]);  // blocks 0, 1 | 4, 5: words 2, 3
    const __m256i c = _mm256_unpackhi_epi32(c0[g], c1[g]);  // blocks 2, 3 | 6, 7: words 0, 1
    const __m256i d = _mm256_unpackhi_epi32(c2[g], c3[g]);  // blocks 2, 3 | 6, 7: words 2, 3
    const __m256i b04 = _mm256_unpacklo_epi64(a, b);
    const __m256i b15 = _mm256_unpackhi_epi64(a, b);
    const __m256i b26 = _mm256_unpacklo_epi64(c, d);
    const __m256i b37 = _mm256_unpackhi_epi64(c, d);
    _mm256_storeu_si256(out + 4 * g + 0, _mm256_permute2x128_si256(b04, b15, 0x20));
    _mm256_storeu_si256(out + 4 * g + 1, _mm256_permute2x128_si256(b26, b37, 0x20));
    _mm256_storeu_si256(out + 4 * g + 2, _mm256_permute2x128_si256(b04, b15, 0x31));
    _mm256_storeu_si256(out + 4 * g + 3, _mm256_permute2x128_si256(b26, b37, 0x31));
  }
}

// The AVX-512 operations of `philox_blocks_avx512` in their zero-masked forms with every lane
// selected: the same instructions, but g++ 12's unmasked forms start from
// `_mm512_undefined_epi32()`, which -Wuninitialized flags once they are inlined.
#define SQUALL_AVX512 __attribute__((target("avx512f"), always_inline)) inline
SQUALL_AVX512 __m512i avx512_mul_even(__m512i a, __m512i b) {  // 64-bit products, even lanes
  return _mm512_maskz_mul_epu32(0xff, a, b);
}
template <_MM_PERM_ENUM Words>
SQUALL_AVX512 __m512i avx512_words(__m512i a) {  // a shuffle of the 32-bit words of each quarter
  return _mm512_maskz_shuffle_epi32(0xffff, a, Words);
}
SQUALL_AVX512 __m512i avx512_unpacklo_32(__m512i a, __m512i b) {
  return _mm512_maskz_unpacklo_epi32(0xffff, a, b);
}
SQUALL_AVX512 __m512i avx512_unpackhi_32(__m512i a, __m512i b) {
  return _mm512_maskz_unpackhi_epi32(0xffff, a, b);
}
SQUALL_AVX512 __m512i avx512_unpacklo_64(__m512i a, __m512i b) {
  return _mm512_maskz_unpacklo_epi64(0xff, a, b);
}
SQUALL_AVX512 __m512i avx512_unpackhi_64(__m512i a, __m512i b) {
  return _mm512_maskz_unpackhi_epi64(0xff, a, b);
}
template <int Quarters>
SQUALL_AVX512 __m512i avx512_quarters(__m512i a, __m512i b) {  // 128-bit quarters of a and b
  return _mm512_maskz_shuffle_i32x4(0xffff, a, b, Quarters);
}
#undef SQUALL_AVX512

/// `philox_avx2_blocks` twice over in AVX-512 registers: the same rounds on 16 lanes, a
/// round's high and low words put back by masked shuffles and its three-way xor in one
/// `ternarylogic` (about a third of the AVX2 round's operations per block). Group g's lane l
/// holds block first + 16 g + l; the same output order and the same precondition as
/// `philox_blocks_avx2`.
template <std::size_t G = philox_avx2_groups>
__attribute__((target("avx512f"))) void philox_blocks_avx512(std::uint64_t seed,
                                                             random_stream stream,
                                                             std::uint64_t first,
                                                             std::uint32_t* words) {
  const __m512i m0 = _mm512_set1_epi64(PHILOX_M4x32_0);
  const __m512i m1 = _mm512_set1_epi64(PHILOX_M4x32_1);
  const __m512i low = _mm512_set1_epi32(static_cast<int>(static_cast<std::uint32_t>(first)));
  const __m512i lanes = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  constexpr auto odd_words = static_cast<_MM_PERM_ENUM>(0xf5);   // words 1, 1, 3, 3
  constexpr auto even_words = static_cast<_MM_PERM_ENUM>(0xa0);  // words 0, 0, 2, 2
  __m512i c0[G], c1[G], c2[G], c3[G];
  for (std::size_t g = 0; g < G; ++g) {
    c0[g] =
        _mm512_add_epi32(low, _mm512_add_epi32(lanes, _mm512_set1_epi32(static_cast<int>(16 * g))));
    c1[g] = _mm512_set1_epi32(static_cast<int>(static_cast<std::uint32_t>(first >> 32)));
    c2[g] = _mm512_set1_epi32(static_cast<int>(static_cast<std::uint32_t>(stream.step)));
    c3[g] = _mm512_set1_epi32(static_cast<int>(stream.rank));
  }
  std::uint32_t k0 = static_cast<std::uint32_t>(seed);
  std::uint32_t k1 = static_cast<std::uint32_t>(seed >> 32);
  for (int round = 0; round < 10; ++round) {
    const __m512i key0 = _mm512_set1_epi32(static_cast<int>(k0));
    const __m512i key1 = _mm512_set1_epi32(static_cast<int>(k1));
    for (std::size_t g = 0; g < G; ++g) {
      const __m512i even0 = avx512_mul_even(c0[g], m0);
      const __m512i odd0 = avx512_mul_even(avx512_words<odd_words>(c0[g]), m0);
      const __m512i even1 = avx512_mul_even(c2[g], m1);
      const __m512i odd1 = avx512_mul_even(avx512_words<odd_words>(c2[g]), m1);
      // even lanes: the high word of the even product; odd lanes: the odd product's
      const __m512i hi0 = _mm512_mask_shuffle_epi32(odd0, 0x5555, even0, odd_words);
      const __m512i hi1 = _mm512_mask_shuffle_epi32(odd1, 0x5555, even1, odd_words);
      // even lanes: the even product's low word; odd lanes: the odd product's
      const __m512i lo0 = _mm512_mask_shuffle_epi32(even0, 0xaaaa, odd0, even_words);
      const __m512i lo1 = _mm512_mask_shuffle_epi32(even1, 0xaaaa, odd1, even_words);
      c0[g] = _mm512_ternarylogic_epi32(hi1, c1[g], key0, 0x96);  // hi1 ^ c1 ^ k0
      c2[g] = _mm512_ternarylogic_epi32(hi0, c3[g], key1, 0x96);  // hi0 ^ c3 ^ k1
      c1[g] = lo1;
      c3[g] = lo0;
    }
    k0 += PHILOX_W32_0;
    k1 += PHILOX_W32_1;
  }
  // to block order: within each 128-bit quarter q the unpacks give blocks 4q (b04), 4q + 1,
  // 4q + 2 and 4q + 3; the quarter shuffles then gather blocks 0-3, 4-7, 8-11 and 12-15
  auto* out = reinterpret_cast<__m512i*>(words);
  for (std::size_t g = 0; g < G; ++g) {
    const __m512i a = avx512_unpacklo_32(c0[g], c1[g]);
    const __m512i b = avx512_unpacklo_32(c2[g], c3[g]);
    const __m512i c = avx512_unpackhi_32(c0[g], c1[g]);
    const __m512i d = avx512_unpackhi_32(c2[g], c3[g]);
    const __m512i b04 = avx512_unpacklo_64(a, b);
    const __m512i b15 = avx512_unpackhi_64(a, b);
    const __m512i b26 = avx512_unpacklo_64(c, d);
    const __m512i b37 = avx512_unpackhi_64(c, d);
    const __m512i t0 = avx512_quarters<0x44>(b04, b15);  // quarters 0, 1 of each
    const __m512i t1 = avx512_quarters<0x44>(b26, b37);
    const __m512i t2 = avx512_quarters<0xee>(b04, b15);  // quarters 2, 3 of each
    const __m512i t3 = avx512_quarters<0xee>(b26, b37);
    _mm512_storeu_si512(out + 4 * g + 0, avx512_quarters<0x88>(t0, t1));
    _mm512_storeu_si512(out + 4 * g + 1, avx512_quarters<0xdd>(t0, t1));
    _mm512_storeu_si512(out + 4 * g + 2, avx512_quarters<0x88>(t2, t3));
    _mm512_storeu_si512(out + 4 * g + 3, avx512_quarters<0xdd>(t2, t3));
  }
}

inline bool cpu_has_avx2() noexcept { return __builtin_cpu_supports("avx2"); }
inline bool cpu_has_avx512f() noexcept { return __builtin_cpu_supports("avx512f"); }
#endif

/// The instruction sets `philox_fill` may use, widest first; tests force each in turn.
enum class philox_isa { best, avx2, scalar };

/// `philox_fill` on at most the instruction set `isa` (`best`: AVX-512 where the CPU has it,
/// else AVX2, else scalar): passes of 64 blocks (AVX-512) or 32 (AVX2), then 16, then 8,
/// then block by block; a pass whose block numbers would carry into the high word goes to
/// the next, narrower one.
inline void philox_fill_on(philox_isa isa, std::uint64_t seed, random_stream stream,
                           std::uint64_t first, std::size_t blocks, std::uint32_t* words) {
  std::size_t j = 0;
#if defined(SQUALL_HAS_AVX2_PHILOX)
  // Passes of `pass` blocks from j while they fit and their block numbers share a high word.
  const auto passes = [&](std::size_t pass, auto&& fill) {
    for (; j + pass <= blocks; j += pass) {
      const std::uint64_t block = first + j;
      if (static_cast<std::uint32_t>(block) > 0xffffffffu - (pass - 1)) break;  // a carry
      fill(block, words + 4 * j);
    }
  };
  if (isa == philox_isa::best && cpu_has_avx512f()) {
    passes(2 * philox_avx2_blocks,
           [&](std::uint64_t b, std::uint32_t* w) { philox_blocks_avx512(seed, stream, b, w); });
    passes(16,
           [&](std::uint64_t b, std::uint32_t* w) { philox_blocks_avx512<1>(seed, stream, b, w); });
  }
  if (isa != philox_isa::scalar && cpu_has_avx2()) {
    passes(philox_avx2_blocks,
           [&](std::uint64_t b, std::uint32_t* w) { philox_blocks_avx2(seed, stream, b, w); });
    passes(8,
           [&](std::uint64_t b, std::uint32_t* w) { philox_blocks_avx2<1>(seed, stream, b, w); });
  }
#else
  (void)isa;
#endif
  for (; j < blocks; ++j) {
    const philox_block r = philox(seed, stream, first + j);
    for (std::size_t t = 0; t < 4; ++t) words[4 * j + t] = r.word[t];
  }
}
}  // namespace detail

/// Writes `words[4 j + t] = philox(seed, stream, first + j).word[t]` for j < `blocks`: the
/// same numbers as `philox`, 64 blocks per pass in AVX-512 registers or 32 in AVX2 registers,
/// whichever the running CPU has (about 4x the scalar rate in AVX2), then in passes of 16
/// and 8, then block by block. Host only: a CUDA thread calls `philox` for its own block. The
/// test "the lane-parallel Philox equals Random123's" checks every width word for word, across
/// a carry into the block number's high word.
inline void philox_fill(std::uint64_t seed, random_stream stream, std::uint64_t first,
                        std::size_t blocks, std::uint32_t* words) {
  detail::philox_fill_on(detail::philox_isa::best, seed, stream, first, blocks, words);
}

/// The 32-bit word of `element` in the stream (seed, step, rank).
SQUALL_HOST_DEVICE inline std::uint32_t random_word(std::uint64_t seed, random_stream stream,
                                                    std::uint64_t element) {
  return philox(seed, stream, element / 4).word[element % 4];
}

/// Random bits a stochastic rounding of a value of type `T` draws: 16 for float (two elements a
/// Philox word: the rounding's bias is at most 2^-16 of a step, far below what float's 24-bit
/// fraction carries of it), 32 for double. Element e's draw is unit e of
/// `stochastic_draw_unit<T>` in the bytes of the stream's Philox words (on the little-endian
/// hosts the kernels target, the low half of word e / 2 first for float), the layout hq and the
/// quantizers read in place.
template <class T>
inline constexpr unsigned stochastic_draw_bits = std::is_same_v<T, float> ? 16 : 32;
/// A draw's type (`stochastic_draw_bits`).
template <class T>
using stochastic_draw_unit =
    std::conditional_t<stochastic_draw_bits<T> == 16, std::uint16_t, std::uint32_t>;

/// Elements whose draws one Philox block (four words) holds: 8 for float, 4 for double.
template <class T>
inline constexpr std::size_t stochastic_draws_per_block = 16 / sizeof(stochastic_draw_unit<T>);

/// The Philox words holding the draws of elements `first`, ..., `first` + `count` - 1 (`first`
/// a multiple of `stochastic_draws_per_block<T>`) into `words`, element `first` + k's draw unit
/// k of their bytes. Host only (`philox_fill`).
template <class T>
inline void stochastic_draws_fill(std::uint64_t seed, random_stream stream, std::uint64_t first,
                                  std::size_t count, std::uint32_t* words) {
  constexpr std::size_t per_block = stochastic_draws_per_block<T>;
  philox_fill(seed, stream, first / per_block, (count + per_block - 1) / per_block, words);
}

/// A quantizer's draw as the 32-bit word its rounding reads from the top bits: a 16-bit draw
/// in the top half (the bottom half zero, so a rounding up with probability p happens with
/// probability ceil(p x 2^16) / 2^16), a 32-bit one as it is.
template <class T>
SQUALL_HOST_DEVICE constexpr std::uint32_t draw_as_word(std::uint32_t draw) {
  return stochastic_draw_bits<T> == 16 ? draw << 16 : draw;
}

/// Element `element`'s draw for a quantizer's stochastic rounding of values of type `T`, as
/// `draw_as_word` gives it: for float half `element % 2` of word `element / 2`, so that one
/// Philox block serves 8 elements; for double the whole `random_word`.
template <class T>
SQUALL_HOST_DEVICE inline std::uint32_t stochastic_draw(std::uint64_t seed, random_stream stream,
                                                        std::uint64_t element) {
  if constexpr (stochastic_draw_bits<T> == 16) {
    const std::uint32_t word =
        philox(seed, stream, element / stochastic_draws_per_block<T>).word[(element / 2) % 4];
    return draw_as_word<T>((word >> (16 * (element % 2))) & 0xffffu);
  } else {
    return random_word(seed, stream, element);
  }
}

/// `stochastic_draw<T>` of elements 4 `quad` ... 4 `quad` + 3 into `words`, from one Philox
/// block (a CUDA thread's four elements).
template <class T>
SQUALL_HOST_DEVICE inline void stochastic_draws4(std::uint64_t seed, random_stream stream,
                                                 std::uint64_t quad, std::uint32_t (&words)[4]) {
  if constexpr (stochastic_draw_bits<T> == 16) {
    const philox_block block = philox(seed, stream, quad / 2);
    const auto at = static_cast<unsigned>(2 * (quad % 2));
    words[0] = block.word[at] << 16;
    words[1] = block.word[at] & 0xffff0000u;
    words[2] = block.word[at + 1] << 16;
    words[3] = block.word[at + 1] & 0xffff0000u;
  } else {
    const philox_block block = philox(seed, stream, quad);
    for (unsigned t = 0; t < 4; ++t) words[t] = block.word[t];
  }
}

/// A word as a uniform double in [0, 1): word / 2^32, exact.
SQUALL_HOST_DEVICE inline double unit_interval(std::uint32_t word) {
  return static_cast<double>(word) * (1.0 / 4294967296.0);
}

/// True with probability `p` (in [0, 1]) for a uniform `word`: word < p * 2^32, so the
/// probability is p to within 2^-32 (exactly ceil(p * 2^32) / 2^32).
SQUALL_HOST_DEVICE inline bool bernoulli(std::uint32_t word, double p) {
  return static_cast<double>(word) < p * 4294967296.0;
}

}  // namespace squall
