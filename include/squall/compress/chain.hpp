// SPDX-License-Identifier: Apache-2.0
#pragma once
/// `chain<Select, Values>`: a compressor built from two others (issue 17, after CocktailSGD:
/// Wang et al., "CocktailSGD: Fine-tuning Foundation Models over 500Mbps Networks", ICML 2023,
/// which chains random-k, top-k and quantization). `Select` picks what is sent (top-k or
/// random-k: indices, or a shared seed, and a dense array of k values); `Values` compresses
/// those k values as a tensor of its own (int8, int4, fp8, or another chain). So
/// `chain<randomk_compressor, chain<topk_compressor, int4_compressor>>` is CocktailSGD's
/// random-k 10%, then top-k 20% of those, then 4-bit values: by name "randomk:0.1>topk:0.2>int4".
///
/// The aggregation class comes from the parts: a chain's payloads are gathered, decoded and
/// summed (`aggregation::gather`); both parts linear (random-k's values cast to 16 bits) would
/// add, but that chain is not offered. Error feedback wraps a chain as any compressor:
/// the residual keeps what selection and quantization both left out.
///
/// Payload, after the 16-byte header (kind chain 16, parameter 0):
///
///   offset 16  u64 S   bytes of `Select`'s payload before its values (its header, k,
///                      indices or seed)
///   offset 24  u64 V   bytes of `Values`' payload
///   offset 32  those S bytes, then zeros up to a multiple of 8
///   then       `Values`' payload of the k values (V bytes)
///
/// Decode decodes the values, puts them back after the S bytes and decodes that as `Select`'s
/// payload: every check of both parts runs (k, indices, codes, sizes).

#include <squall/compress/payload.hpp>
#include <squall/compress/quantize.hpp>
#include <squall/compress/sparsify.hpp>
#include <squall/compress/traits.hpp>
#include <squall/concepts.hpp>
#include <squall/core/buffer.hpp>
#include <squall/core/error.hpp>
#include <squall/core/random.hpp>
#include <squall/core/types.hpp>
#include <squall/kernels/host/reduce.hpp>

#include <array>
#include <cstddef>  // byte, size_t
#include <cstdint>
#include <cstring>  // memcpy
#include <limits>
#include <string>
#include <string_view>
#include <utility>  // pair
#include <vector>

namespace squall {

/// Where a selecting compressor's payload keeps its k values, a dense array of T: `of(c,
/// head, count)` gives their offset and k from the payload's first `head_bytes` bytes (on the
/// host) and the tensor's count (a k above the count comes back as count + 1, refused);
/// `most(c, count)` the largest k. Specialized for top-k and random-k.
template <class C>
struct selected_values;

template <>
struct selected_values<topk_compressor> {
  static constexpr std::size_t head_bytes = 24;
  /// The payload's own k (offset 16): the sampled threshold may send fewer than `entries`.
  template <class T>
  static std::pair<std::size_t, std::size_t> of(const topk_compressor& /*c*/, const std::byte* head,
                                                std::size_t count) {
    std::uint64_t k = 0;
    std::memcpy(&k, head + 16, 8);
    if (k > count) return {std::numeric_limits<std::size_t>::max(), count + 1};  // refused
    return {24 + static_cast<std::size_t>(k) * detail::sparse_index_bytes(count),
            static_cast<std::size_t>(k)};
  }
  static std::size_t most(const topk_compressor& c, std::size_t count) { return c.entries(count); }
};

template <>
struct selected_values<randomk_compressor> {
  static constexpr std::size_t head_bytes = 40;
  template <class T>
  static std::pair<std::size_t, std::size_t> of(const randomk_compressor& c,
                                                const std::byte* /*head*/, std::size_t count) {
    return {40, c.entries(count)};
  }
  static std::size_t most(const randomk_compressor& c, std::size_t count) {
    return c.entries(count);
  }
};

namespace detail {
/// "first>second" as a constant string.
template <class A, class B>
struct chain_name {
  static constexpr std::size_t size = A::name.size() + 1 + B::name.size();
  static constexpr std::array<char, size> text = [] {
    std::array<char, size> t{};
    std::size_t at = 0;
    for (const char ch : A::name) t[at++] = ch;
    t[at++] = '>';
    for (const char ch : B::name) t[at++] = ch;
    return t;
  }();
  static constexpr std::string_view value{text.data(), size};
};
}  // namespace detail

/// `Select`, then `Values` on what it selected (see the file comment). Runtime parameters: the
/// two parts (`select`, `values`), each with its own.
template <class Select, class Values>
requires requires { sizeof(selected_values<Select>); }
struct chain {
  static constexpr std::string_view name = detail::chain_name<Select, Values>::value;
  static constexpr aggregation_set aggregations{aggregation::gather};
  static constexpr bool fixed_size =
      compression_traits<Select>::fixed_size && compression_traits<Values>::fixed_size;
  static constexpr payload_kind kind = payload_kind::chain;
  static constexpr std::size_t prefix_bytes = payload_header::bytes + 16;

