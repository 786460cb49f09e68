// SPDX-License-Identifier: Apache-2.0
// error_feedback<C>: mass conservation (sum of decoded payloads + final residual = sum of the
// gradients), that it sends what a lossy compressor alone would drop, and save / restore.
#include <squall/backend/host.hpp>
#include <squall/compress/cast.hpp>
#include <squall/compress/error_feedback.hpp>

#include <doctest/doctest.h>

#include <cmath>
#include <random>
#include <vector>

namespace {

using squall::host_backend;
using squall::host_view;

}  // namespace

TEST_SUITE("error_feedback") {
  TEST_CASE("conserves mass over many steps") {
    const std::size_t n = 4096;
    const int steps = 200;
    const squall::error_feedback<squall::cast_compressor<squall::float16>> ef;
    squall::error_feedback_state<float> state(n);
    std::mt19937 gen(3);
    std::normal_distribution<float> normal(0.0f, 1e-2f);
    std::vector<double> sent(n, 0.0), total(n, 0.0);
    std::vector<float> g(n), decoded(n), scratch(n);
    std::vector<std::byte> payload(ef.max_payload_bytes(squall::dtype::float32, n));
    double largest = 0;
    for (int t = 0; t < steps; ++t) {
      for (std::size_t i = 0; i < n; ++i) {
        g[i] = normal(gen) * (i % 7 == 0 ? 1e-4f : 1.0f);  // some far below float16's resolution
        total[i] += g[i];
        largest = std::max(largest, std::fabs(static_cast<double>(g[i])));
      }
      const std::size_t bytes = ef.encode(host_backend{}, state, host_view<const float>(g),
                                          host_view<std::byte>(payload), host_view<float>(scratch));
      ef.decode(host_backend{}, host_view<const std::byte>(payload.data(), bytes),
                host_view<float>(decoded));
      for (std::size_t i = 0; i < n; ++i) sent[i] += decoded[i];
    }
    // Each step rounds the residual twice in float, and the residual stays below twice the
    // largest gradient (it is a gradient plus less than one float16 step of it): the identity
    // holds to steps x 2 roundings x eps x 2 x largest.
    const double tolerance = steps * 2.0 * 1.2e-7 * 2.0 * largest;
    for (std::size_t i = 0; i < n; ++i) {
      REQUIRE(std::fabs(sent[i] + state.residual()[i] - total[i]) <= tolerance);
    }
  }

  TEST_CASE("what a cast alone loses, error feedback sends later") {
    // 1e-4 added to 1.0 is below float16's resolution there (2^-10): the cast alone sends
    // 1.0 every time; with error feedback the small part accumulates and is sent.
    const squall::cast_compressor<squall::float16> cast;
    const squall::error_feedback<squall::cast_compressor<squall::float16>> ef;
    squall::error_feedback_state<float> state(1);
    const std::vector<float> g = {1.0f + 1e-4f};
    std::vector<float> out(1), scratch(1);
    std::vector<std::byte> payload(cast.max_payload_bytes(squall::dtype::float32, 1));
    double plain = 0, with_feedback = 0;
    for (int t = 0; t < 100; ++t) {
      cast.encode(host_backend{}, host_view<const float>(g), host_view<std::byte>(payload));
      cast.decode(host_backend{}, host_view<const std::byte>(payload), host_view<float>(out));
      plain += out[0];
      ef.encode(host_backend{}, state, host_view<const float>(g), host_view<std::byte>(payload),
                host_view<float>(scratch));
      ef.decode(host_backend{}, host_view<const std::byte>(payload), host_view<float>(out));
      with_feedback += out[0];
    }
    const double exact = 100.0 * static_cast<double>(g[0]);
    CHECK(std::fabs(plain - exact) > 0.009);          // lost about 100 x 1e-4
    CHECK(std::fabs(with_feedback - exact) < 0.001);  // within one float16 step
  }

  TEST_CASE("the state saves and restores, and rejects what is not a saved state") {
    squall::error_feedback_state<float> s(5);
    for (std::size_t i = 0; i < 5; ++i) s.residual()[i] = 0.5f * static_cast<float>(i);
    const auto bytes = s.save();
    const auto back =
        squall::error_feedback_state<float>::restore(host_view<const std::byte>(bytes));
    REQUIRE(back.count() == 5);
    for (std::size_t i = 0; i < 5; ++i) CHECK(back.residual()[i] == s.residual()[i]);
    CHECK_THROWS_WITH_AS(
        squall::error_feedback_state<double>::restore(host_view<const std::byte>(bytes)),
        doctest::Contains("float32 restored as float64"), squall::invalid_argument);
    auto cut = bytes;
    cut.pop_back();
    CHECK_THROWS_AS(squall::error_feedback_state<float>::restore(host_view<const std::byte>(cut)),
                    squall::invalid_argument);
    auto bad = bytes;
    bad[0] = std::byte{0};
    CHECK_THROWS_WITH_AS(
        squall::error_feedback_state<float>::restore(host_view<const std::byte>(bad)),
        doctest::Contains("not a saved"), squall::invalid_argument);
    // a gradient of the wrong size
    const squall::error_feedback<squall::cast_compressor<squall::float16>> ef;
    std::vector<float> g(4), scratch(4);
    std::vector<std::byte> payload(ef.max_payload_bytes(squall::dtype::float32, 4));
    CHECK_THROWS_AS(ef.encode(host_backend{}, s, host_view<const float>(g),
                              host_view<std::byte>(payload), host_view<float>(scratch)),
                    squall::invalid_argument);
  }
}
