// SPDX-License-Identifier: Apache-2.0
#pragma once
/// The bucketed quantizers: `int8_compressor` (max-abs scale, nearest level), the 8-bit floats
/// `fp8_compressor` (E4M3 or E5M2, to nearest or stochastic), `sign_compressor`
/// (1 bit and a mean-|g| scale per bucket: 1-bit SGD, EF-SignSGD), `sign_vote_compressor`
/// (signSGD with majority vote), `terngrad_compressor` ({-1, 0, +1} x max |g|, stochastic) and
/// `qsgd_compressor<Levels>` (L2 norm, stochastic rounding to `Levels` levels). One policy
/// template, `quantize_compressor<Scheme>`, with the loops in kernels/host/quantize.hpp.
///
/// Payload (docs/compressors.md): the 16-byte header (parameter 0), then
///   offset 16  u64 bucket   elements per bucket (the last bucket may be shorter)
///   offset 24  u32 levels   s of the scheme      offset 28  u32 reserved (0)
///   offset 32  ceil(count / bucket) scales of T
///   then       ceil(count x width / 8) bytes of codes, element k at bits [k w, (k + 1) w),
///              low bits first; code = q + s for the signed level q in [-s, s] (sign: 1 bit,
///              1 for negative).
/// A value decodes as (code - s) x scale / s (sign: +-scale).

#include <squall/compress/payload.hpp>
#include <squall/compress/traits.hpp>
#include <squall/concepts.hpp>
#include <squall/core/buffer.hpp>
#include <squall/core/error.hpp>
#include <squall/core/random.hpp>
#include <squall/core/types.hpp>
#include <squall/kernels/host/quantize.hpp>
#include <squall/kernels/host/reduce.hpp>

#include <cstddef>  // byte, size_t
#include <cstdint>
#include <cstring>  // memcpy
#include <limits>
#include <string>
#include <string_view>

namespace squall {

/// What a quantizer is: a type with static constexpr `name`, `kind` (payload_kind),
/// `aggregations`, `scheme` (kernels::quantize_scheme) and `default_bucket` (0: one bucket for
/// the whole tensor), and optionally `majority_vote`.
template <class S>
concept quantizer_spec = requires {
  { S::name } -> std::convertible_to<std::string_view>;
  { S::kind } -> std::convertible_to<payload_kind>;
  { S::aggregations } -> std::convertible_to<aggregation_set>;
  { S::scheme } -> std::convertible_to<kernels::quantize_scheme>;
  { S::default_bucket } -> std::convertible_to<std::uint64_t>;
};

/// A bucketed quantizer. Runtime parameters: `bucket` (elements per scale, a multiple of 8, or
/// 0 for one bucket), `seed` (stochastic schemes' Philox key), `check_finite` (throw on a
/// NaN or Inf input instead of propagating it) and `fit_scale` (least-squares scales). Fixed
/// size for a given count and bucket.
///
/// NaN and Inf: with `check_finite` false, a bucket holding a NaN or an Inf is sent with a NaN
/// scale and decodes to all NaN (the bad value propagates to its bucket, nothing else);
/// with `check_finite` true, encode throws `invalid_argument` naming the first such element.
template <quantizer_spec Spec>
struct quantize_compressor {
  static constexpr std::string_view name = Spec::name;
  static constexpr aggregation_set aggregations = Spec::aggregations;
  /// sign_vote: the gathered payloads are summed as a majority vote (a spec may omit it)
  static constexpr bool majority_vote = compression_traits<Spec>::majority_vote;
  static constexpr bool fixed_size = true;
  static constexpr payload_kind kind = Spec::kind;
  static constexpr kernels::quantize_scheme scheme = Spec::scheme;
  static constexpr std::size_t prefix_bytes = 16;  // bucket, levels, reserved

