// SPDX-License-Identifier: Apache-2.0
#pragma once
/// Host selection kernels of the sparsifying compressors (compress/sparsify.hpp): top-k by
/// magnitude (a radix select on the magnitude's bits), the sampled threshold of Deep Gradient
/// Compression, stratified random-k indices, and the pass that writes the selected (index,
/// value) pairs in ascending index order.
///
/// Magnitudes are compared as keys: the bits of |x| as an unsigned integer (`magnitude_key`),
/// which order exactly as the magnitudes do for every non-NaN value, with +Inf above every
/// finite value and every NaN above +Inf. So NaN ranks as the largest magnitude, and no
/// comparison here involves a floating-point NaN (no UB, no unordered compare).
///
/// A selection is described by a `selection_cut`: every element whose key is above `key`, plus
/// the first `ties` elements (in index order) whose key equals `key`. That is how top-k
/// resolves ties at the k-th magnitude: lower index first.

#include <squall/backend/host.hpp>
#include <squall/core/buffer.hpp>
#include <squall/core/config.hpp>
#include <squall/core/random.hpp>

#include <algorithm>  // nth_element, min
#include <array>
#include <cmath>     // isnan, signbit
#include <concepts>  // same_as, floating_point
#include <cstddef>   // byte, size_t
#include <cstdint>
#include <cstring>     // memcpy
#include <functional>  // greater
#include <limits>
#include <optional>
#include <string_view>
#include <type_traits>
#include <vector>

