// SPDX-License-Identifier: Apache-2.0
#pragma once
/// CUDA twins of kernels/host/sketch.hpp: count-sketch accumulation and median estimates,
/// the heavy-hitter selection, and PowerSGD's products, orthogonalization and random factor.
/// Same signatures over device memory, same `SQUALL_HOST_DEVICE` hashing (`sketch_word`,
/// `sketch_bucket`, `sketch_sign_bit`, Philox), so every element lands in the host's bucket
/// with the host's sign. How close each twin is to the host:
///
/// - `count_sketch_estimate`, `keep_largest_magnitudes`, `powersgd_random_factor`: bit for bit
///   (the same products by +-1 and the same median network; top-k's stable sort; the same
///   Philox words), except that a NaN estimate may carry another payload (GPU arithmetic
///   returns its canonical NaN).
/// - `count_sketch_accumulate`: one `atomicAdd` per element and row, so each bucket is the
///   host's sum of the same terms in another order: equal up to float reassociation, within
///   2 (n_b - 1) eps sum_b |g_i| for a bucket of n_b terms (both sums are within
///   (n_b - 1) eps sum_b |g_i| of the exact one; Higham, "Accuracy and Stability of Numerical
///   Algorithms", 2nd ed., 2002, section 4.2).
/// - PowerSGD's products (`powersgd_multiply`, `powersgd_multiply_transposed`,
///   `powersgd_decompress`) sum in double as the host does, in another order (CUB block
///   reductions, row chunks) and with fused multiply-adds, then round once to `T`: each entry
///   is within one rounding of `T` (eps_T |x|) plus 2 n eps_double sum |terms| of the host's,
///   n the terms of its dot product. `powersgd_orthogonalize` is the host's Gram-Schmidt
///   (twice, in double, the same dependence test) with block-reduced dot products: its
///   columns agree with the host's to about r^2 m eps_double for a well-conditioned P (a
///   column at the dependence threshold may be kept by one side and zeroed by the other).

#include <squall/backend/cuda.cuh>
#include <squall/core/buffer.hpp>
#include <squall/core/random.hpp>
#include <squall/kernels/cuda/reduce.cuh>
#include <squall/kernels/cuda/select.cuh>
#include <squall/kernels/host/sketch.hpp>

#include <cub/block/block_reduce.cuh>
#include <cuda/std/limits>
#include <cuda_runtime.h>

#include <bit>      // countr_zero
#include <cstddef>  // size_t
#include <cstdint>

namespace squall::kernels {
namespace detail {

inline constexpr int sketch_threads = 256;
inline constexpr int orthogonalize_threads = 512;
/// Rows of the m x c view per partial sum of `powersgd_multiply_transposed`.
inline constexpr std::size_t transposed_chunk_rows = 128;

inline unsigned sketch_grid(std::size_t count) {
  const std::size_t blocks = (count + sketch_threads - 1) / sketch_threads;
  return static_cast<unsigned>(blocks < max_blocks ? (blocks == 0 ? 1 : blocks) : max_blocks);
}

/// The Rows hash functions copied to device memory (stream-ordered; the host array may go
/// when the call returns).
template <std::size_t Rows>
device_scratch<sketch_row_hash> device_hashes(const cuda_backend& backend,
                                              const sketch_row_hash (&hash)[Rows]) {
  device_scratch<sketch_row_hash> out(backend, Rows);
  SQUALL_CUDA_CHECK(
      cudaMemcpyAsync(out.data(), hash, sizeof hash, cudaMemcpyHostToDevice, backend.stream));
  return out;
}

template <std::size_t Rows, std::size_t Cols, class T>
__global__ void __launch_bounds__(sketch_threads)
    count_sketch_accumulate_kernel(const T* in, std::size_t count, const sketch_row_hash* hash,
                                   unsigned bits, T* sketch) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * sketch_threads;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * sketch_threads + threadIdx.x;
       i < count; i += stride) {
    const T x = in[i];
    for (std::size_t r = 0; r < Rows; ++r) {
      const std::uint64_t w = sketch_word(hash[r], i);
      // s_r(i) x: a sign flip, exact, as the host's xor of the sign bit
      atomicAdd(sketch + r * Cols + sketch_bucket(w, bits), sketch_sign_bit(w) != 0 ? -x : x);
    }
  }
}

