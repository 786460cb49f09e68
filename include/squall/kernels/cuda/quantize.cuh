// SPDX-License-Identifier: Apache-2.0
#pragma once
/// CUDA twins of kernels/host/quantize.hpp (`quantize`, `dequantize`): the same signatures
/// over device memory and the same per-element math (`quantize_code`, `dequantize_code`,
/// Philox from Random123), so a device payload equals the host's byte for byte. One warp per
/// bucket: shuffles give the scale (a sum in double in the host's order, or the max of the
/// magnitudes' bit patterns, as on the host); each lane then codes groups of 4 or 8
/// consecutive elements into whole bytes.

#include <squall/backend/cuda.cuh>
#include <squall/core/random.hpp>
#include <squall/kernels/cuda/reduce.cuh>  // store_bytes, load_bytes
#include <squall/kernels/host/quantize.hpp>

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>  // uintptr_t
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

inline constexpr unsigned warp_lanes = 32;
inline constexpr unsigned bucket_warps = quantize_threads / warp_lanes;
inline constexpr unsigned full_warp = 0xffffffffu;

/// Elements a lane codes (or decodes) at a time: 4 (one Philox block of words), or the 8 of
/// one byte of 1-bit codes. Bucket starts are multiples of 8, so a group never straddles a
/// byte or a Philox block.
template <unsigned Width>
inline constexpr unsigned code_group = Width == 1 ? 8 : 4;

/// A warp's sums in the order of the host's `bucket_stats_of` (`bucket_sum_lanes`, 256): lane
/// l's `acc[k]` is host lane 32 k + l (elements 32 k + l, + 256, + 512, ... in turn), so the
/// pairwise steps over 128, 64 and 32 are within the lane and those over 16 ... 1 are
/// shuffles; each sum rounded once. Every lane gets the total.
__device__ inline double warp_bucket_sum(double (&acc)[8]) {
  static_assert(8 * warp_lanes == bucket_sum_lanes);
#pragma unroll
  for (unsigned half = 4; half > 0; half /= 2) {
#pragma unroll
    for (unsigned k = 0; k < half; ++k) acc[k] = __dadd_rn(acc[k], acc[k + half]);
  }
  double v = acc[0];
#pragma unroll
  for (unsigned half = warp_lanes / 2; half > 0; half /= 2) {
    v = __dadd_rn(v, __shfl_down_sync(full_warp, v, half));
  }
  return __shfl_sync(full_warp, v, 0);
}

/// One bucket per warp (8 per block, no block-wide barrier): the lanes read the bucket 256
/// elements at a time, 8 loads in flight each, for the scale (the largest magnitude pattern
/// by shuffles; a sum in the host's order, `warp_bucket_sum`), then code groups of
/// `code_group` elements (one Philox call per group where stochastic), each group's
/// `code_group x width / 8` bytes stored by its lane.
template <std::uint32_t Levels, unsigned Width, int Scale, bool Stochastic, bool SignOnly,
          unsigned Float8, class T>
