// SPDX-License-Identifier: Apache-2.0
#pragma once
/// CUDA twins of kernels/host/reduce.hpp: the same signatures over device views, the same
/// per-element functors (core/ops.hpp), so the host tests pin down the device math.

#include <squall/backend/cuda.cuh>
#include <squall/core/buffer.hpp>
#include <squall/core/error.hpp>
#include <squall/core/ops.hpp>
#include <squall/detail/math.hpp>
#include <squall/kernels/host/reduce.hpp>
#include <squall/tuning/tuning.hpp>

#include <cuda_runtime.h>

#include <cstddef>  // size_t
#include <type_traits>

namespace squall::kernels {
namespace detail {

/// The most blocks one launch uses; the grid-stride loop covers any count beyond.
inline constexpr std::size_t max_blocks = 65535;

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

}  // namespace squall::kernels
