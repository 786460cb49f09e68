// SPDX-License-Identifier: Apache-2.0
#pragma once
/// Byte views of typed views: what transports and schedules move (they know no element types).

#include <squall/core/buffer.hpp>

#include <cstddef>  // byte

namespace squall::detail {

/// The bytes of `view`, read-only.
template <class T, class M>
buffer_view<const std::byte, M> as_bytes(buffer_view<T, M> view) noexcept {
  return {reinterpret_cast<const std::byte*>(view.data()), view.size_bytes()};
}

/// The bytes of `view`, writable.
template <class T, class M>
requires(!std::is_const_v<T>) buffer_view<std::byte, M> as_writable_bytes(buffer_view<T, M> view)
noexcept { return {reinterpret_cast<std::byte*>(view.data()), view.size_bytes()}; }

}  // namespace squall::detail
