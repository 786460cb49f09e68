// SPDX-License-Identifier: Apache-2.0
#pragma once
/// CUDA twins of kernels/host/select.hpp, the selections of the sparsifying compressors
/// (compress/sparsify.hpp): the same signatures over device memory, the same keys
/// (`magnitude_key`: NaN above +Inf above every finite magnitude) and the same Philox draws
/// (`sample_position`, `stratum_pick`), so a device payload equals the host's byte for byte.
///
/// - top-k (`select_topk`): the keys are sorted with `cub::DeviceRadixSort::SortPairsDescending`,
///   carrying the element indices. The sort is stable, so among equal keys the lower index
///   comes first, and entry k - 1 of the sorted pairs gives the cut: its key, and its index as
///   the last tie taken (the host's rule: ties at the k-th magnitude go to the lower index).
/// - writing a selection (`write_selected`, and top-k's last step): `cub::DeviceSelect::If`
///   over the element indices in order, with a predicate on the cut, writing through a
///   `thrust::tabulate_output_iterator` that stores entry j's index and value straight into the
///   payload (no intermediate array; entries beyond the expected count are dropped, so a
///   miscount cannot write out of bounds, and is reported by the returned count).
/// - the sampled threshold (`sampled_cut`): the samples are gathered by a kernel and sorted with
///   `cub::DeviceRadixSort::SortKeysDescending`; counts (`count_at_least`) are a block reduce
///   (`cub::BlockReduce`) and one atomic add per block: integers, so exact.
/// - random-k, the sparse decode (index checks, scatter) and the finiteness test: plain
///   grid-stride kernels.
///
/// Every call is enqueued on the backend's stream; the calls that return a count or an index
/// wait for the stream once to read it back. Scratch is stream-ordered (`allocate_scratch`).

#include <squall/backend/cuda.cuh>
#include <squall/core/buffer.hpp>
#include <squall/core/error.hpp>
#include <squall/core/random.hpp>
#include <squall/kernels/cuda/reduce.cuh>
#include <squall/kernels/host/select.hpp>

#include <cub/block/block_reduce.cuh>
#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_select.cuh>
#include <cuda_runtime.h>
#include <thrust/iterator/counting_iterator.h>
#include <thrust/iterator/tabulate_output_iterator.h>

#include <algorithm>  // clamp
#include <cstddef>    // byte, ptrdiff_t, size_t
#include <cstdint>
#include <cstring>  // memcpy
#include <limits>
#include <optional>
#include <string_view>

namespace squall::kernels {
namespace detail {

inline constexpr int select_threads = 256;

/// Blocks for a grid-stride loop over `count` items, one per thread (at most `max_blocks`).
inline unsigned select_grid(std::size_t count) {
  const std::size_t blocks = (count + select_threads - 1) / select_threads;
  return static_cast<unsigned>(blocks < max_blocks ? (blocks == 0 ? 1 : blocks) : max_blocks);
}

/// `v` stored at `p`, which need not be aligned for `V`.
template <class V>
__device__ inline void store_unaligned(std::byte* p, V v) {
  if (reinterpret_cast<std::uintptr_t>(p) % alignof(V) == 0) {
    *reinterpret_cast<V*>(p) = v;
  } else {
    memcpy(p, &v, sizeof v);
  }
}

/// The `V` at `p`, which need not be aligned for `V`.
template <class V>
__device__ inline V load_unaligned(const std::byte* p) {
  if (reinterpret_cast<std::uintptr_t>(p) % alignof(V) == 0) return *reinterpret_cast<const V*>(p);
  V v;
  memcpy(&v, p, sizeof v);
  return v;
}

template <class T>
__global__ void __launch_bounds__(select_threads)
    first_non_finite_kernel(const T* in, std::size_t count, unsigned long long* first) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * select_threads;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * select_threads + threadIdx.x;
       i < count; i += stride) {
    if (magnitude_key(in[i]) >= infinity_key<T>)
      atomicMin(first, static_cast<unsigned long long>(i));
  }
}

template <class T>
__global__ void __launch_bounds__(select_threads)
    count_at_least_kernel(const T* in, std::size_t count, magnitude_key_type<T> key,
                          unsigned long long* total) {
  using reduce = cub::BlockReduce<unsigned long long, select_threads>;
  __shared__ typename reduce::TempStorage storage;
  unsigned long long n = 0;
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * select_threads;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * select_threads + threadIdx.x;
       i < count; i += stride) {
    n += magnitude_key(in[i]) >= key ? 1u : 0u;
  }
  const unsigned long long block_total = reduce(storage).Sum(n);
  if (threadIdx.x == 0 && block_total != 0) atomicAdd(total, block_total);
}

