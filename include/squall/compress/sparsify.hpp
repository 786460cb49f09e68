// SPDX-License-Identifier: Apache-2.0
#pragma once
/// The sparsifying compressors: `topk_compressor` (the k largest magnitudes, exact or by DGC's
/// sampled threshold), `randomk_compressor` (k stratified random elements from a shared seed)
/// and `threshold_compressor` (Strom's +-tau). docs/compressors.md describes them for users.
///
/// Sparse payload (topk, threshold), little-endian, after the 16-byte header of
/// compress/payload.hpp (kind topk 8 or threshold 10, dtype, count):
///
///   offset 16            u64 k: the number of entries (k <= count)
///   offset 24            k indices, strictly increasing, each < count: u32 when
///                        count <= 2^32, else u64 (`sparse_index_bytes(count)`)
///   offset 24 + k x I    k values of T (float or double); threshold sends +-tau here
///
/// Size 24 + k x (I + sizeof(T)) bytes: on the wire, (192 + k x (8 I + 8 sizeof(T))) / count
/// bits per element (128 header + 64 k bits), e.g. (192 + 64 k) / count for float with u32
/// indices. Decode zeroes `out` and scatters the values.
///
/// Random-k payload (kind randomk 9), after the header:
///
///   offset 16  u64 seed   offset 24  u64 step   offset 32  u64 k
///   offset 40  k values of T, one per stratum, in stratum order (no indices)
///
/// Size 40 + k x sizeof(T) bytes: (320 + 8 k sizeof(T)) / count bits per element. Decode
/// regenerates the indices from the payload's own seed and step.
///
/// Decoders check every field before reading what it describes, so no payload, whatever its
/// bytes, makes them read or write out of bounds; each fault throws `invalid_argument` naming it.

#include <squall/compress/payload.hpp>
#include <squall/concepts.hpp>
#include <squall/core/buffer.hpp>
#include <squall/core/error.hpp>
#include <squall/core/random.hpp>
#include <squall/core/types.hpp>
#include <squall/kernels/host/reduce.hpp>
#include <squall/kernels/host/select.hpp>

#include <algorithm>  // fill, clamp
#include <cmath>      // isfinite, nextafter, round
#include <cstddef>    // byte, size_t
#include <cstdint>
#include <cstring>  // memcpy
#include <limits>
#include <string>
#include <string_view>
#include <vector>

