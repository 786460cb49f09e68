// SPDX-License-Identifier: Apache-2.0
#pragma once
/// `detail::backend_array<T, Backend>`: `count` elements of `T` owned in a backend's memory,
/// kept from call to call (a compression state's error-feedback residual and PowerSGD's Q),
/// with the two copies to and from host memory that saving and restoring it need. Allocated
/// by the backend's `allocate_scratch` kernel: a `std::vector` on the host, stream-ordered
/// device memory on CUDA, whatever a test's backend gives.

#include <squall/backend/dispatch.hpp>
#include <squall/core/buffer.hpp>
#include <squall/core/error.hpp>

#include <cstddef>  // size_t
#include <string>
#include <utility>  // declval

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

  /// `dst` = the elements, after the backend's earlier work; complete when it returns.
  void read(host_view<T> dst) const {
    require_count(dst.count());
    dispatch::copy_across_on(backend_, dst, view());
    backend_.synchronize();
  }
  /// The elements = `src`; complete when it returns.
  void write(host_view<const T> src) {
    require_count(src.count());
    dispatch::copy_across_on(backend_, view(), src);
    backend_.synchronize();
  }

 private:
  T* data() { return static_cast<T*>(storage_.data()); }
  const T* data() const { return static_cast<const T*>(storage_.data()); }

  void require_count(std::size_t host) const {
    if (host != count_) {
      throw invalid_argument(
          {.operation = "backend_array"},
          std::to_string(host) + " host elements for an array of " + std::to_string(count_));
    }
  }

  Backend backend_;
  decltype(dispatch::allocate_on<T>(std::declval<const Backend&>(), 0)) storage_;
  std::size_t count_ = 0;
};

}  // namespace squall::detail
