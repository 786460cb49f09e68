// SPDX-License-Identifier: Apache-2.0
#pragma once
/// The compressed allreduce: which aggregation runs (what the compressor allows, then the
/// tuning and the topology), and the buffers they keep.

#include <squall/algorithm/call_check.hpp>
#include <squall/algorithm/compressed/gather.hpp>
#include <squall/algorithm/compressed/linear.hpp>
#include <squall/algorithm/compressed/lowrank.hpp>
#include <squall/algorithm/compressed/overlap.hpp>
#include <squall/algorithm/compressed/payload.hpp>
#include <squall/algorithm/compressed/per_hop.hpp>
#include <squall/algorithm/compressed/phases.hpp>
#include <squall/algorithm/compressed/sparse_merge.hpp>
#include <squall/algorithm/compressed/two_round.hpp>
#include <squall/backend/host.hpp>
#include <squall/compress/linear_body.hpp>
#include <squall/compress/state.hpp>
#include <squall/compress/traits.hpp>
#include <squall/core/buffer.hpp>
#include <squall/core/error.hpp>
#include <squall/tuning/tuning.hpp>

#include <concepts>  // same_as
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace squall::detail {

/// What the compressed algorithms keep between calls, owned by the communicator: buffers in
/// the backend's memory.
template <class Backend>
struct compressed_workspace {
  payload_workspace<Backend> payload;
  gather_workspace<Backend> gather;
  lowrank_workspace<Backend> lowrank;
  requantize_buffers<Backend> per_hop;
  gtopk_workspace<Backend> sparse_merge;
  two_round_workspace<Backend> two_round;
  overlap_workspace<Backend> overlap;       ///< the worker and second payload slot of overlap
  gather_workspace<Backend> gather_second;  ///< gather's second slot with overlap
  phase_clock clock;                        ///< the last call's split (communicator::last_split)
};

/// An `invalid_argument` every rank of a collective raises alike (after an exchange), so
/// none announces it to the others (`communicator::announced`).
class raised_everywhere : public invalid_argument {
 public:
  using invalid_argument::invalid_argument;
};

/// `options::check_finite`: every rank finds the first NaN or infinite element of its `in` and
/// the ranks exchange where (8 bytes each) before anything else moves; if any rank has one,
/// every rank throws `invalid_argument` naming the lowest such rank and its element, so all
/// stop at the same point and the next call starts clean.
template <class Dense, class T>
void require_finite_everywhere(Dense& dense,
                               buffer_view<const T, typename Dense::memory_space> in) {
  const std::uint64_t mine = first_non_finite(dense.backend(), in);
  dense.settle();
  std::vector<std::uint64_t> all(static_cast<std::size_t>(dense.size()), mine);
  if (dense.size() > 1) dense.exchange(&mine, sizeof mine, all.data());
  for (std::size_t q = 0; q < all.size(); ++q) {
    if (all[q] < in.count()) {
      throw raised_everywhere(
          {.operation = "compressed collective", .rank = dense.rank()},
          "rank " + std::to_string(q) + "'s input has a NaN or infinity at element " +
              std::to_string(all[q]) + ": every rank stops before sending (options::check_finite)");
    }
  }
}

/// The chunks a compressed allreduce running `how` cuts `count` elements of `T` into (see
/// `collective_tuning::overlap_chunks`): `plan_chunks` at `c`'s chunk alignment for linear and
/// gather on the host backend, else one. Throws `invalid_argument` for more than
/// `max_overlap_chunks` asked, also where it would not overlap.
template <class Dense, class C, class T>
chunk_plan overlap_plan(aggregation how, const collective_tuning& tuning, const C& c,
                        std::size_t count, int rank) {
  const chunk_plan asked =
      plan_chunks(count, sizeof(T), tuning.overlap_chunks, chunk_alignment(inner_of(c)), rank);
  constexpr bool host = !Dense::staged && std::same_as<typename Dense::backend_type, host_backend>;
  if (host && (how == aggregation::linear || how == aggregation::gather)) return asked;
  return {.count = count, .length = count, .chunks = 1};
}

/// The aggregation a compressed allreduce runs, for a compressor (`compressor`) that allows
/// `allowed`, on `size` ranks, where per-hop requantization runs or not (`per_hop_runs`, with
/// `per_hop_why` saying why not), over a staged core or not (`staged`: the backend's memory
/// is not the transport's; per_hop and gtopk move payloads over the transport themselves and
/// do not run there): `tuning.aggregation` when the compressor allows it and it runs here;
/// `automatic`: the compressor's first allowed aggregation that runs here. Throws
/// `invalid_argument` naming the compressor and what it allows for one it does not, and
/// saying why for one that cannot run here. Not a template (see `aggregation_of`).
inline aggregation choose_aggregation(const collective_tuning& tuning, aggregation_set allowed,
                                      std::string_view compressor, bool per_hop_runs,
                                      const std::string& per_hop_why, bool staged, int rank) {
  const error_context where{.operation = "compressed allreduce", .rank = rank};
  const auto why_not = [&](aggregation a) -> std::string {
    if (staged && (a == aggregation::per_hop || a == aggregation::gtopk)) {
      return "aggregation " + std::string(to_string(a)) +
             " moves payloads over the transport itself and does not run staged (a Backend "
             "whose memory the Transport does not carry): linear, low_rank and gather do";
    }
    if (a == aggregation::per_hop && !per_hop_runs) return per_hop_why;
    return {};
  };
  const aggregation asked = tuning.aggregation;
  if (asked == aggregation::automatic) {
    for (std::size_t i = 0; i < allowed.size(); ++i) {
      if (why_not(allowed[i]).empty()) return allowed[i];
    }
    throw invalid_argument(where, why_not(allowed[0]));
  }
  if (!allowed.contains(asked)) {
    throw invalid_argument(where, "collective_tuning::aggregation is " +
                                      std::string(to_string(asked)) + ", which compressor '" +
                                      std::string(compressor) + "' does not allow (it allows " +
                                      allowed.names() + ")");
  }
  if (const std::string why = why_not(asked); !why.empty()) throw invalid_argument(where, why);
  return asked;
}

/// The aggregation the compressed allreduce of `C` over `Topology` on `size` ranks runs, over
/// a staged core or not (`choose_aggregation`); states at compile time what `C`'s traits
/// promise.
template <class C, class Topology>
aggregation aggregation_of(const collective_tuning& tuning, int rank, int size, bool staged) {
  using Inner = inner_compressor_t<C>;
  constexpr aggregation_set allowed = compression_traits<Inner>::aggregations;
  if constexpr (allowed.contains(aggregation::linear)) {
    static_assert(linear_pairing<Inner, Topology>::possible);
  }
  if constexpr (allowed.contains(aggregation::gtopk)) {
    static_assert(gtopk_mergeable<Inner>,
                  "squall: this Compressor allows aggregation::gtopk, which merges payloads in "
                  "the topk / threshold layout (payload_kind topk or threshold)");
  }
  std::string why;
  const bool per_hop =
      allowed.contains(aggregation::per_hop) && per_hop_runs<Topology, Inner>(size, &why);
  return choose_aggregation(tuning, allowed, Inner::name, per_hop, why, staged, rank);
}

/// Runs `how` (from `aggregation_of`) on `data` in the chunks of `plan` (`overlap_plan`);
/// the sum, before any finalize. Only the
/// aggregations `C` allows (and that run on `Dense`: not per_hop or gtopk when it stages)
/// are instantiated.
template <class Dense, class C, class T>
void compressed_allreduce(aggregation how, const chunk_plan& plan, Dense& dense, const C& c,
                          compressed_workspace<typename Dense::backend_type>& w,
                          buffer_view<T, typename Dense::memory_space> data,
                          compression_state<C, T, typename Dense::backend_type>& state) {
  constexpr aggregation_set allowed = compression_traits<inner_compressor_t<C>>::aggregations;
  switch (how) {
    case aggregation::low_rank:
      if constexpr (allowed.contains(aggregation::low_rank)) {
        lowrank_allreduce(dense, c, w.lowrank, w.payload, data, state, w.clock);
        return;
      }
      break;
    case aggregation::linear:
      // without a linear_body, aggregation_of's static_assert has said so: no second error
      if constexpr (allowed.contains(aggregation::linear) &&
                    has_linear_body<inner_compressor_t<C>>) {
        linear_allreduce(dense, c, w.payload, w.overlap, plan, data, state, w.clock);
        return;
      }
      break;
    case aggregation::per_hop:
      if constexpr (allowed.contains(aggregation::per_hop) && !Dense::staged) {
        per_hop_allreduce(dense, c, w.per_hop, data, state, w.clock);
        return;
      }
      break;
    case aggregation::gtopk:
      if constexpr (allowed.contains(aggregation::gtopk) && !Dense::staged) {
        sparse_merge_allreduce(dense, c, w.payload, w.sparse_merge, data, state, w.clock);
        return;
      }
      break;
    case aggregation::gather:
      if constexpr (allowed.contains(aggregation::gather)) {
        gather_allreduce(dense, c, w.payload, w.gather, w.overlap, w.gather_second, plan, data,
                         state, w.clock);
        return;
      }
      break;
    case aggregation::two_round:
      if constexpr (allowed.contains(aggregation::two_round)) {
        two_round_allreduce(dense, c, w.payload, w.two_round, data, state, w.clock);
        return;
      }
      break;
    case aggregation::automatic:
      break;
  }
  throw error(make_error_code(errc::internal), {.operation = "compressed allreduce"},
              "aggregation " + std::string(to_string(how)) + " is not one of " + allowed.names());
}

}  // namespace squall::detail
