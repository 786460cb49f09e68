// SPDX-License-Identifier: Apache-2.0
#pragma once
/// CUDA twins of kernels/host/sparse_merge.hpp, gTop-k's set kernels (algorithm/detail/
/// gtopk.hpp): the same signatures over device memory and the same results, entry for entry
/// (the union's shared entries are a's value + b's, one addition, as on the host; the cut is
/// `select_topk`'s, whose device twin keeps the host's ties). A thread per entry, each placing
/// its entry by binary searches in the other sorted set:
/// - the union: entry a_i goes to i + |{b < a_i}| - |{shared indices < a_i}|, entry b_j (not
///   in a) to j + |{a < b_j}| - |{shared < b_j}|, the shared counts an exclusive scan
///   (`cub::DeviceScan`) of "in the other set" flags; the host reads back the union's size (it
///   sizes the next message), the one wait;
/// - the cut: entry p is kept if p is one of select_topk's (ascending) positions, at its rank
///   among them, else dropped at p minus the positions below p;
/// - the add-back: entries with distinct indices, so no two threads touch one element.
/// Compiled for sm_80 and sm_90; not run on a GPU yet (README, "compiled, not run").

#include <squall/backend/cuda.cuh>
#include <squall/core/buffer.hpp>
#include <squall/kernels/cuda/reduce.cuh>  // device_scratch, run_cub, read_back
#include <squall/kernels/cuda/select.cuh>  // select_topk, load_unaligned, store_unaligned
#include <squall/kernels/host/sparse_merge.hpp>

#include <cub/device/device_scan.cuh>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace squall::kernels {
namespace detail {

/// The entries of the `n` strictly increasing `Index`es at `indices` below `index`.
template <class Index>
__device__ inline std::size_t sparse_below(const std::byte* indices, std::size_t n, Index index) {
  std::size_t low = 0;
  std::size_t high = n;
  while (low < high) {
    const std::size_t mid = low + (high - low) / 2;
    if (load_unaligned<Index>(indices + mid * sizeof(Index)) < index) {
      low = mid + 1;
    } else {
      high = mid;
    }
  }
  return low;
}

/// Whether `index` is one of the `n` at `indices`.
template <class Index>
__device__ inline bool sparse_has(const std::byte* indices, std::size_t n, Index index) {
  const std::size_t at = sparse_below(indices, n, index);
  return at < n && load_unaligned<Index>(indices + at * sizeof(Index)) == index;
}

#define SQUALL_SPARSE_FOR_EACH(j, n)                                                        \
  for (std::size_t j = static_cast<std::size_t>(blockIdx.x) * select_threads + threadIdx.x; \
       j < (n); j += static_cast<std::size_t>(gridDim.x) * select_threads)

/// flags[i] = 1 if entry i of `set` (`n`) is also in `other` (`other_n`), else 0.
template <class Index>
__global__ void __launch_bounds__(select_threads)
    sparse_shared_kernel(const std::byte* set, std::size_t n, const std::byte* other,
                         std::size_t other_n, unsigned long long* flags) {
  SQUALL_SPARSE_FOR_EACH(i, n) {
    flags[i] = sparse_has(other, other_n, load_unaligned<Index>(set + i * sizeof(Index))) ? 1 : 0;
  }
}

/// Places set `from`'s entries in the union (see the file comment); `shared_before[i]`: the
/// shared indices among its entries before i. `first`: the set whose value comes first at a
/// shared index (a), which writes the sum; the other (b) skips its shared entries.
template <class Index, class T>
__global__ void __launch_bounds__(select_threads)
    sparse_place_kernel(const std::byte* from, std::size_t n, const std::byte* other,
                        std::size_t other_n, const unsigned long long* shared_before, bool first,
                        std::byte* indices, T* values) {
  const std::byte* from_values = from + n * sizeof(Index);
  const std::byte* other_values = other + other_n * sizeof(Index);
  SQUALL_SPARSE_FOR_EACH(i, n) {
    const Index index = load_unaligned<Index>(from + i * sizeof(Index));
    const std::size_t below = sparse_below(other, other_n, index);
    const bool shared =
        below < other_n && load_unaligned<Index>(other + below * sizeof(Index)) == index;
    if (shared && !first) continue;
    const std::size_t at = i + below - static_cast<std::size_t>(shared_before[i]);
    store_unaligned(indices + at * sizeof(Index), index);
    const T mine = load_unaligned<T>(from_values + i * sizeof(T));
    values[at] = shared ? mine + load_unaligned<T>(other_values + below * sizeof(T)) : mine;
  }
}

/// Splits union entry p into kept (its rank among the ascending `positions`, `cap` of them;
/// select_topk wrote its value) or dropped (p minus the positions below it).
template <class Index, class T>
__global__ void __launch_bounds__(select_threads)
    sparse_split_kernel(const std::byte* indices, const T* values, std::size_t m,
                        const std::byte* positions, std::size_t cap, std::byte* kept,
                        std::byte* dropped) {
  std::byte* dropped_values = dropped + (m - cap) * sizeof(Index);
  SQUALL_SPARSE_FOR_EACH(p, m) {
    const std::size_t below = sparse_below<std::uint64_t>(positions, cap, p);
    const Index index = load_unaligned<Index>(indices + p * sizeof(Index));
    if (below < cap && load_unaligned<std::uint64_t>(positions + below * sizeof(std::uint64_t)) ==
                           static_cast<std::uint64_t>(p)) {
      store_unaligned(kept + below * sizeof(Index), index);
    } else {
      store_unaligned(dropped + (p - below) * sizeof(Index), index);
      store_unaligned(dropped_values + (p - below) * sizeof(T), values[p]);
    }
  }
}

/// residual[i] += v for the entries whose index is (or is not) in `set`.
template <class Index, class T>
__global__ void __launch_bounds__(select_threads)
    sparse_add_back_kernel(T* residual, const std::byte* entries, std::size_t n,
                           const std::byte* set, std::size_t set_n, bool in_set) {
  const std::byte* values = entries + n * sizeof(Index);
  SQUALL_SPARSE_FOR_EACH(j, n) {
    const Index index = load_unaligned<Index>(entries + j * sizeof(Index));
    if (sparse_has(set, set_n, index) == in_set) {
      residual[static_cast<std::size_t>(index)] += load_unaligned<T>(values + j * sizeof(T));
    }
  }
}

#undef SQUALL_SPARSE_FOR_EACH

/// The exclusive prefix sums of `n` flags, in place after `flags` (`out`, n + 1 entries: the
/// last is the total).
inline void sparse_exclusive_scan(const cuda_backend& backend, const unsigned long long* flags,
                                  std::size_t n, unsigned long long* out) {
  run_cub(backend, [&](void* temp, std::size_t& bytes) {
    return cub::DeviceScan::ExclusiveSum(temp, bytes, flags, out, n + 1, backend.stream);
  });
}

}  // namespace detail

