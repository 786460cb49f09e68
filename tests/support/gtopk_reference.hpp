// SPDX-License-Identifier: Apache-2.0
#pragma once
// A serial gTop-k (Shi et al., arXiv 1901.04359), written apart from
// algorithm/detail/gtopk.hpp for the tests: every rank's local set from its own encode (through
// its residual with error feedback), the extra ranks r >= P2 = bit_floor(P) folded into r - P2,
// then rounds d = 1, 2, ..., P2 / 2 merging set r + d into set r (r a multiple of 2d); a merge
// is the union with the receiver's value + the sender's at a shared index, then the `cap`
// entries of largest magnitude (a full sort; ties to the lower index), cap = the larger cap.
// Error feedback: each rank adds back its local entries not in G, then what its own merges cut
// off at G's indices, in merge order.

#include <squall/backend/host.hpp>
#include <squall/compress/state.hpp>
#include <squall/core/buffer.hpp>
#include <squall/core/random.hpp>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

namespace squall::test {

template <class T>
struct sparse_entry {
  std::uint64_t index = 0;
  T value{};
};

template <class T>
struct reference_set {
  std::vector<sparse_entry<T>> entries;  // ascending index
  std::size_t cap = 0;
};

/// The entries of a topk / threshold payload of `count` elements.
template <class T>
std::vector<sparse_entry<T>> payload_entries(const std::vector<std::byte>& payload,
                                             std::size_t size, std::size_t count) {
  std::uint64_t k = 0;
  std::memcpy(&k, payload.data() + 16, 8);
  const std::size_t ib = count <= (std::size_t{1} << 32) ? 4 : 8;
  std::vector<sparse_entry<T>> out(static_cast<std::size_t>(k));
  for (std::size_t j = 0; j < out.size(); ++j) {
    std::uint64_t i = 0;
    std::memcpy(&i, payload.data() + 24 + j * ib, ib);
    out[j].index = i;
    std::memcpy(&out[j].value, payload.data() + 24 + k * ib + j * sizeof(T), sizeof(T));
  }
  (void)size;
  return out;
}

/// |x| ordered as bits (NaN above +Inf), as topk orders magnitudes.
template <class T>
auto magnitude_bits(T x) {
  using U = std::conditional_t<sizeof(T) == 4, std::uint32_t, std::uint64_t>;
  return std::bit_cast<U>(x) & (~U(0) >> 1);
}

/// a = merge(a, b); what is cut off is appended to `dropped`.
template <class T>
void reference_merge(reference_set<T>& a, const reference_set<T>& b,
                     std::vector<sparse_entry<T>>& dropped) {
  std::vector<sparse_entry<T>> u = a.entries;
  for (const auto& e : b.entries) {
    auto it = std::find_if(u.begin(), u.end(), [&](const auto& x) { return x.index == e.index; });
    if (it != u.end()) {
      it->value = it->value + e.value;
    } else {
      u.push_back(e);
    }
  }
  std::sort(u.begin(), u.end(), [](const auto& x, const auto& y) { return x.index < y.index; });
  a.cap = std::max(a.cap, b.cap);
  std::vector<sparse_entry<T>> by_size = u;
  std::stable_sort(by_size.begin(), by_size.end(), [](const auto& x, const auto& y) {
    return magnitude_bits(x.value) > magnitude_bits(y.value);  // stable: lower index first
  });
  const std::size_t keep = std::min(a.cap, by_size.size());
  std::vector<sparse_entry<T>> kept(by_size.begin(),
                                    by_size.begin() + static_cast<std::ptrdiff_t>(keep));
  std::vector<sparse_entry<T>> cut(by_size.begin() + static_cast<std::ptrdiff_t>(keep),
                                   by_size.end());
  const auto by_index = [](const auto& x, const auto& y) { return x.index < y.index; };
  std::sort(kept.begin(), kept.end(), by_index);
  std::sort(cut.begin(), cut.end(), by_index);
  a.entries = kept;
  dropped.insert(dropped.end(), cut.begin(), cut.end());
}

/// One gTop-k step of `inner` (topk or threshold) over every rank's input; with `residuals`
/// (one per rank, error feedback) they are used and updated as the communicator does. `cap`
/// is topk's k, or 0 for each rank's own count (threshold). Returns G as a dense vector.
template <class C, class T>
std::vector<T> gtopk_reference(const C& inner, const std::vector<std::vector<T>>& inputs,
                               std::uint64_t step, std::size_t cap,
                               std::vector<std::vector<T>>* residuals = nullptr) {
  const std::size_t p = inputs.size();
  const std::size_t count = inputs[0].size();
  std::vector<T> out(count, T(0));
  if (count == 0) return out;
  const host_backend b{};
  std::vector<reference_set<T>> sets(p);
  std::vector<std::vector<sparse_entry<T>>> local(p);
  std::vector<std::vector<sparse_entry<T>>> dropped(p);
  for (std::size_t q = 0; q < p; ++q) {
    std::vector<T> acc = inputs[q];
    if (residuals != nullptr) {
      for (std::size_t i = 0; i < count; ++i) acc[i] = (*residuals)[q][i] + inputs[q][i];
    }
    std::vector<std::byte> payload(inner.max_payload_bytes(dtype_of<T>, count));
    const random_stream stream{step, static_cast<std::uint32_t>(q)};
    const std::size_t size =
        inner.encode(b, host_view<const T>(acc.data(), count),
                     host_view<std::byte>(payload.data(), payload.size()), stream);
    local[q] = payload_entries<T>(payload, size, count);
    sets[q].entries = local[q];
    sets[q].cap = cap == 0 ? local[q].size() : cap;
    if (residuals != nullptr) {
      std::vector<T> decoded(count, T(0));
      for (const auto& e : local[q]) decoded[e.index] = e.value;
      for (std::size_t i = 0; i < count; ++i) (*residuals)[q][i] = acc[i] - decoded[i];
    }
  }
  const std::size_t p2 = std::bit_floor(p);
  for (std::size_t r = p2; r < p; ++r) reference_merge(sets[r - p2], sets[r], dropped[r - p2]);
  for (std::size_t d = 1; d < p2; d *= 2) {
    for (std::size_t r = 0; r + d < p2; r += 2 * d)
      reference_merge(sets[r], sets[r + d], dropped[r]);
  }
  const auto& g = sets[0].entries;
  const auto in_g = [&](std::uint64_t i) {
    return std::any_of(g.begin(), g.end(), [&](const auto& e) { return e.index == i; });
  };
  for (const auto& e : g) out[e.index] = e.value;
  if (residuals != nullptr) {
    for (std::size_t q = 0; q < p; ++q) {
      for (const auto& e : local[q]) {
        if (!in_g(e.index)) (*residuals)[q][e.index] += e.value;
      }
      for (const auto& e : dropped[q]) {
        if (in_g(e.index)) (*residuals)[q][e.index] += e.value;
      }
    }
  }
  return out;
}

}  // namespace squall::test