  std::uint64_t bucket = Spec::default_bucket;
  std::uint64_t seed = 0;
  bool check_finite = false;
  /// Integer levels only (int8, int4, TernGrad, QSGD): each bucket's scale refitted to its
  /// codes by least squares (s x sum q v / sum q^2, the codes unchanged), so that the decoded
  /// bucket is nearer the input than 0 is: a contraction, as error feedback needs, where
  /// TernGrad and QSGD at few levels are not; biased. The payload is the same format (by name
  /// `terngrad:fit`, `qsgd:4_fit`; docs/compressors.md).
  bool fit_scale = false;

  /// Chunks starting at multiples of the bucket quantize as the whole tensor does (each bucket
  /// has its own scale); 0 with a bucket of the whole tensor (`collective_tuning::overlap_chunks`).
  std::size_t chunk_alignment() const { return static_cast<std::size_t>(bucket); }

  /// The exact payload size for `count` elements of `type` (float32 or float64); throws
  /// `invalid_argument` for another type, a bucket that is not a multiple of 8, or overflow.
  std::size_t max_payload_bytes(dtype type, std::size_t count) const {
    if (type != dtype::float32 && type != dtype::float64) {
      throw invalid_argument({.operation = name}, "takes float32 or float64 elements, not " +
                                                      std::string(to_string(type)));
    }
    return payload_bytes(size_of(type), count, effective_bucket(count));
  }

  /// Quantizes `in` into `payload`; returns the payload's size. Stochastic schemes draw from
  /// Philox keyed by (seed, stream.step, stream.rank, element). Throws `invalid_argument` if
  /// `payload` is too small or (with `check_finite`) an element is NaN or Inf.
  template <class B, real_gradient T>
  std::size_t encode(const B& backend, buffer_view<const T, typename B::memory_space> in,
                     buffer_view<std::byte, typename B::memory_space> payload,
                     random_stream stream = {}) const {
    const std::size_t count = in.count();
    const std::size_t bucket_size = effective_bucket(count);
    const std::size_t size = payload_bytes(sizeof(T), count, bucket_size);
    if (payload.count() < size) {
      throw invalid_argument({.operation = name}, "payload buffer of " +
                                                      std::to_string(payload.count()) +
                                                      " bytes for " + std::to_string(size));
    }
    if (fit_scale && (scheme.float8 != 0 || scheme.sign_only)) {
      throw invalid_argument({.operation = name},
                             "fit_scale takes integer levels (int8, int4, terngrad, qsgd)");
    }
    // header and prefix built on the host, stored into the payload (host or device memory)
    std::byte head[body_offset] = {};
    write_payload_header({.kind = kind, .type = dtype_of<T>, .count = count}, head);
    const std::uint64_t b = bucket_size;
    const std::uint32_t prefix[2] = {scheme.levels, 0};
    std::memcpy(head + payload_header::bytes, &b, 8);
    std::memcpy(head + payload_header::bytes + 8, prefix, 8);
    store_bytes(backend, payload.data(), head, body_offset);
    std::byte* p = payload.data();
    T* scales = reinterpret_cast<T*>(p + body_offset);
    auto* codes =
        reinterpret_cast<std::uint8_t*>(p + body_offset + buckets(count, bucket_size) * sizeof(T));
    const std::size_t bad =
        quantize<scheme>(backend, in.data(), count, bucket_size, scales, codes, seed, stream,
                         /*find_non_finite=*/check_finite, fit_scale);
    if (check_finite && bad != count) {
      // the element itself may be in device memory: the kind is not read back
      throw_not_finite(name, bad, "NaN or infinite");
    }
    return size;
  }