template <std::size_t Rows, std::size_t Cols, class T>
__global__ void __launch_bounds__(sketch_threads)
    count_sketch_estimate_kernel(const T* sketch, const sketch_row_hash* hash, unsigned bits,
                                 std::size_t count, T* out) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * sketch_threads;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * sketch_threads + threadIdx.x;
       i < count; i += stride) {
    T x[Rows];
    for (std::size_t r = 0; r < Rows; ++r) {
      const std::uint64_t w = sketch_word(hash[r], i);
      // the host's product: the sign as +-1 of T, times the bucket
      x[r] = apply_sign(T(1), sketch_sign_bit(w)) * sketch[r * Cols + sketch_bucket(w, bits)];
    }
    out[i] = median_of(x);
  }
}

template <class T>
__global__ void __launch_bounds__(sketch_threads)
    keep_cut_kernel(T* values, std::size_t count, magnitude_key_type<T> key,
                    std::uint64_t tie_end) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * sketch_threads;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * sketch_threads + threadIdx.x;
       i < count; i += stride) {
    const magnitude_key_type<T> k = magnitude_key(values[i]);
    if (!(k > key || (k == key && i < tie_end))) values[i] = T(0);
  }
}

/// Elements of row `i` of the m x c view of `count` elements (the host's `row_length`).
__device__ inline std::size_t view_row_length(std::size_t i, std::size_t columns,
                                              std::size_t count) {
  const std::size_t start = i * columns;
  if (start >= count) return 0;
  return count - start < columns ? count - start : columns;
}

// P = M Q: one block per row (grid-stride), one block reduction per column of Q.
template <class T>
__global__ void __launch_bounds__(sketch_threads)
    powersgd_multiply_kernel(const T* in, std::size_t count, std::size_t rows, std::size_t columns,
                             std::size_t rank, const T* q, T* p) {
  using reduce = cub::BlockReduce<double, sketch_threads>;
  __shared__ typename reduce::TempStorage storage;
  for (std::size_t i = blockIdx.x; i < rows; i += gridDim.x) {
    const std::size_t len = view_row_length(i, columns, count);
    const T* row = in + i * columns;
    for (std::size_t k = 0; k < rank; ++k) {
      double sum = 0;
      for (std::size_t j = threadIdx.x; j < len; j += sketch_threads) {
        sum += static_cast<double>(row[j]) * static_cast<double>(q[j * rank + k]);
      }
      const double total = reduce(storage).Sum(sum);
      if (threadIdx.x == 0) p[i * rank + k] = static_cast<T>(total);
      __syncthreads();  // the temporary storage is reused
    }
  }
}

// Q = M^T P, step 1: partial[chunk][k][j] = sum over the chunk's rows i of P[i][k] M[i][j];
// thread j of block (x, k, chunk), so a warp reads consecutive elements of a row.
template <class T>
__global__ void __launch_bounds__(sketch_threads)
    powersgd_transposed_partial_kernel(const T* in, std::size_t count, std::size_t rows,
                                       std::size_t columns, std::size_t rank, const T* p,
                                       double* partial) {
  const std::size_t j = static_cast<std::size_t>(blockIdx.x) * sketch_threads + threadIdx.x;
  const std::size_t k = blockIdx.y;
  const std::size_t chunk = blockIdx.z;
  if (j >= columns) return;
  const std::size_t first = chunk * transposed_chunk_rows;
  const std::size_t last =
      rows - first < transposed_chunk_rows ? rows : first + transposed_chunk_rows;
  double acc = 0;
  for (std::size_t i = first; i < last && i * columns + j < count; ++i) {
    acc += static_cast<double>(p[i * rank + k]) * static_cast<double>(in[i * columns + j]);
  }
  partial[(chunk * rank + k) * columns + j] = acc;
}