namespace squall::kernels {

/// The unsigned integer as wide as `T`: the type of `T`'s magnitude keys.
template <real_gradient T>
using magnitude_key_type = std::conditional_t<sizeof(T) == 4, std::uint32_t, std::uint64_t>;

/// The bits of |x| as an unsigned integer: ordered as the magnitudes are; NaN above +Inf.
template <real_gradient T>
SQUALL_HOST_DEVICE SQUALL_FORCEINLINE magnitude_key_type<T> magnitude_key(T x) {
  using U = magnitude_key_type<T>;
  U bits;
  std::memcpy(&bits, &x, sizeof bits);
  return bits & static_cast<U>(static_cast<U>(~U{0}) >> 1);  // no numeric_limits: device code
}

/// The key of +Inf: keys at or above it belong to non-finite elements.
template <real_gradient T>
inline constexpr magnitude_key_type<T> infinity_key =
    sizeof(T) == 4 ? magnitude_key_type<T>(0x7f800000u)
                   : magnitude_key_type<T>(0x7ff0000000000000ull);

/// Selects every element with key above `key` and the first `ties` elements with key equal to
/// `key`; `count` is how many that is.
template <real_gradient T>
struct selection_cut {
  magnitude_key_type<T> key = 0;
  std::size_t ties = 0;
  std::size_t count = 0;
};

namespace detail {

/// Elements per block of the skip-ahead loops: a block is scanned element by element only if
/// the vectorized test says it holds a selected element.
inline constexpr std::size_t select_block = 16;

/// Bits of the first radix digit: 12, a 4096-bucket histogram (32 KiB of counters).
inline constexpr unsigned radix_bits = 12;

template <class U>
inline constexpr unsigned key_bits = sizeof(U) * 8 - 1;  // the sign bit is masked off

/// The high 64 bits of a x b.
SQUALL_HOST_DEVICE inline std::uint64_t mul_high(std::uint64_t a, std::uint64_t b) {
  const std::uint64_t a_lo = a & 0xffffffffu, a_hi = a >> 32;
  const std::uint64_t b_lo = b & 0xffffffffu, b_hi = b >> 32;
  const std::uint64_t lo_lo = a_lo * b_lo, hi_lo = a_hi * b_lo, lo_hi = a_lo * b_hi;
  const std::uint64_t cross = (lo_lo >> 32) + (hi_lo & 0xffffffffu) + lo_hi;
  return a_hi * b_hi + (hi_lo >> 32) + (cross >> 32);
}

/// Histogram of the digit `key >> shift` (below 2^radix_bits) over `count` elements.
template <real_gradient T>
SQUALL_HOST_CLONES void key_histogram(const T* SQUALL_RESTRICT in, std::size_t count,
                                      unsigned shift, std::size_t* SQUALL_RESTRICT hist) {
  // Four sub-histograms, so runs of equal digits do not serialize on one counter.
  constexpr std::size_t buckets = std::size_t{1} << radix_bits;
  std::vector<std::uint32_t> sub(4 * buckets, 0);
  std::uint32_t* h = sub.data();
  std::size_t done = 0;
  while (done < count) {
    // u32 counters: flush at most every 2^31 elements.
    const std::size_t n = std::min<std::size_t>(count - done, std::size_t{1} << 31);
    const T* p = in + done;
    std::size_t i = 0;
    for (; i + 4 <= n; i += 4) {
      ++h[0 * buckets + (magnitude_key(p[i + 0]) >> shift)];
      ++h[1 * buckets + (magnitude_key(p[i + 1]) >> shift)];
      ++h[2 * buckets + (magnitude_key(p[i + 2]) >> shift)];
      ++h[3 * buckets + (magnitude_key(p[i + 3]) >> shift)];
    }
    for (; i < n; ++i) ++h[magnitude_key(p[i]) >> shift];
    for (std::size_t b = 0; b < buckets; ++b) {
      hist[b] += std::size_t{h[b]} + h[buckets + b] + h[2 * buckets + b] + h[3 * buckets + b];
    }
    std::fill(sub.begin(), sub.end(), 0u);
    done += n;
  }
}

/// Copies the index and value of every element whose key is at least `low` to `index` and
/// `value` (room for all of them plus one), in ascending index order; returns how many.
template <real_gradient T>
SQUALL_HOST_CLONES std::size_t collect_at_least(const T* SQUALL_RESTRICT in, std::size_t count,
                                                magnitude_key_type<T> low,
                                                std::size_t* SQUALL_RESTRICT index,
                                                T* SQUALL_RESTRICT value) {
  // Branch-free compaction: every element is written to the next slot, which is kept only if
  // it qualifies (measured on 16 Mi floats with 3% qualifying: 15 ms, against 20 ms when
  // blocks of 16 are skipped after a vectorized test, whose branch mispredicts).
  std::size_t m = 0;
  for (std::size_t i = 0; i < count; ++i) {
    const T v = in[i];
    index[m] = i;
    value[m] = v;
    m += static_cast<std::size_t>(magnitude_key(v) >= low);
  }
  return m;
}

/// The key of the `need`-th largest of `keys[0, m)` (the array is permuted) and how many
/// candidates equal to it the need largest take. Radix-refines while the candidates are many
/// (every bucket above the chosen one is selected whole), then finishes with nth_element.
template <class U>
void cut_among(std::vector<U>& keys, std::size_t m, std::size_t need, unsigned low_bits, U& cut_key,
               std::size_t& cut_ties) {
  // Every key in keys[0, m) shares its bits above `low_bits`.
  constexpr std::size_t buckets = std::size_t{1} << radix_bits;
  while (m > 4096 && low_bits > 0) {
    const unsigned digit_bits = std::min(low_bits, radix_bits);
    const unsigned shift = low_bits - digit_bits;
    const U mask = (U{1} << digit_bits) - 1;
    std::array<std::size_t, buckets> hist{};
    for (std::size_t i = 0; i < m; ++i) ++hist[(keys[i] >> shift) & mask];
    std::size_t b = (std::size_t{1} << digit_bits) - 1;
    while (hist[b] < need) {  // the bucket holding the need-th largest
      need -= hist[b];
      --b;
    }
    std::size_t n = 0;
    for (std::size_t i = 0; i < m; ++i) {
      const U key = keys[i];
      keys[n] = key;
      n += static_cast<std::size_t>(((key >> shift) & mask) == b);
    }
    m = n;
    low_bits = shift;
  }
  auto nth = keys.begin() + static_cast<std::ptrdiff_t>(need - 1);
  std::nth_element(keys.begin(), nth, keys.begin() + static_cast<std::ptrdiff_t>(m),
                   std::greater<U>());
  cut_key = *nth;
  std::size_t greater = 0;
  for (std::size_t i = 0; i < m; ++i) greater += static_cast<std::size_t>(keys[i] > cut_key);
  cut_ties = need - greater;
}

}  // namespace detail

/// Writes the `k` largest magnitudes of `in` (0 < k <= in.count()) in ascending index order:
/// indices as `Index` to `indices`, values as `T` to `values` (both unaligned); ties at the
/// k-th magnitude go to the lower index. Returns k.
///
/// A radix select on the magnitude keys: one histogram pass over their top 12 bits finds the
/// bucket b holding the k-th largest; one pass copies every (index, value) of bucket b or
/// above (in index order); the keys of bucket b are refined by further digits and
/// nth_element to the exact k-th key; a last pass over the candidates writes the selection.
/// Scratch: (candidates + 1) x (8 + sizeof(T)) bytes, candidates being the elements of bucket
/// b and above (about k plus the bucket; all of `in` when every magnitude is equal).
template <class Index, real_gradient T>
std::size_t select_topk(const host_backend& /*backend*/, host_view<const T> in, std::size_t k,
                        std::byte* indices, std::byte* values) {
  using U = magnitude_key_type<T>;
  constexpr unsigned shift = detail::key_bits<U> - detail::radix_bits;
  constexpr std::size_t buckets = std::size_t{1} << detail::radix_bits;
  std::vector<std::size_t> hist(buckets, 0);
  detail::key_histogram(in.data(), in.count(), shift, hist.data());
  std::size_t need = k;
  std::size_t b = buckets - 1;
  while (hist[b] < need) {
    need -= hist[b];
    --b;
  }
  const std::size_t room = (k - need) + hist[b] + 1;
  std::vector<std::size_t> candidate_index(room);
  std::vector<T> candidate_value(room);
  const std::size_t m = detail::collect_at_least(in.data(), in.count(), U(U(b) << shift),
                                                 candidate_index.data(), candidate_value.data());
  std::vector<U> keys;
  keys.reserve(hist[b]);
  for (std::size_t j = 0; j < m; ++j) {
    const U key = magnitude_key(candidate_value[j]);
    if ((key >> shift) == b) keys.push_back(key);
  }
  U cut_key = 0;
  std::size_t ties = 0;
  detail::cut_among(keys, keys.size(), need, shift, cut_key, ties);
  std::size_t n = 0;
  for (std::size_t j = 0; j < m; ++j) {
    const T v = candidate_value[j];
    const U key = magnitude_key(v);
    const bool take_tie = key == cut_key && ties != 0;
    if (key > cut_key || take_tie) {
      ties -= static_cast<std::size_t>(take_tie);
      const Index index = static_cast<Index>(candidate_index[j]);
      std::memcpy(indices + n * sizeof(Index), &index, sizeof index);
      std::memcpy(values + n * sizeof(T), &v, sizeof v);
      ++n;
    }
  }
  return n;
}

/// Counts the elements of `in` whose key is at least `key`.
template <real_gradient T>
SQUALL_HOST_CLONES std::size_t count_at_least(const T* SQUALL_RESTRICT in, std::size_t count,
                                              magnitude_key_type<T> key) {
  std::size_t n = 0;
  for (std::size_t i = 0; i < count; ++i)
    n += static_cast<std::size_t>(magnitude_key(in[i]) >= key);
  return n;
}

/// The positions of the `samples` draws of the sampled threshold: draw j is element
/// mul_high(word pair, count) of Philox block j/2 of (seed, stream) -- uniform over [0, count)
/// to within count / 2^64.
SQUALL_HOST_DEVICE inline std::size_t sample_position(std::uint64_t seed, random_stream stream,
                                                      std::uint64_t j, std::size_t count) {
  const philox_block r = philox(seed, stream, j / 2);
  const std::size_t w = (j % 2) * 2;
  const std::uint64_t word = (std::uint64_t{r.word[w]} << 32) | r.word[w + 1];
  return static_cast<std::size_t>(detail::mul_high(word, count));
}

/// The cut of Deep Gradient Compression's sampled threshold (Lin et al., "Deep Gradient
/// Compression", ICLR 2018): estimate the k-th largest magnitude as the ks-th largest of
/// `samples` magnitudes drawn at random positions (ks = max(1, round(k x samples / count))),
/// and return the cut selecting every element at or above it, if at most `k` pass; if more
/// pass, return nothing: the caller sends their exact top k, which is the top k of `in`
/// (`select_topk`), as DGC does.
template <real_gradient T>
std::optional<selection_cut<T>> sampled_cut(const host_backend& /*backend*/, host_view<const T> in,
                                            std::size_t k, std::size_t samples, std::uint64_t seed,
                                            random_stream stream) {
  using U = magnitude_key_type<T>;
  const std::size_t count = in.count();
  std::vector<U> sample(samples);
  for (std::size_t j = 0; j < samples; ++j) {
    sample[j] = magnitude_key(in[sample_position(seed, stream, j, count)]);
  }
  const double wanted =
      static_cast<double>(k) * static_cast<double>(samples) / static_cast<double>(count);
  const std::size_t ks =
      std::clamp<std::size_t>(static_cast<std::size_t>(wanted + 0.5), 1, samples);
  auto nth = sample.begin() + static_cast<std::ptrdiff_t>(ks - 1);
  std::nth_element(sample.begin(), nth, sample.end(), std::greater<U>());
  const U threshold = *nth;
  const std::size_t passed = count_at_least(in.data(), count, threshold);
  if (passed <= k) {
    // everything at or above the threshold: above (threshold - 1), no ties needed
    if (threshold == 0) return selection_cut<T>{.key = 0, .ties = passed, .count = passed};
    return selection_cut<T>{.key = U(threshold - 1), .ties = 0, .count = passed};
  }
  return std::nullopt;
}

/// Writes the elements `cut` selects in ascending index order: their indices as `Index` to
/// `indices` and their values (or, with `quantize`, sign(x) x `level`) as `T` to `values`
/// (both unaligned). Returns how many were written (`cut.count`).
template <class Index, real_gradient T>
SQUALL_HOST_CLONES std::size_t write_selected(const T* SQUALL_RESTRICT in, std::size_t count,
                                              magnitude_key_type<T> cut_key, std::size_t ties,
                                              std::byte* SQUALL_RESTRICT indices,
                                              std::byte* SQUALL_RESTRICT values, bool quantize,
                                              T level) {
  using U = magnitude_key_type<T>;
  std::size_t n = 0;
  const auto emit = [&](std::size_t i) {
    const Index index = static_cast<Index>(i);
    T v = in[i];
    if (quantize && magnitude_key(v) <= infinity_key<T>) v = std::signbit(v) ? -level : level;
    std::memcpy(indices + n * sizeof(Index), &index, sizeof index);
    std::memcpy(values + n * sizeof(T), &v, sizeof v);
    ++n;
  };
  std::size_t i = 0;
  const auto scalar = [&](std::size_t end) {
    for (; i < end; ++i) {
      const U key = magnitude_key(in[i]);
      if (key > cut_key) {
        emit(i);
      } else if (key == cut_key && ties != 0) {
        emit(i);
        --ties;
      }
    }
  };
  for (; i + detail::select_block <= count;) {
    bool any = false;
    for (std::size_t j = 0; j < detail::select_block; ++j) {
      any |= magnitude_key(in[i + j]) >= cut_key;
    }
    if (any) {
      scalar(i + detail::select_block);
    } else {
      i += detail::select_block;
    }
  }
  scalar(count);
  return n;
}

/// `count_at_least` over a view: the elements of `in` whose key is at least `key`.
template <real_gradient T>
std::size_t count_at_least(const host_backend& /*backend*/, host_view<const T> in,
                           magnitude_key_type<T> key) {
  return count_at_least(in.data(), in.count(), key);
}

/// `write_selected` over a view: writes the elements the cut (`cut_key`, `ties`) selects, in
/// ascending index order (kernels/cuda/select.cuh is the twin). Returns how many.
template <class Index, real_gradient T>
std::size_t write_selected(const host_backend& /*backend*/, host_view<const T> in,
                           magnitude_key_type<T> cut_key, std::size_t ties, std::byte* indices,
                           std::byte* values, bool quantize, T level) {
  return write_selected<Index>(in.data(), in.count(), cut_key, ties, indices, values, quantize,
                               level);
}

/// The first element of `in` that is NaN or infinite, or `in.count()` if all are finite:
/// blocks of 256 tested by their largest magnitude key (an integer maximum, which g++
/// vectorizes; an OR of each element's comparison stayed scalar, a cycle an element), then the
/// block that holds one searched element by element.
template <real_gradient T>
SQUALL_HOST_CLONES std::size_t first_non_finite(const host_backend& /*backend*/,
                                                host_view<const T> in) {
  constexpr std::size_t block = 256;
  const T* p = in.data();
  const std::size_t count = in.count();
  std::size_t i = 0;
  for (; i + block <= count; i += block) {
    magnitude_key_type<T> top = 0;
    for (std::size_t j = 0; j < block; ++j) {
      const magnitude_key_type<T> key = magnitude_key(p[i + j]);
      top = key > top ? key : top;
    }
    if (top >= infinity_key<T>) break;
  }
  for (; i < count; ++i) {
    if (magnitude_key(p[i]) >= infinity_key<T>) return i;
  }
  return count;
}

/// Throws `invalid_argument` naming `operation` and the first NaN or infinite element of
/// `in`, if any (the compressors' `check_finite`).
template <real_gradient T>
void require_finite(std::string_view operation, host_view<const T> in) {
  const std::size_t i = first_non_finite(host_backend{}, in);
  if (i != in.count()) throw_not_finite(operation, i, std::isnan(in[i]) ? "NaN" : "infinite");
}

/// `require_finite` with the backend first, so that the compressors reach the device twin
/// (kernels/cuda/select.cuh) for device views.
template <real_gradient T>
void require_finite(const host_backend& /*backend*/, std::string_view operation,
                    host_view<const T> in) {
  require_finite(operation, in);
}

/// The first position j < k of a sparse payload's index array (`k` unaligned `Index`es at
/// `indices`) whose index is out of range (>= `count`) or not above the index before it; `k`
/// if every index is in range and they strictly increase.
template <class Index>
std::size_t sparse_index_fault(const host_backend& /*backend*/, const std::byte* indices,
                               std::size_t k, std::size_t count) {
  std::uint64_t previous = 0;
  for (std::size_t j = 0; j < k; ++j) {
    Index raw;
    std::memcpy(&raw, indices + j * sizeof(Index), sizeof raw);
    const std::uint64_t index = raw;
    if (index >= count || (j != 0 && index <= previous)) return j;
    previous = index;
  }
  return k;
}

/// Zeroes `out` and writes value j (unaligned `T`s at `values`) at index j (unaligned
/// `Index`es at `indices`), for j < k. The indices must be in range and distinct
/// (`sparse_index_fault` returned k).
template <class Index, real_gradient T>
void scatter_sparse(const host_backend& /*backend*/, const std::byte* indices,
                    const std::byte* values, std::size_t k, host_view<T> out) {
  std::fill(out.begin(), out.end(), T(0));
  for (std::size_t j = 0; j < k; ++j) {
    Index index;
    T value;
    std::memcpy(&index, indices + j * sizeof(Index), sizeof index);
    std::memcpy(&value, values + j * sizeof(T), sizeof value);
    out[static_cast<std::size_t>(index)] = value;
  }
}

namespace detail {
/// `out[index_j] + value_j` (`Sign` +1) or `out[index_j] - value_j` (-1) into
/// `out[index_j]`, for j < k. Indices as for `scatter_sparse`.
template <int Sign, class Index, real_gradient T>
void scatter_combine_sparse(const std::byte* indices, const std::byte* values, std::size_t k,
                            host_view<T> out) {
  for (std::size_t j = 0; j < k; ++j) {
    Index index;
    T value;
    std::memcpy(&index, indices + j * sizeof(Index), sizeof index);
    std::memcpy(&value, values + j * sizeof(T), sizeof value);
    T& at = out[static_cast<std::size_t>(index)];
    at = static_cast<T>(Sign > 0 ? at + value : at - value);
  }
}
}  // namespace detail

/// Adds value j at index j of `out` (`out[index_j] += value_j`), for j < k: a sparse payload
/// decoded into a sum without a pass over `out`. Indices as for `scatter_sparse`.
template <class Index, real_gradient T>
void scatter_add_sparse(const host_backend& /*backend*/, const std::byte* indices,
                        const std::byte* values, std::size_t k, host_view<T> out) {
  detail::scatter_combine_sparse<1, Index>(indices, values, k, out);
}

/// Subtracts value j at index j of `out` (`out[index_j] -= value_j`), for j < k: error
/// feedback's residual -= decode(payload) without a pass over the residual. Indices as for
/// `scatter_sparse`.
template <class Index, real_gradient T>
void scatter_subtract_sparse(const host_backend& /*backend*/, const std::byte* indices,
                             const std::byte* values, std::size_t k, host_view<T> out) {
  detail::scatter_combine_sparse<-1, Index>(indices, values, k, out);
}

/// Gathers value j from index j of `in` (`values_j = in[index_j]`, unaligned `T`s at `values`),
/// for j < k: the exact values of coordinates chosen elsewhere (count sketch's second round,
/// algorithm/compressed/two_round.hpp). Indices as for `scatter_sparse`.
template <class Index, real_gradient T>
void gather_sparse(const host_backend& /*backend*/, host_view<const T> in, const std::byte* indices,
                   std::size_t k, std::byte* values) {
  for (std::size_t j = 0; j < k; ++j) {
    Index index;
    std::memcpy(&index, indices + j * sizeof(Index), sizeof index);
    const T value = in[static_cast<std::size_t>(index)];
    std::memcpy(values + j * sizeof(T), &value, sizeof value);
  }
}

/// The stratum layout of random-k: [0, count) split into k strata, the first count % k of
/// size count / k + 1, the rest of size count / k.
struct strata {
  std::size_t count = 0;
  std::size_t k = 0;

