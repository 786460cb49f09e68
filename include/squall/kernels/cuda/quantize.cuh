// SPDX-License-Identifier: Apache-2.0
#pragma once
/// CUDA twins of kernels/host/quantize.hpp (`quantize`, `dequantize`): the same signatures
/// over device memory and the same per-element math (`quantize_code`, `dequantize_code`,
/// Philox from Random123), so a device payload equals the host's byte for byte. One block per
/// bucket: CUB's BlockReduce gives the scale (sum in double, or the max of the magnitudes' bit
/// patterns, as on the host); each thread then codes 8 consecutive elements into `width` whole
/// bytes.

#include <squall/backend/cuda.cuh>
#include <squall/core/random.hpp>
#include <squall/kernels/cuda/reduce.cuh>  // store_bytes, load_bytes
#include <squall/kernels/host/quantize.hpp>

#include <cub/block/block_reduce.cuh>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace squall::kernels {
namespace detail {

inline constexpr int quantize_threads = 256;

// nvcc cannot emit host stubs for __global__ templates with class-type template arguments:
// the scheme travels as plain values and is rebuilt inside.
template <std::uint32_t Levels, unsigned Width, int Scale, bool Stochastic, bool SignOnly,
          unsigned Float8>
__device__ constexpr quantize_scheme scheme_of() {
  return {Levels,     Width,    static_cast<bucket_scale>(Scale),
          Stochastic, SignOnly, static_cast<std::uint8_t>(Float8)};
}

static_assert(static_cast<std::size_t>(quantize_threads) == bucket_sum_lanes,
              "a block's threads are the lanes of the host's bucket sum");

/// The bucket sum of the host's `bucket_stats_of`: thread t holds lane t's sum; the lanes are
/// added pairwise, t taking t + s for s = 128, ..., 1 (shared memory, then shuffles within the
/// first warp), each sum rounded once. Thread 0 gets the total.
__device__ inline double bucket_sum(double mine, double* lanes) {
  const unsigned t = threadIdx.x;
  lanes[t] = mine;
  __syncthreads();
  for (unsigned half = quantize_threads / 2; half >= 32; half /= 2) {
    if (t < half) lanes[t] = __dadd_rn(lanes[t], lanes[t + half]);
    __syncthreads();
  }
  double v = t < 32 ? lanes[t] : 0.0;
  if (t < 32) {
    for (unsigned half = 16; half > 0; half /= 2) {
      v = __dadd_rn(v, __shfl_down_sync(0xffffffffu, v, half));
    }
  }
  __syncthreads();  // `lanes` is read before the next bucket writes it
  return v;
}

template <std::uint32_t Levels, unsigned Width, int Scale, bool Stochastic, bool SignOnly,
          unsigned Float8, class T>
__global__ void __launch_bounds__(quantize_threads)
    quantize_kernel(const T* in, std::size_t count, std::size_t bucket, T* scales,
                    std::uint8_t* codes, std::uint64_t seed, random_stream stream,
                    unsigned long long* first_bad) {
  constexpr quantize_scheme q = scheme_of<Levels, Width, Scale, Stochastic, SignOnly, Float8>();
  using bits_t = std::conditional_t<sizeof(T) == 4, std::uint32_t, unsigned long long>;
  constexpr bits_t exponent =
      static_cast<bits_t>(sizeof(T) == 4 ? 0x7f800000ull : 0x7ff0000000000000ull);
  constexpr bits_t magnitude =
      static_cast<bits_t>(sizeof(T) == 4 ? 0x7fffffffull : 0x7fffffffffffffffull);
  using max_reduce = cub::BlockReduce<bits_t, quantize_threads>;
  __shared__ double lane_sums[quantize_threads];
  __shared__ typename max_reduce::TempStorage max_storage;
  __shared__ T shared_scale;
  __shared__ bool shared_usable;
  const std::size_t buckets = (count + bucket - 1) / bucket;
  for (std::size_t b = blockIdx.x; b < buckets; b += gridDim.x) {
    const std::size_t begin = b * bucket;
    const std::size_t n = count - begin < bucket ? count - begin : bucket;
    double sum = 0;
    bits_t top = 0;
    for (std::size_t i = threadIdx.x; i < n; i += quantize_threads) {
      const T v = in[begin + i];
      bits_t bits;
      memcpy(&bits, &v, sizeof bits);
      bits &= magnitude;
      top = top > bits ? top : bits;
      const double a = fabs(static_cast<double>(v));
      // rounded apart, as the host: no fused multiply-add
      sum = __dadd_rn(sum, Scale == static_cast<int>(bucket_scale::l2_norm) ? __dmul_rn(a, a) : a);
    }
    double total = 0;
    if constexpr (Scale != static_cast<int>(bucket_scale::max_abs)) {
      total = bucket_sum(sum, lane_sums);
    }
    const bits_t largest =
        max_reduce(max_storage).Reduce(top, [](bits_t x, bits_t y) { return x > y ? x : y; });
    if (threadIdx.x == 0) {
      const bool finite = largest < exponent;
      double scale;
      if constexpr (Scale == static_cast<int>(bucket_scale::max_abs)) {
        T m;
        memcpy(&m, &largest, sizeof m);
        scale = static_cast<double>(m);
      } else if constexpr (Scale == static_cast<int>(bucket_scale::l2_norm)) {
        scale = sqrt(total);
      } else {
        scale = total / static_cast<double>(n);
      }
      const T s = static_cast<T>(scale);
      scales[b] = finite ? s : static_cast<T>(NAN);
      shared_scale = static_cast<T>(scale);
      shared_usable = finite && s > T(0) && isfinite(s);
    }
    __syncthreads();
    const T scale = shared_scale;
    const bool usable = shared_usable;
    // the same inverse as the host, or double x 2^600 for a subnormal scale
    const T inverse = static_cast<T>(static_cast<double>(Levels) / static_cast<double>(scale));
    const bool wide = !isfinite(inverse);
    const double wide_inverse =
        static_cast<double>(Levels) / (static_cast<double>(scale) * 0x1p600);
    const std::size_t groups = (n + 7) / 8;
    for (std::size_t g = threadIdx.x; g < groups; g += quantize_threads) {
      const std::size_t first = begin + 8 * g;  // a multiple of 8
      unsigned long long packed = 0;
      for (unsigned t = 0; t < 8 && 8 * g + t < n; ++t) {
        const std::size_t i = first + t;
        const T v = in[i];
        if (!isfinite(v)) atomicMin(first_bad, static_cast<unsigned long long>(i));
        std::uint8_t code;
        if (!usable) {
          code = zero_code(q);
        } else {
          const std::uint32_t word = Stochastic ? random_word(seed, stream, i) : 0u;
          code = wide ? quantize_code(q, static_cast<double>(v) * 0x1p600, wide_inverse, word)
                      : quantize_code(q, v, inverse, word);
        }
        packed |= static_cast<unsigned long long>(code) << (t * Width);
      }
      const unsigned bytes = (8 * g + 8 <= n ? 8 : static_cast<unsigned>(n - 8 * g)) * Width;
      for (unsigned k = 0; k < (bytes + 7) / 8; ++k) {
        codes[first * Width / 8 + k] = static_cast<std::uint8_t>(packed >> (8 * k));
      }
    }
    __syncthreads();
  }
}

template <std::uint32_t Levels, unsigned Width, int Scale, bool Stochastic, bool SignOnly,
          unsigned Float8, class T>
__global__ void __launch_bounds__(quantize_threads)
    dequantize_kernel(const T* scales, const std::uint8_t* codes, std::size_t count,
                      std::size_t bucket, T* out, unsigned long long* first_bad) {
  constexpr quantize_scheme q = scheme_of<Levels, Width, Scale, Stochastic, SignOnly, Float8>();
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * quantize_threads;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * quantize_threads + threadIdx.x;
       i < count; i += stride) {
    const unsigned bit = static_cast<unsigned>((i * Width) % 8);
    const auto code =
        static_cast<std::uint8_t>((codes[i * Width / 8] >> bit) & ((1u << Width) - 1));
    if (!valid_code(q, code)) atomicMin(first_bad, static_cast<unsigned long long>(i));
    out[i] = dequantize_code(q, code, scales[i / bucket]);
  }
}

