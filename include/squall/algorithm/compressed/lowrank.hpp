// SPDX-License-Identifier: Apache-2.0
#pragma once
/// The low-rank aggregation (`aggregation::low_rank`): PowerSGD's compressed allreduce (Vogels
/// et al., NeurIPS 2019, Algorithm 1 with error feedback), two sums of small factors through
/// the topology's schedule, for any compressor that models `low_rank_compressor`
/// (compress/traits.hpp says what is called).

#include <squall/algorithm/compressed/payload.hpp>
#include <squall/algorithm/detail/scratch.hpp>
#include <squall/backend/host.hpp>
#include <squall/compress/sketch.hpp>
#include <squall/compress/state.hpp>
#include <squall/compress/traits.hpp>
#include <squall/core/buffer.hpp>
#include <squall/core/error.hpp>
#include <squall/core/ops.hpp>
#include <squall/detail/math.hpp>
#include <squall/kernels/host/reduce.hpp>

#include <cstddef>
#include <cstring>  // memcpy
#include <string>
#include <type_traits>  // remove_cvref_t
#include <vector>

namespace squall::detail {

/// The factors between calls: P and this rank's Q.
struct lowrank_workspace {
  std::vector<std::byte> factors;
};

// step 0: M = data (or residual + data); P = M Q with Q the state's warm start; sum P.
// step 1: orthogonalize P; Q = M^T P (kept as this rank's share); sum Q into the state.
// step 2: residual -= P Q_mine^T (error feedback); data = P Q^T.
template <class Dense, class C, class T>
void lowrank_allreduce(Dense& dense, const C& compressor, lowrank_workspace& w,
                       payload_workspace& scratch, host_view<T> data,
                       compression_state<C, T>& state) {
  const auto& c = inner_of(compressor);
  static_assert(low_rank_compressor<std::remove_cvref_t<decltype(c)>, T>);
  auto& ps = state.low_rank();
  const std::size_t count = data.count();
  const auto shape = c.shape(count);
  if (ps.rows() != shape.rows || ps.columns() != shape.columns || ps.rank() != c.rank) {
    throw invalid_argument({.operation = "compressed allreduce", .rank = dense.rank()},
                           "a low-rank state of " + std::to_string(ps.rows()) + " x " +
                               std::to_string(ps.columns()) + " rank " + std::to_string(ps.rank()) +
                               " used for " + std::to_string(shape.rows) + " x " +
                               std::to_string(shape.columns) + " rank " + std::to_string(c.rank));
  }
  if (count == 0) {
    dense.settle();
    return;
  }
  const host_backend b{};
  const std::size_t p_count = shape.rows * c.rank;
  const std::size_t q_count = shape.columns * c.rank;
  const std::size_t q_at = align_up(p_count * sizeof(T), 16) / sizeof(T);
  T* p = elements_of<T>(w.factors, q_at + q_count);
  T* mine = p + q_at;
  host_view<const T> matrix(data.data(), count);
  if constexpr (is_error_feedback<C>) {
    kernels::reduce_into(b, sum_op{}, state.residual().residual(), matrix);
    matrix = host_view<const T>(state.residual().residual().data(), count);
  }
  c.multiply(b, matrix, host_view<const T>(ps.q().data(), q_count), host_view<T>(p, p_count));
  dense.sum_in_place(p, p_count);
  c.orthogonalize(b, host_view<T>(p, p_count));
  c.multiply_transposed(b, matrix, host_view<const T>(p, p_count), host_view<T>(mine, q_count));
  std::memcpy(ps.q().data(), mine, q_count * sizeof(T));
  dense.sum_in_place(ps.q().data(), q_count);
  if constexpr (is_error_feedback<C>) {
    T* share = elements_of<T>(scratch.decoded, count);
    c.decompress(b, host_view<const T>(p, p_count), host_view<const T>(mine, q_count),
                 host_view<T>(share, count));
    kernels::subtract_into(b, state.residual().residual(), host_view<const T>(share, count));
  }
  c.decompress(b, host_view<const T>(p, p_count), host_view<const T>(ps.q().data(), q_count), data);
}

}  // namespace squall::detail
