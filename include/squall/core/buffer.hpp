// SPDX-License-Identifier: Apache-2.0
#pragma once
/// `buffer_view<T, MemorySpace>`: a pointer, a `std::size_t` count, and where the memory lives.
/// The memory space is part of the type, so a device pointer cannot reach a host loop.

#include <squall/core/error.hpp>

#include <concepts>  // same_as
#include <cstddef>   // size_t
#include <iterator>  // data, size
#include <limits>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>

namespace squall {

/// Memory the CPU can dereference: pageable, pinned or shared host memory.
struct host_memory {
  static constexpr std::string_view name = "host";
};

/// Memory of a CUDA device, reachable only from kernels and copies.
struct device_memory {
  static constexpr std::string_view name = "device";
};

/// One of the memory spaces above.
template <class M>
concept memory_space = std::same_as<M, host_memory> || std::same_as<M, device_memory>;

/// A non-owning view of `count` elements of `T` in `MemorySpace`. Counts and byte sizes are
/// `std::size_t` throughout, so views of more than 2^31 elements work. Element access
/// (`operator[]`, iteration, `span()`) exists only for host memory.
template <class T, memory_space MemorySpace = host_memory>
class buffer_view {
 public:
  using element_type = T;
  using memory_space = MemorySpace;

  /// The empty view.
  constexpr buffer_view() noexcept = default;

  /// Views `count` elements at `data`. Throws `invalid_argument` for a null pointer with a
  /// nonzero count, or a count whose byte size overflows `std::size_t`.
  constexpr buffer_view(T* data, std::size_t count) : data_(data), count_(count) {
    if (data == nullptr && count != 0) {
      throw invalid_argument({.operation = "buffer_view"},
                             "null pointer with count " + std::to_string(count));
    }
    if (count > std::numeric_limits<std::size_t>::max() / sizeof(T)) {
      throw invalid_argument({.operation = "buffer_view"},
                             "count " + std::to_string(count) + " overflows the byte size");
    }
  }

  /// Views a contiguous host container or span (`std::vector`, `std::array`, `std::span`).
  template <class Container>
  requires std::same_as<MemorySpace, host_memory> &&
      (!std::is_same_v<std::remove_cvref_t<Container>, buffer_view>)&&requires(Container& c) {
    { std::data(c) } -> std::convertible_to<T*>;
    { std::size(c) } -> std::convertible_to<std::size_t>;
  }
  constexpr buffer_view(Container&& c)  // NOLINT(google-explicit-constructor): like std::span
      : buffer_view(std::data(c), static_cast<std::size_t>(std::size(c))) {}

  /// A view of non-const elements converts to a view of const ones.
  template <class U>
  requires(!std::is_same_v<U, T> && std::is_convertible_v<U (*)[], T (*)[]>) constexpr buffer_view(
      buffer_view<U, MemorySpace> other) noexcept  // NOLINT: like std::span
      : data_(other.data()), count_(other.count()) {}

  constexpr T* data() const noexcept { return data_; }
  constexpr std::size_t count() const noexcept { return count_; }
  constexpr std::size_t size_bytes() const noexcept { return count_ * sizeof(T); }
  constexpr bool empty() const noexcept { return count_ == 0; }

  /// Elements `[offset, offset + count)`; throws `invalid_argument` if they are not all inside.
  constexpr buffer_view subview(std::size_t offset, std::size_t count) const {
    if (offset > count_ || count > count_ - offset) {
      throw invalid_argument({.operation = "buffer_view subview"},
                             "elements [" + std::to_string(offset) + ", " + std::to_string(offset) +
                                 " + " + std::to_string(count) + ") outside a view of " +
                                 std::to_string(count_));
    }
    return buffer_view(data_ + offset, count);
  }

  constexpr T& operator[](
      std::size_t i) const noexcept requires std::same_as<MemorySpace, host_memory> {
    return data_[i];
  }
  constexpr T* begin() const noexcept requires std::same_as<MemorySpace, host_memory> {
    return data_;
  }
  constexpr T* end() const noexcept requires std::same_as<MemorySpace, host_memory> {
    return data_ + count_;
  }
  constexpr std::span<T> span() const noexcept requires std::same_as<MemorySpace, host_memory> {
    return {data_, count_};
  }

 private:
  T* data_ = nullptr;
  std::size_t count_ = 0;
};

template <class Container>
buffer_view(Container&)
    -> buffer_view<std::remove_pointer_t<decltype(std::data(std::declval<Container&>()))>>;

/// A view of host memory.
template <class T>
using host_view = buffer_view<T, host_memory>;
/// A view of device memory.
template <class T>
using device_view = buffer_view<T, device_memory>;

}  // namespace squall
