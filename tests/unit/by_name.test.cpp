// SPDX-License-Identifier: Apache-2.0
// Compressors by name (compress/by_name.hpp): the text's parts, the policy each name visits
// with its parameter, the tuning an @aggregation sets, and a clear error for every bad text.

#include <squall/compress/by_name.hpp>

#include <doctest/doctest.h>

#include <string>
#include <string_view>
#include <type_traits>

namespace {

/// The `what()` of the exception `text` makes parse + visit throw, "" if none.
std::string fault_of(std::string_view text) {
  try {
    squall::visit_compressor(squall::parse_compressor(text), [](auto) {});
  } catch (const squall::invalid_argument& e) {
    return e.what();
  }
  return "";
}

template <class Expected>
bool visits(std::string_view text) {
  return squall::visit_compressor(squall::parse_compressor(text),
                                  [](auto c) { return std::is_same_v<decltype(c), Expected>; });
}

}  // namespace

TEST_SUITE("compress") {
  TEST_CASE("a compressor's text splits into name, parameter, +ef and @aggregation") {
    const auto c = squall::parse_compressor("topk:0.001+ef@gtopk");
    CHECK(c.text == "topk:0.001+ef@gtopk");
    CHECK(c.name == "topk");
    CHECK(c.parameter == "0.001");
    CHECK(c.error_feedback);
    CHECK(c.aggregation == squall::aggregation::gtopk);
    CHECK_FALSE(c.dense());
    const auto plain = squall::parse_compressor("int8");
    CHECK(plain.parameter.empty());
    CHECK_FALSE(plain.aggregation.has_value());
    CHECK_FALSE(plain.error_feedback);
    CHECK(squall::parse_compressor("none").dense());
  }

  TEST_CASE("each name visits its policy, +ef wraps it in error_feedback") {
    CHECK(visits<squall::identity_compressor>("none"));
    CHECK(visits<squall::cast_compressor<squall::bfloat16>>("cast"));
    CHECK(visits<squall::cast_compressor<squall::float16>>("cast:fp16"));
    CHECK(visits<squall::int8_compressor>("int8"));
    CHECK(visits<squall::error_feedback<squall::sign_compressor>>("sign+ef"));
    CHECK(visits<squall::sign_vote_compressor>("sign_vote"));
    CHECK(visits<squall::terngrad_compressor>("terngrad"));
    CHECK(visits<squall::qsgd_compressor<4>>("qsgd"));
    CHECK(visits<squall::qsgd_compressor<16>>("qsgd:16"));
    CHECK(visits<squall::error_feedback<squall::topk_compressor>>("topk:0.01+ef@gtopk"));
    CHECK(visits<squall::randomk_compressor>("randomk:0.5"));
    CHECK(visits<squall::threshold_compressor>("threshold:0.3"));
    CHECK(visits<squall::count_sketch_compressor<3, 4096>>("count_sketch:4096"));
    CHECK(visits<squall::count_sketch_compressor<3, 65536>>("count_sketch"));
    CHECK(visits<squall::fetchsgd_compressor<3, 16384>>("fetchsgd"));
    CHECK(visits<squall::fetchsgd_compressor<3, 4096>>("fetchsgd:4096"));
    CHECK(visits<squall::error_feedback<squall::powersgd_compressor>>("powersgd:2+ef"));
  }

  TEST_CASE("the parameter reaches the policy") {
    const auto ratio =
        squall::visit_compressor(squall::parse_compressor("topk:0.25+ef"), [](auto c) {
          if constexpr (requires { c.inner.ratio; }) return c.inner.ratio;
          return -1.0;
        });
    CHECK(ratio == 0.25);
    CHECK(squall::visit_compressor(squall::parse_compressor("topk_sampled"), [](auto c) {
      if constexpr (requires { c.method; })
        return c.method == squall::topk_method::sampled_threshold;
      return false;
    }));
    CHECK(squall::visit_compressor(squall::parse_compressor("threshold:0.125"), [](auto c) {
            if constexpr (requires { c.tau; }) return c.tau;
            return -1.0;
          }) == 0.125);
    CHECK(squall::visit_compressor(squall::parse_compressor("powersgd:3"), [](auto c) {
            if constexpr (requires { c.rank; }) return c.rank;
            return std::size_t{0};
          }) == 3);
    // "_fit" ("fit" for terngrad) sets least-squares scales on the same policy type
    const auto fits = [](std::string_view text) {
      return squall::visit_compressor(squall::parse_compressor(text), [](auto c) {
        if constexpr (requires { c.inner.fit_scale; }) return c.inner.fit_scale ? 1 : 0;
        if constexpr (requires { c.fit_scale; }) return c.fit_scale ? 1 : 0;
        return -1;
      });
    };
    CHECK(visits<squall::error_feedback<squall::qsgd_compressor<4>>>("qsgd:4_fit+ef"));
    CHECK(visits<squall::qsgd_compressor<16>>("qsgd:16_fit"));
    CHECK(visits<squall::terngrad_compressor>("terngrad:fit"));
    CHECK(fits("qsgd:4_fit+ef") == 1);
    CHECK(fits("qsgd:127_fit") == 1);
    CHECK(fits("qsgd:fit") == 1);
    CHECK(fits("terngrad:fit+ef") == 1);
    CHECK(fits("qsgd:4+ef") == 0);
    CHECK(fits("terngrad") == 0);
    CHECK(fits("int8") == 0);
  }

  TEST_CASE("@aggregation sets the aggregation of a tuning") {
    const squall::collective_tuning base{.chunk_bytes = 4096};
    const auto g = squall::parse_compressor("topk+ef@gtopk").tuned(base);
    CHECK(g.aggregation == squall::aggregation::gtopk);
    CHECK(g.chunk_bytes == 4096);
    CHECK(squall::parse_compressor("int8@gather").tuned(base).aggregation ==
          squall::aggregation::gather);
    CHECK(squall::parse_compressor("int8@per_hop").tuned(base).aggregation ==
          squall::aggregation::per_hop);
    CHECK(squall::parse_compressor("powersgd:2@low_rank").tuned(base).aggregation ==
          squall::aggregation::low_rank);
    CHECK(squall::parse_compressor("count_sketch:4096+ef@two_round").tuned(base).aggregation ==
          squall::aggregation::two_round);
    CHECK(squall::parse_compressor("int8").tuned(base) == base);
  }

  TEST_CASE("/chunks sets overlap_chunks, after +ef and @aggregation") {
    const auto c = squall::parse_compressor("topk:0.01+ef@gather/4");
    CHECK(c.name == "topk");
    CHECK(c.parameter == "0.01");
    CHECK(c.error_feedback);
    CHECK(c.aggregation == squall::aggregation::gather);
    CHECK(c.chunks == std::size_t{4});
    CHECK(squall::parse_compressor("cast:bf16/1").tuned({}).overlap_chunks == 1);
    CHECK(squall::parse_compressor("cast:bf16").tuned({}).overlap_chunks == 0);
    for (const char* bad : {"topk/0", "topk/33", "topk/x", "topk/", "topk/-2", "topk/4x"}) {
      CAPTURE(bad);
      CHECK(fault_of(bad).find("is not a number from 1 to 32") != std::string::npos);
    }
    CHECK(fault_of("none/2").find("none takes no") != std::string::npos);
  }

  TEST_CASE("bad texts throw invalid_argument naming the text and the fault") {
    CHECK(fault_of("topk:0.01") == "");
    CHECK(fault_of("zstd").find("unknown compressor 'zstd'") != std::string::npos);
    CHECK(fault_of("topk@fastest").find("unknown aggregation 'fastest'") != std::string::npos);
    CHECK(fault_of("topk@allgather").find("unknown aggregation 'allgather'") != std::string::npos);
    CHECK(fault_of("int8:3").find("int8 takes no parameter") != std::string::npos);
    CHECK(fault_of("none+ef").find("none takes no +ef") != std::string::npos);
    CHECK(fault_of("qsgd:5").find("qsgd takes 4, 16 or 127") != std::string::npos);
    CHECK(fault_of("qsgd:5_fit").find("qsgd takes 4, 16 or 127") != std::string::npos);
    CHECK(fault_of("qsgd:4fit").find("qsgd takes 4, 16 or 127") != std::string::npos);
    CHECK(fault_of("terngrad:4").find("terngrad takes fit or nothing") != std::string::npos);
    CHECK(fault_of("cast:fp8").find("cast takes fp16, bf16, e4m3, e5m2") != std::string::npos);
    CHECK(fault_of("topk:0").find("'0' is not a positive number") != std::string::npos);
    CHECK(fault_of("topk:abc").find("'abc' is not a positive number") != std::string::npos);
    CHECK(fault_of("randomk:1.5").find("above 1") != std::string::npos);
    CHECK(fault_of("powersgd:2.5").find("not a whole number") != std::string::npos);
    CHECK(fault_of("count_sketch:100").find("4096, 16384 or 65536") != std::string::npos);
    CHECK(fault_of("fetchsgd:100").find("4096, 16384 or 65536") != std::string::npos);
    CHECK(fault_of("fetchsgd+ef").find("fetchsgd takes no +ef") != std::string::npos);
  }
}
