// SPDX-License-Identifier: Apache-2.0
#pragma once
/// The compressed allreduce: which algorithm runs, chosen at compile time from the
/// compressor's aggregation class and then from the tuning, and the buffers they keep.

#include <squall/algorithm/call_check.hpp>
#include <squall/algorithm/compressed/gather.hpp>
#include <squall/algorithm/compressed/linear.hpp>
#include <squall/algorithm/compressed/lowrank.hpp>
#include <squall/algorithm/compressed/payload.hpp>
#include <squall/algorithm/compressed/per_hop.hpp>
#include <squall/algorithm/compressed/sparse_merge.hpp>
#include <squall/compress/linear_body.hpp>
#include <squall/compress/state.hpp>
#include <squall/compress/traits.hpp>
#include <squall/core/buffer.hpp>
#include <squall/tuning/tuning.hpp>

namespace squall::detail {

/// What the compressed algorithms keep between calls, owned by the communicator.
struct compressed_workspace {
  payload_workspace payload;
  gather_workspace gather;
  lowrank_workspace lowrank;
  requantize_buffers per_hop;
  gtopk_workspace sparse_merge;
};

/// The algorithm the compressed allreduce of `C` over `Topology` runs: chosen at compile time
/// from the compressor's aggregation class, then from `tuning` (and, for per hop, the
/// topology and the rank count).
template <class C, class Topology>
compressed_path compressed_path_of(const collective_tuning& tuning, int rank, int size) {
  using Inner = inner_compressor_t<C>;
  if constexpr (uses_powersgd<C>) {
    return compressed_path::powersgd;
  } else if constexpr (C::aggregation == aggregation_class::linear) {
    static_assert(linear_pairing<Inner, Topology>::possible);
    return compressed_path::linear;
  } else if constexpr (C::aggregation == aggregation_class::requantize) {
    return uses_per_hop<Topology, Inner>(tuning.requantize, rank, size) ? compressed_path::per_hop
                                                                        : compressed_path::gather;
  } else if constexpr (gtopk_mergeable<Inner>) {
    return tuning.sparse == sparse_algorithm::gtopk ? compressed_path::gtopk
                                                    : compressed_path::gather;
  } else {
    return compressed_path::gather;
  }
}

/// Runs `path` (from `compressed_path_of`) on `data`; the sum, before any finalize.
template <class Dense, class C, class T>
void compressed_allreduce(compressed_path path, Dense& dense, const C& c, compressed_workspace& w,
                          host_view<T> data, compression_state<C, T>& state) {
  switch (path) {
    case compressed_path::powersgd:
      if constexpr (uses_powersgd<C>)
        lowrank_allreduce(dense, c, w.lowrank, w.payload, data, state);
      break;
    case compressed_path::linear:
      if constexpr (has_linear_body<inner_compressor_t<C>>) {
        linear_allreduce(dense, c, w.payload, data, state);
      }
      break;
    case compressed_path::per_hop:
      if constexpr (C::aggregation == aggregation_class::requantize) {
        per_hop_allreduce(dense, c, w.per_hop, data, state);
      }
      break;
    case compressed_path::gtopk:
      if constexpr (gtopk_mergeable<inner_compressor_t<C>>) {
        sparse_merge_allreduce(dense, c, w.payload, w.sparse_merge, data, state);
      }
      break;
    case compressed_path::gather:
      gather_allreduce(dense, c, w.payload, w.gather, data, state);
      break;
  }
}

}  // namespace squall::detail
