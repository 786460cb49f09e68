// SPDX-License-Identifier: Apache-2.0
#pragma once
/// CUDA twins of kernels/host/homomorphic.hpp (`hq_range`, `hq_encode`, `hq_decode`): the same
/// signatures over device memory, one CUDA block of `hq_threads` per rotation block of up to
/// 1,024 elements, signed, rotated (the Walsh-Hadamard transform: a whole block in registers,
/// shuffles and two rounds through shared memory; a shorter one in shared memory a stage at a
/// time, a barrier after each), coded and packed. The work of each thread between two barriers
/// is a phase of kernels/host/homomorphic_phases.hpp, which the host tests run thread by thread
/// against the host kernels, and the register transform applies the same stages in the same
/// order, so the device writes the host's words and values bit for bit (tests/cuda/
/// homomorphic.test.cu): the same signs and draws (Philox), the same sums in the same order,
/// the same per-element code (`hq_code`, its product rounded before the shift).
///
/// The range is not the host's to the last bit: its sums of squares (the rms the clip scales)
/// run in another order, in double, so the agreed scale may differ in its last bits from what
/// the host computes on the same tensor (the collective agrees one range over the ranks, so
/// every rank codes against the same). Where the host must wait: `hq_range` reads the range
/// back (the ranks agree it before anyone encodes), `hq_decode` reads whether every field was
/// in range, and `hq_encode` only with `find_bad`. Run on an H200 (2026-12-04, the device
/// payloads equal to the host's; docs/performance.md has their speed): bound by instructions,
/// not by the memory (ncu: issue slots 87% busy, DRAM 16%; the integer pipe, Philox and the
/// packing, the busiest).

#include <squall/backend/cuda.cuh>
#include <squall/core/random.hpp>
#include <squall/kernels/cuda/quantize.cuh>  // first_index_slot
#include <squall/kernels/cuda/reduce.cuh>    // device_scratch, read_back
#include <squall/kernels/host/homomorphic.hpp>
#include <squall/kernels/host/homomorphic_phases.hpp>

#include <cuda_runtime.h>

#include <cmath>
#include <cstddef>
#include <cstdint>

