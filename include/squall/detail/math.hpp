// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <squall/core/config.hpp>

#include <cstddef>  // size_t
#include <cstdint>

namespace squall::detail {

/// `ceil(a / b)` for `b > 0`, without overflow for any `a`.
SQUALL_HOST_DEVICE constexpr std::size_t div_up(std::size_t a, std::size_t b) {
  return a / b + (a % b != 0 ? 1 : 0);
}

/// The smallest multiple of `alignment` that is `>= value`; `alignment > 0`.
SQUALL_HOST_DEVICE constexpr std::size_t align_up(std::size_t value, std::size_t alignment) {
  return div_up(value, alignment) * alignment;
}

/// A half-open range `[begin, begin + count)` of elements.
struct index_range {
  std::size_t begin = 0;
  std::size_t count = 0;
  SQUALL_HOST_DEVICE constexpr std::size_t end() const { return begin + count; }
  friend constexpr bool operator==(const index_range&, const index_range&) = default;
};

/// Part `part` of `count` elements split into `parts` near-equal pieces: the first
/// `count % parts` pieces hold one element more, so sizes differ by at most one and the
/// pieces tile `[0, count)` in order. Preconditions: `parts > 0`, `part < parts`.
SQUALL_HOST_DEVICE constexpr index_range split_range(std::size_t count, std::size_t parts,
                                                     std::size_t part) {
  const std::size_t base = count / parts;
  const std::size_t extra = count % parts;
  const std::size_t begin = part * base + (part < extra ? part : extra);
  return {begin, base + (part < extra ? 1 : 0)};
}

/// 64-bit FNV-1a of `n` bytes at `bytes`: each byte is xored into the hash, which is then
/// multiplied by an odd constant; both steps are bijections of the hash, so two inputs of one
/// length that differ in one byte always hash differently. Not a defence against deliberate
/// tampering. (Saved-state checksums, shared-memory job keys.)
inline std::uint64_t fnv1a64(const void* bytes, std::size_t n) {
  const auto* p = static_cast<const unsigned char*>(bytes);
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (std::size_t i = 0; i < n; ++i) {
    h ^= p[i];
    h *= 0x100000001b3ull;
  }
  return h;
}

}  // namespace squall::detail