// The keys of `in` and the indices 0, 1, ...: the pairs top-k sorts.
template <class T, class Index>
__global__ void __launch_bounds__(select_threads)
    key_index_kernel(const T* in, std::size_t count, magnitude_key_type<T>* keys, Index* index) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * select_threads;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * select_threads + threadIdx.x;
       i < count; i += stride) {
    keys[i] = magnitude_key(in[i]);
    index[i] = static_cast<Index>(i);
  }
}

template <class T>
__global__ void __launch_bounds__(select_threads)
    sample_keys_kernel(const T* in, std::size_t count, std::size_t samples, std::uint64_t seed,
                       random_stream stream, magnitude_key_type<T>* keys) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * select_threads;
  for (std::size_t j = static_cast<std::size_t>(blockIdx.x) * select_threads + threadIdx.x;
       j < samples; j += stride) {
    keys[j] = magnitude_key(in[sample_position(seed, stream, j, count)]);
  }
}

/// The sign bit of `v` (std::signbit, which device code cannot call).
template <class T>
__device__ inline bool negative(T v) {
  magnitude_key_type<T> bits;
  memcpy(&bits, &v, sizeof bits);
  return (bits >> (sizeof(bits) * 8 - 1)) != 0;
}

/// Selects element i if its key is above `key`, or equal to it with i < `tie_end` (the ties
/// taken are the lowest-indexed ones).
template <class T>
struct cut_predicate {
  const T* in;
  magnitude_key_type<T> key;
  std::uint64_t tie_end;
  __device__ bool operator()(std::uint64_t i) const {
    const magnitude_key_type<T> k = magnitude_key(in[i]);
    return k > key || (k == key && i < tie_end);
  }
};

/// Selects element i if its key equals `key`.
template <class T>
struct equal_key_predicate {
  const T* in;
  magnitude_key_type<T> key;
  __device__ bool operator()(std::uint64_t i) const { return magnitude_key(in[i]) == key; }
};

/// Output of the selection: entry j (element i) goes to the payload's index and value arrays,
/// the value as the host's `write_selected` writes it (sign x level when quantizing, NaN kept).
template <class Index, class T>
struct emit_entry {
  const T* in;
  std::byte* indices;
  std::byte* values;
  std::uint64_t room;
  bool quantize;
  T level;
  __device__ void operator()(std::ptrdiff_t j, std::uint64_t i) const {
    if (j < 0 || static_cast<std::uint64_t>(j) >= room) return;  // a miscount: dropped
    T v = in[i];
    if (quantize && magnitude_key(v) <= infinity_key<T>) v = negative(v) ? -level : level;
    const auto e = static_cast<std::size_t>(j);
    store_unaligned(indices + e * sizeof(Index), static_cast<Index>(i));
    store_unaligned(values + e * sizeof(T), v);
  }
};

/// Output that keeps only entry `target`'s element index.
struct record_entry {
  std::uint64_t target;
  std::uint64_t* out;
  __device__ void operator()(std::ptrdiff_t j, std::uint64_t i) const {
    if (static_cast<std::uint64_t>(j) == target) *out = i;
  }
};

/// The number of elements `predicate` selects, in index order, each passed to `output` as
/// (entry, element index): `cub::DeviceSelect::If` over the indices 0 .. count - 1.
template <class Predicate, class Output>
std::size_t select_indices(const cuda_backend& backend, std::size_t count, Predicate predicate,
                           Output output) {
  device_scratch<unsigned long long> selected(backend, 1);
  const thrust::counting_iterator<std::uint64_t> first(0);
  const thrust::tabulate_output_iterator<Output> out(output);
  run_cub(backend, [&](void* temp, std::size_t& bytes) {
    return cub::DeviceSelect::If(temp, bytes, first, out, selected.data(),
                                 static_cast<std::int64_t>(count), predicate, backend.stream);
  });
  return static_cast<std::size_t>(read_back(backend, selected.data()));
}

