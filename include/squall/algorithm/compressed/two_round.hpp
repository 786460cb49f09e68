// SPDX-License-Identifier: Apache-2.0
#pragma once
/// The two-round aggregation (`aggregation::two_round`): a sketch finds the coordinates, a
/// second round sends their exact values (Ivkin, Rothchild, Ullah, Braverman, Stoica, Arora,
/// "Communication-efficient Distributed SGD with Sketching", NeurIPS 2019, the second round
/// of their Algorithm 1, the round FetchSGD does without; here for estimates too noisy to use).
///
///   round 1: every rank sketches r (its residual + gradient with error feedback, else its
///            gradient); the sketches' bodies are summed through the topology's schedule
///            (they are linear); every rank estimates every coordinate of the sum from the
///            same summed sketch and picks the same k largest estimates (ties to the lower
///            index), so every rank holds the same index set I;
///   round 2: every rank gathers r at I (k values) and the k-vectors are summed through the
///            topology's schedule: the exact sum of the ranks' r at I;
///   result:  data = that sum at I, 0 elsewhere; with error feedback residual = r with I
///            zeroed (exactly what was sent leaves it: r_i - r_i = 0).
///
/// So what every rank adds is r restricted to I, a contraction (||r - r_I|| <= ||r||) whatever
/// the sketch's noise: error feedback's residual stays bounded where count sketch's own decode
/// (the estimates) is no contraction and diverges. Wire: the sketch (Rows x Cols values) plus k
/// values a rank, in two sums; no indices cross (every rank derives I).

#include <squall/algorithm/compressed/linear.hpp>  // sum_linear_body
#include <squall/algorithm/compressed/payload.hpp>
#include <squall/algorithm/compressed/phases.hpp>
#include <squall/algorithm/detail/scratch.hpp>
#include <squall/backend/dispatch.hpp>
#include <squall/compress/linear_body.hpp>
#include <squall/compress/sparsify.hpp>  // sparse_index_bytes
#include <squall/compress/state.hpp>
#include <squall/compress/traits.hpp>
#include <squall/core/buffer.hpp>
#include <squall/core/ops.hpp>
#include <squall/core/random.hpp>
#include <squall/kernels/host/select.hpp>

#include <algorithm>  // min
#include <concepts>   // convertible_to
#include <cstddef>
#include <cstdint>

namespace squall::detail {

/// What the two-round aggregation calls of a compressor: a linear sketch (`linear_body`),
/// `estimate(b, payload, out)` of every coordinate from a (summed) payload, and `kept()`,
/// the coordinates the second round fetches.
template <class C, class T, class Backend>
concept two_round_compressor = has_linear_body<C> &&
    requires(const C& c, const Backend& b,
             buffer_view<const std::byte, typename Backend::memory_space> p,
             buffer_view<T, typename Backend::memory_space> out) {
  { c.kept() } -> std::convertible_to<std::size_t>;
  c.estimate(b, p, out);
};

// The kernels called with explicit template arguments (`name<Index>(b, ...)`), declared here
// so that the name is a template; argument-dependent lookup adds the backend's own overloads.
using kernels::gather_sparse;
using kernels::scatter_sparse;
using kernels::scatter_subtract_sparse;
using kernels::select_topk;

/// The second round's index set and values, in the backend's memory, kept between calls.
template <class Backend>
struct two_round_workspace {
  scratch_bytes<Backend> indices;  ///< I, k indices ascending (u32, or u64 from 2^32 elements)
  scratch_bytes<Backend> values;   ///< the k values: estimates, then r at I, then their sum
};

// step 0: r = residual + data (or data); sketch r; sum the sketches' bodies.
// step 1: estimate every coordinate from the sum; I = the k largest; gather r at I; residual
//         at I = 0; sum the k values.
// step 2: data = the sums at I, 0 elsewhere.
template <class Dense, class C, class T>
void two_round_allreduce(Dense& dense, const C& compressor,
                         payload_workspace<typename Dense::backend_type>& w,
                         two_round_workspace<typename Dense::backend_type>& t,
                         buffer_view<T, typename Dense::memory_space> data,
                         compression_state<C, T, typename Dense::backend_type>& state,
                         phase_clock& clock) {
  using M = typename Dense::memory_space;
  using Inner = inner_compressor_t<C>;
  const Inner& c = inner_of(compressor);
  static_assert(two_round_compressor<Inner, T, typename Dense::backend_type>,
                "squall: aggregation::two_round needs a linear sketch with estimate(b, payload, "
                "out) and kept()");
  const std::size_t count = data.count();
  if (count == 0) {
    dense.settle();
    return;
  }
  const auto& b = dense.backend();
  buffer_view<const T, M> r(data);
  if constexpr (is_error_feedback<C>) {
    const buffer_view<T, M> residual(state.residual().residual().data(), count);
    dispatch::reduce_into_on(b, sum_op{}, residual, r);
    r = buffer_view<const T, M>(residual);
  }
  const std::size_t capacity = c.max_payload_bytes(dtype_of<T>, count);
  const buffer_view<std::byte, M> payload(w.payload.reserve(b, capacity), capacity);
  const std::size_t bytes = c.encode(b, r, payload, state.stream(dense.rank()));
  clock.mark(phase::encode);
  sum_linear_body<Dense, Inner, T>(dense, c, payload.data(), count, bytes);
  clock.mark(phase::transfer);
  const buffer_view<T, M> estimates = w.decoded.template elements<T>(b, count);
  c.estimate(b, buffer_view<const std::byte, M>(payload.data(), bytes), estimates);
  const std::size_t k = std::min(c.kept(), count);
  const std::size_t index_bytes = sparse_index_bytes(count);
  std::byte* const indices = t.indices.reserve(b, k * index_bytes);
  T* const values = t.values.template elements<T>(b, k).data();
  auto* const value_bytes = reinterpret_cast<std::byte*>(values);
  const auto second_round = [&](auto index) {
    using Index = decltype(index);
    select_topk<Index>(b, buffer_view<const T, M>(estimates), k, indices, value_bytes);
    gather_sparse<Index>(b, r, indices, k, value_bytes);  // the estimates replaced
    if constexpr (is_error_feedback<C>) {
      scatter_subtract_sparse<Index>(b, indices, value_bytes, k,
                                     buffer_view<T, M>(state.residual().residual().data(), count));
    }
    clock.mark(phase::encode);
    dense.sum_in_place(values, k);
    clock.mark(phase::transfer);
    scatter_sparse<Index>(b, indices, value_bytes, k, data);
  };
  if (index_bytes == 4) {
    second_round(std::uint32_t{});
  } else {
    second_round(std::uint64_t{});
  }
  clock.mark(phase::decode);
}

}  // namespace squall::detail
