// SPDX-License-Identifier: Apache-2.0
// Chained compressors (`chain<Select, Values>`, issue 17) against their parts run one after the
// other by hand: top-k's k largest, their values quantized by int8 or int4 as a tensor of
// their own, scattered back; random-k's stratified picks, top-k of those values, int4 of what
// top-k kept. Also the wire size, the names, and decode's refusal of corrupt sizes.
#include <squall/backend/host.hpp>
#include <squall/compress/by_name.hpp>
#include <squall/compress/chain.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "../support/compressed_reference.hpp"
#include "../support/data.hpp"
#include "../support/host_codec.hpp"

namespace {

using squall::chain;
using squall::int4_compressor;
using squall::int8_compressor;
using squall::randomk_compressor;
using squall::topk_compressor;

// The k largest magnitudes' indices (ascending), by sorting: ties go to the lower index.
template <class T>
std::vector<std::size_t> largest(const std::vector<T>& v, std::size_t k) {
  std::vector<std::size_t> order(v.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    return std::fabs(static_cast<double>(v[a])) > std::fabs(static_cast<double>(v[b]));
  });
  order.resize(k);
  std::sort(order.begin(), order.end());
  return order;
}

// `values` through quantizer `q` as a tensor of their own (stream as the chain passes it).
template <class Q, class T>
std::vector<T> quantized(const Q& q, const std::vector<T>& values, squall::random_stream stream) {
  return squall::test::decode_on_host(q, squall::test::encode_on_host(q, values, stream),
                                      values.size(), T(0));
}

}  // namespace