/// Writes the elements (key above `cut_key`, or equal with index below `tie_end`), in index
/// order, as entries of the sparse arrays (at most `room` of them); returns how many the cut
/// selects.
template <class Index, class T>
std::size_t write_cut(const cuda_backend& backend, device_view<const T> in,
                      magnitude_key_type<T> cut_key, std::uint64_t tie_end, std::byte* indices,
                      std::byte* values, std::size_t room, bool quantize, T level) {
  return select_indices(backend, in.count(), cut_predicate<T>{in.data(), cut_key, tie_end},
                        emit_entry<Index, T>{in.data(), indices, values, room, quantize, level});
}

/// The cut of the top k (0 < k <= count): the k-th largest key, and one past the index of
/// the last element with that key that the top k takes.
template <class T>
struct topk_cut {
  magnitude_key_type<T> key = 0;
  std::uint64_t tie_end = 0;
};

template <class Index, class T>
topk_cut<T> find_topk_cut_as(const cuda_backend& backend, device_view<const T> in, std::size_t k) {
  using U = magnitude_key_type<T>;
  const std::size_t count = in.count();
  device_scratch<U> keys(backend, count);
  device_scratch<U> sorted_keys(backend, count);
  device_scratch<Index> index(backend, count);
  device_scratch<Index> sorted_index(backend, count);
  key_index_kernel<<<select_grid(count), select_threads, 0, backend.stream>>>(
      in.data(), count, keys.data(), index.data());
  SQUALL_CUDA_CHECK(cudaGetLastError());
  // bits [0, key_bits): the key's top bit (the float's sign) is always 0
  run_cub(backend, [&](void* temp, std::size_t& bytes) {
    return cub::DeviceRadixSort::SortPairsDescending(
        temp, bytes, keys.data(), sorted_keys.data(), index.data(), sorted_index.data(),
        static_cast<std::int64_t>(count), 0, static_cast<int>(key_bits<U>), backend.stream);
  });
  topk_cut<T> cut;
  cut.key = read_back(backend, sorted_keys.data() + (k - 1));
  cut.tie_end = static_cast<std::uint64_t>(read_back(backend, sorted_index.data() + (k - 1))) + 1;
  return cut;
}

/// The top-k cut of `in`: a stable descending radix sort of (key, index) pairs; entry k - 1.
template <class T>
topk_cut<T> find_topk_cut(const cuda_backend& backend, device_view<const T> in, std::size_t k) {
  squall::detail::device_guard guard(backend.device);
  if (in.count() <= std::numeric_limits<std::uint32_t>::max()) {
    return find_topk_cut_as<std::uint32_t>(backend, in, k);
  }
  return find_topk_cut_as<std::uint64_t>(backend, in, k);
}

template <class T>
__global__ void __launch_bounds__(select_threads)
    randomk_gather_kernel(const T* in, strata s, std::uint64_t seed, std::uint64_t step,
                          std::byte* values) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * select_threads;
  for (std::size_t j = static_cast<std::size_t>(blockIdx.x) * select_threads + threadIdx.x; j < s.k;
       j += stride) {
    store_unaligned(values + j * sizeof(T), in[stratum_pick(s, seed, step, j)]);
  }
}

template <class T>
__global__ void __launch_bounds__(select_threads)
    randomk_scatter_kernel(const std::byte* values, strata s, std::uint64_t seed,
                           std::uint64_t step, T* out) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * select_threads;
  for (std::size_t j = static_cast<std::size_t>(blockIdx.x) * select_threads + threadIdx.x; j < s.k;
       j += stride) {
    out[stratum_pick(s, seed, step, j)] = load_unaligned<T>(values + j * sizeof(T));
  }
}

template <class Index>
__global__ void __launch_bounds__(select_threads)
    sparse_index_fault_kernel(const std::byte* indices, std::size_t k, std::size_t count,
                              unsigned long long* first) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * select_threads;
  for (std::size_t j = static_cast<std::size_t>(blockIdx.x) * select_threads + threadIdx.x; j < k;
       j += stride) {
    const std::uint64_t index = load_unaligned<Index>(indices + j * sizeof(Index));
    const bool bad =
        index >= count || (j != 0 && index <= static_cast<std::uint64_t>(load_unaligned<Index>(
                                                  indices + (j - 1) * sizeof(Index))));
    if (bad) atomicMin(first, static_cast<unsigned long long>(j));
  }
}

