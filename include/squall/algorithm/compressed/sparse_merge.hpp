// SPDX-License-Identifier: Apache-2.0
#pragma once
/// gTop-k (Shi et al. 2019) for sparse compressors: the local sets merged pairwise up a tree
/// keeping the k largest sums, the global set broadcast down (algorithm/detail/gtopk.hpp).

#include <squall/algorithm/compressed/payload.hpp>
#include <squall/algorithm/compressed/phases.hpp>
#include <squall/algorithm/detail/gtopk.hpp>
#include <squall/compress/state.hpp>
#include <squall/core/buffer.hpp>

#include <cstddef>

namespace squall::detail {

// step 0: encode (through error feedback); step 1: merge the sparse sets up a tree to rank 0
// keeping the k largest, broadcast G back down; data = G (the merges and writing G count as
// transfer).
template <class Dense, class C, class T>
void sparse_merge_allreduce(Dense& dense, const C& c,
                            payload_workspace<typename Dense::backend_type>& pw,
                            gtopk_workspace<typename Dense::backend_type>& w,
                            buffer_view<T, typename Dense::memory_space> data,
                            compression_state<C, T, typename Dense::backend_type>& state,
                            phase_clock& clock) {
  using M = typename Dense::memory_space;
  const auto& b = dense.backend();
  const std::size_t bytes = encode_payload(b, c, pw, dense.rank(), buffer_view<const T, M>(data),
                                           state, range_agreement(dense, 1));
  clock.mark(phase::encode);
  dense.settle();
  buffer_view<T, M> residual;
  if constexpr (is_error_feedback<C>) {
    residual = buffer_view<T, M>(state.residual().residual().data(), data.count());
  }
  std::size_t cap = 0;  // threshold: each rank's own entry count
  if constexpr (requires { inner_of(c).entries(data.count()); }) {
    cap = inner_of(c).entries(data.count());
  }
  gtopk_allreduce(dense.wire(), b, buffer_view<const std::byte, M>(pw.payload.data(), bytes), cap,
                  data, residual, w);
  clock.mark(phase::transfer);
}

}  // namespace squall::detail
