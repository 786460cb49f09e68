// SPDX-License-Identifier: Apache-2.0
#pragma once
/// Typed views of the byte vectors the algorithms keep between calls.

#include <cstddef>  // byte, size_t
#include <vector>

namespace squall::detail {

/// `count` elements of `T` in `bytes`, grown as needed (operator new aligns to 16).
template <class T>
T* elements_of(std::vector<std::byte>& bytes, std::size_t count) {
  if (bytes.size() < count * sizeof(T)) bytes.resize(count * sizeof(T));
  return reinterpret_cast<T*>(bytes.data());
}

}  // namespace squall::detail
