// SPDX-License-Identifier: Apache-2.0
#pragma once
/// CUDA twins of kernels/host/reduce.hpp: the same signatures over device views, the same
/// per-element functors (core/ops.hpp), so the host tests pin down the device math. Also the
/// device side of the compressors' generic helpers: `subtract_into` (error feedback),
/// `fill_zero`, the payload byte transfers `store_bytes` / `load_bytes` (host bytes to and
/// from device memory), and `allocate_scratch` (stream-ordered `cudaMallocAsync` scratch, which the
/// other CUDA kernels use for CUB's temporary storage through `detail::run_cub`).

#include <squall/backend/cuda.cuh>
#include <squall/core/buffer.hpp>
#include <squall/core/error.hpp>
#include <squall/core/ops.hpp>
#include <squall/detail/math.hpp>
#include <squall/kernels/host/reduce.hpp>
#include <squall/tuning/tuning.hpp>

#include <cuda_runtime.h>

#include <cstddef>  // byte, size_t
#include <cstdint>  // int32_t
#include <cstring>  // memcpy
#include <limits>
#include <string>
#include <type_traits>
#include <utility>  // exchange

namespace squall::kernels {
namespace detail {

/// The most blocks one launch uses; the grid-stride loop covers any count beyond.
inline constexpr std::size_t max_blocks = 65535;

/// Four elements in one aligned access (16 bytes of float, 8 of a 16-bit type).
template <class T>
struct alignas(4 * sizeof(T)) four {
  T v[4];
};

// step: each block takes tiles of threads_per_block * items_per_thread elements; thread t
// handles elements tile + k * threads_per_block + t, so a warp's accesses are coalesced.
template <kernel_tuning Tuning, class Body>
__device__ void for_each_index(std::size_t count, Body body) {
  constexpr std::size_t tile =
      static_cast<std::size_t>(Tuning.threads_per_block) * Tuning.items_per_thread;
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * tile;
  for (std::size_t base = static_cast<std::size_t>(blockIdx.x) * tile; base < count;
       base += stride) {
#pragma unroll
    for (int k = 0; k < Tuning.items_per_thread; ++k) {
      const std::size_t i =
          base + static_cast<std::size_t>(k) * Tuning.threads_per_block + threadIdx.x;
      if (i < count) body(i);
    }
  }
}

// nvcc 13.0 cannot emit host stubs for __global__ templates with class-type template
// arguments, so the __global__ wrappers take the tuning as two ints and rebuild it.
template <int Threads, int Items, class T, class Op>
__global__ void __launch_bounds__(Threads)
    reduce_kernel(T* dst, const T* a, const T* b, std::size_t count, Op op) {
  for_each_index<kernel_tuning{Threads, Items}>(
      count, [&](std::size_t i) { dst[i] = combine<T>(op, a[i], b[i]); });
}

template <int Threads, int Items, class T, class Op>
__global__ void __launch_bounds__(Threads)
    finalize_kernel(T* dst, std::size_t count, std::size_t contributions, Op op) {
  for_each_index<kernel_tuning{Threads, Items}>(count, [&](std::size_t i) {
    dst[i] = from_accumulator<T>(op.finalize(to_accumulator(dst[i]), contributions));
  });
}

template <int Threads, int Items, class T>
__global__ void __launch_bounds__(Threads)
    subtract_kernel(T* dst, const T* src, std::size_t count) {
  for_each_index<kernel_tuning{Threads, Items}>(
      count, [&](std::size_t i) { dst[i] = difference(dst[i], src[i]); });
}

template <int Threads, int Items, class T>
__global__ void __launch_bounds__(Threads)
    vote_add_kernel(std::int32_t* votes, T* sums, const T* x, std::size_t count, bool first) {
  for_each_index<kernel_tuning{Threads, Items}>(count, [&](std::size_t i) {
    const T value = x[i];
    const std::int32_t sign =
        static_cast<std::int32_t>(value > T(0)) - static_cast<std::int32_t>(value < T(0));
    const T magnitude = value < T(0) ? -value : value;
    votes[i] = first ? sign : votes[i] + sign;
    sums[i] = first ? magnitude : sums[i] + magnitude;
  });
}

template <int Threads, int Items, class T>
__global__ void __launch_bounds__(Threads)
    vote_finish_kernel(const std::int32_t* votes, T* sums, std::size_t count) {
  for_each_index<kernel_tuning{Threads, Items}>(count, [&](std::size_t i) {
    sums[i] = votes[i] > 0 ? sums[i] : votes[i] < 0 ? -sums[i] : T(0) * sums[i];
  });
}

template <kernel_tuning Tuning>
unsigned grid_for(std::size_t count) {
  const std::size_t tile =
      static_cast<std::size_t>(Tuning.threads_per_block) * Tuning.items_per_thread;
  const std::size_t blocks = squall::detail::div_up(count, tile);
  return static_cast<unsigned>(blocks < max_blocks ? blocks : max_blocks);
}

template <kernel_tuning Tuning, class T, class Op>
void launch_reduce(const cuda_backend& backend, Op op, T* dst, const T* a, const T* b,
                   std::size_t count) {
  if (count == 0) return;
  squall::detail::device_guard guard(backend.device);
  reduce_kernel<Tuning.threads_per_block, Tuning.items_per_thread>
      <<<grid_for<Tuning>(count), Tuning.threads_per_block, 0, backend.stream>>>(dst, a, b, count,
                                                                                 op);
  SQUALL_CUDA_CHECK(cudaGetLastError());
}

}  // namespace detail

/// Device scratch for `count` elements of `T`: taken from squall's pool (`scratch_pool`) on
/// the backend's stream when made, `cudaFreeAsync` on it when destroyed, so it is
/// stream-ordered with the kernels that use it (contents unspecified). Move-only.
template <class T>
class device_scratch {
 public:
  device_scratch(const cuda_backend& backend, std::size_t count)
      : backend_(backend), count_(count) {
    if (count == 0) return;
    if (count > std::numeric_limits<std::size_t>::max() / sizeof(T)) {
      throw invalid_argument({.operation = "allocate_scratch"},
                             "scratch of " + std::to_string(count) + " elements overflows");
    }
    squall::detail::device_guard guard(backend.device);
    data_ = static_cast<T*>(
        squall::detail::allocate_device_scratch(backend.device, count * sizeof(T), backend.stream));
  }
  ~device_scratch() { release(); }
  device_scratch(device_scratch&& other) noexcept
      : backend_(other.backend_),
        data_(std::exchange(other.data_, nullptr)),
        count_(std::exchange(other.count_, 0)) {}
  device_scratch& operator=(device_scratch&& other) noexcept {
    if (this != &other) {
      release();
      backend_ = other.backend_;
      data_ = std::exchange(other.data_, nullptr);
      count_ = std::exchange(other.count_, 0);
    }
    return *this;
  }
  device_scratch(const device_scratch&) = delete;
  device_scratch& operator=(const device_scratch&) = delete;