inline unsigned quantize_grid(std::size_t blocks) {
  return static_cast<unsigned>(blocks < 65535 ? blocks : 65535);
}

}  // namespace detail

namespace detail {

/// A device word where a kernel records the first bad element's index by atomicMin: set to
/// `none` on the stream, read back (waiting for the stream) by `read`, freed by either.
class first_index_slot {
 public:
  first_index_slot(const cuda_backend& backend, std::size_t none) : backend_(backend), none_(none) {
    word_ = static_cast<unsigned long long*>(
        squall::detail::allocate_device_scratch(backend_.device, sizeof *word_, backend_.stream));
    SQUALL_CUDA_CHECK(
        cudaMemcpyAsync(word_, &none_, sizeof none_, cudaMemcpyHostToDevice, backend_.stream));
  }
  first_index_slot(const first_index_slot&) = delete;
  first_index_slot& operator=(const first_index_slot&) = delete;
  ~first_index_slot() {
    if (word_ != nullptr) (void)cudaFreeAsync(word_, backend_.stream);
  }
  unsigned long long* get() const noexcept { return word_; }
  /// The recorded index, or `none` if no thread recorded one.
  std::size_t read() {
    unsigned long long index = none_;
    SQUALL_CUDA_CHECK(
        cudaMemcpyAsync(&index, word_, sizeof index, cudaMemcpyDeviceToHost, backend_.stream));
    SQUALL_CUDA_CHECK(cudaFreeAsync(word_, backend_.stream));
    word_ = nullptr;
    SQUALL_CUDA_CHECK(cudaStreamSynchronize(backend_.stream));
    return static_cast<std::size_t>(index);
  }