// Writes value j at index j (`Sign` 0), or adds it (+1) or subtracts it (-1) there, for j < k;
// the indices are distinct.
template <class Index, class T>
__global__ void __launch_bounds__(select_threads)
    gather_sparse_kernel(const T* in, const std::byte* indices, std::size_t k, std::byte* values) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * select_threads;
  for (std::size_t j = static_cast<std::size_t>(blockIdx.x) * select_threads + threadIdx.x; j < k;
       j += stride) {
    const auto index = static_cast<std::size_t>(load_unaligned<Index>(indices + j * sizeof(Index)));
    store_unaligned(values + j * sizeof(T), in[index]);
  }
}

template <int Sign, class Index, class T>
__global__ void __launch_bounds__(select_threads)
    scatter_sparse_kernel(const std::byte* indices, const std::byte* values, std::size_t k,
                          T* out) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * select_threads;
  for (std::size_t j = static_cast<std::size_t>(blockIdx.x) * select_threads + threadIdx.x; j < k;
       j += stride) {
    const auto index = static_cast<std::size_t>(load_unaligned<Index>(indices + j * sizeof(Index)));
    const T value = load_unaligned<T>(values + j * sizeof(T));
    if constexpr (Sign > 0)
      out[index] = static_cast<T>(out[index] + value);
    else if constexpr (Sign < 0)
      out[index] = static_cast<T>(out[index] - value);
    else
      out[index] = value;
  }
}

}  // namespace detail

/// Device twin of the host `first_non_finite`: the first NaN or infinite element of `in`, or
/// `in.count()`. Waits for the stream.
template <real_gradient T>
std::size_t first_non_finite(const cuda_backend& backend, device_view<const T> in) {
  if (in.empty()) return 0;
  squall::detail::device_guard guard(backend.device);
  device_scratch<unsigned long long> first(backend, 1);
  const unsigned long long none = in.count();
  SQUALL_CUDA_CHECK(
      cudaMemcpyAsync(first.data(), &none, sizeof none, cudaMemcpyHostToDevice, backend.stream));
  detail::first_non_finite_kernel<<<detail::select_grid(in.count()), detail::select_threads, 0,
                                    backend.stream>>>(in.data(), in.count(), first.data());
  SQUALL_CUDA_CHECK(cudaGetLastError());
  return static_cast<std::size_t>(detail::read_back(backend, first.data()));
}

/// Device twin of the host `require_finite`: throws `invalid_argument` naming `operation` and
/// the first NaN or infinite element of `in` (the element is read back to name its kind).
template <real_gradient T>
void require_finite(const cuda_backend& backend, std::string_view operation,
                    device_view<const T> in) {
  const std::size_t i = first_non_finite(backend, in);
  if (i == in.count()) return;
  T value{};
  load_bytes(backend, &value, reinterpret_cast<const std::byte*>(in.data() + i), sizeof value);
  throw_not_finite(operation, i, value != value ? "NaN" : "infinite");
}

/// Device twin of the host `count_at_least`: the elements of `in` whose key is at least `key`.
/// Waits for the stream.
template <real_gradient T>
std::size_t count_at_least(const cuda_backend& backend, device_view<const T> in,
                           magnitude_key_type<T> key) {
  if (in.empty()) return 0;
  squall::detail::device_guard guard(backend.device);
  device_scratch<unsigned long long> total(backend, 1);
  SQUALL_CUDA_CHECK(cudaMemsetAsync(total.data(), 0, sizeof(unsigned long long), backend.stream));
  detail::count_at_least_kernel<<<detail::select_grid(in.count()), detail::select_threads, 0,
                                  backend.stream>>>(in.data(), in.count(), key, total.data());
  SQUALL_CUDA_CHECK(cudaGetLastError());
  return static_cast<std::size_t>(detail::read_back(backend, total.data()));
}