  T* data() const noexcept { return data_; }
  std::size_t count() const noexcept { return count_; }
  device_view<T> view() const { return {data_, count_}; }

 private:
  // No throwing here: errors of the free surface at the stream's next checked call.
  void release() noexcept {
    if (data_ == nullptr) return;
    int previous = 0;
    const bool switched = cudaGetDevice(&previous) == cudaSuccess && previous != backend_.device &&
                          cudaSetDevice(backend_.device) == cudaSuccess;
    cudaFreeAsync(data_, backend_.stream);
    if (switched) cudaSetDevice(previous);
    data_ = nullptr;
  }

  cuda_backend backend_;
  T* data_ = nullptr;
  std::size_t count_ = 0;
};

/// Device twin of the host `allocate_scratch`: `count` elements of `T` in device memory,
/// stream-ordered on the backend's stream.
template <class T>
device_scratch<T> allocate_scratch(const cuda_backend& backend, std::size_t count) {
  return device_scratch<T>(backend, count);
}

namespace detail {

/// Runs a CUB device-wide algorithm: `call(temp, bytes)` is called once with a null `temp` to
/// size the temporary storage, then with stream-ordered scratch of that size (at least one
/// byte, so the second call is never taken for a size query). `call` returns CUB's
/// `cudaError_t`, which is checked.
template <class Call>
void run_cub(const cuda_backend& backend, Call call) {
  std::size_t bytes = 0;
  SQUALL_CUDA_CHECK(call(static_cast<void*>(nullptr), bytes));
  device_scratch<std::byte> temp(backend, bytes == 0 ? 1 : bytes);
  SQUALL_CUDA_CHECK(call(static_cast<void*>(temp.data()), bytes));
}

/// The value at `device` copied to the host, after the stream's earlier work (one sync).
template <class V>
V read_back(const cuda_backend& backend, const V* device) {
  V value{};
  SQUALL_CUDA_CHECK(
      cudaMemcpyAsync(&value, device, sizeof value, cudaMemcpyDeviceToHost, backend.stream));
  SQUALL_CUDA_CHECK(cudaStreamSynchronize(backend.stream));
  return value;
}

}  // namespace detail

/// `dst[i] = op(dst[i], src[i])` on the device, enqueued on the backend's stream. `src` may
/// be `dst`; a count mismatch throws `invalid_argument`.
template <element T, reduction_op<T> Op, kernel_tuning Tuning = elementwise_tuning>
void reduce_into(const cuda_backend& backend, Op op, device_view<T> dst,
                 device_view<const std::type_identity_t<T>> src) {
  detail::require_same_count("reduce_into", dst.count(), src.count());
  detail::launch_reduce<Tuning>(backend, op, dst.data(), dst.data(), src.data(), dst.count());
}

/// `dst[i] = op(a[i], b[i])` on the device; `dst` may be `a` or `b`.
template <element T, reduction_op<T> Op, kernel_tuning Tuning = elementwise_tuning>
void reduce(const cuda_backend& backend, Op op, device_view<T> dst,
            device_view<const std::type_identity_t<T>> a,
            device_view<const std::type_identity_t<T>> b) {
  detail::require_same_count("reduce", dst.count(), a.count());
  detail::require_same_count("reduce", dst.count(), b.count());
  detail::launch_reduce<Tuning>(backend, op, dst.data(), a.data(), b.data(), dst.count());
}

/// `dst[i] = src[i]` on the device (a stream-ordered device-to-device copy).
template <class T>
requires std::is_trivially_copyable_v<T>
void copy(const cuda_backend& backend, device_view<T> dst,
          device_view<const std::type_identity_t<T>> src) {
  detail::require_same_count("copy", dst.count(), src.count());
  if (dst.empty() || dst.data() == src.data()) return;
  squall::detail::device_guard guard(backend.device);
  SQUALL_CUDA_CHECK(cudaMemcpyAsync(dst.data(), src.data(), dst.size_bytes(),
                                    cudaMemcpyDeviceToDevice, backend.stream));
}

/// `dst[i] = src[i]` from the device to the host, stream-ordered (the staging step of a
/// host transport: the caller synchronizes before the host reads `dst`).
template <class T>
requires std::is_trivially_copyable_v<T>
void copy(const cuda_backend& backend, host_view<T> dst,
          device_view<const std::type_identity_t<T>> src) {
  detail::require_same_count("copy", dst.count(), src.count());
  if (dst.empty()) return;
  squall::detail::device_guard guard(backend.device);
  SQUALL_CUDA_CHECK(cudaMemcpyAsync(dst.data(), src.data(), dst.size_bytes(),
                                    cudaMemcpyDeviceToHost, backend.stream));
}

/// `dst[i] = src[i]` from the host to the device, stream-ordered (the staging step's way
/// back; `src` must stay unchanged until the stream has run the copy).
template <class T>
requires std::is_trivially_copyable_v<T>
void copy(const cuda_backend& backend, device_view<T> dst,
          host_view<const std::type_identity_t<T>> src) {
  detail::require_same_count("copy", dst.count(), src.count());
  if (dst.empty()) return;
  squall::detail::device_guard guard(backend.device);
  SQUALL_CUDA_CHECK(cudaMemcpyAsync(dst.data(), src.data(), dst.size_bytes(),
                                    cudaMemcpyHostToDevice, backend.stream));
}

/// Device twin of the host `subtract_into`: `dst[i] = dst[i] - src[i]` in the accumulator
/// type, rounded once (integers wrap), enqueued on the backend's stream. Equal to the host bit
/// for bit except NaN payloads (the GPU's float arithmetic returns its canonical NaN) and, for
/// float16, the NaN a rounding returns.
template <element T, kernel_tuning Tuning = elementwise_tuning>
void subtract_into(const cuda_backend& backend, device_view<T> dst,
                   device_view<const std::type_identity_t<T>> src) {
  detail::require_same_count("subtract_into", dst.count(), src.count());
  if (dst.empty()) return;
  squall::detail::device_guard guard(backend.device);
  detail::subtract_kernel<Tuning.threads_per_block, Tuning.items_per_thread>
      <<<detail::grid_for<Tuning>(dst.count()), Tuning.threads_per_block, 0, backend.stream>>>(
          dst.data(), src.data(), dst.count());
  SQUALL_CUDA_CHECK(cudaGetLastError());
}

/// Device twin of the host `fill_zero`: every byte of `dst` set to zero (`cudaMemsetAsync`).
template <class T>
requires std::is_trivially_copyable_v<T>
void fill_zero(const cuda_backend& backend, device_view<T> dst) {
  if (dst.empty()) return;
  squall::detail::device_guard guard(backend.device);
  SQUALL_CUDA_CHECK(cudaMemsetAsync(dst.data(), 0, dst.size_bytes(), backend.stream));
}

/// `op.finalize` on every element on the device; a no-op for ops without one.
template <element T, reduction_op<T> Op, kernel_tuning Tuning = elementwise_tuning>
void finalize(const cuda_backend& backend, Op op, device_view<T> dst, std::size_t contributions) {
  if constexpr (finalizing_op<Op, T>) {
    if (contributions == 0) {
      throw invalid_argument({.operation = "finalize"}, "zero contributions");
    }
    if (dst.empty()) return;
    squall::detail::device_guard guard(backend.device);
    detail::finalize_kernel<Tuning.threads_per_block, Tuning.items_per_thread>
        <<<detail::grid_for<Tuning>(dst.count()), Tuning.threads_per_block, 0, backend.stream>>>(
            dst.data(), dst.count(), contributions, op);
    SQUALL_CUDA_CHECK(cudaGetLastError());
  }
}

/// Device twin of the host `vote_add`: one step of a majority vote over decoded values `x`.
template <class T>
requires std::is_floating_point_v<T>
void vote_add(const cuda_backend& backend, device_view<std::int32_t> votes, device_view<T> sums,
              device_view<const std::type_identity_t<T>> x, bool first) {
  detail::require_same_count("vote_add", votes.count(), x.count());
  detail::require_same_count("vote_add", sums.count(), x.count());
  if (x.empty()) return;
  squall::detail::device_guard guard(backend.device);
  constexpr kernel_tuning tuning = elementwise_tuning;
  detail::vote_add_kernel<tuning.threads_per_block, tuning.items_per_thread>
      <<<detail::grid_for<tuning>(x.count()), tuning.threads_per_block, 0, backend.stream>>>(
          votes.data(), sums.data(), x.data(), x.count(), first);
  SQUALL_CUDA_CHECK(cudaGetLastError());
}

/// Device twin of the host `vote_finish`: the vote's signed sums, in place.
template <class T>
requires std::is_floating_point_v<T>
void vote_finish(const cuda_backend& backend, device_view<const std::int32_t> votes,
                 device_view<T> sums) {
  detail::require_same_count("vote_finish", votes.count(), sums.count());
  if (sums.empty()) return;
  squall::detail::device_guard guard(backend.device);
  constexpr kernel_tuning tuning = elementwise_tuning;
  detail::vote_finish_kernel<tuning.threads_per_block, tuning.items_per_thread>
      <<<detail::grid_for<tuning>(sums.count()), tuning.threads_per_block, 0, backend.stream>>>(
          votes.data(), sums.data(), sums.count());
  SQUALL_CUDA_CHECK(cudaGetLastError());
}

namespace detail {

/// Bytes that `store_bytes` passes by value in a kernel's parameters (a payload's header).
inline constexpr std::size_t inline_store_bytes = 256;

struct inline_bytes {
  std::byte bytes[inline_store_bytes];
};

template <int = 0>
__global__ void store_inline_kernel(std::byte* dst, inline_bytes src, unsigned size) {
  for (unsigned i = threadIdx.x; i < size; i += blockDim.x) dst[i] = src.bytes[i];
}

}  // namespace detail

/// Copies `size` host bytes into device memory at `dst`, stream-ordered; the host source may
/// be reused when the call returns. Up to `inline_store_bytes` travel in a kernel's
/// parameters, so the call neither waits for the stream nor lets the driver wait for it (a
/// copy from pageable memory would); more go by `cudaMemcpyAsync`, then a wait.
inline void store_bytes(const cuda_backend& backend, std::byte* dst, const void* src,
                        std::size_t size) {
  if (size == 0) return;
  squall::detail::device_guard guard(backend.device);
  if (size <= detail::inline_store_bytes) {
    detail::inline_bytes value;
    std::memcpy(value.bytes, src, size);
    detail::store_inline_kernel<<<1, 64, 0, backend.stream>>>(dst, value,
                                                              static_cast<unsigned>(size));
    SQUALL_CUDA_CHECK(cudaGetLastError());
    return;
  }
  SQUALL_CUDA_CHECK(cudaMemcpyAsync(dst, src, size, cudaMemcpyHostToDevice, backend.stream));
  SQUALL_CUDA_CHECK(cudaStreamSynchronize(backend.stream));
}

/// Copies `size` device bytes at `src` to the host, after the stream's earlier work.
inline void load_bytes(const cuda_backend& backend, void* dst, const std::byte* src,
                       std::size_t size) {
  if (size == 0) return;
  squall::detail::device_guard guard(backend.device);
  SQUALL_CUDA_CHECK(cudaMemcpyAsync(dst, src, size, cudaMemcpyDeviceToHost, backend.stream));
  SQUALL_CUDA_CHECK(cudaStreamSynchronize(backend.stream));
}

}  // namespace squall::kernels
