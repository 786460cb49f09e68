// SPDX-License-Identifier: Apache-2.0
#pragma once
/// The CUDA kernels of homomorphic quantization (kernels/cuda/homomorphic.cuh) as phases of one
/// rotation block of up to `hq_max_block` elements: each phase is the work of thread `t` of
/// `threads`, and a kernel runs a phase on every thread of a CUDA block with a barrier between
/// phases, on the block's values in shared memory. The phases are `SQUALL_HOST_DEVICE`, so the
/// host tests run them thread by thread (tests/compress/homomorphic.test.cpp) and compare what
/// they write with the host kernels (kernels/host/homomorphic.hpp) bit for bit: the device's
/// schedule (the Hadamard transform a stage at a time, the draws and signs from Philox words
/// computed once per block, each 64-bit word assembled from the codes of the block it lies in)
/// is tested where no GPU is. What the host cannot run is the glue (the barriers, the atomic
/// OR of a word shared by two blocks, the launch) and the transform of a whole block in
/// registers and warp shuffles (`hq_rotate_registers`, the same stages in the same order as
/// `butterflies`), which the CUDA tests check against the host kernels on a GPU.

#include <squall/core/config.hpp>
#include <squall/core/random.hpp>
#include <squall/kernels/host/homomorphic.hpp>

#include <cstddef>
#include <cstdint>

