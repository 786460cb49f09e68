// SPDX-License-Identifier: Apache-2.0
#pragma once
// A 64-bit hash of a result's bytes, so that ranks in different processes can show cheaply
// that they hold bitwise the same result (equal hashes everywhere, compared through MPI or a
// shared page), and hash-based inputs that any rank can compute for any other rank.

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace squall::test {

/// A word-at-a-time multiplicative hash of `bytes` bytes at `data`; the length is mixed in,
/// so an empty result and a result of zeros differ.
inline std::uint64_t hash_bytes(const void* data, std::size_t bytes) {
  const auto* p = static_cast<const unsigned char*>(data);
  std::uint64_t h = 0x9E3779B97F4A7C15ull ^ (bytes * 0xD6E8FEB86659FD93ull);
  std::size_t i = 0;
  for (; i + 8 <= bytes; i += 8) {
    std::uint64_t w = 0;
    std::memcpy(&w, p + i, 8);
    h = (h ^ w) * 0x100000001B3ull;
    h ^= h >> 29;
  }
  for (; i < bytes; ++i) h = (h ^ p[i]) * 0x100000001B3ull;
  h ^= h >> 31;
  h *= 0x94D049BB133111EBull;
  h ^= h >> 32;
  return h;
}

/// splitmix64 of (seed, rank, index): the raw material of inputs that every rank can compute
/// for every other rank without exchanging them.
inline std::uint64_t mix(std::uint64_t seed, int rank, std::size_t index) {
  std::uint64_t x = seed * 0x9E3779B97F4A7C15ull + (static_cast<std::uint64_t>(rank) << 40) +
                    static_cast<std::uint64_t>(index) * 0xBF58476D1CE4E5B9ull;
  x ^= x >> 30;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 27;
  x *= 0x94D049BB133111EBull;
  x ^= x >> 31;
  return x;
}

}  // namespace squall::test