__global__ void __launch_bounds__(quantize_threads)
    quantize_kernel(const T* in, std::size_t count, std::size_t bucket, T* scales,
                    std::uint8_t* codes, std::uint64_t seed, random_stream stream,
                    unsigned long long* first_bad) {
  constexpr quantize_scheme q = scheme_of<Levels, Width, Scale, Stochastic, SignOnly, Float8>();
  constexpr bool summed = Scale != static_cast<int>(bucket_scale::max_abs);
  using bits_t = std::conditional_t<sizeof(T) == 4, std::uint32_t, unsigned long long>;
  constexpr bits_t exponent =
      static_cast<bits_t>(sizeof(T) == 4 ? 0x7f800000ull : 0x7ff0000000000000ull);
  constexpr bits_t magnitude =
      static_cast<bits_t>(sizeof(T) == 4 ? 0x7fffffffull : 0x7fffffffffffffffull);
  constexpr unsigned group = code_group<Width>;
  static_assert(!Stochastic || group == 4, "a stochastic group is one Philox block");
  const unsigned lane = threadIdx.x % warp_lanes;
  const std::size_t buckets = (count + bucket - 1) / bucket;
  const std::size_t warps = static_cast<std::size_t>(gridDim.x) * bucket_warps;
  for (std::size_t b =
           static_cast<std::size_t>(blockIdx.x) * bucket_warps + threadIdx.x / warp_lanes;
       b < buckets; b += warps) {
    const std::size_t begin = b * bucket;
    const std::size_t n = count - begin < bucket ? count - begin : bucket;
    const T* v = in + begin;
    double acc[8] = {};
    bits_t top = 0;
    for (std::size_t c = 0; c < n; c += bucket_sum_lanes) {
      T x[8];
#pragma unroll
      for (unsigned k = 0; k < 8; ++k) {
        const std::size_t e = c + k * warp_lanes + lane;
        x[k] = e < n ? v[e] : T(0);
      }
#pragma unroll
      for (unsigned k = 0; k < 8; ++k) {
        bits_t bits;
        memcpy(&bits, &x[k], sizeof bits);
        bits &= magnitude;
        top = top > bits ? top : bits;
        if constexpr (summed) {
          const double a = fabs(static_cast<double>(x[k]));
          // rounded apart, as the host: no fused multiply-add
          acc[k] = __dadd_rn(
              acc[k], Scale == static_cast<int>(bucket_scale::l2_norm) ? __dmul_rn(a, a) : a);
        }
      }
    }
#pragma unroll
    for (unsigned half = warp_lanes / 2; half > 0; half /= 2) {
      const bits_t other = __shfl_xor_sync(full_warp, top, half);
      top = top > other ? top : other;
    }
    const bool finite = top < exponent;
    double scale;
    if constexpr (Scale == static_cast<int>(bucket_scale::max_abs)) {
      T m;
      memcpy(&m, &top, sizeof m);
      scale = static_cast<double>(m);
    } else if constexpr (Scale == static_cast<int>(bucket_scale::l2_norm)) {
      scale = sqrt(warp_bucket_sum(acc));
    } else {
      scale = warp_bucket_sum(acc) / static_cast<double>(n);
    }
    const T s = static_cast<T>(scale);
    if (lane == 0) scales[b] = finite ? s : static_cast<T>(NAN);
    const bool usable = finite && s > T(0) && isfinite(s);
    // the same inverse as the host, or double x 2^600 for a subnormal scale
    const T inverse = static_cast<T>(static_cast<double>(Levels) / static_cast<double>(s));
    const bool wide = !isfinite(inverse);
    const double wide_inverse = static_cast<double>(Levels) / (static_cast<double>(s) * 0x1p600);
    std::uint8_t* out = codes + begin * Width / 8;  // begin is a multiple of 8
    for (std::size_t first = static_cast<std::size_t>(lane) * group; first < n;
         first += warp_lanes * group) {
      std::uint32_t words[4] = {};
      if constexpr (Stochastic) {
        const philox_block block = philox(seed, stream, (begin + first) / 4);
#pragma unroll
        for (unsigned w = 0; w < 4; ++w) words[w] = block.word[w];
      }
      unsigned long long packed = 0;
#pragma unroll
      for (unsigned t = 0; t < group; ++t) {
        if (first + t < n) {
          const T x = v[first + t];
          if (!isfinite(x))
            atomicMin(first_bad, static_cast<unsigned long long>(begin + first + t));
          std::uint8_t code;
          if (!usable) {
            code = zero_code(q);
          } else {
            const std::uint32_t word = words[t % 4];
            code = wide ? quantize_code(q, static_cast<double>(x) * 0x1p600, wide_inverse, word)
                        : quantize_code(q, x, inverse, word);
          }
          packed |= static_cast<unsigned long long>(code) << (t * Width);
        }
      }
      const std::size_t left = n - first < group ? n - first : group;
      const unsigned bytes = static_cast<unsigned>((left * Width + 7) / 8);
      for (unsigned k = 0; k < bytes; ++k) {
        out[first * Width / 8 + k] = static_cast<std::uint8_t>(packed >> (8 * k));
      }
    }
  }
}

/// A thread per group of `code_group` elements (never two buckets: buckets start at
/// multiples of 8), grid-stride: the group's code bytes in one load and, for four elements of
/// an aligned output, one store, where aligned; the bucket by a 32-bit division where the
/// counts allow.
template <std::uint32_t Levels, unsigned Width, int Scale, bool Stochastic, bool SignOnly,
          unsigned Float8, class T>