// Q = M^T P, step 2: the chunks' partial sums in chunk order, rounded once to T.
template <class T>
__global__ void __launch_bounds__(sketch_threads)
    powersgd_transposed_sum_kernel(const double* partial, std::size_t chunks, std::size_t columns,
                                   std::size_t rank, T* q) {
  const std::size_t entries = columns * rank;
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * sketch_threads;
  for (std::size_t e = static_cast<std::size_t>(blockIdx.x) * sketch_threads + threadIdx.x;
       e < entries; e += stride) {
    const std::size_t j = e / rank;
    const std::size_t k = e % rank;
    double sum = 0;
    for (std::size_t c = 0; c < chunks; ++c) sum += partial[(c * rank + k) * columns + j];
    q[e] = static_cast<T>(sum);
  }
}

// Gram-Schmidt, twice, in double, by one block over the column-major copy `col` (m x r).
template <class T>
__global__ void __launch_bounds__(orthogonalize_threads)
    powersgd_orthogonalize_kernel(T* p, std::size_t rows, std::size_t rank, double* col) {
  using reduce = cub::BlockReduce<double, orthogonalize_threads>;
  __shared__ typename reduce::TempStorage storage;
  __shared__ double shared;
  const auto dot = [&](const double* a, const double* b) {
    double s = 0;
    for (std::size_t i = threadIdx.x; i < rows; i += orthogonalize_threads) s += a[i] * b[i];
    const double total = reduce(storage).Sum(s);
    if (threadIdx.x == 0) shared = total;
    __syncthreads();
    const double result = shared;
    __syncthreads();  // before the storage and `shared` are reused
    return result;
  };
  for (std::size_t e = threadIdx.x; e < rows * rank; e += orthogonalize_threads) {
    col[(e % rank) * rows + e / rank] = static_cast<double>(p[e]);
  }
  __syncthreads();
  for (std::size_t k = 0; k < rank; ++k) {
    double* v = col + k * rows;
    const double before = sqrt(dot(v, v));
    for (int pass = 0; pass < 2; ++pass) {
      for (std::size_t e = 0; e < k; ++e) {
        const double* u = col + e * rows;
        const double d = dot(v, u);
        for (std::size_t i = threadIdx.x; i < rows; i += orthogonalize_threads) v[i] -= d * u[i];
        __syncthreads();
      }
    }
    const double norm = sqrt(dot(v, v));
    if (norm > dependent_tolerance * before && norm <= ::cuda::std::numeric_limits<double>::max()) {
      for (std::size_t i = threadIdx.x; i < rows; i += orthogonalize_threads) v[i] /= norm;
    } else if (!(norm != norm)) {  // zero, dependent or overflowing: zero, no NaN
      for (std::size_t i = threadIdx.x; i < rows; i += orthogonalize_threads) v[i] = 0.0;
    }
    __syncthreads();
  }
  for (std::size_t e = threadIdx.x; e < rows * rank; e += orthogonalize_threads) {
    p[e] = static_cast<T>(col[(e % rank) * rows + e / rank]);
  }
}

// out = P Q^T, one thread per element: the host's sum over k, in the host's order.
template <class T>
__global__ void __launch_bounds__(sketch_threads)
    powersgd_decompress_kernel(const T* p, const T* q, std::size_t columns, std::size_t rank,
                               T* out, std::size_t count) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * sketch_threads;
  for (std::size_t e = static_cast<std::size_t>(blockIdx.x) * sketch_threads + threadIdx.x;
       e < count; e += stride) {
    const std::size_t i = e / columns;
    const std::size_t j = e % columns;
    double acc = 0;
    for (std::size_t k = 0; k < rank; ++k) {
      acc += static_cast<double>(p[i * rank + k]) * static_cast<double>(q[j * rank + k]);
    }
    out[e] = static_cast<T>(acc);
  }
}

