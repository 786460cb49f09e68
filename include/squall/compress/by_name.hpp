// SPDX-License-Identifier: Apache-2.0
#pragma once
/// Compressors by name, the way a command line names them:
/// "name[:parameter][+ef][@aggregation][/chunks]", e.g. "topk:0.01+ef", "qsgd:4", "cast:bf16",
/// "hq:4", "powersgd:4+ef", "topk:0.001+ef@gtopk", "int8@gather", "topk:0.01+ef/4" (overlapped in 4
/// chunks: `collective_tuning::overlap_chunks`), "none". `parse_compressor` reads the text (and
/// says what is wrong with it); `visit_compressor` calls a generic callable with the policy the
/// text names, so a program instantiates its compressed path once per policy and picks one at run
/// time. squall-bench and examples/train_fashion_mnist choose their compressors through it.

#include <squall/compress/cast.hpp>
#include <squall/compress/chain.hpp>
#include <squall/compress/error_feedback.hpp>
#include <squall/compress/fetchsgd.hpp>
#include <squall/compress/homomorphic.hpp>
#include <squall/compress/none.hpp>
#include <squall/compress/quantize.hpp>
#include <squall/compress/sketch.hpp>
#include <squall/compress/sparsify.hpp>
#include <squall/core/error.hpp>
#include <squall/tuning/tuning.hpp>

