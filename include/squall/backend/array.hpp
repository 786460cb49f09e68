// SPDX-License-Identifier: Apache-2.0
#pragma once
/// `detail::backend_array<T, Backend>`: `count` elements of `T` owned in a backend's memory,
/// kept from call to call (a compression state's error-feedback residual and PowerSGD's Q),
/// with the two copies to and from host memory that saving and restoring it need. Allocated
/// by the backend's `allocate_scratch` kernel: a `std::vector` on the host, stream-ordered
/// device memory on CUDA, whatever a test's backend gives.

#include <squall/backend/dispatch.hpp>
#include <squall/core/buffer.hpp>

#include <cstddef>  // byte, size_t
#include <cstring>  // memcpy
#include <utility>  // declval
#include <vector>

namespace squall::detail {

template <class T, class Backend>
class backend_array {
 public:
  using memory_space = typename Backend::memory_space;

  /// `count` zero elements (zeroed on the backend; complete when it returns).
  backend_array(const Backend& b, std::size_t count)
      : backend_(b), storage_(dispatch::allocate_on<T>(b, count)), count_(count) {
    dispatch::fill_zero_on(backend_, view());
    backend_.synchronize();
  }

  std::size_t count() const { return count_; }
  const Backend& backend() const { return backend_; }
  buffer_view<T, memory_space> view() { return {data(), count_}; }
  buffer_view<const T, memory_space> view() const { return {data(), count_}; }

  /// The elements' bytes into host memory at `dst` (`count() * sizeof(T)` bytes, aligned for
  /// `T`: a saved state's values), after the backend's earlier work; complete when it returns.
  void save_to(std::byte* dst) const {
    dispatch::copy_across_on(backend_, host_view<T>(reinterpret_cast<T*>(dst), count_), view());
    backend_.synchronize();
  }
  /// The elements from `count() * sizeof(T)` bytes of host memory at `src`, which need not be
  /// aligned for `T` (a restored state's values); complete when it returns.
  void load_from(const std::byte* src) {
    std::vector<T> values(count_);
    if (count_ != 0) std::memcpy(values.data(), src, count_ * sizeof(T));
    dispatch::copy_across_on(backend_, view(), host_view<const T>(values.data(), count_));
    backend_.synchronize();
  }

 private:
  T* data() { return static_cast<T*>(storage_.data()); }
  const T* data() const { return static_cast<const T*>(storage_.data()); }

  Backend backend_;
  decltype(dispatch::allocate_on<T>(std::declval<const Backend&>(), 0)) storage_;
  std::size_t count_ = 0;
};

}  // namespace squall::detail
