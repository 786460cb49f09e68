// SPDX-License-Identifier: Apache-2.0
#pragma once
/// Host kernels of gTop-k's sparse sets (algorithm/detail/gtopk.hpp): the union of two sets,
/// the cut of a union to its cap largest magnitudes, and error feedback's add-back. The CUDA
/// twins are kernels/cuda/sparse_merge.cuh.
///
/// A set in *wire layout* is `n` indices (`Index`: u32, or u64 above 2^32 elements), strictly
/// increasing, then `n` values of `T`, both unaligned: the body of a sparse payload after its
/// 24 bytes (compress/sparsify.hpp) and of a gTop-k message after its 16-byte head. A *union*
/// is the merge's scratch: the indices at `indices`, the values, aligned, at `values`.

#include <squall/backend/host.hpp>
#include <squall/core/buffer.hpp>
#include <squall/core/types.hpp>
#include <squall/kernels/host/select.hpp>

#include <cstddef>  // byte, size_t
#include <cstdint>
#include <cstring>  // memcpy

namespace squall::kernels {

/// Which entries `sparse_add_back` adds: those whose index is in the set, or those whose is not.
enum class membership { in_set, not_in_set };

namespace detail {

/// Entry `j` of the unaligned array of `U`s at `at`.
template <class U>
U sparse_load(const std::byte* at, std::size_t j) {
  U value;
  std::memcpy(&value, at + j * sizeof(U), sizeof value);
  return value;
}

/// Writes `value` as entry `j` of the unaligned array of `U`s at `at`.
template <class U>
void sparse_store(std::byte* at, std::size_t j, U value) {
  std::memcpy(at + j * sizeof(U), &value, sizeof value);
}

/// Whether `index` is one of the `n` strictly increasing `Index`es at `indices` (binary search).
template <class Index>
bool sparse_contains(const std::byte* indices, std::size_t n, Index index) {
  std::size_t low = 0;
  std::size_t high = n;
  while (low < high) {
    const std::size_t mid = low + (high - low) / 2;
    if (sparse_load<Index>(indices, mid) < index) {
      low = mid + 1;
    } else {
      high = mid;
    }
  }
  return low < n && sparse_load<Index>(indices, low) == index;
}

}  // namespace detail

/// Writes the union of sets `a` (`a_n` entries) and `b` (`b_n`), both in wire layout, in index
/// order to `indices` and `values` (room for a_n + b_n each), with a's value + b's value (in
/// that order) at an index in both; returns its entry count.
template <class Index, real_gradient T>
std::size_t sparse_union(const host_backend& /*backend*/, const std::byte* a, std::size_t a_n,
                         const std::byte* b, std::size_t b_n, std::byte* indices, T* values) {
  const std::byte* a_values = a + a_n * sizeof(Index);
  const std::byte* b_values = b + b_n * sizeof(Index);
  std::size_t i = 0;
  std::size_t j = 0;
  std::size_t m = 0;
  while (i < a_n || j < b_n) {
    const Index a_index = i < a_n ? detail::sparse_load<Index>(a, i) : Index(0);
    const Index b_index = j < b_n ? detail::sparse_load<Index>(b, j) : Index(0);
    if (j == b_n || (i < a_n && a_index < b_index)) {
      detail::sparse_store(indices, m, a_index);
      values[m++] = detail::sparse_load<T>(a_values, i++);
    } else if (i == a_n || b_index < a_index) {
      detail::sparse_store(indices, m, b_index);
      values[m++] = detail::sparse_load<T>(b_values, j++);
    } else {
      detail::sparse_store(indices, m, a_index);
      values[m++] = detail::sparse_load<T>(a_values, i++) + detail::sparse_load<T>(b_values, j++);
    }
  }
  return m;
}

/// Splits the union (`indices`, `values`) into the min(m, cap) entries of largest magnitude,
/// written as a set in wire layout to `kept` (`select_topk`: ties at the cut go to the lower
/// index, NaN ranks above every magnitude), and the rest, in index order, to `dropped` (wire
/// layout, m - kept entries); `positions` holds cap u64s. Returns the kept entry count.
template <class Index, real_gradient T>
std::size_t sparse_keep_largest(const host_backend& backend, const std::byte* indices,
                                host_view<const T> values, std::size_t cap, std::byte* positions,
                                std::byte* kept, std::byte* dropped) {
  const std::size_t m = values.count();
  if (m <= cap) {
    if (m != 0) {
      std::memcpy(kept, indices, m * sizeof(Index));
      std::memcpy(kept + m * sizeof(Index), values.data(), m * sizeof(T));
    }
    return m;
  }
  if (cap != 0) {
    select_topk<std::uint64_t>(backend, values, cap, positions, kept + cap * sizeof(Index));
  }
  std::byte* dropped_values = dropped + (m - cap) * sizeof(Index);
  std::size_t next = 0;  // the next kept position
  std::size_t d = 0;
  for (std::size_t p = 0; p < m; ++p) {
    const std::uint64_t at = next < cap ? detail::sparse_load<std::uint64_t>(positions, next) : m;
    const Index index = detail::sparse_load<Index>(indices, p);
    if (p == at) {
      detail::sparse_store(kept, next++, index);  // its value is select_topk's
    } else {
      detail::sparse_store(dropped, d, index);
      detail::sparse_store(dropped_values, d++, values[p]);
    }
  }
  return cap;
}

/// `residual[i] += v` for each entry (i, v) of the set at `entries` (`n`, wire layout), in
/// order, whose index is (`in_set`) or is not (`not_in_set`) in the set at `set` (`set_n`).
template <class Index, real_gradient T>
void sparse_add_back(const host_backend& /*backend*/, host_view<T> residual,
                     const std::byte* entries, std::size_t n, const std::byte* set,
                     std::size_t set_n, membership where) {
  const std::byte* values = entries + n * sizeof(Index);
  for (std::size_t j = 0; j < n; ++j) {
    const Index index = detail::sparse_load<Index>(entries, j);
    if (detail::sparse_contains(set, set_n, index) == (where == membership::in_set)) {
      residual[static_cast<std::size_t>(index)] += detail::sparse_load<T>(values, j);
    }
  }
}

}  // namespace squall::kernels