/// Device twin of the host `sparse_union`: the same union, the same values; returns its entry
/// count (read back: one wait).
template <class Index, real_gradient T>
std::size_t sparse_union(const cuda_backend& backend, const std::byte* a, std::size_t a_n,
                         const std::byte* b, std::size_t b_n, std::byte* indices, T* values) {
  if (a_n + b_n == 0) return 0;
  squall::detail::device_guard guard(backend.device);
  // flags of a's entries in b (and a trailing 0), their exclusive scan; the same for b
  device_scratch<unsigned long long> flags(backend, a_n + b_n + 2);
  device_scratch<unsigned long long> before(backend, a_n + b_n + 2);
  unsigned long long* a_flags = flags.data();
  unsigned long long* b_flags = flags.data() + a_n + 1;
  SQUALL_CUDA_CHECK(
      cudaMemsetAsync(flags.data(), 0, flags.count() * sizeof(unsigned long long), backend.stream));
  if (a_n != 0) {
    detail::sparse_shared_kernel<Index>
        <<<detail::select_grid(a_n), detail::select_threads, 0, backend.stream>>>(a, a_n, b, b_n,
                                                                                  a_flags);
    SQUALL_CUDA_CHECK(cudaGetLastError());
  }
  if (b_n != 0) {
    detail::sparse_shared_kernel<Index>
        <<<detail::select_grid(b_n), detail::select_threads, 0, backend.stream>>>(b, b_n, a, a_n,
                                                                                  b_flags);
    SQUALL_CUDA_CHECK(cudaGetLastError());
  }
  unsigned long long* a_before = before.data();
  unsigned long long* b_before = before.data() + a_n + 1;
  detail::sparse_exclusive_scan(backend, a_flags, a_n, a_before);
  detail::sparse_exclusive_scan(backend, b_flags, b_n, b_before);
  if (a_n != 0) {
    detail::sparse_place_kernel<Index, T>
        <<<detail::select_grid(a_n), detail::select_threads, 0, backend.stream>>>(
            a, a_n, b, b_n, a_before, true, indices, values);
    SQUALL_CUDA_CHECK(cudaGetLastError());
  }
  if (b_n != 0) {
    detail::sparse_place_kernel<Index, T>
        <<<detail::select_grid(b_n), detail::select_threads, 0, backend.stream>>>(
            b, b_n, a, a_n, b_before, false, indices, values);
    SQUALL_CUDA_CHECK(cudaGetLastError());
  }
  const unsigned long long shared = detail::read_back(backend, a_before + a_n);  // a's total
  return a_n + b_n - static_cast<std::size_t>(shared);
}

/// Device twin of the host `sparse_keep_largest`: the same kept and dropped sets.
template <class Index, real_gradient T>
std::size_t sparse_keep_largest(const cuda_backend& backend, const std::byte* indices,
                                device_view<const T> values, std::size_t cap, std::byte* positions,
                                std::byte* kept, std::byte* dropped) {
  const std::size_t m = values.count();
  squall::detail::device_guard guard(backend.device);
  if (m <= cap) {
    if (m != 0) {
      SQUALL_CUDA_CHECK(cudaMemcpyAsync(kept, indices, m * sizeof(Index), cudaMemcpyDeviceToDevice,
                                        backend.stream));
      SQUALL_CUDA_CHECK(cudaMemcpyAsync(kept + m * sizeof(Index), values.data(), m * sizeof(T),
                                        cudaMemcpyDeviceToDevice, backend.stream));
    }
    return m;
  }
  if (cap != 0) {
    select_topk<std::uint64_t>(backend, values, cap, positions, kept + cap * sizeof(Index));
  }
  detail::sparse_split_kernel<Index, T>
      <<<detail::select_grid(m), detail::select_threads, 0, backend.stream>>>(
          indices, values.data(), m, positions, cap, kept, dropped);
  SQUALL_CUDA_CHECK(cudaGetLastError());
  return cap;
}

/// Device twin of the host `sparse_add_back`.
template <class Index, real_gradient T>
void sparse_add_back(const cuda_backend& backend, device_view<T> residual, const std::byte* entries,
                     std::size_t n, const std::byte* set, std::size_t set_n, membership where) {
  if (n == 0) return;
  squall::detail::device_guard guard(backend.device);
  detail::sparse_add_back_kernel<Index, T>
      <<<detail::select_grid(n), detail::select_threads, 0, backend.stream>>>(
          residual.data(), entries, n, set, set_n, where == membership::in_set);
  SQUALL_CUDA_CHECK(cudaGetLastError());
}

}  // namespace squall::kernels