namespace squall::kernels {
namespace detail {

inline constexpr unsigned hq_threads = 256;
/// Values of a whole rotation block a thread holds in registers: element t + 256 i in x[i].
inline constexpr unsigned hq_per_thread = hq_max_block / hq_threads;

/// What `hq_range_kernel` leaves per rotation block: its bound on (or exact) max |y|, its
/// sum of squares, and whether its sum of |x| was finite.
struct hq_block_range {
  double top;
  double squares;
  int finite;
};

/// The range `hq_range` reads back: max |y| (NaN if any sum was not finite) and the rms.
struct hq_range_result {
  double max_abs;
  double rms;
};

/// Where a rotation block's signs come from and how its transform is scaled.
struct hq_rotation {
  bool rotate;
  std::uint64_t seed;
  std::uint64_t step;
};

/// Block-wide sums (and a max) over the `hq_threads` threads, in shared memory; every thread
/// gets the results. The order is fixed (a tree over thread indices), so a run repeats its bits.
struct hq_block_totals {
  double largest;
  double l1;
  double l2;
};
__device__ inline hq_block_totals hq_reduce_block(hq_block_totals mine, double* scratch) {
  const unsigned t = threadIdx.x;
  scratch[t] = mine.largest;
  scratch[hq_threads + t] = mine.l1;
  scratch[2 * hq_threads + t] = mine.l2;
  __syncthreads();
  for (unsigned half = hq_threads / 2; half > 0; half /= 2) {
    if (t < half) {
      const double a = scratch[t + half];
      scratch[t] = a > scratch[t] ? a : scratch[t];  // a NaN is not taken (the sums carry it)
      scratch[hq_threads + t] = __dadd_rn(scratch[hq_threads + t], scratch[hq_threads + t + half]);
      scratch[2 * hq_threads + t] =
          __dadd_rn(scratch[2 * hq_threads + t], scratch[2 * hq_threads + t + half]);
    }
    __syncthreads();
  }
  const hq_block_totals total{scratch[0], scratch[hq_threads], scratch[2 * hq_threads]};
  __syncthreads();  // the scratch is free again
  return total;
}

/// The Walsh-Hadamard transform of the block's `length` values in shared memory, a stage at a
/// time (`hq_phase::butterflies`), a barrier after each; the last stage scaled by 1 /
/// sqrt(length): `norm_full` for a whole block, else `norm_last` (the last block's, computed on
/// the host as `hq_hadamard` computes it).
template <class T>
__device__ inline void hq_rotate_shared(T* v, std::size_t length, T norm_full, T norm_last) {
  const T norm = length == hq_max_block ? norm_full : norm_last;
  for (std::size_t h = 1; h < length; h *= 2) {
    hq_phase::butterflies(threadIdx.x, hq_threads, v, length, h,
                          hq_phase::stage_scale(h, length, norm));
    __syncthreads();
  }
}

/// One butterfly of the transform on registers: (a, b) -> (a + b, a - b)
/// (`hq_phase::butterflies`' operations on the same operands, so its bits; the last stage's
/// scale is a multiply after it, as there).
template <class T>
__device__ __forceinline__ void hq_butterfly(T& a, T& b) {
  const T sum = a + b;
  b = a - b;
  a = sum;
}

/// The transform of a whole rotation block (`hq_max_block` values) held in registers, thread t
/// holding element t + 256 i in x[i], in the stages' order h = 1, 2, ..., 512 (the order of
/// `hq_rotate_shared`, so the same bits): distances 1 to 16 between the lanes of a warp
/// (shuffles), 32 to 128 in shared memory `v` (a thread per 8 elements, the three stages in
/// its registers), 256 and 512 between a thread's own registers, the last scaled by `norm`.
/// Two barriers instead of ten, and no index arithmetic per pair.
template <class T>
__device__ inline void hq_rotate_registers(T (&x)[hq_per_thread], T* v, T norm) {
  static_assert(hq_max_block == 1024 && hq_threads == 256, "the stages' split assumes these");
  const unsigned t = threadIdx.x;
  const unsigned lane = t % 32;
#pragma unroll
  for (unsigned h = 1; h < 32; h *= 2) {
    const bool upper = (lane & h) != 0;
#pragma unroll
    for (unsigned i = 0; i < hq_per_thread; ++i) {
      const T partner = __shfl_xor_sync(0xffffffffu, x[i], h);
      x[i] = upper ? partner - x[i] : x[i] + partner;  // (a + b, a - b) of the pair
    }
  }
#pragma unroll
  for (unsigned i = 0; i < hq_per_thread; ++i) v[t + hq_threads * i] = x[i];
  __syncthreads();
  if (t < hq_max_block / 8) {  // element bits 5 to 7 vary within a thread's 8
    const unsigned base = t % 32 + t / 32 * 256;
    T y[8];
#pragma unroll
    for (unsigned w = 0; w < 8; ++w) y[w] = v[base + 32 * w];
#pragma unroll
    for (unsigned d = 1; d < 8; d *= 2) {
#pragma unroll
      for (unsigned w = 0; w < 8; ++w) {
        if ((w & d) == 0) hq_butterfly(y[w], y[w + d]);
      }
    }
#pragma unroll
    for (unsigned w = 0; w < 8; ++w) v[base + 32 * w] = y[w];
  }
  __syncthreads();
#pragma unroll
  for (unsigned i = 0; i < hq_per_thread; ++i) x[i] = v[t + hq_threads * i];
  hq_butterfly(x[0], x[1]);  // distance 256
  hq_butterfly(x[2], x[3]);
  hq_butterfly(x[0], x[2]);  // distance 512, the last: scaled
  hq_butterfly(x[1], x[3]);
#pragma unroll
  for (unsigned i = 0; i < hq_per_thread; ++i) x[i] *= norm;
}

/// Per rotation block: |x| statistics of its elements and, for the exact max (rotation, no
/// bound), the block rotated in shared memory.
template <class T>
__global__ void __launch_bounds__(hq_threads)
    hq_range_kernel(const T* in, std::size_t count, hq_rotation r, bool bound_only, T norm_full,
                    T norm_last, hq_block_range* partial) {
  __shared__ T v[hq_max_block];
  __shared__ std::uint32_t signs[hq_phase::sign_words];
  __shared__ double scratch[3 * hq_threads];
  const unsigned t = threadIdx.x;
  const std::size_t blocks = (count + hq_max_block - 1) / hq_max_block;
  for (std::size_t k = blockIdx.x; k < blocks; k += gridDim.x) {
    const std::size_t first = k * hq_max_block;
    const std::size_t length = hq_phase::block_length(count, k, r.rotate);
    const std::size_t n = length < count - first ? length : count - first;
    hq_block_totals mine{0, 0, 0};
    for (std::size_t j = t; j < n; j += hq_threads) {
      const double a = fabs(static_cast<double>(in[first + j]));
      mine.largest = a > mine.largest ? a : mine.largest;
      mine.l1 = __dadd_rn(mine.l1, a);
      mine.l2 = __dadd_rn(mine.l2, __dmul_rn(a, a));
    }
    const hq_block_totals x = hq_reduce_block(mine, scratch);
    double top = x.largest;
    if (r.rotate && bound_only) {
      const double root = sqrt(static_cast<double>(length));
      const double l2 = sqrt(x.l2);
      top = x.l1 / root < l2 ? x.l1 / root : l2;
    } else if (r.rotate) {
      hq_phase::signs(t, hq_threads, r.seed, r.step, k, length, signs);
      __syncthreads();
      hq_phase::load(t, hq_threads, in, count, first, length, true, signs, v);
      __syncthreads();
      hq_rotate_shared(v, length, norm_full, norm_last);
      hq_block_totals rotated{0, 0, 0};
      for (std::size_t j = t; j < length; j += hq_threads) {
        const double a = fabs(static_cast<double>(v[j]));
        rotated.largest = a > rotated.largest ? a : rotated.largest;
      }
      top = hq_reduce_block(rotated, scratch).largest;
    }
    if (t == 0) partial[k] = {top, x.l2, isfinite(x.l1) ? 1 : 0};
  }
}

/// The blocks' ranges into (max |y|, rms): one CUDA block, a fixed order.
__global__ void __launch_bounds__(hq_threads)
    hq_range_total_kernel(const hq_block_range* partial, std::size_t blocks, std::size_t padded,
                          hq_range_result* out) {
  __shared__ double scratch[3 * hq_threads];
  hq_block_totals mine{0, 0, 0};  // l1 counts the blocks whose sums were not finite
  for (std::size_t k = threadIdx.x; k < blocks; k += hq_threads) {
    const hq_block_range b = partial[k];
    mine.largest = b.top > mine.largest ? b.top : mine.largest;
    mine.l2 = __dadd_rn(mine.l2, b.squares);
    mine.l1 += b.finite != 0 ? 0.0 : 1.0;
  }
  const hq_block_totals total = hq_reduce_block(mine, scratch);
  if (threadIdx.x == 0) {
    *out = {total.l1 == 0 ? total.largest : __longlong_as_double(0x7ff8000000000000ll),
            padded == 0 ? 0.0 : sqrt(total.l2 / static_cast<double>(padded))};
  }
}

/// Per rotation block: the block's input read into registers first (its loads in flight while
/// the signs and draws are computed from Philox into shared memory), signed and rotated
/// (a whole block in registers, `hq_rotate_registers`; a shorter last one, or no rotation, in
/// shared memory a stage at a time), coded into shared memory, and its words written (stored
/// where the block holds every element of the word, ORed into the zeroed words where it shares
/// one with a neighbour).
template <class T>
__global__ void __launch_bounds__(hq_threads, 8)  // 32 registers: 8 blocks a multiprocessor
    hq_encode_kernel(const T* in, std::size_t count, hq_rotation r, std::uint64_t seed,
                     random_stream stream, T inverse_step, std::uint32_t levels, unsigned field,
                     std::size_t padded, std::size_t total_words, T norm_full, T norm_last,
                     std::uint64_t* words, unsigned long long* first_bad) {
  __shared__ T v[hq_max_block];
  __shared__ std::uint32_t signs[hq_phase::sign_words];
  __shared__ std::uint32_t draws[hq_phase::draw_words<T>];
  __shared__ std::uint8_t codes[hq_max_block];
  const unsigned t = threadIdx.x;
  const std::size_t blocks = (count + hq_max_block - 1) / hq_max_block;
  for (std::size_t k = blockIdx.x; k < blocks; k += gridDim.x) {
    const std::size_t first = k * hq_max_block;
    const std::size_t length = hq_phase::block_length(count, k, r.rotate);
    T x[hq_per_thread];
#pragma unroll
    for (unsigned i = 0; i < hq_per_thread; ++i) {
      const unsigned j = t + i * hq_threads;
      x[i] = j < length && first + j < count ? in[first + j] : T(0);
    }
    if (r.rotate) hq_phase::signs(t, hq_threads, r.seed, r.step, k, length, signs);
    hq_phase::draws<T>(t, hq_threads, seed, stream, first, length, draws);
    __syncthreads();
    const auto scaled = [=](T y) {
      if constexpr (sizeof(T) == 4) {
        return __fmul_rn(y, inverse_step);
      } else {
        return __dmul_rn(y, inverse_step);
      }
    };
    const bool in_registers = r.rotate && length == hq_max_block;  // the same for the block
#pragma unroll
    for (unsigned i = 0; i < hq_per_thread; ++i) {  // hq_phase::load, from the registers
      const unsigned j = t + i * hq_threads;
      if (first_bad != nullptr && j < length && first + j < count && !isfinite(x[i])) {
        atomicMin(first_bad, static_cast<unsigned long long>(first + j));
      }
      if (in_registers) {
        x[i] = hq_phase::signed_value(x[i], j, true, signs);
      } else if (j < length) {
        v[j] = hq_phase::signed_value(x[i], j, r.rotate, signs);
      }
    }
    if (in_registers) {
      hq_rotate_registers(x, v, norm_full);
#pragma unroll
      for (unsigned i = 0; i < hq_per_thread; ++i) {  // hq_phase::codes, from the registers
        const unsigned j = t + i * hq_threads;
        codes[j] = hq_phase::code_of(x[i], j, draws, scaled, levels);
      }
    } else {
      __syncthreads();
      if (r.rotate) hq_rotate_shared(v, length, norm_full, norm_last);
      hq_phase::codes(t, hq_threads, v, length, draws, scaled, levels, codes);
    }
    __syncthreads();
    hq_phase::pack(t, hq_threads, codes, first, length, padded, field, total_words,
                   [&](std::size_t w, std::uint64_t bits, bool alone) {
                     if (alone) {
                       words[w] = bits;
                     } else if (bits != 0) {
                       atomicOr(reinterpret_cast<unsigned long long*>(words + w),
                                static_cast<unsigned long long>(bits));
                     }
                   });
    __syncthreads();  // the shared arrays are the next block's
  }
}

/// Per rotation block: the summed fields unpacked to values in shared memory, rotated back (in
/// registers for a whole block, as the encode) and signed on the way out; a field above n x 2L
/// recorded by atomicMin.
template <class T>
__global__ void __launch_bounds__(hq_threads)
    hq_decode_kernel(const std::uint64_t* words, std::size_t count, hq_rotation r, unsigned field,
                     std::size_t padded, std::size_t total_words, std::uint64_t top, T offset,
                     T step, T norm_full, T norm_last, T* out, unsigned long long* first_bad) {
  __shared__ T v[hq_max_block];
  __shared__ std::uint32_t signs[hq_phase::sign_words];
  const unsigned t = threadIdx.x;
  const std::size_t blocks = (count + hq_max_block - 1) / hq_max_block;
  for (std::size_t k = blockIdx.x; k < blocks; k += gridDim.x) {
    const std::size_t first = k * hq_max_block;
    const std::size_t length = hq_phase::block_length(count, k, r.rotate);
    hq_phase::unpack(t, hq_threads, words, first, length, padded, field, total_words, top, offset,
                     step, v, [&](std::size_t e) {
                       atomicMin(first_bad,
                                 static_cast<unsigned long long>(e < count ? e : count - 1));
                     });
    if (r.rotate) hq_phase::signs(t, hq_threads, r.seed, r.step, k, length, signs);
    __syncthreads();
    if (r.rotate && length == hq_max_block) {  // the same for the block
      T x[hq_per_thread];
#pragma unroll
      for (unsigned i = 0; i < hq_per_thread; ++i) x[i] = v[t + i * hq_threads];
      hq_rotate_registers(x, v, norm_full);
#pragma unroll
      for (unsigned i = 0; i < hq_per_thread; ++i) {  // hq_phase::store, from the registers
        const unsigned j = t + i * hq_threads;        // the padding of a last block is not written
        if (first + j < count) out[first + j] = hq_phase::stored_value(x[i], j, true, signs, step);
      }
    } else {
      if (r.rotate) hq_rotate_shared(v, length, norm_full, norm_last);
      const std::size_t n = length < count - first ? length : count - first;
      hq_phase::store(t, hq_threads, v, n, r.rotate, signs, step, out + first);
    }
    __syncthreads();  // the shared arrays are the next block's
  }
}

/// A CUDA block per rotation block, up to 2^20 (then grid-stride).
inline unsigned hq_grid(std::size_t blocks) {
  constexpr std::size_t most = std::size_t{1} << 20;
  return static_cast<unsigned>(blocks < most ? blocks : most);
}

inline hq_rotation rotation_of(const hq_shape& s) { return {s.rotate, s.seed, s.step}; }

}  // namespace detail

/// Device twin of the host `hq_range`: the same bound or exact max and rms, the sums in
/// another order (see the file comment); waits for the stream once, to read them.
template <class T>
void hq_range(const cuda_backend& backend, const hq_shape& s, const T* in, bool bound_only,
              double& max_abs, double& rms) {
  max_abs = 0;
  rms = 0;
  if (s.count == 0) return;
  squall::detail::device_guard guard(backend.device);
  const std::size_t blocks = s.blocks();
  device_scratch<detail::hq_block_range> partial(backend, blocks);
  device_scratch<detail::hq_range_result> out(backend, 1);
  detail::hq_range_kernel<T><<<detail::hq_grid(blocks), detail::hq_threads, 0, backend.stream>>>(
      in, s.count, detail::rotation_of(s), bound_only, detail::hq_norm<T>(hq_max_block),
      detail::hq_norm<T>(s.block_length(blocks - 1)), partial.data());
  SQUALL_CUDA_CHECK(cudaGetLastError());
  detail::hq_range_total_kernel<<<1, detail::hq_threads, 0, backend.stream>>>(
      partial.data(), blocks, s.padded(), out.data());
  SQUALL_CUDA_CHECK(cudaGetLastError());
  const detail::hq_range_result range = detail::read_back(backend, out.data());
  max_abs = range.max_abs;
  rms = range.rms;
}

/// Device twin of the host `hq_encode`: the same words (zeroed on the stream, then written by
/// `hq_encode_kernel`). With `find_bad`, waits for the stream once and returns the first
/// non-finite element (or `count`); without, returns `count` and does not wait.
template <class T>
std::size_t hq_encode(const cuda_backend& backend, const hq_shape& s, const T* in, double scale,
                      std::uint64_t seed, random_stream stream, bool find_bad,
                      std::uint64_t* words) {
  if (s.count == 0) return 0;
  squall::detail::device_guard guard(backend.device);
  const std::uint32_t levels = hq_levels(s.bits);
  const T inverse_step = scale > 0 ? static_cast<T>(levels / scale) : T{0};
  const std::size_t blocks = s.blocks();
  SQUALL_CUDA_CHECK(cudaMemsetAsync(words, 0, s.words() * sizeof(std::uint64_t), backend.stream));
  const auto launch = [&](unsigned long long* first_bad) {
    detail::hq_encode_kernel<T><<<detail::hq_grid(blocks), detail::hq_threads, 0, backend.stream>>>(
        in, s.count, detail::rotation_of(s), seed, stream, inverse_step, levels, s.field,
        s.padded(), s.words(), detail::hq_norm<T>(hq_max_block),
        detail::hq_norm<T>(s.block_length(blocks - 1)), words, first_bad);
    SQUALL_CUDA_CHECK(cudaGetLastError());
  };
  if (!find_bad) {
    launch(nullptr);
    return s.count;
  }
  detail::first_index_slot first_bad(backend, s.count);
  launch(first_bad.get());
  return first_bad.read();
}

/// Device twin of the host `hq_decode`: returns the first element whose field is above n x 2L
/// (or `count`), so it waits for the stream once.
template <class T>
std::size_t hq_decode(const cuda_backend& backend, const hq_shape& s, const std::uint64_t* words,
                      std::uint64_t contributions, double scale, T* out) {
  if (s.count == 0) return 0;
  squall::detail::device_guard guard(backend.device);
  const std::uint32_t levels = hq_levels(s.bits);
  const std::size_t blocks = s.blocks();
  detail::first_index_slot first_bad(backend, s.count);
  detail::hq_decode_kernel<T><<<detail::hq_grid(blocks), detail::hq_threads, 0, backend.stream>>>(
      words, s.count, detail::rotation_of(s), s.field, s.padded(), s.words(),
      contributions * 2u * levels, static_cast<T>(static_cast<double>(contributions * levels)),
      static_cast<T>(scale / levels), detail::hq_norm<T>(hq_max_block),
      detail::hq_norm<T>(s.block_length(blocks - 1)), out, first_bad.get());
  SQUALL_CUDA_CHECK(cudaGetLastError());
  return first_bad.read();
}

}  // namespace squall::kernels