  /// Decodes a payload into `out`: checks the header, the bucket (a multiple of 8 or one bucket,
  /// and not 0), the levels, the reserved word and the exact size, then dequantizes, checking
  /// that every code is a level (at most 2s). Throws `invalid_argument` naming the first
  /// inconsistency (`out` is then unspecified).
  template <class B, real_gradient T>
  void decode(const B& backend, buffer_view<const std::byte, typename B::memory_space> payload,
              buffer_view<T, typename B::memory_space> out) const {
    const error_context where{.operation = name};
    const std::size_t count = out.count();
    // header and prefix copied to the host and checked there
    std::byte head[body_offset] = {};
    const std::size_t head_size = payload.count() < body_offset ? payload.count() : body_offset;
    load_bytes(backend, head, payload.data(), head_size);
    read_payload_header(name, head, payload.count(), kind, dtype_of<T>, count);
    if (payload.count() < body_offset) {
      throw invalid_argument(where, "payload of " + std::to_string(payload.count()) +
                                        " bytes ends inside its bucket and levels fields");
    }
    std::uint64_t b = 0;
    std::uint32_t prefix[2] = {};
    std::memcpy(&b, head + payload_header::bytes, 8);
    std::memcpy(prefix, head + payload_header::bytes + 8, 8);
    if (prefix[0] != scheme.levels) {
      throw invalid_argument(where, "payload of " + std::to_string(prefix[0]) + " levels where " +
                                        std::to_string(scheme.levels) + " are expected");
    }
    if (prefix[1] != 0) throw invalid_argument(where, "payload's reserved word is not 0");
    const bool one_bucket = b == count;
    if (count != 0 && (b == 0 || (!one_bucket && (b % 8 != 0 || b > count)))) {
      throw invalid_argument(where, "bucket of " + std::to_string(b) + " elements for " +
                                        std::to_string(count) +
                                        " (a multiple of 8 below the count, or the count)");
    }
    const std::size_t bucket_size = count == 0 ? 0 : static_cast<std::size_t>(b);
    const std::size_t size = payload_bytes(sizeof(T), count, bucket_size);
    if (payload.count() != size) {
      throw invalid_argument(where, "payload of " + std::to_string(payload.count()) +
                                        " bytes where " + std::to_string(size) + " are expected");
    }
    const T* scales = reinterpret_cast<const T*>(payload.data() + body_offset);
    const auto* codes = reinterpret_cast<const std::uint8_t*>(
        payload.data() + body_offset + buckets(count, bucket_size) * sizeof(T));
    const std::size_t bad =
        dequantize<scheme>(backend, scales, codes, count, bucket_size, out.data());
    if (bad != count) {
      throw invalid_argument(
          where, "payload's code of element " + std::to_string(bad) +
                     (scheme.float8 != 0
                          ? std::string(" is an 8-bit float NaN or infinity")
                          : " is above the top level " + std::to_string(2 * scheme.levels)));
    }
  }

 private:
  static constexpr std::size_t body_offset = payload_header::bytes + prefix_bytes;

  static std::size_t buckets(std::size_t count, std::size_t bucket_size) {
    return count == 0 ? 0 : (count - 1) / bucket_size + 1;
  }

  std::size_t effective_bucket(std::size_t count) const {
    if (bucket % 8 != 0) {
      throw invalid_argument({.operation = name}, "bucket of " + std::to_string(bucket) +
                                                      " elements is not a multiple of 8");
    }
    return bucket == 0 || bucket >= count ? count : static_cast<std::size_t>(bucket);
  }

