// SPDX-License-Identifier: Apache-2.0
#pragma once
/// gTop-k: the compressed allreduce of sparse payloads (topk, threshold) when
/// `collective_tuning::aggregation` is `aggregation::gtopk` (Shi et al., "A Distributed
/// Synchronous SGD Algorithm with Global Top-k Sparsification for Low Bandwidth Networks",
/// ICDCS 2019, arXiv 1901.04359, Algorithms 2 and 3).
///
/// A *set* is a list of (index, value) entries in strictly increasing index order, with a cap:
/// the most entries a merge keeps. With P2 = bit_floor(P) and extra = P - P2:
///
///   step 0 (local):     each rank's set is its payload's entries (encoded through error
///                       feedback if wrapped); its cap is topk's k = entries(count), or, for a
///                       compressor without a fixed k (threshold), its own entry count.
///   step 1 (fold):      rank r >= P2 sends its set to r - P2, which merges it.
///   step 2 (reduce):    for d = 1, 2, ..., P2 / 2: rank r with r mod 2d = d sends its set to
///                       r - d; rank r with r mod 2d = 0 receives from r + d and merges. Rank 0
///                       ends with the global set G.
///   step 3 (broadcast): for d = P2 / 2, ..., 2, 1: rank r with r mod 2d = 0 sends G to r + d,
///                       rank r with r mod 2d = d receives it from r - d; then rank r < extra
///                       sends G to r + P2.
///   step 4 (result):    data = G's values at G's indices, zero elsewhere.
///
/// Steps 1-3 are the binomial tree's schedule (`binomial_tree_steps`, topology/schedule.hpp),
/// walked with sets in place of elements.
///
/// Merge (receiver a, sender b): the union of the indices, a's value + b's value (in that order)
/// at an index in both; cap = max(a's cap, b's cap); if the union holds more than cap entries,
/// the cap entries of largest magnitude stay (`kernels::select_topk`: ties at the cut go to the
/// lower index, NaN ranks above every magnitude, as topk's own encode), the rest are dropped.
/// For topk every set holds exactly k entries (count >= 1), so G is the top k of the tree's sums;
/// for threshold G holds at most the largest entry count of any rank.
///
/// Error feedback (the paper's Algorithm 3, line "G_acc += G~ (not gMask)", made exact): after
/// the local encode the residual is acc - local (error_feedback's own step); then a rank adds
/// back (a) its local entries whose index is not in G, and (b) the entries it dropped in its
/// merges (in merge order) whose index is in G: mass of G's indices that a merge on the way cut
/// off, which the paper loses. So every input's mass is in exactly one place, and over ranks and
/// steps: sum of inputs = sum of results + sum of final residuals (up to float rounding of the
/// merges' sums).
///
/// Wire: a set is two messages: a 16-byte head (u64 entries n, u64 cap), then, if n > 0, n
/// indices (u32, or u64 above 2^32 elements: `sparse_index_bytes`) and n values of T. So a set
/// of n entries costs 16 + n (I + sizeof(T)) bytes. Every rank sends at most ceil(log2 P) sets
/// (one up, one per child down; rank 0: one per child) and receives at most ceil(log2 P): with
/// topk, at most 2 ceil(log2 P) (16 + k (I + sizeof(T))) bytes per rank, the paper's
/// 2 k log P entries. A received set is checked (n <= cap <= count, indices in range and strictly
/// increasing) and a fault throws `invalid_argument` naming it.
///
/// Layout: a set is kept in its wire layout (n indices, then n values: kernels/host/
/// sparse_merge.hpp) in the backend's memory, so a send needs no packing and a receive no
/// unpacking; this rank's own set is its payload's body, read in place (a sparse payload's
/// entries after its 24 bytes are that layout). Every operation on set data is a kernel
/// called with the backend (`sparse_union`, `sparse_keep_largest`, `sparse_add_back`,
/// `scatter_sparse`, `check_sparse_indices`); the host keeps only the counts and caps.