 private:
  const cuda_backend& backend_;
  unsigned long long none_;
  unsigned long long* word_ = nullptr;
};

}  // namespace detail

/// Device twin of the host `quantize`: same arguments over device memory, enqueued on the
/// backend's stream. Returns the first non-finite element's index (or `count`), so it waits
/// for the stream once.
template <quantize_scheme Q, class T>
std::size_t quantize(const cuda_backend& backend, const T* in, std::size_t count,
                     std::size_t bucket, T* scales, std::uint8_t* codes, std::uint64_t seed,
                     random_stream stream) {
  if (count == 0) return 0;
  squall::detail::device_guard guard(backend.device);
  detail::first_index_slot first_bad(backend, count);
  detail::quantize_kernel<Q.levels, Q.width, static_cast<int>(Q.scale), Q.stochastic, Q.sign_only,
                          Q.float8>
      <<<detail::quantize_grid((count + bucket - 1) / bucket), detail::quantize_threads, 0,
         backend.stream>>>(in, count, bucket, scales, codes, seed, stream, first_bad.get());
  SQUALL_CUDA_CHECK(cudaGetLastError());
  return first_bad.read();
}

/// Device twin of the host `dequantize`: returns the first element whose code is not a level
/// (or `count`), so it waits for the stream once.
template <quantize_scheme Q, class T>
std::size_t dequantize(const cuda_backend& backend, const T* scales, const std::uint8_t* codes,
                       std::size_t count, std::size_t bucket, T* out) {
  if (count == 0) return 0;
  squall::detail::device_guard guard(backend.device);
  detail::first_index_slot first_bad(backend, count);
  detail::dequantize_kernel<Q.levels, Q.width, static_cast<int>(Q.scale), Q.stochastic, Q.sign_only,
                            Q.float8>
      <<<detail::quantize_grid((count + detail::quantize_threads - 1) / detail::quantize_threads),
         detail::quantize_threads, 0, backend.stream>>>(scales, codes, count, bucket, out,
                                                        first_bad.get());
  SQUALL_CUDA_CHECK(cudaGetLastError());
  return first_bad.read();
}

}  // namespace squall::kernels
