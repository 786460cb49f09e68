// SPDX-License-Identifier: Apache-2.0
#pragma once
/// The random numbers of the stochastic compressors: Random123's Philox4x32-10 (Salmon et al.,
/// "Parallel Random Numbers: As Easy as 1, 2, 3", SC 2011; Debian's librandom123-dev), a
/// counter-based generator, so the number drawn for an element is a pure function of
/// (seed, step, rank, element) and the same on the host and in a CUDA kernel.
///
/// Keying (docs/compressors.md): key = (seed low 32 bits, seed high 32 bits); counter =
/// (block low 32 bits, block high 32 bits, step's low 32 bits, rank), where block = element / 4 and the
/// element takes word element % 4 of the block's four outputs. `step` counts the calls on one
/// tensor (the caller's state advances it); `rank` separates the ranks' streams. A compressor
/// whose payloads must agree across ranks (randomk's indices, count_sketch's hashes) draws
/// with `rank = shared_rank`, the same on every rank.

#include <squall/core/config.hpp>

#include <Random123/philox.h>

#include <cstddef>
#include <cstdint>

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

/// The 32-bit word of `element` in the stream (seed, step, rank).
SQUALL_HOST_DEVICE inline std::uint32_t random_word(std::uint64_t seed, random_stream stream,
                                                    std::uint64_t element) {
  return philox(seed, stream, element / 4).word[element % 4];
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
