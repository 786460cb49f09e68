// SPDX-License-Identifier: Apache-2.0
#pragma once
/// `compression_traits<C>`: what the algorithm layer asks of a compressor at compile time,
/// each fact read from one declaration of `C` (with its default where `C` is silent).

#include <squall/backend/host.hpp>
#include <squall/concepts.hpp>
#include <squall/core/buffer.hpp>

#include <concepts>  // same_as, convertible_to
#include <cstddef>   // byte, size_t
#include <utility>   // declval
#include <vector>

namespace squall {

/// Compile-time facts about compressor `C` (or a quantizer spec), derived from its declarations.
template <class C>
struct compression_traits {
  /// The aggregations its payloads allow, preferred first (`C::aggregations`).
  static constexpr aggregation_set aggregations = C::aggregations;
  /// Payloads add (C(a) + C(b) = C(a + b)), so topologies reduce their bodies directly.
  static constexpr bool linear = aggregations.contains(aggregation::linear);
  /// Every rank's payload has the same size for the same count, so the size exchange is
  /// skipped (GRACE's `tensors_size_are_same`). True if `C::fixed_size` says so.
  static constexpr bool fixed_size = [] {
    if constexpr (requires { C::fixed_size; }) {
      return static_cast<bool>(C::fixed_size);
    } else {
      return false;
    }
  }();
  /// The gathered payloads combine by a majority vote of their signs (sign_vote), not by a
  /// sum. True if `C::majority_vote` says so.
  static constexpr bool majority_vote = [] {
    if constexpr (requires { C::majority_vote; }) {
      return static_cast<bool>(C::majority_vote);
    } else {
      return false;
    }
  }();
};

/// The element alignment at which compressor `c` may cut a tensor into chunks that encode to
/// what the whole tensor does (`c.chunk_alignment()`, used by `collective_tuning::
/// overlap_chunks`); 0 where chunking changes what it computes: its `chunk_alignment()`
/// says 0, or it has none (top-k's k is per tensor).
template <class C>
std::size_t chunk_alignment(const C& c) {
  if constexpr (requires {
                  { c.chunk_alignment() } -> std::convertible_to<std::size_t>;
                }) {
    return c.chunk_alignment();
  } else {
    return 0;
  }
}

/// What the low-rank aggregation (algorithm/compressed/lowrank.hpp) calls of a compressor
/// that allows it, with elements `T` on backend `B`: the m x c view of a tensor
/// (`shape(count)`), the factors' rank `rank`, a per-tensor state holding Q (c x r, the
/// warm start each call updates; saved and restored with the compression state), and the
/// four pieces of one power iteration: P = M Q, orthogonalize P, Q = M^T P, M ~ P Q^T.
template <class C, class T, class B = host_backend>
concept low_rank_compressor = compression_traits<C>::aggregations.contains(aggregation::low_rank) &&
                              requires(const C& c, const B& b, std::size_t count,
                                       buffer_view<const T, typename B::memory_space> in,
                                       buffer_view<const T, typename B::memory_space> factor,
                                       buffer_view<T, typename B::memory_space> out) {
  { c.shape(count).rows } -> std::convertible_to<std::size_t>;
  { c.shape(count).columns } -> std::convertible_to<std::size_t>;
  { c.rank } -> std::convertible_to<std::size_t>;
  c.template make_state<T>(count);
  c.multiply(b, in, factor, out);
  c.orthogonalize(b, out);
  c.multiply_transposed(b, in, factor, out);
  c.decompress(b, factor, factor, out);
}
&&requires(std::remove_cvref_t<decltype(std::declval<const C&>().template make_state<T>(0))> s,
           buffer_view<const std::byte> bytes) {
  { s.rows() } -> std::convertible_to<std::size_t>;
  { s.columns() } -> std::convertible_to<std::size_t>;
  { s.rank() } -> std::convertible_to<std::size_t>;
  { s.q() } -> std::same_as<buffer_view<T>>;
  { s.save() } -> std::same_as<std::vector<std::byte>>;
  s = decltype(s)::restore(bytes);
};

}  // namespace squall