template <class T>
__global__ void __launch_bounds__(sketch_threads)
    powersgd_random_factor_kernel(std::uint64_t seed, random_stream stream, T* q,
                                  std::size_t entries) {
  const std::size_t blocks = (entries + 3) / 4;
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * sketch_threads;
  for (std::size_t b = static_cast<std::size_t>(blockIdx.x) * sketch_threads + threadIdx.x;
       b < blocks; b += stride) {
    const philox_block x = philox(seed, stream, b);
    for (std::size_t l = 0; l < 4 && 4 * b + l < entries; ++l) {
      q[4 * b + l] = static_cast<T>(2.0 * unit_interval(x.word[l]) - 1.0);
    }
  }
}

/// The two rounded operations of FetchSGD's step, as the host rounds them (no contraction).
SQUALL_DEVICE inline float momentum_mul(float a, float b) { return __fmul_rn(a, b); }
SQUALL_DEVICE inline double momentum_mul(double a, double b) { return __dmul_rn(a, b); }
SQUALL_DEVICE inline float momentum_add(float a, float b) { return __fadd_rn(a, b); }
SQUALL_DEVICE inline double momentum_add(double a, double b) { return __dadd_rn(a, b); }

template <class T>
__global__ void __launch_bounds__(sketch_threads)
    sketch_momentum_kernel(T* momentum, T* error, const T* sum, std::size_t count, T rho) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * sketch_threads;
  for (std::size_t j = static_cast<std::size_t>(blockIdx.x) * sketch_threads + threadIdx.x;
       j < count; j += stride) {
    const T u = momentum_add(momentum_mul(rho, momentum[j]), sum[j]);
    momentum[j] = u;
    error[j] = momentum_add(error[j], u);
  }
}

template <std::size_t Rows, std::size_t Cols, class T>
__global__ void __launch_bounds__(sketch_threads)
    count_sketch_zero_support_kernel(const T* values, std::size_t count,
                                     const sketch_row_hash* hash, unsigned bits, T* a, T* b) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * sketch_threads;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * sketch_threads + threadIdx.x;
       i < count; i += stride) {
    if (values[i] == T(0)) continue;
    for (std::size_t r = 0; r < Rows; ++r) {
      const std::size_t at = r * Cols + sketch_bucket(sketch_word(hash[r], i), bits);
      a[at] = T(0);  // every thread writes the same zero: no order to race over
      b[at] = T(0);
    }
  }
}

}  // namespace detail

/// Device twin of the host `count_sketch_accumulate`: adds s_r(i) in[i] to bucket h_r(i) of
/// each row of `sketch` (device memory, Rows x Cols, row-major) with `atomicAdd`. Equal to the
/// host up to the order of each bucket's sum (see the file comment for the bound).
template <std::size_t Rows, std::size_t Cols, real_gradient T>
void count_sketch_accumulate(const cuda_backend& backend, device_view<const T> in,
                             const sketch_row_hash (&hash)[Rows], T* sketch) {
  if (in.empty()) return;
  squall::detail::device_guard guard(backend.device);
  const auto device_hash = detail::device_hashes(backend, hash);
  constexpr auto bits = static_cast<unsigned>(std::countr_zero(Cols));
  detail::count_sketch_accumulate_kernel<Rows, Cols>
      <<<detail::sketch_grid(in.count()), detail::sketch_threads, 0, backend.stream>>>(
          in.data(), in.count(), device_hash.data(), bits, sketch);
  SQUALL_CUDA_CHECK(cudaGetLastError());
}

