// SPDX-License-Identifier: Apache-2.0
#pragma once
/// gTop-k (Shi et al. 2019) for sparse compressors: the local sets merged pairwise up a tree
/// keeping the k largest sums, the global set broadcast down (algorithm/detail/gtopk.hpp).

#include <squall/algorithm/compressed/payload.hpp>
#include <squall/algorithm/detail/gtopk.hpp>
#include <squall/compress/state.hpp>
#include <squall/core/buffer.hpp>

#include <cstddef>

namespace squall::detail {

// step 0: encode (through error feedback); step 1: merge the sparse sets up a tree to rank 0
// keeping the k largest, broadcast G back down; data = G.
template <class Dense, class C, class T>
void sparse_merge_allreduce(Dense& dense, const C& c, payload_workspace& pw, gtopk_workspace& w,
                            host_view<T> data, compression_state<C, T>& state) {
  const std::size_t bytes =
      encode_payload(c, pw, dense.rank(), host_view<const T>(data.data(), data.count()), state);
  dense.settle();
  T* residual = nullptr;
  if constexpr (is_error_feedback<C>) residual = state.residual().residual().data();
  std::size_t cap = 0;  // threshold: each rank's own entry count
  if constexpr (requires { inner_of(c).entries(data.count()); }) {
    cap = inner_of(c).entries(data.count());
  }
  gtopk_allreduce(dense.transport(), dense.counters(),
                  host_view<const std::byte>(pw.payload.data(), bytes), cap, data, residual,
                  w.template of<T>());
}

}  // namespace squall::detail