  /// 32 + scales + codes bytes; throws on overflow.
  std::size_t payload_bytes(std::size_t scale_bytes, std::size_t count,
                            std::size_t bucket_size) const {
    constexpr std::size_t max = std::numeric_limits<std::size_t>::max();
    const std::size_t nb = buckets(count, bucket_size);
    if (count > (max - 7) / scheme.width || nb > (max / 2) / scale_bytes) {
      throw invalid_argument({.operation = name},
                             "payload size of " + std::to_string(count) + " elements overflows");
    }
    const std::size_t code_bytes = (count * scheme.width + 7) / 8;
    const std::size_t fixed = body_offset + nb * scale_bytes;
    if (code_bytes > max - fixed) {
      throw invalid_argument({.operation = name},
                             "payload size of " + std::to_string(count) + " elements overflows");
    }
    return fixed + code_bytes;
  }
};

/// int8: per bucket scale = max |g|, each element rounded to the nearest of 255 levels
/// (-127..127) x scale / 127: error at most half a step, scale / 254. Deterministic. Needs
/// decoding to add (per hop or gathered), as in CGX (Markov et al., "CGX: Adaptive System Support
/// for Communication-Efficient Deep Learning", Middleware 2022).
struct int8_spec {
  static constexpr std::string_view name = "int8";
  static constexpr payload_kind kind = payload_kind::int8;
  static constexpr aggregation_set aggregations{aggregation::per_hop, aggregation::gather};
  static constexpr kernels::quantize_scheme scheme = {.levels = 127,
                                                      .width = 8,
                                                      .scale = kernels::bucket_scale::max_abs,
                                                      .stochastic = false,
                                                      .sign_only = false};
  static constexpr std::uint64_t default_bucket = 512;
};
using int8_compressor = quantize_compressor<int8_spec>;

/// int4: as int8 with 15 levels (-7..7) in 4-bit codes: error at most scale / 14. The values
/// of a chained compressor (compress/chain.hpp: "topk:0.01>int4").
struct int4_spec {
  static constexpr std::string_view name = "int4";
  static constexpr payload_kind kind = payload_kind::int4;
  static constexpr aggregation_set aggregations{aggregation::per_hop, aggregation::gather};
  static constexpr kernels::quantize_scheme scheme = {.levels = 7,
                                                      .width = 4,
                                                      .scale = kernels::bucket_scale::max_abs,
                                                      .stochastic = false,
                                                      .sign_only = false};
  static constexpr std::uint64_t default_bucket = 512;
};
using int4_compressor = quantize_compressor<int4_spec>;

/// Scaled sign: 1 bit per element and the bucket's mean |g| as its magnitude (Seide et al.,
/// "1-Bit Stochastic Gradient Descent", Interspeech 2014; Karimireddy et al., "Error Feedback
/// Fixes SignSGD and other Gradient Compression Schemes", ICML 2019, whose scale is
/// ||g||_1 / d). Zero counts as positive. Biased: use it with `error_feedback`.
struct sign_spec {
  static constexpr std::string_view name = "sign";
  static constexpr payload_kind kind = payload_kind::sign;
  static constexpr aggregation_set aggregations{aggregation::per_hop, aggregation::gather};
  static constexpr kernels::quantize_scheme scheme = {.levels = 1,
                                                      .width = 1,
                                                      .scale = kernels::bucket_scale::mean_abs,
                                                      .stochastic = false,
                                                      .sign_only = true};
  static constexpr std::uint64_t default_bucket = 512;
};
using sign_compressor = quantize_compressor<sign_spec>;

/// signSGD with majority vote (Bernstein et al., "signSGD: Compressed Optimisation for
/// Non-Convex Problems", ICML 2018; "signSGD with Majority Vote is Communication Efficient and
/// Fault Tolerant", ICLR 2019): 1 bit per element and one mean-|g| scale for the tensor; the
/// collective sums the votes and sends back their sign (vote class).
struct sign_vote_spec {
  static constexpr std::string_view name = "sign_vote";
  static constexpr payload_kind kind = payload_kind::sign_vote;
  static constexpr aggregation_set aggregations{aggregation::gather};
  static constexpr bool majority_vote = true;
  static constexpr kernels::quantize_scheme scheme = {.levels = 1,
                                                      .width = 1,
                                                      .scale = kernels::bucket_scale::mean_abs,
                                                      .stochastic = false,
                                                      .sign_only = true};
  static constexpr std::uint64_t default_bucket = 0;
};
using sign_vote_compressor = quantize_compressor<sign_vote_spec>;

/// TernGrad (Wen et al., "TernGrad: Ternary Gradients to Reduce Communication in Distributed
/// Deep Learning", NeurIPS 2017): per bucket s_t = max |g|, each element becomes
/// s_t x sign(g) x b with b ~ Bernoulli(|g| / s_t): unbiased, 2 bits per element.
struct terngrad_spec {
  static constexpr std::string_view name = "terngrad";
  static constexpr payload_kind kind = payload_kind::terngrad;
  static constexpr aggregation_set aggregations{aggregation::per_hop, aggregation::gather};
  static constexpr kernels::quantize_scheme scheme = {.levels = 1,
                                                      .width = 2,
                                                      .scale = kernels::bucket_scale::max_abs,
                                                      .stochastic = true,
                                                      .sign_only = false};
  static constexpr std::uint64_t default_bucket = 512;
};
using terngrad_compressor = quantize_compressor<terngrad_spec>;

/// The code width of QSGD with `levels` s: the 2s + 1 signed levels fit in 2, 4 or 8 bits.
constexpr unsigned qsgd_width(std::uint32_t levels) {
  return 2 * levels + 1 <= 4 ? 2 : 2 * levels + 1 <= 16 ? 4 : 8;
}

/// QSGD (Alistarh et al., "QSGD: Communication-Efficient SGD via Gradient Quantization and
/// Encoding", NeurIPS 2017) with `Levels` s in [1, 127]: per bucket the L2 norm ||v||, each
/// element ||v|| x sign(v_i) x xi_i / s with xi_i the stochastic rounding of |v_i| / ||v|| x s
/// to a neighbouring integer: unbiased, variance at most min(n / s^2, sqrt(n) / s) ||v||^2
/// for a bucket of n (their Lemma 3.1). Codes of 2, 4 or 8 bits (`qsgd_width`); no Elias coding.
template <std::uint32_t Levels>
requires(Levels >= 1 && Levels <= 127) struct qsgd_spec {
  static constexpr std::string_view name = "qsgd";
  static constexpr payload_kind kind = payload_kind::qsgd;
  static constexpr aggregation_set aggregations{aggregation::per_hop, aggregation::gather};
  static constexpr kernels::quantize_scheme scheme = {.levels = Levels,
                                                      .width = qsgd_width(Levels),
                                                      .scale = kernels::bucket_scale::l2_norm,
                                                      .stochastic = true,
                                                      .sign_only = false};
  static constexpr std::uint64_t default_bucket = 512;
};
template <std::uint32_t Levels>
using qsgd_compressor = quantize_compressor<qsgd_spec<Levels>>;

/// 8-bit floats with a scale per bucket (issue 17), as NCCL 2.24+, MSCCL++ and Meta's NCCLX send
/// them (Micikevicius et al., "FP8 Formats for Deep Learning", 2022; the OCP OFP8
/// specification, core/float8.hpp): per bucket of 512 the scale max |g|, each element the
/// 8-bit float of g x m / max |g| (m the format's largest finite value: 448 for E4M3, 57344 for
/// E5M2), so the bucket's largest element lands on m; rounded to nearest even, or with `_sr`
/// stochastically (Philox keyed by seed, step, rank, element: reproducible, unbiased). Decoded
/// in the element type and summed there, per hop or gathered: no 8-bit arithmetic, float or
/// double accumulation. Error per element, RNE: at most |g| x 2^-4 (E4M3, 3 fraction bits) or
/// |g| x 2^-3 (E5M2), and no more than max |g| x 2^-10 / 448 (E4M3) or max |g| x 2^-17 / 57344
/// (E5M2) where g x m / max |g| is below the format's smallest normal (half its subnormal
/// step). 8 bits and a scale per 512 elements: 8.06 bits per float element.
template <std::uint8_t Format, bool Stochastic>
requires(Format == 1 || Format == 2) struct fp8_spec {
  static constexpr std::string_view name = Format == 1 ? (Stochastic ? "fp8_e4m3_sr" : "fp8_e4m3")
                                                       : (Stochastic ? "fp8_e5m2_sr" : "fp8_e5m2");
  static constexpr payload_kind kind = payload_kind::fp8;
  static constexpr aggregation_set aggregations{aggregation::per_hop, aggregation::gather};
  static constexpr kernels::quantize_scheme scheme = {
      .levels = squall::detail::float8_max<squall::detail::float8_format_of<Format>>,
      .width = 8,
      .scale = kernels::bucket_scale::max_abs,
      .stochastic = Stochastic,
      .sign_only = false,
      .float8 = Format};
  static constexpr std::uint64_t default_bucket = 512;
};

/// The 8-bit float formats of `fp8_compressor`.
enum class fp8_format : std::uint8_t { e4m3 = 1, e5m2 = 2 };

/// The 8-bit float compressor (`fp8_spec`), its format and rounding chosen at run time: one
/// type, so a program that picks compressors by name (`visit_compressor`: "cast:e4m3",
/// "cast:e5m2", "cast:e4m3_sr", "cast:e5m2_sr") instantiates the collectives once for all
/// four. The payload is `quantize_compressor`'s (kind `fp8`, levels 448 or 57344); the two
/// roundings write the same format, and a payload of the other format fails to decode
/// ("levels where ... are expected").
struct fp8_compressor {
  static constexpr std::string_view name = "fp8";
  static constexpr aggregation_set aggregations{aggregation::per_hop, aggregation::gather};
  static constexpr bool fixed_size = true;
  static constexpr payload_kind kind = payload_kind::fp8;