  Select select{};
  Values values{};

  /// The payload's bound: the prefix, `Select`'s bound (its values included, an
  /// overestimate), and `Values`' bound for the most values `Select` sends.
  std::size_t max_payload_bytes(dtype type, std::size_t count) const {
    const std::size_t a = select.max_payload_bytes(type, count);
    const std::size_t b =
        values.max_payload_bytes(type, selected_values<Select>::most(select, count));
    constexpr std::size_t max = std::numeric_limits<std::size_t>::max();
    if (a > max / 2 - prefix_bytes - 8 || b > max / 2) {
      throw invalid_argument({.operation = name},
                             "payload size of " + std::to_string(count) + " elements overflows");
    }
    return prefix_bytes + round8(a) + b;
  }

  /// Encodes `in` with `Select` into scratch, then its k values with `Values` into the
  /// payload after the selection's own bytes; returns the size. Both parts draw from
  /// `stream`. Throws what either part throws, or `invalid_argument` for too small a payload.
  template <class B, real_gradient T>
  std::size_t encode(const B& backend, buffer_view<const T, typename B::memory_space> in,
                     buffer_view<std::byte, typename B::memory_space> payload,
                     random_stream stream = {}) const {
    using M = typename B::memory_space;
    const std::size_t count = in.count();
    const std::size_t bound = max_payload_bytes(dtype_of<T>, count);
    if (payload.count() < bound) {
      throw invalid_argument({.operation = name}, "payload buffer of " +
                                                      std::to_string(payload.count()) +
                                                      " bytes for " + std::to_string(bound));
    }
    require_payload_alignment(name, payload.data(), 8);
    // the selection, read back to the host: its head bytes and its values
    const std::size_t a_bound = select.max_payload_bytes(dtype_of<T>, count);
    auto a = allocate_scratch<std::uint64_t>(backend, (a_bound + 7) / 8);
    const std::size_t a_size = select.encode(
        backend, in, buffer_view<std::byte, M>(reinterpret_cast<std::byte*>(a.data()), a_bound),
        stream);
    std::vector<std::byte> selected(a_size);
    load_bytes(backend, selected.data(), reinterpret_cast<const std::byte*>(a.data()), a_size);
    const auto [offset, k] = values_of<T>(selected.data(), a_size, count);
    // the k values, aligned, in the backend's memory
    auto v = allocate_scratch<T>(backend, k);
    store_bytes(backend, reinterpret_cast<std::byte*>(v.data()), selected.data() + offset,
                k * sizeof(T));
    const std::size_t at = prefix_bytes + round8(offset);
    const std::size_t b_size = values.encode(backend, buffer_view<const T, M>(v.data(), k),
                                             payload.subview(at, payload.count() - at), stream);
    std::vector<std::byte> head(at, std::byte{0});
    write_payload_header({.kind = kind, .type = dtype_of<T>, .count = count}, head.data());
    const std::uint64_t sizes[2] = {offset, b_size};
    std::memcpy(head.data() + payload_header::bytes, sizes, sizeof sizes);
    std::memcpy(head.data() + prefix_bytes, selected.data(), offset);
    store_bytes(backend, payload.data(), head.data(), at);
    return at + b_size;
  }