  /// The first element of stratum `j`.
  SQUALL_HOST_DEVICE std::size_t begin(std::size_t j) const {
    const std::size_t q = count / k, r = count % k;
    return j * q + (j < r ? j : r);
  }
  /// The number of elements of stratum `j`.
  SQUALL_HOST_DEVICE std::size_t size(std::size_t j) const {
    return count / k + (j < count % k ? 1 : 0);
  }
};

/// The element random-k picks in stratum `j`: begin(j) + mul_high(w, size(j)), w the 64-bit
/// word pair j % 2 of Philox block j / 2 of (seed, {step, shared_rank}), so every element of
/// the stratum is picked with probability 1 / size(j) to within size(j) / 2^64.
SQUALL_HOST_DEVICE inline std::size_t stratum_pick(strata s, std::uint64_t seed, std::uint64_t step,
                                                   std::size_t j) {
  return s.begin(j) + sample_position(seed, random_stream{step, shared_rank}, j, s.size(j));
}

/// Writes random-k's k indices (ascending, one per stratum) to `out`.
inline void randomk_indices(const host_backend& /*backend*/, std::size_t count, std::size_t k,
                            std::uint64_t seed, std::uint64_t step, host_view<std::size_t> out) {
  const strata s{count, k};
  for (std::size_t j = 0; j < k; ++j) out[j] = stratum_pick(s, seed, step, j);
}

/// Gathers random-k's values: `values[j] = in[pick(j)]` (unaligned `T`s).
template <real_gradient T>
void randomk_gather(const host_backend& /*backend*/, host_view<const T> in, std::size_t k,
                    std::uint64_t seed, std::uint64_t step, std::byte* values) {
  const strata s{in.count(), k};
  for (std::size_t j = 0; j < k; ++j) {
    const T v = in[stratum_pick(s, seed, step, j)];
    std::memcpy(values + j * sizeof(T), &v, sizeof v);
  }
}

/// Scatters random-k's values: `out[pick(j)] = values[j]`, every other element 0.
template <real_gradient T>
void randomk_scatter(const host_backend& /*backend*/, const std::byte* values, std::size_t k,
                     std::uint64_t seed, std::uint64_t step, host_view<T> out) {
  std::fill(out.begin(), out.end(), T(0));
  if (k == 0) return;
  const strata s{out.count(), k};
  for (std::size_t j = 0; j < k; ++j) {
    T v;
    std::memcpy(&v, values + j * sizeof(T), sizeof v);
    out[stratum_pick(s, seed, step, j)] = v;
  }
}

}  // namespace squall::kernels