/// Device twin of the host `write_selected`: writes every element with key above `cut_key`
/// and the first `ties` (in index order) with key equal to it, in ascending index order, as
/// `Index`es to `indices` and `T`s (sign x `level` if `quantize`, NaN kept) to `values`, both
/// in device memory and unaligned. Returns how many were written.
template <class Index, real_gradient T>
std::size_t write_selected(const cuda_backend& backend, device_view<const T> in,
                           magnitude_key_type<T> cut_key, std::size_t ties, std::byte* indices,
                           std::byte* values, bool quantize, T level) {
  const std::size_t count = in.count();
  if (count == 0) return 0;
  squall::detail::device_guard guard(backend.device);
  // tie_end: one past the ties-th element equal to the cut (all of them if fewer)
  std::uint64_t tie_end = 0;
  if (ties != 0) {
    device_scratch<std::uint64_t> nth(backend, 1);
    const std::size_t equal =
        detail::select_indices(backend, count, detail::equal_key_predicate<T>{in.data(), cut_key},
                               detail::record_entry{ties - 1, nth.data()});
    tie_end = equal <= ties ? count : detail::read_back(backend, nth.data()) + 1;
  }
  // the caller sized the arrays for the cut's count, as for the host twin
  return detail::write_cut<Index>(backend, in, cut_key, tie_end, indices, values, count, quantize,
                                  level);
}

/// Device twin of the host `select_topk`: the k largest magnitudes of `in` (0 < k <=
/// in.count()) in ascending index order, ties at the k-th magnitude to the lower index, as
/// `Index`es to `indices` and `T`s to `values` (device memory, unaligned). Returns k.
/// Scratch: 2 x count keys and 2 x count indices (u32 up to 2^32 elements) plus CUB's.
template <class Index, real_gradient T>
std::size_t select_topk(const cuda_backend& backend, device_view<const T> in, std::size_t k,
                        std::byte* indices, std::byte* values) {
  if (k == 0) return 0;
  const detail::topk_cut<T> cut = detail::find_topk_cut(backend, in, k);
  squall::detail::device_guard guard(backend.device);
  return detail::write_cut<Index>(backend, in, cut.key, cut.tie_end, indices, values, k, false,
                                  T(0));
}

/// Device twin of the host `sampled_cut` (Deep Gradient Compression's sampled threshold):
/// the same Philox sample positions, the ks-th largest sampled key (a descending radix sort
/// of the samples), the same count and the same answer.
template <real_gradient T>
std::optional<selection_cut<T>> sampled_cut(const cuda_backend& backend, device_view<const T> in,
                                            std::size_t k, std::size_t samples, std::uint64_t seed,
                                            random_stream stream) {
  using U = magnitude_key_type<T>;
  const std::size_t count = in.count();
  squall::detail::device_guard guard(backend.device);
  device_scratch<U> sample(backend, samples);
  device_scratch<U> sorted(backend, samples);
  detail::sample_keys_kernel<<<detail::select_grid(samples), detail::select_threads, 0,
                               backend.stream>>>(in.data(), count, samples, seed, stream,
                                                 sample.data());
  SQUALL_CUDA_CHECK(cudaGetLastError());
  detail::run_cub(backend, [&](void* temp, std::size_t& bytes) {
    return cub::DeviceRadixSort::SortKeysDescending(
        temp, bytes, sample.data(), sorted.data(), static_cast<std::int64_t>(samples), 0,
        static_cast<int>(detail::key_bits<U>), backend.stream);
  });
  const double wanted =
      static_cast<double>(k) * static_cast<double>(samples) / static_cast<double>(count);
  const std::size_t ks =
      std::clamp<std::size_t>(static_cast<std::size_t>(wanted + 0.5), 1, samples);
  const U threshold = detail::read_back(backend, sorted.data() + (ks - 1));
  const std::size_t passed = count_at_least(backend, in, threshold);
  if (passed <= k) {
    if (threshold == 0) return selection_cut<T>{.key = 0, .ties = passed, .count = passed};
    return selection_cut<T>{.key = U(threshold - 1), .ties = 0, .count = passed};
  }
  return std::nullopt;
}

/// Device twin of the host `randomk_gather`: `values[j] = in[pick(j)]` (device memory,
/// unaligned `T`s), the same picks.
template <real_gradient T>
void randomk_gather(const cuda_backend& backend, device_view<const T> in, std::size_t k,
                    std::uint64_t seed, std::uint64_t step, std::byte* values) {
  if (k == 0) return;
  squall::detail::device_guard guard(backend.device);
  detail::
      randomk_gather_kernel<<<detail::select_grid(k), detail::select_threads, 0, backend.stream>>>(
          in.data(), strata{in.count(), k}, seed, step, values);
  SQUALL_CUDA_CHECK(cudaGetLastError());
}