namespace squall::kernels::hq_phase {

/// Elements of rotation block `k` of `count` after padding (`hq_shape::block_length`).
SQUALL_HOST_DEVICE constexpr std::size_t block_length(std::size_t count, std::size_t k,
                                                      bool rotate) {
  const std::size_t rest = count - k * hq_max_block;
  if (rest >= hq_max_block) return hq_max_block;
  if (!rotate) return rest;
  std::size_t n = 1;
  while (n < rest) n *= 2;
  return n;
}

/// Philox words of a block: the signs' (one bit an element) and the draws' (16 or 32 bits).
inline constexpr std::size_t sign_words = hq_max_block / 32;
template <class T>
inline constexpr std::size_t draw_words = hq_max_block* stochastic_draw_bits<T> / 32;

/// Philox blocks `first`, ..., `first` + `blocks` - 1 of (seed, stream) into `words` (4 words
/// each, as `philox_fill` writes them), split over the threads.
SQUALL_HOST_DEVICE inline void philox_words(unsigned t, unsigned threads, std::uint64_t seed,
                                            random_stream stream, std::uint64_t first,
                                            std::size_t blocks, std::uint32_t* words) {
  for (unsigned b = t; b < blocks; b += threads) {
    const philox_block r = philox(seed, stream, first + b);
    for (unsigned w = 0; w < 4; ++w) words[4 * b + w] = r.word[w];
  }
}

/// The rotation's sign words of block `k` (`length` elements): those of `hq_signs`, the
/// shared stream (seed, step), 128 sign bits a Philox block.
SQUALL_HOST_DEVICE inline void signs(unsigned t, unsigned threads, std::uint64_t seed,
                                     std::uint64_t step, std::size_t k, std::size_t length,
                                     std::uint32_t* words) {
  philox_words(t, threads, seed, random_stream{step, shared_rank}, k * hq_max_block / 128,
               (length + 127) / 128, words);
}

/// The rounding's draws of the block starting at element `first` (`length` elements): the
/// Philox words `hq_encode` reads.
template <class T>
SQUALL_HOST_DEVICE inline void draws(unsigned t, unsigned threads, std::uint64_t seed,
                                     random_stream stream, std::size_t first, std::size_t length,
                                     std::uint32_t* words) {
  constexpr std::size_t per_block = stochastic_draws_per_block<T>;
  philox_words(t, threads, seed, stream, first / per_block, (length + per_block - 1) / per_block,
               words);
}

/// Element j's draw: unit j of `stochastic_draw_unit<T>` in `words` (the low half of a word first).
template <class T>
SQUALL_HOST_DEVICE inline std::uint32_t draw_of(const std::uint32_t* words, unsigned j) {
  if constexpr (stochastic_draw_bits<T> == 16) {
    return (words[j / 2] >> (16 * (j % 2))) & 0xffffu;
  } else {
    return words[j];
  }
}

/// Element j's value `x` with the rotation's sign applied where `rotate` (as
/// `detail::hq_apply_signs`: times +1 or -1).
template <class T>
SQUALL_HOST_DEVICE SQUALL_FORCEINLINE T signed_value(T x, unsigned j, bool rotate,
                                                     const std::uint32_t* sign_bits) {
  return rotate ? x * (T(1) - static_cast<T>(2 * ((sign_bits[j / 32] >> (j % 32)) & 1u))) : x;
}

/// The block's values into `v`: the input from element `first` (zero past `count`), signed
/// (`signed_value`). (The encode kernel reads its input into registers before the block's
/// Philox words are drawn, then signs it the same way.)
template <class T>
SQUALL_HOST_DEVICE inline void load(unsigned t, unsigned threads, const T* in, std::size_t count,
                                    std::size_t first, std::size_t length, bool rotate,
                                    const std::uint32_t* sign_bits, T* v) {
  for (unsigned j = t; j < length; j += threads) {
    v[j] = signed_value(first + j < count ? in[first + j] : T(0), j, rotate, sign_bits);
  }
}

/// One stage of the Walsh-Hadamard transform of `length` values: pairs (i, i + h), the sum in
/// the lower and the difference in the upper, each times `scale` (1, or 1 / sqrt(length) on
/// the last stage). Stage by stage with the scale on the last, as `hq_hadamard` computes.
/// `h` is a power of two, so pair p's lower index is p / h x 2h + p % h by masks (a division
/// by a run-time 64-bit value is a long subroutine on a GPU: it was most of the transform).
template <class T>
SQUALL_HOST_DEVICE inline void butterflies(unsigned t, unsigned threads, T* v, std::size_t length,
                                           std::size_t h, T scale) {
  const auto half = static_cast<unsigned>(length / 2);
  const auto d = static_cast<unsigned>(h);
  for (unsigned p = t; p < half; p += threads) {
    const unsigned i = ((p & ~(d - 1)) << 1) | (p & (d - 1));
    const T a = v[i];
    const T b = v[i + d];
    v[i] = (a + b) * scale;
    v[i + d] = (a - b) * scale;
  }
}

/// Element j's code of its rotated value y, scaled by `scaled(y)` (y / step, the product
/// rounded before `hq_code` adds the shift, as on the host: the device passes an
/// uncontracted multiply, `__fmul_rn`).
template <class T, class Scaled>
SQUALL_HOST_DEVICE SQUALL_FORCEINLINE std::uint8_t code_of(T y, unsigned j,
                                                           const std::uint32_t* draw_bits,
                                                           Scaled&& scaled, std::uint32_t levels) {
  return hq_code<T>(scaled(y), levels, draw_of<T>(draw_bits, j));
}

/// `code_of` each of the block's rotated values `v` into `out`.
template <class T, class Scaled>
SQUALL_HOST_DEVICE inline void codes(unsigned t, unsigned threads, const T* v, std::size_t length,
                                     const std::uint32_t* draw_bits, Scaled&& scaled,
                                     std::uint32_t levels, std::uint8_t* out) {
  for (unsigned j = t; j < length; j += threads) {
    out[j] = code_of(v[j], j, draw_bits, scaled, levels);
  }
}

/// The words of fields that hold elements of the block starting at `first` (`length`
/// elements; `total` words in the tensor): [begin, end).
struct word_span {
  std::size_t begin;
  std::size_t end;
};
SQUALL_HOST_DEVICE inline word_span words_of(std::size_t first, std::size_t length,
                                             unsigned per_word, std::size_t total) {
  const std::size_t group = std::size_t{per_word} * hq_group_words;
  const std::size_t begin = first / group * hq_group_words;
  const std::size_t end = ((first + length - 1) / group + 1) * hq_group_words;
  return {begin, end < total ? end : total};
}

/// Element of field `f` of word `w` (the inverse of `hq_place_of`).
SQUALL_HOST_DEVICE constexpr std::size_t element_of(std::size_t w, unsigned f, unsigned per_word) {
  return w / hq_group_words * (std::size_t{per_word} * hq_group_words) + f * hq_group_words +
         w % hq_group_words;
}

/// Calls `each(f, j)` for each field f of word `w` whose element lies in the block starting at
/// `first` (j = the element - `first` < `length`) and below `padded`; returns whether every
/// field below `padded` did (the word is the block's alone). In 32-bit offsets from `first`:
/// field f's element is `element_of(w, 0)` + 8f, within a group (8F elements) of the block.
template <class Each>
SQUALL_HOST_DEVICE SQUALL_FORCEINLINE bool block_fields(std::size_t w, unsigned per_word,
                                                        std::size_t first, unsigned length,
                                                        std::size_t padded, Each&& each) {
  const auto j0 = static_cast<int>(static_cast<std::int64_t>(element_of(w, 0, per_word)) -
                                   static_cast<std::int64_t>(first));
  const std::size_t room = padded - first;  // at least `length`
  const int stop = room < std::size_t{0x7fffffff} ? static_cast<int>(room) : 0x7fffffff;
  bool alone = true;
  for (unsigned f = 0; f < per_word; ++f) {
    const int j = j0 + static_cast<int>(f * hq_group_words);
    if (j >= stop) break;  // elements of a word grow with f
    if (j < 0 || j >= static_cast<int>(length)) {
      alone = false;
      continue;
    }
    each(f, static_cast<unsigned>(j));
  }
  return alone;
}

/// The words of the block (`words_of`), each assembled from the codes of its elements in the
/// block (`codes`, indexed from `first`) and passed to `put(w, bits, alone)`: `alone` when no
/// element of the word lies in another block (every element of the word below `padded` is
/// in this one), so it may be stored; else it must be ORed into the word.
template <class Put>
SQUALL_HOST_DEVICE inline void pack(unsigned t, unsigned threads, const std::uint8_t* codes,
                                    std::size_t first, std::size_t length, std::size_t padded,
                                    unsigned field, std::size_t total, Put&& put) {
  const unsigned per_word = 64 / field;
  const word_span span = words_of(first, length, per_word, total);
  for (std::size_t w = span.begin + t; w < span.end; w += threads) {
    std::uint64_t bits = 0;
    const bool alone = block_fields(
        w, per_word, first, static_cast<unsigned>(length), padded,
        [&](unsigned f, unsigned j) { bits |= std::uint64_t{codes[j]} << (f * field); });
    put(w, bits, alone);
  }
}

/// The block's values from the summed fields: (field - n L) x step for element `first` + j,
/// into `v`; a field above `top` (n x 2L) is reported by `bad(element)`. A word at a time, as
/// `pack` (the words of the block, `total` in the tensor, the elements below `padded`): each
/// word is read once, and an element's place needs no division by the run-time field count.
template <class T, class Bad>
SQUALL_HOST_DEVICE inline void unpack(unsigned t, unsigned threads, const std::uint64_t* words,
                                      std::size_t first, std::size_t length, std::size_t padded,
                                      unsigned field, std::size_t total, std::uint64_t top,
                                      T offset, T step, T* v, Bad&& bad) {
  const unsigned per_word = 64 / field;
  const std::uint64_t mask = (std::uint64_t{1} << field) - 1;
  const word_span span = words_of(first, length, per_word, total);
  for (std::size_t w = span.begin + t; w < span.end; w += threads) {
    const std::uint64_t word = words[w];
    block_fields(w, per_word, first, static_cast<unsigned>(length), padded,
                 [&](unsigned f, unsigned j) {
                   const std::uint64_t sum = (word >> (f * field)) & mask;
                   if (sum > top) bad(first + j);
                   v[j] = (static_cast<T>(static_cast<std::uint32_t>(sum)) - offset) * step;
                 });
  }
}

/// Element j's decoded value from its rotated-back value y: the rotation's sign applied where
/// `rotate`; a NaN `step` (a NaN on some rank made the scale NaN) gives that NaN itself, as
/// the host's arithmetic on it does (a GPU's gives its canonical NaN).
template <class T>
SQUALL_HOST_DEVICE SQUALL_FORCEINLINE T stored_value(T y, unsigned j, bool rotate,
                                                     const std::uint32_t* sign_bits, T step) {
  const bool nan = step != step;  // NOLINT(misc-redundant-expression): NaN test
  return nan ? step : signed_value(y, j, rotate, sign_bits);
}

/// The block's `n` values (`n` <= length: the padding is not written) out from `v`
/// (`stored_value`).
template <class T>
SQUALL_HOST_DEVICE inline void store(unsigned t, unsigned threads, const T* v, std::size_t n,
                                     bool rotate, const std::uint32_t* sign_bits, T step, T* out) {
  for (unsigned j = t; j < n; j += threads) out[j] = stored_value(v[j], j, rotate, sign_bits, step);
}

/// The scale of the stage at distance `h` of a transform of `length` values: 1, or `norm`
/// (1 / sqrt(length)) on the last; the stages run h = 1, 2, ..., length / 2, a barrier after
/// each.
template <class T>
SQUALL_HOST_DEVICE constexpr T stage_scale(std::size_t h, std::size_t length, T norm) {
  return 2 * h == length ? norm : T(1);
}

}  // namespace squall::kernels::hq_phase
