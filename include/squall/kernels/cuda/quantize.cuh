// SPDX-License-Identifier: Apache-2.0
#pragma once
/// CUDA twins of kernels/host/quantize.hpp (`quantize`, `dequantize`): the same signatures
/// over device memory and the same per-element math (`quantize_code`, `dequantize_code`,
/// Philox from Random123), so a device payload equals the host's byte for byte. One warp per
/// bucket: shuffles give the scale (a sum in double in the host's order, or the max of the
/// magnitudes' bit patterns, as on the host). A bucket of up to 512 elements (the default) is
/// read once into registers and coded from there, each lane's 4 codes stored as one word
/// (`quantize_resident_kernel`); a larger one is read twice, for the scale and for the codes
/// (`quantize_kernel`). The encode waits for the stream only where it must report the first
/// non-finite element (`check_finite`); the decode waits to check every code.

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

/// The quiet NaN the host sends as a non-finite bucket's scale, bit for bit.
template <class T>
__device__ T quiet_nan() {
  const auto bits = float_bits<T>::quiet_nan;
  T value;
  memcpy(&value, &bits, sizeof value);
  return value;
}

inline constexpr unsigned warp_lanes = 32;
inline constexpr unsigned bucket_warps = quantize_threads / warp_lanes;
inline constexpr unsigned full_warp = 0xffffffffu;

/// What a warp codes a bucket with: the scale it sends (NaN if the bucket holds a NaN or an
/// Inf), whether its elements are coded as levels at all (`usable`: a finite, positive scale),
/// and the host's inverse, or double x 2^600 for a subnormal scale (`wide`).
template <class T>
struct bucket_coding {
  bool finite;
  T sent;
  bool usable;
  T inverse;
  bool wide;
  double wide_inverse;
};

/// The bucket's coding from the largest magnitude pattern of each lane (`top`) and, for a
/// summed scale, the bucket's sum in the host's order; every lane gets it.
template <std::uint32_t Levels, int Scale, class T>
__device__ SQUALL_FORCEINLINE bucket_coding<T> coding_of(typename float_bits<T>::type top,
                                                         double sum, std::size_t n) {
#pragma unroll
  for (unsigned half = warp_lanes / 2; half > 0; half /= 2) {
    const auto other = __shfl_xor_sync(full_warp, top, half);
    top = top > other ? top : other;
  }
  const bool finite = top < float_bits<T>::exponent;
  double scale;
  if constexpr (Scale == static_cast<int>(bucket_scale::max_abs)) {
    T largest;
    memcpy(&largest, &top, sizeof largest);
    scale = static_cast<double>(largest);
  } else if constexpr (Scale == static_cast<int>(bucket_scale::l2_norm)) {
    scale = sqrt(sum);
  } else {
    scale = sum / static_cast<double>(n);
  }
  const T s = static_cast<T>(scale);
  // the same inverse as the host, or double x 2^600 for a subnormal scale
  const T inverse = static_cast<T>(static_cast<double>(Levels) / static_cast<double>(s));
  return {.finite = finite,
          .sent = finite ? s : quiet_nan<T>(),
          .usable = finite && s > T(0) && isfinite(s),
          .inverse = inverse,
          .wide = !isfinite(inverse),
          .wide_inverse = static_cast<double>(Levels) / (static_cast<double>(s) * 0x1p600)};
}

