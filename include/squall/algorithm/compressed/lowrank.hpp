// SPDX-License-Identifier: Apache-2.0
#pragma once
/// The low-rank aggregation (`aggregation::low_rank`): PowerSGD's compressed allreduce (Vogels
/// et al., NeurIPS 2019, Algorithm 1 with error feedback), two sums of small factors through
/// the topology's schedule, for any compressor that models `low_rank_compressor`
/// (compress/traits.hpp says what is called).

#include <squall/algorithm/compressed/payload.hpp>
#include <squall/algorithm/compressed/phases.hpp>
#include <squall/algorithm/detail/scratch.hpp>
#include <squall/backend/dispatch.hpp>
#include <squall/compress/sketch.hpp>
#include <squall/compress/state.hpp>
#include <squall/compress/traits.hpp>
#include <squall/core/buffer.hpp>
#include <squall/core/error.hpp>
#include <squall/core/ops.hpp>
#include <squall/detail/math.hpp>

#include <concepts>  // same_as
#include <cstddef>
#include <string>
#include <type_traits>  // remove_cvref_t

namespace squall::detail {

/// The factors between calls (P and this rank's Q), in the backend's memory.
template <class Backend>
struct lowrank_workspace {
  scratch_bytes<Backend> factors;
};

// step 0: M = data (or residual + data); P = M Q with Q the state's warm start; sum P.
// step 1: orthogonalize P; Q = M^T P (kept as this rank's share); sum Q into the state.
// step 2: residual -= P Q_mine^T (error feedback); data = P Q^T.
template <class Dense, class C, class T>
void lowrank_allreduce(Dense& dense, const C& compressor,
                       lowrank_workspace<typename Dense::backend_type>& w,
                       payload_workspace<typename Dense::backend_type>& scratch,
                       buffer_view<T, typename Dense::memory_space> data,
                       compression_state<C, T, typename Dense::backend_type>& state,
                       phase_clock& clock) {
  using M = typename Dense::memory_space;
  using view = buffer_view<T, M>;
  using const_view = buffer_view<const T, M>;
  const auto& c = inner_of(compressor);
  static_assert(low_rank_compressor<std::remove_cvref_t<decltype(c)>, T>);
  auto& ps = state.low_rank();
  static_assert(std::same_as<typename decltype(ps.q())::memory_space, M>,
                "squall: this low-rank compressor keeps Q in host memory (its make_state<T>(count) "
                "takes no backend): give it make_state<T>(count, backend) for this Backend");
  const std::size_t count = data.count();
  // the state's view: the default (c.shape(count)) or the one it was made with (a layer's
  // own matrix); m = ceil(count / c) either way
  const std::size_t rows = ps.rows();
  const std::size_t columns = ps.columns();
  const bool covers = columns == 0 ? rows == 0 && count == 0 : rows == div_up(count, columns);
  if (!covers || ps.rank() != c.rank) {
    throw invalid_argument({.operation = "compressed allreduce", .rank = dense.rank()},
                           "a low-rank state of " + std::to_string(ps.rows()) + " x " +
                               std::to_string(ps.columns()) + " rank " + std::to_string(ps.rank()) +
                               " used for " + std::to_string(count) + " elements at rank " +
                               std::to_string(c.rank));
  }
  if (count == 0) {
    dense.settle();
    return;
  }
  const auto& b = dense.backend();
  const std::size_t p_count = rows * c.rank;
  const std::size_t q_count = columns * c.rank;
  const std::size_t q_at = align_up(p_count * sizeof(T), 16) / sizeof(T);
  const view factors = w.factors.template elements<T>(b, q_at + q_count);
  const view p = factors.subview(0, p_count);
  const view mine = factors.subview(q_at, q_count);
  const view q(ps.q().data(), q_count);
  const_view matrix(data);
  if constexpr (is_error_feedback<C>) {
    const view residual(state.residual().residual().data(), count);
    dispatch::reduce_into_on(b, sum_op{}, residual, matrix);
    matrix = const_view(residual);
  }
  c.multiply(b, matrix, const_view(q), p);
  clock.mark(phase::encode);
  dense.sum_in_place(p.data(), p_count);
  clock.mark(phase::transfer);
  c.orthogonalize(b, p);
  c.multiply_transposed(b, matrix, const_view(p), mine);
  dispatch::copy_on(b, q, const_view(mine));
  clock.mark(phase::encode);
  dense.sum_in_place(q.data(), q_count);
  clock.mark(phase::transfer);
  if constexpr (is_error_feedback<C>) {
    const view share = scratch.decoded.template elements<T>(b, count);
    c.decompress(b, const_view(p), const_view(mine), share);
    dispatch::subtract_into_on(b, view(state.residual().residual().data(), count),
                               const_view(share));
  }
  c.decompress(b, const_view(p), const_view(q), data);
}

}  // namespace squall::detail
