// SPDX-License-Identifier: Apache-2.0
#pragma once
// The first page boundary in a byte buffer, for tests that place data at chosen offsets in a
// page (the copy kernels' and the cross-memory copies' slow case depends on them).

#include <squall/detail/math.hpp>

#include <cstddef>
#include <cstdint>
#include <vector>

namespace squall::test {

/// The first address in `buffer` at a multiple of `page`; the caller sizes `buffer` `page`
/// bytes beyond what it uses from there.
inline std::byte* page_aligned(std::vector<std::byte>& buffer, std::size_t page) {
  const auto at = reinterpret_cast<std::uintptr_t>(buffer.data());
  return buffer.data() + (detail::align_up(at, page) - at);
}

}  // namespace squall::test
