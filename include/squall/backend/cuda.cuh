// SPDX-License-Identifier: Apache-2.0
#pragma once
/// `cuda_backend{device, stream}`: kernels run stream-ordered on one CUDA device.

#include <squall/backend/host.hpp>
#include <squall/concepts.hpp>
#include <squall/core/error.hpp>

#include <cuda_runtime.h>

#include <string>
#include <string_view>
#include <system_error>

namespace squall {
namespace detail {

[[noreturn]] inline void throw_cuda_error(cudaError_t status, const char* expression,
                                          const char* file, int line) {
  throw error(std::error_code(static_cast<int>(status), cuda_category()), {.operation = expression},
              std::string(cudaGetErrorName(status)) + " (" + cudaGetErrorString(status) + ") at " +
                  file + ":" + std::to_string(line));
}

/// Makes `device` current for the scope and restores the previous device after it.
class device_guard {
 public:
  explicit device_guard(int device);
  ~device_guard() { cudaSetDevice(previous_); }
  device_guard(const device_guard&) = delete;
  device_guard& operator=(const device_guard&) = delete;

 private:
  int previous_ = 0;
};

}  // namespace detail

/// Throws `squall::error` in the cuda category, naming the expression, if it is not
/// `cudaSuccess`.
#define SQUALL_CUDA_CHECK(expr)                                                           \
  do {                                                                                    \
    const cudaError_t squall_cuda_status_ = (expr);                                       \
    if (squall_cuda_status_ != cudaSuccess) {                                             \
      ::squall::detail::throw_cuda_error(squall_cuda_status_, #expr, __FILE__, __LINE__); \
    }                                                                                     \
  } while (false)

inline detail::device_guard::device_guard(int device) {
  SQUALL_CUDA_CHECK(cudaGetDevice(&previous_));
  if (device != previous_) SQUALL_CUDA_CHECK(cudaSetDevice(device));
}

/// The CUDA backend: kernels are enqueued on `stream` of `device` and return at once;
/// `synchronize()` waits for them. A small value, copied freely.
struct cuda_backend : kernels::kernel_dispatch {
  using memory_space = device_memory;
  static constexpr std::string_view name = "cuda";

  /// Work goes to `stream` (the legacy default stream if null) on `device`.
  explicit cuda_backend(int device = 0, cudaStream_t stream = nullptr) noexcept
      : device(device), stream(stream) {}

  /// Blocks until everything enqueued on `stream` has finished; throws on a CUDA error.
  void synchronize() const {
    detail::device_guard guard(device);
    SQUALL_CUDA_CHECK(cudaStreamSynchronize(stream));
  }

  int device;
  cudaStream_t stream;
};
static_assert(backend<cuda_backend>);

}  // namespace squall