__global__ void __launch_bounds__(quantize_threads)
    dequantize_kernel(const T* scales, const std::uint8_t* codes, std::size_t count,
                      std::size_t bucket, T* out, unsigned long long* first_bad) {
  constexpr quantize_scheme q = scheme_of<Levels, Width, Scale, Stochastic, SignOnly, Float8>();
  constexpr unsigned group = code_group<Width>;
  constexpr unsigned group_bytes = group * Width / 8;  // 4, 2, 1 or 1
  using word_t =
      std::conditional_t<group_bytes == 4, std::uint32_t,
                         std::conditional_t<group_bytes == 2, std::uint16_t, std::uint8_t>>;
  constexpr unsigned mask = (1u << Width) - 1;
  const bool narrow = count <= 0xffffffffull && bucket <= 0xffffffffull;
  const bool words = reinterpret_cast<std::uintptr_t>(codes) % group_bytes == 0;
  const bool fours = group == 4 && reinterpret_cast<std::uintptr_t>(out) % sizeof(four<T>) == 0;
  const std::size_t groups = (count + group - 1) / group;
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * quantize_threads;
  for (std::size_t g = static_cast<std::size_t>(blockIdx.x) * quantize_threads + threadIdx.x;
       g < groups; g += stride) {
    const std::size_t first = g * group;
    const std::size_t b =
        narrow ? static_cast<std::uint32_t>(first) / static_cast<std::uint32_t>(bucket)
               : first / bucket;
    const T scale = scales[b];
    const bool whole = count - first >= group;
    unsigned long long packed = 0;
    if (whole && words) {
      packed = reinterpret_cast<const word_t*>(codes)[g];
    } else {
      const std::size_t left = whole ? group : count - first;
      for (unsigned k = 0; k < (left * Width + 7) / 8; ++k) {
        packed |= static_cast<unsigned long long>(codes[g * group_bytes + k]) << (8 * k);
      }
    }
    T values[group];
#pragma unroll
    for (unsigned t = 0; t < group; ++t) {
      const auto code = static_cast<std::uint8_t>((packed >> (t * Width)) & mask);
      if (first + t < count && !valid_code(q, code)) {
        atomicMin(first_bad, static_cast<unsigned long long>(first + t));
      }
      values[t] = dequantize_code(q, code, scale);
    }
    if constexpr (group == 4) {
      if (whole && fours) {
        reinterpret_cast<four<T>*>(out)[g] = {{values[0], values[1], values[2], values[3]}};
        continue;
      }
    }
#pragma unroll
    for (unsigned t = 0; t < group; ++t) {
      if (first + t < count) out[first + t] = values[t];
    }
  }
}

/// Blocks for a thread per group of codes.
template <unsigned Width>
std::size_t group_blocks(std::size_t count) {
  const std::size_t groups = (count + code_group<Width> - 1) / code_group<Width>;
  return (groups + quantize_threads - 1) / quantize_threads;
}

/// Blocks for one warp per bucket.
inline std::size_t bucket_blocks(std::size_t count, std::size_t bucket) {
  return ((count + bucket - 1) / bucket + bucket_warps - 1) / bucket_warps;
}

inline unsigned quantize_grid(std::size_t blocks) {
  return static_cast<unsigned>(blocks < 65535 ? blocks : 65535);
}

}  // namespace detail

namespace detail {

/// A device word where a kernel records the first bad element's index by atomicMin: set to
/// `none` on the stream (`store_bytes`: no wait), read back by `read` (one wait).
class first_index_slot {
 public:
  first_index_slot(const cuda_backend& backend, std::size_t none)
      : backend_(backend), word_(backend, 1) {
    const auto value = static_cast<unsigned long long>(none);
    store_bytes(backend, reinterpret_cast<std::byte*>(word_.data()), &value, sizeof value);
  }
  unsigned long long* get() const noexcept { return word_.data(); }
  /// The recorded index, or `none` if no thread recorded one.
  std::size_t read() const { return static_cast<std::size_t>(read_back(backend_, word_.data())); }

 private:
  cuda_backend backend_;
  device_scratch<unsigned long long> word_;
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
      <<<detail::quantize_grid(detail::bucket_blocks(count, bucket)), detail::quantize_threads, 0,
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
      <<<detail::quantize_grid(detail::group_blocks<Q.width>(count)), detail::quantize_threads, 0,
         backend.stream>>>(scales, codes, count, bucket, out, first_bad.get());
  SQUALL_CUDA_CHECK(cudaGetLastError());
  return first_bad.read();
}

}  // namespace squall::kernels