/// Device twin of the host `randomk_scatter`: zeroes `out`, then `out[pick(j)] = values[j]`.
template <real_gradient T>
void randomk_scatter(const cuda_backend& backend, const std::byte* values, std::size_t k,
                     std::uint64_t seed, std::uint64_t step, device_view<T> out) {
  fill_zero(backend, out);
  if (k == 0) return;
  squall::detail::device_guard guard(backend.device);
  // one pick per stratum, the strata disjoint: no two threads write the same element
  detail::
      randomk_scatter_kernel<<<detail::select_grid(k), detail::select_threads, 0, backend.stream>>>(
          values, strata{out.count(), k}, seed, step, out.data());
  SQUALL_CUDA_CHECK(cudaGetLastError());
}

/// Device twin of the host `sparse_index_fault`: the first position whose index is out of
/// range or not above the one before it, or `k`. Waits for the stream.
template <class Index>
std::size_t sparse_index_fault(const cuda_backend& backend, const std::byte* indices, std::size_t k,
                               std::size_t count) {
  if (k == 0) return 0;
  squall::detail::device_guard guard(backend.device);
  device_scratch<unsigned long long> first(backend, 1);
  const unsigned long long none = k;
  SQUALL_CUDA_CHECK(
      cudaMemcpyAsync(first.data(), &none, sizeof none, cudaMemcpyHostToDevice, backend.stream));
  detail::sparse_index_fault_kernel<Index>
      <<<detail::select_grid(k), detail::select_threads, 0, backend.stream>>>(indices, k, count,
                                                                              first.data());
  SQUALL_CUDA_CHECK(cudaGetLastError());
  return static_cast<std::size_t>(detail::read_back(backend, first.data()));
}

/// Device twin of the host `scatter_sparse`: zeroes `out` and writes value j at index j. The
/// indices must be in range and distinct (`sparse_index_fault` returned k).
template <class Index, real_gradient T>
void scatter_sparse(const cuda_backend& backend, const std::byte* indices, const std::byte* values,
                    std::size_t k, device_view<T> out) {
  fill_zero(backend, out);
  if (k == 0) return;
  squall::detail::device_guard guard(backend.device);
  detail::scatter_sparse_kernel<0, Index>
      <<<detail::select_grid(k), detail::select_threads, 0, backend.stream>>>(indices, values, k,
                                                                              out.data());
  SQUALL_CUDA_CHECK(cudaGetLastError());
}

namespace detail {
// Adds (`Sign` 1) or subtracts (-1) value j at index j of `out`, for j < k.
template <int Sign, class Index, real_gradient T>
void scatter_combine_sparse(const cuda_backend& backend, const std::byte* indices,
                            const std::byte* values, std::size_t k, device_view<T> out) {
  if (k == 0) return;
  squall::detail::device_guard guard(backend.device);
  scatter_sparse_kernel<Sign, Index>
      <<<select_grid(k), select_threads, 0, backend.stream>>>(indices, values, k, out.data());
  SQUALL_CUDA_CHECK(cudaGetLastError());
}
}  // namespace detail

/// Device twin of the host `gather_sparse`: `values_j = in[index_j]`, for j < k.
template <class Index, real_gradient T>
void gather_sparse(const cuda_backend& backend, device_view<const T> in, const std::byte* indices,
                   std::size_t k, std::byte* values) {
  if (k == 0) return;
  squall::detail::device_guard guard(backend.device);
  detail::gather_sparse_kernel<Index>
      <<<detail::select_grid(k), detail::select_threads, 0, backend.stream>>>(in.data(), indices, k,
                                                                              values);
  SQUALL_CUDA_CHECK(cudaGetLastError());
}

/// Device twin of the host `scatter_add_sparse`: `out[index_j] += value_j`. The indices are
/// distinct, so no two threads touch one element.
template <class Index, real_gradient T>
void scatter_add_sparse(const cuda_backend& backend, const std::byte* indices,
                        const std::byte* values, std::size_t k, device_view<T> out) {
  detail::scatter_combine_sparse<1, Index>(backend, indices, values, k, out);
}

/// Device twin of the host `scatter_subtract_sparse`: `out[index_j] -= value_j`.
template <class Index, real_gradient T>
void scatter_subtract_sparse(const cuda_backend& backend, const std::byte* indices,
                             const std::byte* values, std::size_t k, device_view<T> out) {
  detail::scatter_combine_sparse<-1, Index>(backend, indices, values, k, out);
}

}  // namespace squall::kernels