namespace squall {

namespace detail {

/// The number of entries for `ratio` of `count` elements: 0 for count 0, else
/// max(1, round(ratio x count)) clamped to count. Throws `invalid_argument` (naming
/// `operation`) unless ratio is finite and >= 0.
inline std::size_t sparse_k(std::string_view operation, double ratio, std::size_t count) {
  if (!std::isfinite(ratio) || ratio < 0) {
    throw invalid_argument({.operation = operation},
                           "ratio " + std::to_string(ratio) + " is not a finite value >= 0");
  }
  if (count == 0) return 0;
  const double x = std::round(ratio * static_cast<double>(count));
  if (x >= static_cast<double>(count)) return count;
  return std::max<std::size_t>(1, static_cast<std::size_t>(x));
}

/// Bytes of one index in a sparse payload of `count` elements: 4 up to 2^32 elements, else 8.
constexpr std::size_t sparse_index_bytes(std::size_t count) {
  return static_cast<std::uint64_t>(count) <= (std::uint64_t{1} << 32) ? 4 : 8;
}

/// 16 + `fixed` + k x `entry` bytes; throws `invalid_argument` if that overflows.
inline std::size_t payload_bytes(std::string_view operation, std::size_t fixed, std::size_t k,
                                 std::size_t entry) {
  constexpr std::size_t max = std::numeric_limits<std::size_t>::max();
  if (entry == 0 || k > (max - payload_header::bytes - fixed) / entry) {
    throw invalid_argument({.operation = operation},
                           "payload of " + std::to_string(k) + " entries overflows");
  }
  return payload_header::bytes + fixed + k * entry;
}

/// Writes the header and k of a sparse payload of `k` entries (built on the host, stored with
/// the backend's `store_bytes`), then calls `write(Index{}, indices, values)` to fill its index
/// and value arrays (Index u32 or u64 as the layout says; pointers into the payload, in the
/// backend's memory), which returns how many entries it wrote (k). Returns the payload's size.
template <class B, real_gradient T, class Write>
std::size_t encode_sparse(const B& backend, std::string_view operation, payload_kind kind,
                          buffer_view<const T, typename B::memory_space> in,
                          buffer_view<std::byte, typename B::memory_space> payload, std::size_t k,
                          Write write) {
  const std::size_t count = in.count();
  const std::size_t index_bytes = sparse_index_bytes(count);
  const std::size_t size = payload_bytes(operation, 8, k, index_bytes + sizeof(T));
  require_room(operation, payload.count(), size);
  std::byte head[24] = {};
  write_payload_header({.kind = kind, .type = dtype_of<T>, .count = count}, head);
  const std::uint64_t k64 = k;
  std::memcpy(head + 16, &k64, 8);
  store_bytes(backend, payload.data(), head, sizeof head);
  std::byte* indices = payload.data() + 24;
  std::byte* values = indices + k * index_bytes;
  std::size_t written = 0;
  if (k != 0) {
    written = index_bytes == 4 ? write(std::uint32_t{}, indices, values)
                               : write(std::uint64_t{}, indices, values);
  }
  if (written != k) {
    throw error(make_error_code(errc::internal), {.operation = operation},
                "selected " + std::to_string(written) + " entries where " + std::to_string(k) +
                    " were counted");
  }
  return size;
}

/// Writes a sparse payload of the elements `cut` selects (sign x `level`, NaN kept, if
/// `quantize`); returns its size.
template <class B, real_gradient T>
std::size_t encode_cut(const B& backend, std::string_view operation, payload_kind kind,
                       buffer_view<const T, typename B::memory_space> in,
                       buffer_view<std::byte, typename B::memory_space> payload,
                       const kernels::selection_cut<T>& cut, bool quantize = false,
                       T level = T(0)) {
  return encode_sparse(backend, operation, kind, in, payload, cut.count,
                       [&](auto index, std::byte* indices, std::byte* values) {
                         return write_selected<decltype(index)>(backend, in, cut.key, cut.ties,
                                                                indices, values, quantize, level);
                       });
}

/// Throws `invalid_argument` naming the first index of the `k` at `indices` (in the backend's
/// memory) that is out of range or not above the one before it.
template <class Index, class B>
void check_sparse_indices(const B& backend, std::string_view operation, const std::byte* indices,
                          std::size_t k, std::size_t count) {
  const std::size_t j = sparse_index_fault<Index>(backend, indices, k, count);
  if (j == k) return;
  Index pair[2] = {};  // the index before position j, and j's
  const std::size_t first = j == 0 ? 0 : j - 1;
  load_bytes(backend, pair + (j == 0 ? 1 : 0), indices + first * sizeof(Index),
             (j - first + 1) * sizeof(Index));
  const std::uint64_t index = pair[1];
  const std::uint64_t previous = pair[0];
  if (index >= count) {
    throw invalid_argument({.operation = operation},
                           "index " + std::to_string(index) + " at position " + std::to_string(j) +
                               " is out of range for " + std::to_string(count) + " elements");
  }
  throw invalid_argument({.operation = operation},
                         "index " + std::to_string(index) + " at position " + std::to_string(j) +
                             (index == previous ? " repeats" : " is not above") + " the previous " +
                             std::to_string(previous));
}

/// How `decode_sparse` writes the entries: into a zeroed `out`, or added to or subtracted
/// from what `out` holds (`decode_add`, `decode_subtract`).
enum class sparse_write { assign, add, subtract };

/// Decodes a sparse payload of `kind` into `out`: checks the header, k <= count, the exact
/// size and every index (in range, strictly increasing) before writing anything, then zeroes
/// `out` and scatters, or adds or subtracts each entry (`how`). Throws `invalid_argument`
/// naming the first fault; `out` is untouched then.
template <class B, real_gradient T>
void decode_sparse(const B& backend, std::string_view operation, payload_kind kind,
                   buffer_view<const std::byte, typename B::memory_space> payload,
                   buffer_view<T, typename B::memory_space> out,
                   sparse_write how = sparse_write::assign) {
  const std::size_t size = payload.count();
  const std::size_t count = out.count();
  std::byte head[24] = {};  // header and k, copied to the host and checked there
  load_bytes(backend, head, payload.data(), size < sizeof head ? size : sizeof head);
  read_payload_header(operation, head, size, kind, dtype_of<T>, count);
  const error_context where{.operation = operation};
  if (size < 24) {
    throw invalid_argument(
        where, "payload of " + std::to_string(size) + " bytes ends before its entry count");
  }
  std::uint64_t k64 = 0;
  std::memcpy(&k64, head + 16, 8);
  if (k64 > count) {
    throw invalid_argument(where, "payload of " + std::to_string(k64) + " entries for " +
                                      std::to_string(count) + " elements");
  }
  const auto k = static_cast<std::size_t>(k64);
  const std::size_t index_bytes = sparse_index_bytes(count);
  const std::size_t entry = index_bytes + sizeof(T);
  if (k > (size - 24) / entry || size != 24 + k * entry) {
    throw invalid_argument(where, "payload of " + std::to_string(size) + " bytes for " +
                                      std::to_string(k) + " entries (" + std::to_string(entry) +
                                      " bytes each after 24)");
  }
  const std::byte* indices = payload.data() + 24;
  const std::byte* values = indices + k * index_bytes;
  const auto write = [&]<class Index>() {
    check_sparse_indices<Index>(backend, operation, indices, k, count);
    if (how == sparse_write::add) {
      scatter_add_sparse<Index>(backend, indices, values, k, out);
    } else if (how == sparse_write::subtract) {
      scatter_subtract_sparse<Index>(backend, indices, values, k, out);
    } else {
      scatter_sparse<Index>(backend, indices, values, k, out);
    }
  };
  if (index_bytes == 4) {
    write.template operator()<std::uint32_t>();
  } else {
    write.template operator()<std::uint64_t>();
  }
}

}  // namespace detail

/// How `topk_compressor` finds its k elements.
enum class topk_method {
  /// The exact k largest magnitudes (a radix select on the magnitudes' bits).
  exact,
  /// Deep Gradient Compression's sampled threshold: approximate, at most k elements.
  sampled_threshold,
};

/// Sends the k = max(1, round(`ratio` x count)) elements of largest magnitude (clamped to
/// count; 0 for count 0) as (index, value) pairs in ascending index order (Aji and Heafield,
/// "Sparse Communication for Distributed Gradient Descent", EMNLP 2017; with
/// `error_feedback`, Stich et al., "Sparsified SGD with Memory", NeurIPS 2018). Aggregation
/// sparse: payloads are gathered, decoded and summed. Layout: the sparse payload above.
///
/// `topk_method::exact`: the k largest |g|; ties at the k-th magnitude go to the lower index.
/// NaN ranks above every other magnitude (its bits do) and is sent as it is, so it propagates
/// to the sum; infinities rank next. Set `check_finite` to have encode throw instead.
///
/// `topk_method::sampled_threshold` (Lin et al., "Deep Gradient Compression", ICLR 2018):
/// max(1, round(`sample_ratio` x count)) magnitudes are drawn at Philox positions (keyed by
/// `seed` and the encode's `random_stream`), the k-th largest magnitude is estimated from them,
/// and every element at or above the estimate is sent; if more than k pass, their exact top k
/// is sent, as DGC does. The payload may hold fewer than k entries.
struct topk_compressor {
  static constexpr std::string_view name = "topk";
  static constexpr aggregation_set aggregations{aggregation::gather, aggregation::gtopk};
  static constexpr payload_kind kind = payload_kind::topk;