  /// Decodes `Values`' payload into k values, puts them after the selection's bytes and
  /// decodes that with `Select` into `out`. Throws `invalid_argument` naming the first fault
  /// (the sizes, or what either part's decode finds).
  template <class B, real_gradient T>
  void decode(const B& backend, buffer_view<const std::byte, typename B::memory_space> payload,
              buffer_view<T, typename B::memory_space> out) const {
    using M = typename B::memory_space;
    const error_context where{.operation = name};
    const std::size_t size = payload.count();
    const std::size_t count = out.count();
    std::byte head[prefix_bytes] = {};
    load_bytes(backend, head, payload.data(), size < prefix_bytes ? size : prefix_bytes);
    read_payload_header(name, head, size, kind, dtype_of<T>, count);
    if (size < prefix_bytes) {
      throw invalid_argument(
          where, "payload of " + std::to_string(size) + " bytes ends inside its two sizes");
    }
    std::uint64_t sizes[2] = {};
    std::memcpy(sizes, head + payload_header::bytes, sizeof sizes);
    const std::size_t a_bound = select.max_payload_bytes(dtype_of<T>, count);
    if (sizes[0] < selected_values<Select>::head_bytes || sizes[0] > a_bound || sizes[1] > size ||
        prefix_bytes + round8(static_cast<std::size_t>(sizes[0])) !=
            size - static_cast<std::size_t>(sizes[1])) {
      throw invalid_argument(where, "payload of " + std::to_string(size) + " bytes with " +
                                        std::to_string(sizes[0]) + " selection bytes and " +
                                        std::to_string(sizes[1]) + " value bytes");
    }
    const auto offset = static_cast<std::size_t>(sizes[0]);
    std::vector<std::byte> selected(offset);
    load_bytes(backend, selected.data(), payload.data() + prefix_bytes, offset);
    const auto [values_at, k] = values_of<T>(selected.data(), a_bound, count);
    if (values_at != offset) {
      throw invalid_argument(where, "selection of " + std::to_string(offset) +
                                        " bytes where its k gives " + std::to_string(values_at));
    }
    auto v = allocate_scratch<T>(backend, k);
    const std::size_t at = prefix_bytes + round8(offset);
    values.decode(backend, buffer_view<const std::byte, M>(payload.data() + at, size - at),
                  buffer_view<T, M>(v.data(), k));
    selected.resize(offset + k * sizeof(T));
    load_bytes(backend, selected.data() + offset, reinterpret_cast<const std::byte*>(v.data()),
               k * sizeof(T));
    auto a = allocate_scratch<std::uint64_t>(backend, (selected.size() + 7) / 8);
    store_bytes(backend, reinterpret_cast<std::byte*>(a.data()), selected.data(), selected.size());
    select.decode(backend,
                  buffer_view<const std::byte, M>(reinterpret_cast<const std::byte*>(a.data()),
                                                  selected.size()),
                  out);
  }

 private:
  static constexpr std::size_t round8(std::size_t n) { return (n + 7) / 8 * 8; }

  /// The offset and k of the selection's values, checked against its size (`bytes`).
  template <class T>
  std::pair<std::size_t, std::size_t> values_of(const std::byte* selected, std::size_t bytes,
                                                std::size_t count) const {
    if (bytes < selected_values<Select>::head_bytes) {
      throw invalid_argument({.operation = name},
                             "selection of " + std::to_string(bytes) + " bytes has no k");
    }
    const auto [offset, k] = selected_values<Select>::template of<T>(select, selected, count);
    if (k > count || offset > bytes || k > (bytes - offset) / sizeof(T)) {
      throw invalid_argument({.operation = name}, "selection of " + std::to_string(k) +
                                                      " values in " + std::to_string(bytes) +
                                                      " bytes for " + std::to_string(count));
    }
    return {offset, k};
  }
};

}  // namespace squall
