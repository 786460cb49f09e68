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

#include <squall/algorithm/detail/executor.hpp>
#include <squall/backend/host.hpp>
#include <squall/compress/payload.hpp>
#include <squall/compress/sparsify.hpp>
#include <squall/compress/traits.hpp>
#include <squall/concepts.hpp>
#include <squall/core/buffer.hpp>
#include <squall/core/error.hpp>
#include <squall/core/types.hpp>
#include <squall/kernels/host/select.hpp>

#include <algorithm>  // max, fill, binary_search
#include <bit>        // bit_floor
#include <cstddef>    // byte, size_t
#include <cstdint>
#include <cstring>  // memcpy
#include <string>
#include <string_view>
#include <vector>

namespace squall::detail {

inline constexpr std::string_view gtopk_name = "gtopk allreduce";

/// Compressors whose payloads gTop-k merges: they allow `aggregation::gtopk`, which needs the
/// topk / threshold payload layout (sorted indices, then values), the one the merge decodes.
template <class C>
concept gtopk_mergeable = compression_traits<C>::aggregations.contains(aggregation::gtopk) &&
                          (C::kind == payload_kind::topk || C::kind == payload_kind::threshold);

/// A sparse set: `n` entries, indices strictly increasing, and the merge cap.
template <real_gradient T>
struct gtopk_set {
  std::vector<std::uint64_t> index;
  std::vector<T> value;
  std::size_t n = 0;
  std::size_t cap = 0;