  /// The fraction of elements sent (>= 0, finite; values above 1 send everything).
  double ratio = 0.01;
  /// Exact top-k, or DGC's sampled threshold.
  topk_method method = topk_method::exact;
  /// The fraction of elements the sampled threshold draws (> 0, finite; clamped to 1).
  double sample_ratio = 0.01;
  /// Keys the sampled threshold's draws.
  std::uint64_t seed = 0;
  /// When set, encode throws `invalid_argument` naming the first NaN or infinite element.
  bool check_finite = false;

  /// The number of entries sent for `count` elements (k above); throws `invalid_argument` for
  /// a negative or non-finite ratio.
  std::size_t entries(std::size_t count) const { return detail::sparse_k(name, ratio, count); }

  /// 24 + k x (index bytes + element bytes); throws `invalid_argument` on overflow or a bad
  /// ratio.
  std::size_t max_payload_bytes(dtype type, std::size_t count) const {
    return detail::payload_bytes(name, 8, entries(count),
                                 detail::sparse_index_bytes(count) + size_of(type));
  }

  /// Writes the sparse payload of `in`'s top k; returns its size. Throws `invalid_argument` if
  /// `payload` is too small, a parameter is out of range, or (with `check_finite`) an element
  /// is not finite. `stream` keys the sampled threshold's draws.
  template <class B, real_gradient T>
  std::size_t encode(const B& backend, buffer_view<const T, typename B::memory_space> in,
                     buffer_view<std::byte, typename B::memory_space> payload,
                     random_stream stream = {}) const {
    if (check_finite) require_finite(backend, name, in);
    const std::size_t count = in.count();
    const std::size_t k = entries(count);
    if (k != 0 && method == topk_method::sampled_threshold) {
      if (!std::isfinite(sample_ratio) || sample_ratio <= 0) {
        throw invalid_argument({.operation = name}, "sample_ratio " + std::to_string(sample_ratio) +
                                                        " is not a finite value > 0");
      }
      const std::size_t samples = detail::sparse_k(name, sample_ratio, count);
      const auto cut = sampled_cut(backend, in, k, samples, seed, stream);
      if (cut) return detail::encode_cut(backend, name, kind, in, payload, *cut);
      // more than k passed the estimate: send their exact top k, the top k of `in`
    }
    return detail::encode_sparse(backend, name, kind, in, payload, k,
                                 [&](auto index, std::byte* indices, std::byte* values) {
                                   return select_topk<decltype(index)>(backend, in, k, indices,
                                                                       values);
                                 });
  }

