// SPDX-License-Identifier: Apache-2.0
#pragma once
/// CUDA twin of the host `convert` (kernels/host/convert.hpp), the cast compressor's body:
/// one grid-stride kernel over the elements, converting with the same bit routines as the
/// host's portable path (core/types.hpp: `binary32_to_binary16`, `binary16_to_binary32`, the
/// bfloat16 and double roundings), not the `__half` intrinsics, so that every value, NaN
/// payloads included, converts to the host's bits.

#include <squall/backend/cuda.cuh>
#include <squall/core/types.hpp>
#include <squall/kernels/cuda/reduce.cuh>
#include <squall/kernels/host/convert.hpp>

#include <cuda_runtime.h>

#include <concepts>  // same_as
#include <cstddef>   // size_t
#include <cstdint>   // uintptr_t

namespace squall::kernels {
namespace detail {

inline constexpr int convert_threads = 256;

/// A 16-bit value widened to float, exactly, as the host does it.
template <class From>
__device__ inline float widen_element(From x) {
  if constexpr (std::same_as<From, float16>) {
    return squall::detail::binary16_to_binary32(x.bits());
  } else {
    return static_cast<float>(x);  // bfloat16: the top half of a binary32
  }
}

/// A float rounded to a 16-bit `To`, to nearest even, as the host does it.
template <class To>
__device__ inline To narrow_element(float x) {
  if constexpr (std::same_as<To, float16>) {
    return float16::from_bits(squall::detail::binary32_to_binary16(x));
  } else {
    return To(x);  // bfloat16: binary32_to_bfloat16 on both sides
  }
}

/// One element as the host `convert` converts it.
template <class To, class From>
__device__ inline To convert_element(From x) {
  if constexpr (std::same_as<From, To>) {
    return x;
  } else if constexpr (std::same_as<From, float>) {
    return narrow_element<To>(x);
  } else if constexpr (std::same_as<From, double>) {
    return To(x);  // one rounding: round_to_nearest_even on both sides
  } else if constexpr (std::same_as<To, float> || std::same_as<To, double>) {
    return static_cast<To>(widen_element(x));
  } else {
    return narrow_element<To>(widen_element(x));  // one 16-bit type to the other
  }
}

/// Groups of four elements in one load and one store each where both arrays are aligned to
/// four elements, one element at a time otherwise and for the tail.
template <class To, class From>
__global__ void __launch_bounds__(convert_threads)
    convert_kernel(const From* in, To* out, std::size_t count) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * convert_threads;
  const std::size_t first = static_cast<std::size_t>(blockIdx.x) * convert_threads + threadIdx.x;
  const bool aligned = reinterpret_cast<std::uintptr_t>(in) % sizeof(four<From>) == 0 &&
                       reinterpret_cast<std::uintptr_t>(out) % sizeof(four<To>) == 0;
  const std::size_t groups = aligned ? count / 4 : 0;
  for (std::size_t g = first; g < groups; g += stride) {
    const four<From> x = reinterpret_cast<const four<From>*>(in)[g];
    four<To> y;
#pragma unroll
    for (int k = 0; k < 4; ++k) y.v[k] = convert_element<To>(x.v[k]);
    reinterpret_cast<four<To>*>(out)[g] = y;
  }
  for (std::size_t i = 4 * groups + first; i < count; i += stride) {
    out[i] = convert_element<To>(in[i]);
  }
}

}  // namespace detail

/// Device twin of the host `convert`: `out[i] = To(in[i])` for `count` elements of device
/// memory, enqueued on the backend's stream; equal to the host bit for bit.
template <convertible_element To, convertible_element From>
void convert(const cuda_backend& backend, const From* in, To* out, std::size_t count) {
  if (count == 0) return;
  squall::detail::device_guard guard(backend.device);
  if constexpr (std::same_as<From, To>) {
    SQUALL_CUDA_CHECK(
        cudaMemcpyAsync(out, in, count * sizeof(To), cudaMemcpyDeviceToDevice, backend.stream));
  } else {
    const std::size_t threads = (count + 3) / 4;  // a group of four each, where aligned
    const std::size_t blocks = (threads + detail::convert_threads - 1) / detail::convert_threads;
    detail::convert_kernel<To>
        <<<static_cast<unsigned>(blocks < detail::max_blocks ? blocks : detail::max_blocks),
           detail::convert_threads, 0, backend.stream>>>(in, out, count);
    SQUALL_CUDA_CHECK(cudaGetLastError());
  }
}

}  // namespace squall::kernels
