// SPDX-License-Identifier: Apache-2.0
#pragma once
/// `scratch_bytes<Backend>`: bytes in a backend's memory that an algorithm keeps between calls
/// (payloads, decoded elements, factors), grown on demand through the backend's
/// `allocate_scratch` kernel: a `std::vector` on the host, stream-ordered device memory on
/// CUDA, whatever a test's backend gives.

#include <squall/backend/dispatch.hpp>
#include <squall/core/buffer.hpp>

#include <cstddef>  // byte, size_t
#include <optional>
#include <utility>  // declval

namespace squall::detail {

template <class Backend>
class scratch_bytes {
 public:
  using memory_space = typename Backend::memory_space;

  /// At least `bytes` bytes, 16-byte aligned. Growing drops the contents (nothing outlives a
  /// call but what the algorithm rewrites).
  std::byte* reserve(const Backend& b, std::size_t bytes) {
    if (!storage_ || bytes > size_) {
      storage_.reset();
      storage_.emplace(dispatch::allocate_on<std::byte>(b, bytes));
      size_ = bytes;
    }
    return data();
  }
  /// `count` elements of `T` at the start.
  template <class T>
  buffer_view<T, memory_space> elements(const Backend& b, std::size_t count) {
    return {reinterpret_cast<T*>(reserve(b, count * sizeof(T))), count};
  }
  /// The bytes (null before the first `reserve`).
  std::byte* data() { return storage_ ? static_cast<std::byte*>(storage_->data()) : nullptr; }
  std::size_t size() const { return size_; }

 private:
  using storage = decltype(dispatch::allocate_on<std::byte>(std::declval<const Backend&>(), 0));
  std::optional<storage> storage_;
  std::size_t size_ = 0;
};

}  // namespace squall::detail