  /// Zeroes `out` and scatters the payload's entries into it, after checking the header, k,
  /// the size and every index. Throws `invalid_argument` naming the fault (`out` untouched).
  template <class B, real_gradient T>
  void decode(const B& backend, buffer_view<const std::byte, typename B::memory_space> payload,
              buffer_view<T, typename B::memory_space> out) const {
    detail::decode_sparse(backend, name, kind, payload, out);
  }
  /// `out += decode(payload)`, touching only the payload's k elements (the gather path's sum:
  /// one pass over the result instead of one per rank); checks as `decode` does.
  template <class B, real_gradient T>
  void decode_add(const B& backend, buffer_view<const std::byte, typename B::memory_space> payload,
                  buffer_view<T, typename B::memory_space> out) const {
    detail::decode_sparse(backend, name, kind, payload, out, detail::sparse_write::add);
  }
  /// `out -= decode(payload)`, touching only the payload's k elements (error feedback's
  /// residual update without a pass over the residual); checks as `decode` does.
  template <class B, real_gradient T>
  void decode_subtract(const B& backend,
                       buffer_view<const std::byte, typename B::memory_space> payload,
                       buffer_view<T, typename B::memory_space> out) const {
    detail::decode_sparse(backend, name, kind, payload, out, detail::sparse_write::subtract);
  }
};
static_assert(compressor<topk_compressor>);

/// Sends k = max(1, round(`ratio` x count)) elements (clamped to count) picked at random, the
/// same on every rank: [0, count) is split into k strata of nearly equal size (the first
/// count % k hold count / k + 1 elements, the rest count / k) and one element is picked per
/// stratum from Philox keyed by `seed` and `random_stream{stream.step, shared_rank}`, so each
/// element of a stratum of size s is picked with probability 1 / s (to within s / 2^64).
/// Values are sent unscaled, so the estimate is biased by k / count: use it with
/// `error_feedback` (Stich et al., "Sparsified SGD with Memory", NeurIPS 2018).
///
/// Aggregation linear: ranks encoding the same step with the same seed pick the same
/// indices, so summing the value arrays of their payloads (the body from offset 40; the
/// seed, step and k fields are equal and are not summed) gives the payload of the sum. Fixed
/// size: 40 + k x sizeof(T) bytes. Decode regenerates the indices from the payload's own seed
/// and step, and checks that its k is what this compressor's ratio gives for count. NaN and
/// infinities are sent as they are (`check_finite` makes encode throw instead).
struct randomk_compressor {
  static constexpr std::string_view name = "randomk";
  static constexpr aggregation_set aggregations{aggregation::linear, aggregation::gather};
  static constexpr bool fixed_size = true;
  static constexpr payload_kind kind = payload_kind::randomk;