/// Device twin of the host `count_sketch_estimate`: every element's median over rows of
/// s_r(i) sketch[r][h_r(i)], bit for bit the host's (NaN payloads aside).
template <std::size_t Rows, std::size_t Cols, real_gradient T>
void count_sketch_estimate(const cuda_backend& backend, const T* sketch,
                           const sketch_row_hash (&hash)[Rows], device_view<T> out) {
  if (out.empty()) return;
  squall::detail::device_guard guard(backend.device);
  const auto device_hash = detail::device_hashes(backend, hash);
  constexpr auto bits = static_cast<unsigned>(std::countr_zero(Cols));
  detail::count_sketch_estimate_kernel<Rows, Cols>
      <<<detail::sketch_grid(out.count()), detail::sketch_threads, 0, backend.stream>>>(
          sketch, device_hash.data(), bits, out.count(), out.data());
  SQUALL_CUDA_CHECK(cudaGetLastError());
}

/// Device twin of the host `sketch_momentum_step`: momentum = rho momentum + sum; error +=
/// momentum, rounded as the host rounds (bit for bit).
template <real_gradient T>
void sketch_momentum_step(const cuda_backend& backend, device_view<T> momentum,
                          device_view<T> error, device_view<const T> sum, T rho) {
  if (sum.empty()) return;
  squall::detail::device_guard guard(backend.device);
  detail::sketch_momentum_kernel<<<detail::sketch_grid(sum.count()), detail::sketch_threads, 0,
                                   backend.stream>>>(momentum.data(), error.data(), sum.data(),
                                                     sum.count(), rho);
  SQUALL_CUDA_CHECK(cudaGetLastError());
}

/// Device twin of the host `count_sketch_zero_support`: zeroes in `a` and `b` (device memory)
/// the Rows buckets of every element where `values` is not zero (bit for bit the host's).
template <std::size_t Rows, std::size_t Cols, real_gradient T>
void count_sketch_zero_support(const cuda_backend& backend, device_view<const T> values,
                               const sketch_row_hash (&hash)[Rows], T* a, T* b) {
  if (values.empty()) return;
  squall::detail::device_guard guard(backend.device);
  const auto device_hash = detail::device_hashes(backend, hash);
  constexpr auto bits = static_cast<unsigned>(std::countr_zero(Cols));
  detail::count_sketch_zero_support_kernel<Rows, Cols>
      <<<detail::sketch_grid(values.count()), detail::sketch_threads, 0, backend.stream>>>(
          values.data(), values.count(), device_hash.data(), bits, a, b);
  SQUALL_CUDA_CHECK(cudaGetLastError());
}

/// Device twin of the host `keep_largest_magnitudes`: keeps the `k` entries largest in
/// magnitude (top-k's cut: NaN highest, ties to the lower index) and zeroes the rest, in place.
template <real_gradient T>
void keep_largest_magnitudes(const cuda_backend& backend, device_view<T> values, std::size_t k) {
  const std::size_t count = values.count();
  if (k >= count) return;
  if (k == 0) {
    fill_zero(backend, values);
    return;
  }
  const detail::topk_cut<T> cut = detail::find_topk_cut(backend, device_view<const T>(values), k);
  squall::detail::device_guard guard(backend.device);
  detail::
      keep_cut_kernel<<<detail::sketch_grid(count), detail::sketch_threads, 0, backend.stream>>>(
          values.data(), count, cut.key, cut.tie_end);
  SQUALL_CUDA_CHECK(cudaGetLastError());
}

/// Device twin of the host `powersgd_multiply`: P = M Q for the m x c view M of `in`; sums in
/// double (a block reduction per entry), rounded once to `T`.
template <real_gradient T>
void powersgd_multiply(const cuda_backend& backend, device_view<const T> in, std::size_t rows,
                       std::size_t columns, std::size_t rank, const T* q, T* p) {
  if (rows == 0 || rank == 0) return;
  squall::detail::device_guard guard(backend.device);
  detail::powersgd_multiply_kernel<<<static_cast<unsigned>(
                                         rows < detail::max_blocks ? rows : detail::max_blocks),
                                     detail::sketch_threads, 0, backend.stream>>>(
      in.data(), in.count(), rows, columns, rank, q, p);
  SQUALL_CUDA_CHECK(cudaGetLastError());
}