#include <algorithm>
#include <array>
#include <cstddef>  // size_t
#include <cstdlib>  // strtod, strtoul
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace squall {

/// One compressor as named on a command line. `parameter` is "", `aggregation` and `chunks`
/// empty when absent.
struct compressor_choice {
  std::string text;                                ///< as given: "topk:0.001+ef@gtopk"
  std::string name;                                ///< "topk"
  std::string parameter;                           ///< "0.001"
  std::optional<squall::aggregation> aggregation;  ///< aggregation::gtopk
  std::optional<std::size_t> chunks;               ///< "/4": overlap_chunks 4
  bool error_feedback = false;

  /// "none": the dense collective.
  bool dense() const { return name == "none"; }

  /// `tuning` with this choice's aggregation and chunks; unchanged without them.
  collective_tuning tuned(collective_tuning tuning) const {
    if (aggregation) tuning.aggregation = *aggregation;
    if (chunks) tuning.overlap_chunks = *chunks;
    return tuning;
  }
};

/// The names `parse_compressor` accepts, and what each takes after the colon.
inline constexpr std::array<std::pair<std::string_view, std::string_view>, 15> compressor_names{{
    {"none", ""},
    {"cast", "fp16|bf16|e4m3|e5m2|e4m3_sr|e5m2_sr (default bf16)"},
    {"int8", ""},
    {"hq", "BITS 2..8 per rank's code (default 4)"},
    {"sign", "BUCKET elements per scale, 0 for the tensor (default 512)"},
    {"sign_vote", ""},
    {"terngrad", "[fit] (least-squares scales, for error feedback)"},
    {"qsgd", "4|16|127[_fit] levels (default 4); _fit: least-squares scales"},
    {"topk", "RATIO (default 0.01)"},
    {"topk_sampled", "RATIO (default 0.01)"},
    {"randomk", "RATIO (default 0.01)"},
    {"threshold", "TAU (default 0.01)"},
    {"count_sketch", "4096|16384|65536 columns of 3 rows (default 65536)"},
    {"fetchsgd", "4096|16384|65536 columns of 3 rows (default 16384); no +ef: its error is kept"},
    {"powersgd", "RANK (default 4)"},
}};

/// One line naming every compressor and its parameter, for a usage message.
inline std::string compressor_usage() {
  std::string out;
  for (const auto& [name, parameter] : compressor_names) {
    if (!out.empty()) out += ' ';
    out += name;
    // Appended piece by piece: g++ 12 at -O3 warns (-Wrestrict, spuriously) on
    // `":" + std::string(...)`, and a user's -Werror build must not fail on that.
    if (!parameter.empty()) {
      out += ':';
      out += parameter.substr(0, parameter.find(' '));
    }
  }
  out += " or a chain: topk:RATIO>int8|int4, randomk:RATIO>topk:RATIO>int4";
  out += " [+ef] [@automatic|linear|low_rank|per_hop|gtopk|gather] [/chunks 1..32]";
  return out;
}

namespace detail {

[[noreturn]] inline void bad_compressor(std::string_view text, std::string_view why) {
  throw invalid_argument({.operation = "compressor"},
                         "'" + std::string(text) + "': " + std::string(why));
}

/// `choice`'s parameter as a positive number, `fallback` without one.
inline double compressor_parameter(const compressor_choice& choice, double fallback) {
  if (choice.parameter.empty()) return fallback;
  char* end = nullptr;
  const double v = std::strtod(choice.parameter.c_str(), &end);
  if (end == choice.parameter.c_str() || *end != '\0' || !(v > 0)) {
    bad_compressor(choice.text, "'" + choice.parameter + "' is not a positive number");
  }
  return v;
}

/// Calls `f(c)`, or `f(error_feedback<C>{c})` when the choice asks for error feedback.
template <class C, class F>
decltype(auto) visit_with_feedback(const compressor_choice& choice, C c, F&& f) {
  if (choice.error_feedback) return std::forward<F>(f)(error_feedback<C>{std::move(c)});
  return std::forward<F>(f)(std::move(c));
}

/// The ratio of a chain's part "name:RATIO" (in (0, 1]), or throws naming the chain.
inline double chain_ratio(const compressor_choice& chain, std::string_view part,
                          std::string_view name) {
  const std::string prefix = std::string(name) + ":";
  if (!part.starts_with(prefix)) {
    bad_compressor(chain.text, "'" + std::string(part) + "' is not " + prefix + "RATIO");
  }
  compressor_choice p;
  p.text = chain.text;
  p.parameter = std::string(part.substr(prefix.size()));
  const double r = compressor_parameter(p, 0.01);
  if (r > 1) bad_compressor(chain.text, "the ratio " + p.parameter + " is above 1");
  return r;
}

/// Calls `with` with the chain `choice.parameter` names: "topk:R>int8", "topk:R>int4" or
/// "randomk:R>topk:R>int4" (compress/chain.hpp); throws `invalid_argument` for another.
template <class With>
decltype(auto) visit_chain(const compressor_choice& choice, With&& with) {
  std::vector<std::string_view> parts;
  std::string_view rest = choice.parameter;
  for (std::size_t at = rest.find('>'); at != std::string_view::npos; at = rest.find('>')) {
    parts.push_back(rest.substr(0, at));
    rest.remove_prefix(at + 1);
  }
  parts.push_back(rest);
  if (parts.size() == 2 && (parts[1] == "int8" || parts[1] == "int4")) {
    topk_compressor top;
    top.ratio = chain_ratio(choice, parts[0], "topk");
    if (parts[1] == "int8") return with(chain<topk_compressor, int8_compressor>{top, {}});
    return with(chain<topk_compressor, int4_compressor>{top, {}});
  }
  if (parts.size() == 3 && parts[2] == "int4") {
    randomk_compressor random;
    random.ratio = chain_ratio(choice, parts[0], "randomk");
    topk_compressor top;
    top.ratio = chain_ratio(choice, parts[1], "topk");
    return with(
        chain<randomk_compressor, chain<topk_compressor, int4_compressor>>{random, {top, {}}});
  }
  bad_compressor(choice.text,
                 "not a chain squall offers (topk:RATIO>int8, topk:RATIO>int4, "
                 "randomk:RATIO>topk:RATIO>int4)");
}

}  // namespace detail

/// Reads "name[:parameter][+ef][@aggregation]"; throws `invalid_argument` naming the text and
/// what is wrong (unknown name or aggregation, a parameter the name does not take, chunks not
/// from 1 to 32, "none" with a suffix). The parameter's value is checked by `visit_compressor`.
inline compressor_choice parse_compressor(std::string_view text) {
  compressor_choice choice;
  choice.text = std::string(text);
  std::string body(text);
  if (const std::size_t slash = body.rfind('/'); slash != std::string::npos) {
    const std::string asked = body.substr(slash + 1);
    body.resize(slash);
    char* end = nullptr;
    const unsigned long n = std::strtoul(asked.c_str(), &end, 10);
    if (asked.empty() || asked[0] < '0' || asked[0] > '9' || *end != '\0' || n < 1 || n > 32) {
      detail::bad_compressor(text, "chunks '" + asked + "' is not a number from 1 to 32");
    }
    choice.chunks = static_cast<std::size_t>(n);
  }
  if (const std::size_t at = body.find('@'); at != std::string::npos) {
    const std::string asked = body.substr(at + 1);
    body.resize(at);
    for (auto a :
         {aggregation::automatic, aggregation::linear, aggregation::low_rank, aggregation::per_hop,
          aggregation::gtopk, aggregation::gather, aggregation::two_round}) {
      if (asked == to_string(a)) choice.aggregation = a;
    }
    if (!choice.aggregation) {
      detail::bad_compressor(text, "unknown aggregation '" + asked +
                                       "' (automatic, linear, low_rank, per_hop, gtopk or gather)");
    }
  }
  if (body.size() > 3 && body.compare(body.size() - 3, 3, "+ef") == 0) {
    choice.error_feedback = true;
    body.resize(body.size() - 3);
  }
  if (body.find('>') != std::string::npos) {  // a chain: its parts are read by visit_compressor
    choice.name = "chain";
    choice.parameter = body;
    return choice;
  }
  const std::size_t colon = body.find(':');
  choice.name = body.substr(0, colon);
  if (colon != std::string::npos) choice.parameter = body.substr(colon + 1);
  const auto known = std::find_if(compressor_names.begin(), compressor_names.end(),
                                  [&](const auto& n) { return n.first == choice.name; });
  if (known == compressor_names.end()) {
    detail::bad_compressor(text,
                           "unknown compressor '" + choice.name + "' (" + compressor_usage() + ")");
  }
  if (colon != std::string::npos && known->second.empty()) {
    detail::bad_compressor(text, choice.name + " takes no parameter");
  }
  if (choice.dense() && (choice.error_feedback || choice.aggregation || choice.chunks)) {
    detail::bad_compressor(text, "none takes no +ef, @algorithm or /chunks");
  }
  if (choice.name == "fetchsgd" && choice.error_feedback) {
    detail::bad_compressor(text, "fetchsgd takes no +ef: it keeps its error in sketch space");
  }
  return choice;
}

/// Calls `with` with the element-wise quantizer `choice` names: "cast[:fp16|bf16|e4m3|e5m2|
/// e4m3_sr|e5m2_sr]", "int8" or "hq[:BITS]", ignoring its error feedback (the caller wraps);
/// throws `invalid_argument` for another name or a parameter the compressor cannot take.
/// libsquall_mpi offers these alone (interpose/squall_mpi.cpp).
template <class With>
decltype(auto) visit_elementwise_compressor(const compressor_choice& choice, With&& with) {
  const std::string& n = choice.name;
  const std::string& p = choice.parameter;
  if (n == "cast") {
    if (p == "fp16" || p == "float16") return std::forward<With>(with)(cast_compressor<float16>{});
    if (p.empty() || p == "bf16" || p == "bfloat16")
      return std::forward<With>(with)(cast_compressor<bfloat16>{});
    // 8-bit floats with a scale per bucket (fp8_compressor, compress/quantize.hpp)
    if (p == "e4m3" || p == "e5m2" || p == "e4m3_sr" || p == "e5m2_sr") {
      fp8_compressor c;
      c.format = p.starts_with("e5m2") ? fp8_format::e5m2 : fp8_format::e4m3;
      c.stochastic = p.ends_with("_sr");
      return std::forward<With>(with)(c);
    }
    detail::bad_compressor(choice.text, "cast takes fp16, bf16, e4m3, e5m2, e4m3_sr or e5m2_sr");
  }
  if (n == "int8") return std::forward<With>(with)(int8_compressor{});
  if (n == "hq") {
    homomorphic_compressor c;
    const double b = detail::compressor_parameter(choice, 4);
    if (b != static_cast<double>(static_cast<unsigned>(b)) || b < 2 || b > 8) {
      detail::bad_compressor(choice.text, "hq takes 2 to 8 bits");
    }
    c.bits = static_cast<unsigned>(b);
    return std::forward<With>(with)(c);
  }
  detail::bad_compressor(choice.text, "not cast, int8 or hq");
}

/// Calls `f` with the compressor policy `choice` names, wrapped in `error_feedback` for "+ef",
/// and returns what it returns (every instantiation of `f` must return the same type); "none"
/// passes `identity_compressor`. Throws `invalid_argument` for a parameter the compressor
/// cannot take (qsgd:5, cast:fp8, topk:0, topk:2).
template <class F>
decltype(auto) visit_compressor(const compressor_choice& choice, F&& f) {
  const std::string& n = choice.name;
  const std::string& p = choice.parameter;
  auto with = [&](auto c) -> decltype(auto) {
    return detail::visit_with_feedback(choice, std::move(c), std::forward<F>(f));
  };
  auto ratio = [&] {
    const double r = detail::compressor_parameter(choice, 0.01);
    if (r > 1) detail::bad_compressor(choice.text, "the ratio " + p + " is above 1");
    return r;
  };
  if (n == "chain") return detail::visit_chain(choice, with);
  if (n == "cast" || n == "int8" || n == "hq") return visit_elementwise_compressor(choice, with);
  if (n == "sign") {  // sign:0 is EF-SignSGD's one ||g||_1 / d for the whole tensor
    sign_compressor c;
    if (!p.empty()) {
      char* end = nullptr;
      const unsigned long b = std::strtoul(p.c_str(), &end, 10);
      if (p[0] < '0' || p[0] > '9' || *end != '\0' || b % 8 != 0) {
        detail::bad_compressor(choice.text, "sign takes a bucket that is a multiple of 8 (0: one)");
      }
      c.bucket = b;
    }
    return with(c);
  }
  if (n == "sign_vote") return with(sign_vote_compressor{});
  // "_fit" (terngrad: "fit"): each bucket's scale fitted to its codes by least squares, a
  // contraction for error feedback (quantize_compressor::fit_scale)
  const auto fitted = [](auto c, bool fit) {
    c.fit_scale = fit;
    return c;
  };
  if (n == "terngrad") {
    if (!p.empty() && p != "fit")
      detail::bad_compressor(choice.text, "terngrad takes fit or nothing");
    return with(fitted(terngrad_compressor{}, p == "fit"));
  }
  if (n == "qsgd") {
    const bool fit = p.ends_with("_fit") || p == "fit";
    const std::string levels = p == "fit" ? "" : fit ? p.substr(0, p.size() - 4) : p;
    if (levels.empty() || levels == "4") return with(fitted(qsgd_compressor<4>{}, fit));
    if (levels == "16") return with(fitted(qsgd_compressor<16>{}, fit));
    if (levels == "127") return with(fitted(qsgd_compressor<127>{}, fit));
    detail::bad_compressor(choice.text, "qsgd takes 4, 16 or 127 levels, each with _fit or not");
  }
  if (n == "topk" || n == "topk_sampled") {
    topk_compressor c;
    c.ratio = ratio();
    if (n == "topk_sampled") c.method = topk_method::sampled_threshold;
    return with(c);
  }
  if (n == "randomk") {
    randomk_compressor c;
    c.ratio = ratio();
    return with(c);
  }
  if (n == "threshold") {
    threshold_compressor c;
    c.tau = detail::compressor_parameter(choice, 0.01);
    return with(c);
  }
  if (n == "count_sketch") {
    if (p == "4096") return with(count_sketch_compressor<3, 4096>{});
    if (p == "16384") return with(count_sketch_compressor<3, 16384>{});
    if (p.empty() || p == "65536") return with(count_sketch_compressor<3, 65536>{});
    detail::bad_compressor(choice.text, "count_sketch takes 4096, 16384 or 65536 columns");
  }
  if (n == "fetchsgd") {  // momentum and error in sketch space: its state, not +ef
    if (p == "4096") return with(fetchsgd_compressor<3, 4096>{});
    if (p.empty() || p == "16384") return with(fetchsgd_compressor<3, 16384>{});
    if (p == "65536") return with(fetchsgd_compressor<3, 65536>{});
    detail::bad_compressor(choice.text, "fetchsgd takes 4096, 16384 or 65536 columns");
  }
  if (n == "powersgd") {
    powersgd_compressor c;
    c.rank = static_cast<std::size_t>(detail::compressor_parameter(choice, 4));
    if (static_cast<double>(c.rank) != detail::compressor_parameter(choice, 4)) {
      detail::bad_compressor(choice.text, "the rank " + p + " is not a whole number");
    }
    return with(c);
  }
  if (n == "none" && !choice.error_feedback) return std::forward<F>(f)(identity_compressor{});
  detail::bad_compressor(choice.text, "not a compressor (parse it with parse_compressor)");
}

}  // namespace squall