  /// The fraction of elements sent (>= 0, finite; values above 1 send everything).
  double ratio = 0.01;
  /// Keys the index draws; must be the same on every rank.
  std::uint64_t seed = 0;
  /// When set, encode throws `invalid_argument` naming the first NaN or infinite element.
  bool check_finite = false;

  /// The number of values sent for `count` elements (k above).
  std::size_t entries(std::size_t count) const { return detail::sparse_k(name, ratio, count); }

  /// 40 + k x element bytes (exact); throws `invalid_argument` on overflow or a bad ratio.
  std::size_t max_payload_bytes(dtype type, std::size_t count) const {
    return detail::payload_bytes(name, 24, entries(count), size_of(type));
  }

  /// The k indices this compressor picks for `count` elements at `step`, ascending.
  std::vector<std::size_t> indices(std::size_t count, std::uint64_t step) const {
    std::vector<std::size_t> out(entries(count));
    kernels::randomk_indices(host_backend{}, count, out.size(), seed, step,
                             host_view<std::size_t>(out));
    return out;
  }

  /// Writes the header, seed, `stream.step`, k and the picked values; returns the size.
  /// `stream.rank` is not used (every rank draws alike). Throws `invalid_argument` if
  /// `payload` is too small or (with `check_finite`) an element is not finite.
  template <class B, real_gradient T>
  std::size_t encode(const B& backend, buffer_view<const T, typename B::memory_space> in,
                     buffer_view<std::byte, typename B::memory_space> payload,
                     random_stream stream = {}) const {
    if (check_finite) require_finite(backend, name, in);
    const std::size_t k = entries(in.count());
    const std::size_t size = detail::payload_bytes(name, 24, k, sizeof(T));
    detail::require_room(name, payload.count(), size);
    std::byte head[40] = {};  // header, seed, step, k
    write_payload_header({.kind = kind, .type = dtype_of<T>, .count = in.count()}, head);
    const std::uint64_t fields[3] = {seed, stream.step, k};
    std::memcpy(head + 16, fields, sizeof fields);
    store_bytes(backend, payload.data(), head, sizeof head);
    randomk_gather(backend, in, k, seed, stream.step, payload.data() + 40);
    return size;
  }

  /// Zeroes `out` and writes each value at the index its stratum's draw picks (from the
  /// payload's seed and step). Throws `invalid_argument` if the header, k or the size is wrong
  /// (`out` untouched).
  template <class B, real_gradient T>
  void decode(const B& backend, buffer_view<const std::byte, typename B::memory_space> payload,
              buffer_view<T, typename B::memory_space> out) const {
    const std::size_t size = payload.count();
    const std::size_t count = out.count();
    std::byte head[40] = {};  // header, seed, step, k: copied to the host and checked there
    load_bytes(backend, head, payload.data(), size < sizeof head ? size : sizeof head);
    read_payload_header(name, head, size, kind, dtype_of<T>, count);
    const error_context where{.operation = name};
    if (size < 40) {
      throw invalid_argument(
          where, "payload of " + std::to_string(size) + " bytes ends before its seed, step and k");
    }
    std::uint64_t fields[3];
    std::memcpy(fields, head + 16, sizeof fields);
    const std::size_t k = entries(count);
    if (fields[2] != k) {
      throw invalid_argument(where, "payload of " + std::to_string(fields[2]) +
                                        " values where ratio " + std::to_string(ratio) + " gives " +
                                        std::to_string(k) + " for " + std::to_string(count) +
                                        " elements");
    }
    if (size != 40 + k * sizeof(T)) {  // k <= count, and out's bytes fit in size_t
      throw invalid_argument(where, "payload of " + std::to_string(size) + " bytes for " +
                                        std::to_string(k) + " values");
    }
    randomk_scatter(backend, payload.data() + 40, k, fields[0], fields[1], out);
  }
};
static_assert(compressor<randomk_compressor>);

/// Sends every element with |g| >= `tau` as sign(g) x tau, in the sparse payload above (Strom,
/// "Scalable Distributed DNN Training Using Commodity GPU Cloud Computing", Interspeech 2015;
/// Strom keeps the rest as a residual: use `error_feedback`). The test is exact: |g| >= tau
/// as real numbers. The value sent is tau rounded to T (infinity if tau exceeds T's range).
/// The number of entries depends on the data; `max_payload_bytes` bounds the worst case, all
/// count elements. Infinities pass and are sent as +-tau; NaN ranks above every magnitude, so
/// it passes and is sent as NaN (it propagates); `check_finite` makes encode throw instead.
struct threshold_compressor {
  static constexpr std::string_view name = "threshold";
  static constexpr aggregation_set aggregations{aggregation::gather, aggregation::gtopk};
  static constexpr payload_kind kind = payload_kind::threshold;