  void resize(std::size_t entries) {
    if (index.size() < entries) {
      index.resize(entries);
      value.resize(entries);
    }
    n = entries;
  }
};

/// gTop-k's buffers for one element type, kept between calls so that a warm loop of the same
/// size allocates little (`select_topk` keeps its own scratch).
template <real_gradient T>
struct gtopk_buffers {
  gtopk_set<T> current;   ///< this rank's set, then G
  gtopk_set<T> local;     ///< this rank's own entries (error feedback)
  gtopk_set<T> incoming;  ///< a received set
  gtopk_set<T> merged;    ///< the union of a merge
  gtopk_set<T> dropped;   ///< what this rank's merges cut off, in merge order
  std::vector<std::byte> wire;
  std::vector<std::byte> picked;  ///< select_topk's positions and values
};

/// The buffers of both element types, owned by the communicator.
struct gtopk_workspace {
  gtopk_buffers<float> f;
  gtopk_buffers<double> d;
  template <real_gradient T>
  gtopk_buffers<T>& of() {
    if constexpr (sizeof(T) == 4) {
      return f;
    } else {
      return d;
    }
  }
};

/// Reads the entries of sparse payload `payload` (topk or threshold layout, made by this rank's
/// encode for `count` elements) into `out`.
template <real_gradient T>
void gtopk_read_payload(host_view<const std::byte> payload, std::size_t count, gtopk_set<T>& out) {
  std::uint64_t k = 0;
  if (payload.count() >= 24) std::memcpy(&k, payload.data() + 16, 8);
  const std::size_t index_bytes = sparse_index_bytes(count);
  if (payload.count() < 24 || k > count || payload.count() != 24 + k * (index_bytes + sizeof(T))) {
    throw error(make_error_code(errc::internal), {.operation = gtopk_name},
                "a sparse payload of " + std::to_string(payload.count()) + " bytes for " +
                    std::to_string(count) + " elements");
  }
  out.resize(static_cast<std::size_t>(k));
  const std::byte* indices = payload.data() + 24;
  const std::byte* values = indices + out.n * index_bytes;
  for (std::size_t j = 0; j < out.n; ++j) {
    if (index_bytes == 4) {
      std::uint32_t i = 0;
      std::memcpy(&i, indices + j * 4, 4);
      out.index[j] = i;
    } else {
      std::memcpy(&out.index[j], indices + j * 8, 8);
    }
  }
  if (out.n != 0) std::memcpy(out.value.data(), values, out.n * sizeof(T));
}

/// Sends `s` to `peer` (head, then body) and counts the bytes.
template <class Transport, real_gradient T>
void gtopk_send(Transport& t, executor_buffers<Transport>& counters, int peer,
                const gtopk_set<T>& s, std::size_t count, std::vector<std::byte>& wire) {
  const std::size_t index_bytes = sparse_index_bytes(count);
  const std::size_t body = s.n * (index_bytes + sizeof(T));
  if (wire.size() < 16 + body) wire.resize(16 + body);
  const std::uint64_t head[2] = {s.n, s.cap};
  std::memcpy(wire.data(), head, 16);
  std::byte* indices = wire.data() + 16;
  for (std::size_t j = 0; j < s.n; ++j) {
    if (index_bytes == 4) {
      const auto i = static_cast<std::uint32_t>(s.index[j]);
      std::memcpy(indices + j * 4, &i, 4);
    } else {
      std::memcpy(indices + j * 8, &s.index[j], 8);
    }
  }
  if (s.n != 0) std::memcpy(indices + s.n * index_bytes, s.value.data(), s.n * sizeof(T));
  auto first = t.send(peer, buffer_view<const std::byte>(wire.data(), 16));
  if (body != 0) {
    auto second = t.send(peer, buffer_view<const std::byte>(wire.data() + 16, body));
    first.wait();
    second.wait();
  } else {
    first.wait();
  }
  counters.bytes_sent += 16 + body;
}

/// Receives a set from `peer` into `s`, checking it: n <= cap <= count, indices in range and
/// strictly increasing (`invalid_argument` naming the fault otherwise).
template <class Transport, real_gradient T>
void gtopk_recv(Transport& t, executor_buffers<Transport>& counters, int peer, gtopk_set<T>& s,
                std::size_t count, std::vector<std::byte>& wire) {
  std::uint64_t head[2] = {};
  t.recv(peer, buffer_view<std::byte>(reinterpret_cast<std::byte*>(head), 16)).wait();
  if (head[0] > head[1] || head[1] > count) {
    throw invalid_argument({.operation = gtopk_name, .peer = peer},
                           "a set of " + std::to_string(head[0]) + " entries capped at " +
                               std::to_string(head[1]) + " for " + std::to_string(count) +
                               " elements");
  }
  const auto n = static_cast<std::size_t>(head[0]);
  const std::size_t index_bytes = sparse_index_bytes(count);
  const std::size_t body = n * (index_bytes + sizeof(T));
  if (wire.size() < body) wire.resize(body);
  if (body != 0) t.recv(peer, buffer_view<std::byte>(wire.data(), body)).wait();
  counters.bytes_received += 16 + body;
  if (index_bytes == 4) {
    check_sparse_indices<std::uint32_t>(host_backend{}, gtopk_name, wire.data(), n, count);
  } else {
    check_sparse_indices<std::uint64_t>(host_backend{}, gtopk_name, wire.data(), n, count);
  }
  s.resize(n);
  s.cap = static_cast<std::size_t>(head[1]);
  for (std::size_t j = 0; j < n; ++j) {
    if (index_bytes == 4) {
      std::uint32_t i = 0;
      std::memcpy(&i, wire.data() + j * 4, 4);
      s.index[j] = i;
    } else {
      std::memcpy(&s.index[j], wire.data() + j * 8, 8);
    }
  }
  if (n != 0) std::memcpy(s.value.data(), wire.data() + n * index_bytes, n * sizeof(T));
}

/// a = merge(a, b) (see the file comment); entries cut off are appended to `dropped`.
template <real_gradient T>
void gtopk_merge(gtopk_set<T>& a, const gtopk_set<T>& b, gtopk_set<T>& u, gtopk_set<T>& dropped,
                 std::vector<std::byte>& picked) {
  // step 0: the union, in index order; a's value + b's value at a shared index
  u.resize(a.n + b.n);
  std::size_t i = 0;
  std::size_t j = 0;
  std::size_t m = 0;
  while (i < a.n || j < b.n) {
    if (j == b.n || (i < a.n && a.index[i] < b.index[j])) {
      u.index[m] = a.index[i];
      u.value[m++] = a.value[i++];
    } else if (i == a.n || b.index[j] < a.index[i]) {
      u.index[m] = b.index[j];
      u.value[m++] = b.value[j++];
    } else {
      u.index[m] = a.index[i];
      u.value[m++] = a.value[i++] + b.value[j++];
    }
  }
  u.n = m;
  const std::size_t cap = std::max(a.cap, b.cap);
  a.cap = cap;
  if (m <= cap) {
    a.resize(m);
    std::copy(u.index.begin(), u.index.begin() + static_cast<std::ptrdiff_t>(m), a.index.begin());
    std::copy(u.value.begin(), u.value.begin() + static_cast<std::ptrdiff_t>(m), a.value.begin());
    return;
  }
  // step 1: the cap largest magnitudes of the union (positions ascending), the rest dropped
  std::size_t kept = 0;
  const std::size_t room = cap * (sizeof(std::uint64_t) + sizeof(T));
  if (picked.size() < room) picked.resize(room);
  if (cap != 0) {
    kept = kernels::select_topk<std::uint64_t>(
        host_backend{}, host_view<const T>(u.value.data(), m), cap, picked.data(),
        picked.data() + cap * sizeof(std::uint64_t));
  }
  a.resize(kept);
  const std::size_t first_drop = dropped.n;
  dropped.resize(first_drop + (m - kept));
  std::size_t next = 0;  // the next kept position
  std::size_t d = first_drop;
  for (std::size_t p = 0; p < m; ++p) {
    std::uint64_t at = m;
    if (next < kept) std::memcpy(&at, picked.data() + next * sizeof(std::uint64_t), 8);
    if (p == at) {
      a.index[next] = u.index[p];
      a.value[next++] = u.value[p];
    } else {
      dropped.index[d] = u.index[p];
      dropped.value[d++] = u.value[p];
    }
  }
}

/// Whether index `i` is in set `g` (sorted).
template <real_gradient T>
bool gtopk_contains(const gtopk_set<T>& g, std::uint64_t i) {
  return std::binary_search(g.index.begin(), g.index.begin() + static_cast<std::ptrdiff_t>(g.n), i);
}

/// Runs gTop-k (the file comment) on `payload`, this rank's encoded sparse payload of
/// `data.count()` elements, with merge cap `cap` (0 for "the payload's own entry count"), and
/// writes G into `data`. With `residual` (error feedback; the residual after the local encode),
/// adds back the entries the file comment says. Every rank must call it with the same count;
/// bytes are counted into `counters` (the executor's). Throws the transport's errors and
/// `invalid_argument` for a malformed set received.
template <class Transport, real_gradient T>
void gtopk_allreduce(Transport& t, executor_buffers<Transport>& counters,
                     host_view<const std::byte> payload, std::size_t cap, host_view<T> data,
                     T* residual, gtopk_buffers<T>& w) {
  const std::size_t count = data.count();
  if (count == 0) return;  // every rank knows: nothing to send
  const int me = t.rank();
  const int size = t.size();
  const int p2 = static_cast<int>(std::bit_floor(static_cast<unsigned>(size)));
  const int extra = size - p2;
  gtopk_set<T>& s = w.current;
  gtopk_read_payload(payload, count, s);
  s.cap = cap == 0 ? s.n : cap;
  w.dropped.n = 0;
  if (residual != nullptr) {
    w.local.resize(s.n);
    std::copy(s.index.begin(), s.index.begin() + static_cast<std::ptrdiff_t>(s.n),
              w.local.index.begin());
    std::copy(s.value.begin(), s.value.begin() + static_cast<std::ptrdiff_t>(s.n),
              w.local.value.begin());
  }
  const auto merge_from = [&](int peer) {
    gtopk_recv(t, counters, peer, w.incoming, count, w.wire);
    gtopk_merge(s, w.incoming, w.merged, w.dropped, w.picked);
  };
  // step 1: fold the extra ranks into their partners
  if (me >= p2) {
    gtopk_send(t, counters, me - p2, s, count, w.wire);
  } else {
    if (me < extra) merge_from(me + p2);
    // step 2: merge up the binomial tree to rank 0
    for (int d = 1; d < p2; d *= 2) {
      if (me % (2 * d) == d) {
        gtopk_send(t, counters, me - d, s, count, w.wire);
        break;
      }
      merge_from(me + d);
    }
  }
  // step 3: G down the same tree, then to the extra ranks
  if (me >= p2) {
    gtopk_recv(t, counters, me - p2, s, count, w.wire);
  } else {
    int d = p2 / 2;
    if (me != 0) {
      const int low = me & -me;  // the round this rank sent in: it receives G from me - low
      gtopk_recv(t, counters, me - low, s, count, w.wire);
      d = low / 2;
    }
    for (; d >= 1; d /= 2) gtopk_send(t, counters, me + d, s, count, w.wire);
    if (me < extra) gtopk_send(t, counters, me + p2, s, count, w.wire);
  }
  // step 4: error feedback, then the result
  if (residual != nullptr) {
    for (std::size_t j = 0; j < w.local.n; ++j) {
      if (!gtopk_contains(s, w.local.index[j])) residual[w.local.index[j]] += w.local.value[j];
    }
    for (std::size_t j = 0; j < w.dropped.n; ++j) {
      if (gtopk_contains(s, w.dropped.index[j])) residual[w.dropped.index[j]] += w.dropped.value[j];
    }
  }
  std::fill(data.data(), data.data() + count, T(0));
  for (std::size_t j = 0; j < s.n; ++j) data.data()[s.index[j]] = s.value[j];
}

}  // namespace squall::detail