/// Device twin of the host `powersgd_multiply_transposed`: Q = M^T P; sums in double (per
/// chunk of 128 rows, then over the chunks in order), rounded once to `T`.
template <real_gradient T>
void powersgd_multiply_transposed(const cuda_backend& backend, device_view<const T> in,
                                  std::size_t rows, std::size_t columns, std::size_t rank,
                                  const T* p, T* q) {
  if (columns == 0 || rank == 0) return;
  squall::detail::device_guard guard(backend.device);
  const std::size_t chunks = rows == 0 ? 0 : (rows - 1) / detail::transposed_chunk_rows + 1;
  if (chunks == 0) {
    fill_zero(backend, device_view<T>(q, columns * rank));
    return;
  }
  if (chunks > 65535) {
    throw invalid_argument({.operation = "powersgd"},
                           "a view of " + std::to_string(rows) + " rows (at most " +
                               std::to_string(65535 * detail::transposed_chunk_rows) +
                               " on the device)");
  }
  device_scratch<double> partial(backend, chunks * rank * columns);
  const dim3 grid(
      static_cast<unsigned>((columns + detail::sketch_threads - 1) / detail::sketch_threads),
      static_cast<unsigned>(rank), static_cast<unsigned>(chunks));
  detail::powersgd_transposed_partial_kernel<<<grid, detail::sketch_threads, 0, backend.stream>>>(
      in.data(), in.count(), rows, columns, rank, p, partial.data());
  SQUALL_CUDA_CHECK(cudaGetLastError());
  detail::powersgd_transposed_sum_kernel<<<detail::sketch_grid(columns * rank),
                                           detail::sketch_threads, 0, backend.stream>>>(
      partial.data(), chunks, columns, rank, q);
  SQUALL_CUDA_CHECK(cudaGetLastError());
}

/// Device twin of the host `powersgd_orthogonalize`: the same Gram-Schmidt (twice, in double,
/// zeroing dependent columns), by one block of 512 threads over a double copy of P.
template <real_gradient T>
void powersgd_orthogonalize(const cuda_backend& backend, T* p, std::size_t rows, std::size_t rank) {
  if (rows == 0 || rank == 0) return;
  squall::detail::device_guard guard(backend.device);
  device_scratch<double> col(backend, rows * rank);
  detail::powersgd_orthogonalize_kernel<<<1, detail::orthogonalize_threads, 0, backend.stream>>>(
      p, rows, rank, col.data());
  SQUALL_CUDA_CHECK(cudaGetLastError());
}

/// Device twin of the host `powersgd_decompress`: out = P Q^T truncated to out.count()
/// elements; sums in double in the host's order, rounded once to `T`.
template <real_gradient T>
void powersgd_decompress(const cuda_backend& backend, const T* p, const T* q, std::size_t rows,
                         std::size_t columns, std::size_t rank, device_view<T> out) {
  if (out.empty() || rows == 0) return;
  squall::detail::device_guard guard(backend.device);
  detail::powersgd_decompress_kernel<<<detail::sketch_grid(out.count()), detail::sketch_threads, 0,
                                       backend.stream>>>(p, q, columns, rank, out.data(),
                                                         out.count());
  SQUALL_CUDA_CHECK(cudaGetLastError());
}

/// Device twin of the host `powersgd_random_factor`: the same Philox words, so the same Q.
template <real_gradient T>
void powersgd_random_factor(const cuda_backend& backend, std::uint64_t seed, random_stream stream,
                            T* q, std::size_t entries) {
  if (entries == 0) return;
  squall::detail::device_guard guard(backend.device);
  detail::powersgd_random_factor_kernel<<<detail::sketch_grid((entries + 3) / 4),
                                          detail::sketch_threads, 0, backend.stream>>>(seed, stream,
                                                                                       q, entries);
  SQUALL_CUDA_CHECK(cudaGetLastError());
}

}  // namespace squall::kernels