  fp8_format format = fp8_format::e4m3;
  bool stochastic = false;  ///< stochastic rounding (Philox), else to nearest even
  std::uint64_t bucket = 512;
  std::uint64_t seed = 0;
  bool check_finite = false;

  /// Calls `f` with the quantizer of this format and rounding, carrying bucket, seed and
  /// check_finite; throws `invalid_argument` for a format that is neither. (Defined before
  /// the members that deduce their return types from it.)
  template <class F>
  decltype(auto) with_format(F&& f) const {
    const auto call = [&](auto q) -> decltype(auto) {
      q.bucket = bucket;
      q.seed = seed;
      q.check_finite = check_finite;
      return f(q);
    };
    if (format == fp8_format::e5m2) {
      return stochastic ? call(quantize_compressor<fp8_spec<2, true>>{})
                        : call(quantize_compressor<fp8_spec<2, false>>{});
    }
    if (format != fp8_format::e4m3) {
      throw invalid_argument(
          {.operation = name},
          "format " + std::to_string(static_cast<int>(format)) + " is neither e4m3 nor e5m2");
    }
    return stochastic ? call(quantize_compressor<fp8_spec<1, true>>{})
                      : call(quantize_compressor<fp8_spec<1, false>>{});
  }

  std::size_t chunk_alignment() const { return static_cast<std::size_t>(bucket); }

  std::size_t max_payload_bytes(dtype type, std::size_t count) const {
    return with_format([&](const auto& q) { return q.max_payload_bytes(type, count); });
  }

  template <class B, real_gradient T>
  std::size_t encode(const B& backend, buffer_view<const T, typename B::memory_space> in,
                     buffer_view<std::byte, typename B::memory_space> payload,
                     random_stream stream = {}) const {
    return with_format([&](const auto& q) { return q.encode(backend, in, payload, stream); });
  }

  template <class B, real_gradient T>
  void decode(const B& backend, buffer_view<const std::byte, typename B::memory_space> payload,
              buffer_view<T, typename B::memory_space> out) const {
    with_format([&](const auto& q) { q.decode(backend, payload, out); });
  }
};

static_assert(compressor<int8_compressor>);
static_assert(compressor<int4_compressor>);
static_assert(compressor<sign_compressor>);
static_assert(compressor<sign_vote_compressor>);
static_assert(compressor<terngrad_compressor>);
static_assert(compressor<qsgd_compressor<4>>);
static_assert(compressor<fp8_compressor>);

}  // namespace squall