/// Calls `body(b, begin, n)` for each bucket this warp takes: bucket b holds elements `begin`
/// ... + `n` (a warp per bucket, grid-stride over the buckets).
template <class Body>
__device__ SQUALL_FORCEINLINE void for_each_warp_bucket(std::size_t count, std::size_t bucket,
                                                        Body&& body) {
  const std::size_t buckets = (count + bucket - 1) / bucket;
  const std::size_t warps = static_cast<std::size_t>(gridDim.x) * bucket_warps;
  for (std::size_t b =
           static_cast<std::size_t>(blockIdx.x) * bucket_warps + threadIdx.x / warp_lanes;
       b < buckets; b += warps) {
    const std::size_t begin = b * bucket;
    body(b, begin, count - begin < bucket ? count - begin : bucket);
  }
}

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
  using bits_t = typename float_bits<T>::type;
  constexpr unsigned group = code_group<Width>;
  static_assert(!Stochastic || group == 4, "a stochastic group is one Philox block");
  const unsigned lane = threadIdx.x % warp_lanes;
  for_each_warp_bucket(count, bucket, [&](std::size_t b, std::size_t begin, std::size_t n) {
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
        bits &= float_bits<T>::magnitude;
        top = top > bits ? top : bits;
        if constexpr (summed) {
          const double a = fabs(static_cast<double>(x[k]));
          // rounded apart, as the host: no fused multiply-add
          acc[k] = __dadd_rn(
              acc[k], Scale == static_cast<int>(bucket_scale::l2_norm) ? __dmul_rn(a, a) : a);
        }
      }
    }
    const bucket_coding<T> coding =
        coding_of<Levels, Scale, T>(top, summed ? warp_bucket_sum(acc) : 0.0, n);
    if (lane == 0) scales[b] = coding.sent;
    std::uint8_t* out = codes + begin * Width / 8;  // begin is a multiple of 8
    for (std::size_t first = static_cast<std::size_t>(lane) * group; first < n;
         first += warp_lanes * group) {
      std::uint32_t words[4] = {};
      if constexpr (Stochastic) stochastic_draws4<T>(seed, stream, (begin + first) / 4, words);
      unsigned long long packed = 0;
#pragma unroll
      for (unsigned t = 0; t < group; ++t) {
        if (first + t < n) {
          const T x = v[first + t];
          if (first_bad != nullptr && !isfinite(x)) {
            atomicMin(first_bad, static_cast<unsigned long long>(begin + first + t));
          }
          std::uint8_t code;
          if (!coding.usable) {
            code = zero_code(q);
          } else {
            const std::uint32_t word = words[t % 4];
            code = coding.wide ? quantize_code(q, static_cast<double>(x) * 0x1p600,
                                               coding.wide_inverse, word)
                               : quantize_code(q, x, coding.inverse, word);
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
  });
}

/// Buckets up to `resident_bucket` elements are read once into registers: lane l holds
/// elements 128 m + 4 l ... + 3 of the bucket (m < 4), one aligned 4-element load each, all in
/// flight together; the scale comes from the registers and so do the codes, each lane's 4
/// codes stored as one word (the 1-bit codes of two lanes as one byte). The sums keep the
/// host's order (`bucket_sum_lanes`): host lane j = 128 p + 4 l + t is `acc[4 p + t]` of lane
/// l, so the pairwise step over 128 is within the lane, those over 64 ... 4 are shuffles and
/// those over 2 and 1 are within lane 0.
inline constexpr unsigned resident_chunks = 4;
inline constexpr std::size_t resident_bucket = resident_chunks * warp_lanes * 4;

template <class T>
using resident_values = T[resident_chunks][4];

/// Loads the `n` elements of the bucket at `v` into this lane's registers (0 beyond `n`);
/// `Full`: `n` is `resident_bucket` and `vector_in` true.
template <bool Full, class T>
__device__ SQUALL_FORCEINLINE void load_resident(const T* v, std::size_t n, unsigned lane,
                                                 bool vector_in, resident_values<T>& x) {
#pragma unroll
  for (unsigned m = 0; m < resident_chunks; ++m) {
    const std::size_t first = m * warp_lanes * 4 + lane * 4;
    if (Full || (vector_in && first + 4 <= n)) {
      const four<T> f = *reinterpret_cast<const four<T>*>(v + first);
#pragma unroll
      for (unsigned t = 0; t < 4; ++t) x[m][t] = f.v[t];
    } else {
#pragma unroll
      for (unsigned t = 0; t < 4; ++t) x[m][t] = first + t < n ? v[first + t] : T(0);
    }
  }
}

/// Scale and codes of bucket `b` (elements `begin` ... + `n`) from the registers. `Full`: the
/// bucket has `resident_bucket` elements (`n` is ignored), so no element needs a bounds check.
/// The instructions per element are what bounds this kernel (it issues on most cycles while
/// the memory is half busy), so the common case takes the shortest path: a bucket whose
/// largest magnitude is finite has no element to report, and a normal scale needs no wide
/// inverse.
template <std::uint32_t Levels, unsigned Width, int Scale, bool Stochastic, bool SignOnly,
          unsigned Float8, bool Full, class T>
__device__ SQUALL_FORCEINLINE void code_resident(const resident_values<T>& x, std::size_t b,
                                                 std::size_t begin, std::size_t bucket_elements,
                                                 unsigned lane, T* scales, std::uint8_t* codes,
                                                 std::uint64_t seed, random_stream stream,
                                                 unsigned long long* first_bad) {
  constexpr quantize_scheme q = scheme_of<Levels, Width, Scale, Stochastic, SignOnly, Float8>();
  constexpr bool summed = Scale != static_cast<int>(bucket_scale::max_abs);
  using bits_t = typename float_bits<T>::type;
  // a lane's 4 codes: 4, 2 or 1 whole bytes, or half a byte (1-bit codes)
  constexpr unsigned lane_bytes = Width >= 2 ? 4 * Width / 8 : 1;
  using word_t =
      std::conditional_t<lane_bytes == 4, std::uint32_t,
                         std::conditional_t<lane_bytes == 2, std::uint16_t, std::uint8_t>>;
  const std::size_t n = Full ? resident_bucket : bucket_elements;
  const auto inside = [&](std::size_t e) { return Full || e < n; };
  bits_t top = 0;
  double acc[8] = {};
#pragma unroll
  for (unsigned m = 0; m < resident_chunks; ++m) {
#pragma unroll
    for (unsigned t = 0; t < 4; ++t) {
      bits_t bits;
      memcpy(&bits, &x[m][t], sizeof bits);
      bits &= float_bits<T>::magnitude;
      top = top > bits ? top : bits;
      if constexpr (summed) {
        const double a = fabs(static_cast<double>(x[m][t]));
        // rounded apart, as the host: no fused multiply-add
        acc[(m % 2) * 4 + t] =
            __dadd_rn(acc[(m % 2) * 4 + t],
                      Scale == static_cast<int>(bucket_scale::l2_norm) ? __dmul_rn(a, a) : a);
      }
    }
  }
  double sum = 0;
  if constexpr (summed) {
#pragma unroll
    for (unsigned t = 0; t < 4; ++t) acc[t] = __dadd_rn(acc[t], acc[t + 4]);  // over 128
#pragma unroll
    for (unsigned shift = warp_lanes / 2; shift > 0; shift /= 2) {  // over 64 ... 4
#pragma unroll
      for (unsigned t = 0; t < 4; ++t) {
        acc[t] = __dadd_rn(acc[t], __shfl_down_sync(full_warp, acc[t], shift));
      }
    }
    // over 2 and 1, then lane 0's total to every lane
    sum =
        __shfl_sync(full_warp, __dadd_rn(__dadd_rn(acc[0], acc[2]), __dadd_rn(acc[1], acc[3])), 0);
  }
  const bucket_coding<T> coding = coding_of<Levels, Scale, T>(top, sum, n);
  if (lane == 0) scales[b] = coding.sent;
  if (!coding.finite && first_bad != nullptr) {  // the bucket holds a NaN or an Inf: find which
#pragma unroll
    for (unsigned m = 0; m < resident_chunks; ++m) {
#pragma unroll
      for (unsigned t = 0; t < 4; ++t) {
        const std::size_t e = m * warp_lanes * 4 + lane * 4 + t;
        if (inside(e) && !isfinite(x[m][t])) {
          atomicMin(first_bad, static_cast<unsigned long long>(begin + e));
        }
      }
    }
  }
  std::uint8_t* out = codes + begin * Width / 8;  // begin is a multiple of 8
  const bool vector_out = reinterpret_cast<std::uintptr_t>(codes) % lane_bytes == 0;
  // this lane's codes of chunk m (of the elements inside the bucket), by `code_of(e, word)`
  const auto pack = [&](unsigned m, const auto& code_of) {
    const std::size_t first = m * warp_lanes * 4 + lane * 4;
    std::uint32_t words[4] = {};
    if constexpr (Stochastic) {
      if (inside(first)) stochastic_draws4<T>(seed, stream, (begin + first) / 4, words);
    }
    std::uint32_t packed = 0;
#pragma unroll
    for (unsigned t = 0; t < 4; ++t) {
      if (inside(first + t)) {
        packed |= static_cast<std::uint32_t>(code_of(x[m][t], words[t])) << (t * Width);
      }
    }
    return packed;
  };
  const auto store = [&](unsigned m, std::uint32_t packed) {
    const std::size_t first = m * warp_lanes * 4 + lane * 4;
    if constexpr (Width == 1) {
      // the even lane's byte: its 4 codes, then its odd neighbour's (elements 8 k ... 8 k + 7)
      packed |= __shfl_down_sync(full_warp, packed, 1) << 4;
      if (lane % 2 == 0 && inside(first)) out[first / 8] = static_cast<std::uint8_t>(packed);
    } else {
      std::uint8_t* to = out + first * Width / 8;
      if (vector_out && inside(first + 3)) {
        *reinterpret_cast<word_t*>(to) = static_cast<word_t>(packed);
      } else if (inside(first)) {
        const unsigned bytes = static_cast<unsigned>(((n - first) * Width + 7) / 8);
        for (unsigned k = 0; k < bytes && k < lane_bytes; ++k) {
          to[k] = static_cast<std::uint8_t>(packed >> (8 * k));
        }
      }
    }
  };
  if (coding.usable && !coding.wide) {
#pragma unroll
    for (unsigned m = 0; m < resident_chunks; ++m) {
      store(m, pack(m, [&](T e, std::uint32_t word) {
              return quantize_code(q, e, coding.inverse, word);
            }));
    }
  } else if (coding.usable) {
#pragma unroll
    for (unsigned m = 0; m < resident_chunks; ++m) {
      store(m, pack(m, [&](T e, std::uint32_t word) {
              return quantize_code(q, static_cast<double>(e) * 0x1p600, coding.wide_inverse, word);
            }));
    }
  } else {
    const std::uint8_t zero = zero_code(q);
#pragma unroll
    for (unsigned m = 0; m < resident_chunks; ++m) {
      store(m, pack(m, [&](T, std::uint32_t) { return zero; }));
    }
  }
}

/// One bucket per warp, grid-stride over the buckets, a bucket of `resident_bucket` elements
/// (all but perhaps the last) by the path without bounds checks.
template <std::uint32_t Levels, unsigned Width, int Scale, bool Stochastic, bool SignOnly,
          unsigned Float8, class T>
__global__ void __launch_bounds__(quantize_threads)
    quantize_resident_kernel(const T* in, std::size_t count, std::size_t bucket, T* scales,
                             std::uint8_t* codes, std::uint64_t seed, random_stream stream,
                             unsigned long long* first_bad) {
  const unsigned lane = threadIdx.x % warp_lanes;
  const bool vector_in = reinterpret_cast<std::uintptr_t>(in) % sizeof(four<T>) == 0;
  for_each_warp_bucket(count, bucket, [&](std::size_t b, std::size_t begin, std::size_t n) {
    resident_values<T> x;
    // begin is a multiple of 8: in + begin is as aligned as in
    if (n == resident_bucket && vector_in) {
      load_resident<true>(in + begin, n, lane, true, x);
      code_resident<Levels, Width, Scale, Stochastic, SignOnly, Float8, true>(
          x, b, begin, n, lane, scales, codes, seed, stream, first_bad);
    } else {
      load_resident<false>(in + begin, n, lane, vector_in, x);
      code_resident<Levels, Width, Scale, Stochastic, SignOnly, Float8, false>(
          x, b, begin, n, lane, scales, codes, seed, stream, first_bad);
    }
  });
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

/// The host's `fit` (`detail::fit_block`, `detail::fitted_scale`) after the codes are written:
/// a warp per bucket reads its values and codes again, lane l taking elements l, l + 32, ...
/// (host lane l of `fit_lanes`), first summed in T over each block of the host loop
/// (`quantize_block`), then in double, then pairwise by shuffles as the host adds its lanes,
/// so the fitted scale is the host's bit for bit; lane 0 replaces the bucket's scale where the
/// host would.
template <std::uint32_t Levels, unsigned Width, class T>
__global__ void __launch_bounds__(quantize_threads)
    fit_scales_kernel(const T* in, std::size_t count, std::size_t bucket, T* scales,
                      const std::uint8_t* codes) {
  static_assert(fit_lanes == warp_lanes);
  const unsigned lane = threadIdx.x % warp_lanes;
  for_each_warp_bucket(count, bucket, [&](std::size_t b, std::size_t begin, std::size_t n) {
    double dot = 0;
    double square = 0;
    for (std::size_t block = 0; block < n; block += quantize_block) {
      const std::size_t end = n - block < quantize_block ? n : block + quantize_block;
      T part = 0;
      int part_square = 0;
      for (std::size_t e = block + lane; e < end; e += warp_lanes) {
        const std::size_t bit = (begin + e) * Width;
        const unsigned code = (codes[bit / 8] >> (bit % 8)) & ((1u << Width) - 1u);
        const int q = static_cast<int>(code) - static_cast<int>(Levels);
        // rounded apart, as the host: no fused multiply-add
        if constexpr (sizeof(T) == 4) {
          part = __fadd_rn(part, __fmul_rn(static_cast<float>(q), in[begin + e]));
        } else {
          part = __dadd_rn(part, __dmul_rn(static_cast<double>(q), in[begin + e]));
        }
        part_square += q * q;
      }
      dot = __dadd_rn(dot, static_cast<double>(part));
      square = __dadd_rn(square, static_cast<double>(part_square));
    }
#pragma unroll
    for (unsigned half = warp_lanes / 2; half > 0; half /= 2) {
      dot = __dadd_rn(dot, __shfl_down_sync(full_warp, dot, half));
      square = __dadd_rn(square, __shfl_down_sync(full_warp, square, half));
    }
    const T sent = scales[b];
    if (lane == 0 && sent > T(0) && isfinite(sent) && square > 0) {
      const T fitted =
          static_cast<T>(__ddiv_rn(__dmul_rn(static_cast<double>(Levels), dot), square));
      if (fitted > T(0) && isfinite(fitted)) scales[b] = fitted;
    }
  });
}

inline unsigned quantize_grid(std::size_t blocks) {
  return static_cast<unsigned>(blocks < 65535 ? blocks : 65535);
}

}  // namespace detail

namespace detail {

/// Enqueues the quantizer: buckets up to `resident_bucket` elements in registers
/// (`quantize_resident_kernel`) unless `read_twice` (the benchmark's comparison), larger ones
/// read twice (`quantize_kernel`); the first non-finite element's index goes to `first_bad`
/// by atomicMin (where not null). With `fit` (integer levels), `fit_scales_kernel` follows on
/// the stream. No wait.
template <quantize_scheme Q, class T>
void launch_quantize(const cuda_backend& backend, const T* in, std::size_t count,
                     std::size_t bucket, T* scales, std::uint8_t* codes, std::uint64_t seed,
                     random_stream stream, unsigned long long* first_bad, bool read_twice = false,
                     bool fit = false) {
  const unsigned grid = quantize_grid(bucket_blocks(count, bucket));
  if (bucket > resident_bucket || read_twice) {
    quantize_kernel<Q.levels, Q.width, static_cast<int>(Q.scale), Q.stochastic, Q.sign_only,
                    Q.float8><<<grid, quantize_threads, 0, backend.stream>>>(
        in, count, bucket, scales, codes, seed, stream, first_bad);
  } else {
    quantize_resident_kernel<Q.levels, Q.width, static_cast<int>(Q.scale), Q.stochastic,
                             Q.sign_only, Q.float8><<<grid, quantize_threads, 0, backend.stream>>>(
        in, count, bucket, scales, codes, seed, stream, first_bad);
  }
  SQUALL_CUDA_CHECK(cudaGetLastError());
  if constexpr (Q.float8 == 0 && !Q.sign_only) {
    if (fit) {
      fit_scales_kernel<Q.levels, Q.width>
          <<<grid, quantize_threads, 0, backend.stream>>>(in, count, bucket, scales, codes);
      SQUALL_CUDA_CHECK(cudaGetLastError());
    }
  }
}

/// Enqueues the decode; the first element whose code is not a level goes to `first_bad` by
/// atomicMin. No wait.
template <quantize_scheme Q, class T>
void launch_dequantize(const cuda_backend& backend, const T* scales, const std::uint8_t* codes,
                       std::size_t count, std::size_t bucket, T* out,
                       unsigned long long* first_bad) {
  dequantize_kernel<Q.levels, Q.width, static_cast<int>(Q.scale), Q.stochastic, Q.sign_only,
                    Q.float8>
      <<<quantize_grid(group_blocks<Q.width>(count)), quantize_threads, 0, backend.stream>>>(
          scales, codes, count, bucket, out, first_bad);
  SQUALL_CUDA_CHECK(cudaGetLastError());
}

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
/// backend's stream. With `find_non_finite`, returns the first non-finite element's index (or
/// `count`), so it waits for the stream once; without, returns `count` and does not wait (a
/// non-finite element still sends its bucket a NaN scale). `fit` as the host's.
template <quantize_scheme Q, class T>
std::size_t quantize(const cuda_backend& backend, const T* in, std::size_t count,
                     std::size_t bucket, T* scales, std::uint8_t* codes, std::uint64_t seed,
                     random_stream stream, bool find_non_finite = true, bool fit = false) {
  if (count == 0) return 0;
  squall::detail::device_guard guard(backend.device);
  if (!find_non_finite) {
    detail::launch_quantize<Q>(backend, in, count, bucket, scales, codes, seed, stream, nullptr,
                               false, fit);
    return count;
  }
  detail::first_index_slot first_bad(backend, count);
  detail::launch_quantize<Q>(backend, in, count, bucket, scales, codes, seed, stream,
                             first_bad.get(), false, fit);
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
  detail::launch_dequantize<Q>(backend, scales, codes, count, bucket, out, first_bad.get());
  return first_bad.read();
}

}  // namespace squall::kernels