  /// The threshold and the magnitude sent; must be finite and > 0 (encode throws
  /// `invalid_argument` otherwise). Model-dependent: tune it (Strom picks it per model).
  double tau = 0.01;
  /// When set, encode throws `invalid_argument` naming the first NaN or infinite element.
  bool check_finite = false;

  /// Element by element: any chunk encodes as the whole tensor does.
  std::size_t chunk_alignment() const { return 1; }

  /// 24 + count x (index bytes + element bytes): every element passing; throws
  /// `invalid_argument` on overflow.
  std::size_t max_payload_bytes(dtype type, std::size_t count) const {
    return detail::payload_bytes(name, 8, count, detail::sparse_index_bytes(count) + size_of(type));
  }

  /// Writes the sparse payload of the elements with |g| >= tau; returns its size. Throws
  /// `invalid_argument` for a bad tau, a too small `payload`, or (with `check_finite`) an
  /// element that is not finite. Deterministic: the stream is not used.
  template <class B, real_gradient T>
  std::size_t encode(const B& backend, buffer_view<const T, typename B::memory_space> in,
                     buffer_view<std::byte, typename B::memory_space> payload,
                     random_stream /*stream*/ = {}) const {
    if (!std::isfinite(tau) || !(tau > 0)) {
      throw invalid_argument({.operation = name},
                             "tau " + std::to_string(tau) + " is not a finite value > 0");
    }
    if (check_finite) require_finite(backend, name, in);
    // The smallest T at or above tau: |g| >= it in T exactly when |g| >= tau.
    const bool beyond = tau > static_cast<double>(std::numeric_limits<T>::max());
    T low = beyond ? std::numeric_limits<T>::infinity() : static_cast<T>(tau);
    if (static_cast<double>(low) < tau)
      low = std::nextafter(low, std::numeric_limits<T>::infinity());
    const T level = beyond ? std::numeric_limits<T>::infinity() : static_cast<T>(tau);
    const auto key = kernels::magnitude_key(low);  // > 0, as low > 0
    kernels::selection_cut<T> cut{.key = static_cast<kernels::magnitude_key_type<T>>(key - 1),
                                  .ties = 0,
                                  .count = count_at_least(backend, in, key)};
    return detail::encode_cut(backend, name, kind, in, payload, cut, true, level);
  }

  /// Zeroes `out` and scatters the payload's entries; checks as topk's decode does.
  template <class B, real_gradient T>
  void decode(const B& backend, buffer_view<const std::byte, typename B::memory_space> payload,
              buffer_view<T, typename B::memory_space> out) const {
    detail::decode_sparse(backend, name, kind, payload, out);
  }
  /// `out += decode(payload)` on the payload's entries only, as topk's `decode_add`.
  template <class B, real_gradient T>
  void decode_add(const B& backend, buffer_view<const std::byte, typename B::memory_space> payload,
                  buffer_view<T, typename B::memory_space> out) const {
    detail::decode_sparse(backend, name, kind, payload, out, detail::sparse_write::add);
  }
  /// `out -= decode(payload)` on the payload's entries only, as topk's `decode_subtract`.
  template <class B, real_gradient T>
  void decode_subtract(const B& backend,
                       buffer_view<const std::byte, typename B::memory_space> payload,
                       buffer_view<T, typename B::memory_space> out) const {
    detail::decode_sparse(backend, name, kind, payload, out, detail::sparse_write::subtract);
  }
};
static_assert(compressor<threshold_compressor>);

}  // namespace squall