TEST_SUITE("chain") {
  TEST_CASE_TEMPLATE("topk>int8 and topk>int4: the k largest, their values quantized", T, float,
                     double) {
    for (const std::size_t n : {1, 40, 3001}) {
      CAPTURE(n);
      const auto g = squall::test::normal_values<T>(n, 7 + n, 2.0);
      const topk_compressor top{.ratio = 0.05};
      const std::size_t k = top.entries(n);
      const auto picked = largest(g, k);
      std::vector<T> values(k);
      for (std::size_t j = 0; j < k; ++j) values[j] = g[picked[j]];
      const auto check = [&](const auto& c, const auto& q) {
        const auto payload = squall::test::encode_on_host(c, g, {3, 1});
        REQUIRE(payload.size() <= c.max_payload_bytes(squall::dtype_of<T>, n));
        // the prefix, top-k's header and indices rounded to 8, the quantizer's payload
        const std::size_t q_bytes = q.max_payload_bytes(squall::dtype_of<T>, k);
        CHECK(payload.size() == 32 + (24 + 4 * k + 7) / 8 * 8 + q_bytes);
        const auto out = squall::test::decode_on_host(c, payload, n, T(-1));
        const auto want_values = quantized(q, values, {3, 1});
        std::vector<T> want(n, T(0));
        for (std::size_t j = 0; j < k; ++j) want[picked[j]] = want_values[j];
        REQUIRE(out == want);
      };
      check(chain<topk_compressor, int8_compressor>{top, {}}, int8_compressor{});
      check(chain<topk_compressor, int4_compressor>{top, {.bucket = 64}},
            int4_compressor{.bucket = 64});
    }
  }

  TEST_CASE("randomk>topk>int4: the stratified picks, top-k of their values, 4-bit values") {
    const std::size_t n = 100000;
    const auto g = squall::test::normal_values<float>(n, 21, 1.0);
    const randomk_compressor random{.ratio = 0.1, .seed = 4};
    const topk_compressor top{.ratio = 0.2};
    const chain<randomk_compressor, chain<topk_compressor, int4_compressor>> c{random, {top, {}}};
    CHECK(decltype(c)::name == "randomk>topk>int4");
    const std::uint64_t step = 9;
    const auto picks = random.indices(n, step);
    std::vector<float> picked(picks.size());
    for (std::size_t j = 0; j < picks.size(); ++j) picked[j] = g[picks[j]];
    const auto kept = largest(picked, top.entries(picked.size()));
    std::vector<float> kept_values(kept.size());
    for (std::size_t j = 0; j < kept.size(); ++j) kept_values[j] = picked[kept[j]];
    const auto four_bit = quantized(int4_compressor{}, kept_values, {step, 2});
    std::vector<float> want(n, 0.0f);
    for (std::size_t j = 0; j < kept.size(); ++j) want[picks[kept[j]]] = four_bit[j];
    const auto out =
        squall::test::decode_on_host(c, squall::test::encode_on_host(c, g, {step, 2}), n, -1.0f);
    REQUIRE(out == want);
    // 2% of the elements survive, each a 4-byte index into the picks and 4 bits (and a scale
    // per 512): 4 / (0.02 x 4.56) = 43.9x fewer bytes than the floats, less the headers
    const auto payload = squall::test::encode_on_host(c, g, {step, 2});
    MESSAGE("randomk:0.1>topk:0.2>int4 on 100000 floats: " << payload.size() << " bytes, "
                                                           << 4.0 * n / payload.size() << "x");
    CHECK(4.0 * n / static_cast<double>(payload.size()) > 43);
  }

  TEST_CASE("decode refuses corrupt sizes and parts, naming them") {
    const chain<topk_compressor, int8_compressor> c{{.ratio = 0.1}, {}};
    const auto g = squall::test::normal_values<float>(300, 5);
    const auto good = squall::test::encode_on_host(c, g);
    const auto refused = [&](std::vector<std::byte> p, const std::string& what) {
      CAPTURE(what);
      CHECK(squall::test::what_of([&] {
              squall::test::decode_on_host(c, p, g.size(), 0.0f);
            }).find(what) != std::string::npos);
    };
    auto p = good;
    p.pop_back();
    refused(p, "value bytes");
    p = good;
    std::uint64_t s = 7;
    std::memcpy(p.data() + 16, &s, 8);
    refused(p, "7 selection bytes");
    p = good;
    std::uint64_t k = 31;  // top-k's own k, one more than its indices
    std::memcpy(p.data() + 32 + 16, &k, 8);
    refused(p, "selection of");
    p = good;
    p[32] = std::byte{0};  // top-k's magic
    refused(p, "magic");
    p = good;
    p.resize(20);
    refused(p, "inside its two sizes");
  }

  TEST_CASE("by name: sign:BUCKET, 0 for EF-SignSGD's one scale for the tensor") {
    const auto bucket = [](const char* text) {
      return squall::visit_compressor(squall::parse_compressor(text), [](const auto& c) {
        if constexpr (requires { c.inner.bucket; }) {
          return static_cast<long>(c.inner.bucket);
        } else if constexpr (requires { c.bucket; }) {
          return static_cast<long>(c.bucket);
        } else {
          return -1L;
        }
      });
    };
    CHECK(bucket("sign") == 512);
    CHECK(bucket("sign:0+ef") == 0);
    CHECK(bucket("sign:64") == 64);
    for (const char* bad : {"sign:7", "sign:-8", "sign:x", "sign:8.0"}) {
      CAPTURE(bad);
      CHECK_THROWS_AS(bucket(bad), squall::invalid_argument);
    }
  }

  TEST_CASE("by name: topk:R>int8, topk:R>int4, randomk:R>topk:R>int4, and nothing else") {
    const auto label = [](const char* text) {
      return squall::visit_compressor(squall::parse_compressor(text), [](const auto& c) {
        return squall::compressor_label<std::remove_cvref_t<decltype(c)>>();
      });
    };
    CHECK(label("topk:0.01>int8") == "topk>int8");
    CHECK(label("topk:0.01>int4+ef") == "error_feedback<topk>int4>");
    CHECK(label("randomk:0.1>topk:0.1>int4") == "randomk>topk>int4");
    CHECK(squall::parse_compressor("topk:0.01>int4+ef@gather").error_feedback);
    for (const char* bad : {"topk:0.01>int2", "int8>topk:0.1", "topk:2>int8", "topk>int8",
                            "randomk:0.1>topk:0.1>int8"}) {
      CAPTURE(bad);
      CHECK_THROWS_AS(label(bad), squall::invalid_argument);
    }
  }
}