#include <squall/algorithm/detail/scratch.hpp>
#include <squall/algorithm/detail/verbs.hpp>
#include <squall/compress/payload.hpp>
#include <squall/compress/sparsify.hpp>
#include <squall/compress/traits.hpp>
#include <squall/concepts.hpp>
#include <squall/core/buffer.hpp>
#include <squall/core/error.hpp>
#include <squall/core/types.hpp>
#include <squall/kernels/host/select.hpp>
#include <squall/kernels/host/sparse_merge.hpp>
#include <squall/topology/schedule.hpp>

#include <algorithm>  // max, min
#include <array>
#include <cstddef>  // byte, size_t
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>  // is_same_v

namespace squall::detail {

inline constexpr std::string_view gtopk_name = "gtopk allreduce";

/// Compressors whose payloads gTop-k merges: they allow `aggregation::gtopk`, which needs the
/// topk / threshold payload layout (sorted indices, then values), the one the merge decodes.
template <class C>
concept gtopk_mergeable = compression_traits<C>::aggregations.contains(aggregation::gtopk) &&
                          (C::kind == payload_kind::topk || C::kind == payload_kind::threshold);

// The kernels gTop-k calls with explicit template arguments (`name<Index>(b, ...)`), declared
// here so that the name is a template for every compiler; argument-dependent lookup on the
// backend adds the backend's own overloads, as in backend/dispatch.hpp.
using kernels::scatter_sparse;
using kernels::sparse_add_back;
using kernels::sparse_keep_largest;
using kernels::sparse_union;

/// The most merges of one rank: the fold, plus one per round of the tree (log2 P2 <= 30).
inline constexpr std::size_t gtopk_max_merges = 32;
static_assert(gtopk_max_merges >= std::numeric_limits<int>::digits);

/// A set in wire layout at `at`, in the backend's memory: `n` entries, merge cap `cap`.
struct gtopk_set {
  const std::byte* at = nullptr;
  std::size_t n = 0;
  std::size_t cap = 0;
};

/// gTop-k's buffers for one element type, in the backend's memory, kept between calls so that
/// a warm loop of the same size allocates nothing here (`select_topk` keeps its own scratch).
template <class Backend, real_gradient T>
struct gtopk_buffers {
  scratch_bytes<Backend> current;    ///< this rank's set after a merge, then G (wire layout)
  scratch_bytes<Backend> incoming;   ///< a received set (wire layout)
  scratch_bytes<Backend> merged;     ///< a merge's union: indices, then values of T, aligned
  scratch_bytes<Backend> positions;  ///< select_topk's positions in the union (u64)
  std::array<scratch_bytes<Backend>, gtopk_max_merges> dropped;  ///< what merge i cut off
  scratch_bytes<Backend> heads;  ///< the heads in and out (2 x 16 bytes)
};

/// The buffers of both element types, owned by the communicator.
template <class Backend>
struct gtopk_workspace {
  gtopk_buffers<Backend, float> f;
  gtopk_buffers<Backend, double> d;
  template <real_gradient T>
  gtopk_buffers<Backend, T>& of() {
    if constexpr (std::is_same_v<T, float>) {
      return f;
    } else {
      return d;
    }
  }
};

/// This rank's set: the entries of sparse payload `payload` (topk or threshold layout, made by
/// this rank's encode for `count` elements), in place, with cap `cap` (0: its entry count).
template <real_gradient T, class Backend>
gtopk_set gtopk_local_set(const Backend& b,
                          buffer_view<const std::byte, typename Backend::memory_space> payload,
                          std::size_t count, std::size_t cap) {
  std::uint64_t k = 0;
  if (payload.count() >= 24) load_bytes(b, &k, payload.data() + 16, 8);
  const std::size_t index_bytes = sparse_index_bytes(count);
  if (payload.count() < 24 || k > count || payload.count() != 24 + k * (index_bytes + sizeof(T))) {
    throw error(make_error_code(errc::internal), {.operation = gtopk_name},
                "a sparse payload of " + std::to_string(payload.count()) + " bytes for " +
                    std::to_string(count) + " elements");
  }
  const auto n = static_cast<std::size_t>(k);
  return {.at = payload.data() + 24, .n = n, .cap = cap == 0 ? n : cap};
}

/// The 16-byte head that goes before a set's body: entries n, merge cap.
struct gtopk_head {
  std::uint64_t n = 0;
  std::uint64_t cap = 0;
};
static_assert(sizeof(gtopk_head) == 16);

/// The body of a set from `peer` whose head `head` has arrived, into `into`, checking it:
/// n <= cap <= count, indices in range and strictly increasing (`invalid_argument` naming
/// the fault otherwise).
template <class Index, class T, class Transport, class Backend>
gtopk_set gtopk_recv_body(wire<Transport>& link, const Backend& b, int peer, gtopk_head head,
                          scratch_bytes<Backend>& into, std::size_t count) {
  if (head.n > head.cap || head.cap > count) {
    throw invalid_argument({.operation = gtopk_name, .peer = peer},
                           "a set of " + std::to_string(head.n) + " entries capped at " +
                               std::to_string(head.cap) + " for " + std::to_string(count) +
                               " elements");
  }
  const auto n = static_cast<std::size_t>(head.n);
  const std::size_t body = n * (sizeof(Index) + sizeof(T));
  std::byte* at = into.reserve(b, body);
  if (body != 0) link.recv(peer, {at, body}).wait();
  check_sparse_indices<Index>(b, gtopk_name, at, n, count);
  return {.at = at, .n = n, .cap = static_cast<std::size_t>(head.cap)};
}

/// merge(a, b) (see the file comment), written to `w.current`; the entries cut off go to
/// `dropped`, and their count to `dropped_n`.
template <class Index, class Backend, real_gradient T>
gtopk_set gtopk_merge(const Backend& b, gtopk_buffers<Backend, T>& w, gtopk_set a, gtopk_set in,
                      scratch_bytes<Backend>& dropped, std::size_t& dropped_n) {
  // step 0: the union, in index order; a's value + b's value at a shared index
  const std::size_t room = a.n + in.n;
  const std::size_t values_at = (room * sizeof(Index) + 15) / 16 * 16;  // aligned for T
  std::byte* indices = w.merged.reserve(b, values_at + room * sizeof(T));
  T* values = reinterpret_cast<T*>(indices + values_at);
  const std::size_t m = sparse_union<Index>(b, a.at, a.n, in.at, in.n, indices, values);
  // step 1: the cap largest magnitudes of the union, the rest dropped
  const std::size_t cap = std::max(a.cap, in.cap);
  const std::size_t kept = std::min(m, cap);
  const std::size_t entry = sizeof(Index) + sizeof(T);
  std::byte* out = w.current.reserve(b, kept * entry);  // a was read: it may be overwritten
  std::byte* cut = dropped.reserve(b, (m - kept) * entry);
  std::byte* positions = w.positions.reserve(b, m > cap ? cap * sizeof(std::uint64_t) : 0);
  const std::size_t n = sparse_keep_largest<Index>(
      b, indices, buffer_view<const T, typename Backend::memory_space>(values, m), cap, positions,
      out, cut);
  dropped_n = m - n;
  return {.at = out, .n = n, .cap = cap};
}

/// gTop-k's tree over sets of `Index`es (the file comment), from this rank's set `local`:
/// steps 1-3 are `binomial_tree_steps`, the schedule topology/schedule.hpp builds, walked by
/// `walk_steps` (detail/verbs.hpp) with sets in place of elements.
template <class Index, class Transport, class Backend, real_gradient T>
void gtopk_tree(wire<Transport>& link, const Backend& b, gtopk_set local,
                buffer_view<T, typename Backend::memory_space> data,
                buffer_view<T, typename Backend::memory_space> residual,
                gtopk_buffers<Backend, T>& w) {
  const std::size_t count = data.count();
  gtopk_set s = local;
  std::array<std::size_t, gtopk_max_merges> dropped_n{};  // entries merge i cut off
  std::size_t merges = 0;
  using completion = typename wire<Transport>::completion_type;
  using memory = typename Backend::memory_space;
  gtopk_head head_in;
  gtopk_head head_out;
  // The heads travel in the transport's memory, through 32 bytes of the backend's scratch:
  // stored before a send (stream-ordered), loaded after a receive.
  std::byte* heads = w.heads.reserve(b, 2 * sizeof(gtopk_head));
  const buffer_view<std::byte, memory> in_bytes(heads, sizeof(gtopk_head));
  const buffer_view<std::byte, memory> out_bytes(heads + sizeof(gtopk_head), sizeof(gtopk_head));
  std::optional<completion> got;
  std::optional<completion> sent_head;
  std::optional<completion> sent_body;
  // steps 1-3: a set travels as its head, then its body (the file comment). A reducing
  // receive merges the set into this rank's, a copying one takes G, a send sends this rank's
  // set (its partial union, or G on the way down). A step of this schedule sends or
  // receives, never both, so a receive never overwrites a set in flight.
  walk_steps(
      binomial_tree_steps(link.rank(), link.size()),
      step_hooks{
          /*post_recv*/ [&](const step& st) { got.emplace(link.recv(st.recv_from, in_bytes)); },
          /*post_send*/
          [&](const step& st) {
            head_out = {.n = s.n, .cap = s.cap};
            store_bytes(b, out_bytes.data(), &head_out, sizeof head_out);
            sent_head.emplace(link.send(st.send_to, out_bytes));
            const std::size_t body = s.n * (sizeof(Index) + sizeof(T));
            if (body != 0) sent_body.emplace(link.send(st.send_to, {s.at, body}));
          },
          /*finish_recv*/
          [&](const step& st) {
            got->wait();
            got.reset();
            load_bytes(b, &head_in, in_bytes.data(), sizeof head_in);
            if (st.action == step_action::reduce) {
              const gtopk_set in =
                  gtopk_recv_body<Index, T>(link, b, st.recv_from, head_in, w.incoming, count);
              s = gtopk_merge<Index>(b, w, s, in, w.dropped[merges], dropped_n[merges]);
              ++merges;
            } else {
              s = gtopk_recv_body<Index, T>(link, b, st.recv_from, head_in, w.current, count);
            }
          },
          /*end_step*/
          [&](const step&) {
            if (sent_head) sent_head->wait();
            if (sent_body) sent_body->wait();
            sent_head.reset();
            sent_body.reset();
          }});
  // step 4: error feedback, then the result
  if (!residual.empty()) {
    sparse_add_back<Index>(b, residual, local.at, local.n, s.at, s.n,
                           kernels::membership::not_in_set);
    for (std::size_t i = 0; i < merges; ++i) {
      sparse_add_back<Index>(b, residual, w.dropped[i].data(), dropped_n[i], s.at, s.n,
                             kernels::membership::in_set);
    }
  }
  scatter_sparse<Index>(b, s.at, s.at + s.n * sizeof(Index), s.n, data);
}

/// Runs gTop-k (the file comment) on `payload`, this rank's encoded sparse payload of
/// `data.count()` elements, with merge cap `cap` (0 for "the payload's own entry count"), and
/// writes G into `data`. With a non-empty `residual` (error feedback: the residual after the
/// local encode, `data.count()` elements), adds back the entries the file comment says. Every
/// rank must call it with the same count; `link` counts the bytes.
/// Throws the transport's errors and `invalid_argument` for a malformed set received.
template <class Transport, class Backend, real_gradient T>
void gtopk_allreduce(wire<Transport> link, const Backend& b,
                     buffer_view<const std::byte, typename Backend::memory_space> payload,
                     std::size_t cap, buffer_view<T, typename Backend::memory_space> data,
                     buffer_view<T, typename Backend::memory_space> residual,
                     gtopk_workspace<Backend>& w) {
  const std::size_t count = data.count();
  if (count == 0) return;  // every rank knows: nothing to send
  const gtopk_set local = gtopk_local_set<T>(b, payload, count, cap);
  if (sparse_index_bytes(count) == 4) {
    gtopk_tree<std::uint32_t>(link, b, local, data, residual, w.template of<T>());
  } else {
    gtopk_tree<std::uint64_t>(link, b, local, data, residual, w.template of<T>());
  }
}

}  // namespace squall::detail
