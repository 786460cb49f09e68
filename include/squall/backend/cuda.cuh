// SPDX-License-Identifier: Apache-2.0
#pragma once
/// `cuda_backend{device, stream}`: kernels run stream-ordered on one CUDA device.

#include <squall/backend/host.hpp>
#include <squall/concepts.hpp>
#include <squall/core/error.hpp>

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>

namespace squall {
namespace detail {

/// Throws `squall::error` in the cuda category naming the call, the current device and the
/// place: "squall cudaMalloc(...): cudaErrorMemoryAllocation (out of memory) on device 0 at
/// file:line".
[[noreturn]] inline void throw_cuda_error(cudaError_t status, const char* expression,
                                          const char* file, int line) {
  int device = -1;
  const std::string on =
      cudaGetDevice(&device) == cudaSuccess ? " on device " + std::to_string(device) : "";
  throw error(std::error_code(static_cast<int>(status), cuda_category()), {.operation = expression},
              std::string(cudaGetErrorName(status)) + " (" + cudaGetErrorString(status) + ")" + on +
                  " at " + file + ":" + std::to_string(line));
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

namespace detail {

/// The stream-ordered memory pool squall's device scratch comes from on `device`: its own
/// (the device's default pool, and its settings, stay the program's), keeping the memory it
/// has handed out between synchronizations (release threshold: unlimited), as a caching
/// allocator does, so that scratch taken and given back by every call (an encode's
/// workspace, CUB's temporary storage, a word read back) costs no `cudaMalloc` after the
/// first. Created on first use and kept for the process; `trim_device_scratch` returns what
/// is not in use to the device.
inline cudaMemPool_t scratch_pool(int device) {
  static std::mutex mutex;
  static std::map<int, cudaMemPool_t> pools;
  const std::lock_guard lock(mutex);
  if (const auto it = pools.find(device); it != pools.end()) return it->second;
  cudaMemPoolProps props{};
  props.allocType = cudaMemAllocationTypePinned;
  props.location.type = cudaMemLocationTypeDevice;
  props.location.id = device;
  cudaMemPool_t pool{};
  SQUALL_CUDA_CHECK(cudaMemPoolCreate(&pool, &props));
  std::uint64_t keep_all = UINT64_MAX;
  SQUALL_CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep_all));
  pools.emplace(device, pool);
  return pool;
}

/// `bytes` of device memory from `scratch_pool(device)`, ordered on `stream`; give it back
/// with `cudaFreeAsync`.
inline void* allocate_device_scratch(int device, std::size_t bytes, cudaStream_t stream) {
  void* p = nullptr;
  SQUALL_CUDA_CHECK(cudaMallocFromPoolAsync(&p, bytes, scratch_pool(device), stream));
  return p;
}

}  // namespace detail

/// Returns the device scratch that squall's pool on `device` holds and no call is using to
/// the device (`cudaMemPoolTrimTo`), after the work enqueued so far has finished with it.
inline void trim_device_scratch(int device) {
  SQUALL_CUDA_CHECK(cudaDeviceSynchronize());
  SQUALL_CUDA_CHECK(cudaMemPoolTrimTo(detail::scratch_pool(device), 0));
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

/// Page-locked host memory (`cudaHostAlloc`, portable to every device), freed with the object:
/// the staging buffer of a host transport (algorithm/dense.hpp), from which copies to and from
/// the device run at the bus's speed and asynchronously (from pageable memory they go through
/// the driver's own buffer and return only when done).
class pinned_host_bytes {
 public:
  explicit pinned_host_bytes(std::size_t bytes) : size_(bytes) {
    SQUALL_CUDA_CHECK(cudaHostAlloc(&data_, bytes == 0 ? 1 : bytes, cudaHostAllocPortable));
  }
  ~pinned_host_bytes() {
    if (data_ != nullptr) cudaFreeHost(data_);
  }
  pinned_host_bytes(pinned_host_bytes&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}
  pinned_host_bytes& operator=(pinned_host_bytes&&) = delete;
  pinned_host_bytes(const pinned_host_bytes&) = delete;

  std::byte* data() const { return static_cast<std::byte*>(data_); }
  std::size_t size() const { return size_; }

 private:
  void* data_ = nullptr;
  std::size_t size_;
};

/// The staging buffer of `bytes` for `backend` (see `pinned_host_bytes`).
inline pinned_host_bytes allocate_pinned_host(const cuda_backend&, std::size_t bytes) {
  return pinned_host_bytes(bytes);
}

/// A point in a stream's work (an event recorded on it, destroyed with the object): the staged
/// allreduce waits for the copy of one piece to the host, not for the whole stream.
class cuda_mark {
 public:
  explicit cuda_mark(const cuda_backend& backend) {
    detail::device_guard guard(backend.device);
    SQUALL_CUDA_CHECK(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming));
    const cudaError_t recorded = cudaEventRecord(event_, backend.stream);
    if (recorded != cudaSuccess) {
      cudaEventDestroy(event_);
      SQUALL_CUDA_CHECK(recorded);
    }
  }
  ~cuda_mark() {
    if (event_ != nullptr) cudaEventDestroy(event_);  // released once the stream reaches it
  }
  cuda_mark(cuda_mark&& other) noexcept : event_(std::exchange(other.event_, nullptr)) {}
  cuda_mark& operator=(cuda_mark&&) = delete;
  cuda_mark(const cuda_mark&) = delete;

  /// Blocks until the work enqueued before the mark has finished; throws on a CUDA error.
  void wait() const { SQUALL_CUDA_CHECK(cudaEventSynchronize(event_)); }

 private:
  cudaEvent_t event_ = nullptr;
};

/// A mark after the work enqueued on `backend`'s stream so far.
inline cuda_mark record_mark(const cuda_backend& backend) { return cuda_mark(backend); }
/// Blocks until the work before `mark` has finished.
inline void wait_mark(const cuda_backend&, const cuda_mark& mark) { mark.wait(); }

}  // namespace squall
