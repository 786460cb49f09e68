// SPDX-License-Identifier: Apache-2.0
// The per-element functors against plain double arithmetic and the documented edge cases.

#include <squall/core/ops.hpp>

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <limits>

#include "../support/data.hpp"

using squall::avg_op;
using squall::bfloat16;
using squall::float16;
using squall::max_op;
using squall::min_op;
using squall::sum_op;

TEST_SUITE("ops") {
  TEST_CASE_TEMPLATE("combine matches double arithmetic rounded once to T", T,
                     SQUALL_TEST_ELEMENT_TYPES) {
    const auto a = squall::test::random_values<T>(4096, 1);
    const auto b = squall::test::random_values<T>(4096, 2);
    for (std::size_t i = 0; i < a.size(); ++i) {
      const double x = squall::test::as_double(a[i]);
      const double y = squall::test::as_double(b[i]);
      CHECK(squall::test::as_double(squall::combine(sum_op{}, a[i], b[i])) ==
            squall::test::as_double(static_cast<T>(x + y)));
      CHECK(squall::test::as_double(squall::combine(min_op{}, a[i], b[i])) == std::fmin(x, y));
      CHECK(squall::test::as_double(squall::combine(max_op{}, a[i], b[i])) == std::fmax(x, y));
    }
  }

  TEST_CASE("integer sums wrap modulo 2^N instead of overflowing") {
    constexpr auto max32 = std::numeric_limits<std::int32_t>::max();
    constexpr auto min32 = std::numeric_limits<std::int32_t>::min();
    CHECK(sum_op{}(max32, std::int32_t{1}) == min32);
    CHECK(sum_op{}(min32, std::int32_t{-1}) == max32);
    constexpr auto max64 = std::numeric_limits<std::int64_t>::max();
    CHECK(sum_op{}(max64, std::int64_t{2}) == std::numeric_limits<std::int64_t>::min() + 1);
  }

  TEST_CASE("min and max propagate NaN from either side") {
    const float nan = std::numeric_limits<float>::quiet_NaN();
    CHECK(std::isnan(min_op{}(nan, 1.0f)));
    CHECK(std::isnan(min_op{}(1.0f, nan)));
    CHECK(std::isnan(max_op{}(nan, 1.0f)));
    CHECK(std::isnan(max_op{}(1.0f, nan)));
    CHECK(std::isnan(sum_op{}(1.0, std::numeric_limits<double>::quiet_NaN())));
    const float16 h_nan(nan);
    CHECK(std::isnan(static_cast<float>(squall::combine(max_op{}, float16(1.0f), h_nan))));
  }

  TEST_CASE("avg finalizes by dividing by the number of contributions") {
    CHECK(avg_op{}.finalize(10.0, 4) == 2.5);
    CHECK(avg_op{}.finalize(std::int32_t{-7}, 2) == -3);  // truncates toward zero
    CHECK(avg_op{}.finalize(std::int64_t{9}, 3) == 3);
    static_assert(squall::finalizing_op<avg_op, float>);
    static_assert(!squall::finalizing_op<sum_op, float>);
  }

  TEST_CASE("16-bit types combine in float and round once") {
    // 2048 + 1 is exact in float and ties between 2048 and 2050 in float16: even wins.
    CHECK(static_cast<float>(squall::combine(sum_op{}, float16(2048.0f), float16(1.0f))) ==
          2048.0f);
    // 256 + 1 ties between 256 and 258 in bfloat16 (8 significant bits): even wins.
    CHECK(static_cast<float>(squall::combine(sum_op{}, bfloat16(256.0f), bfloat16(1.0f))) ==
          256.0f);
    CHECK(static_cast<float>(squall::combine(sum_op{}, bfloat16(256.0f), bfloat16(3.0f))) ==
          260.0f);
  }

  TEST_CASE("ops model reduction_op for every element type") {
    static_assert(squall::reduction_op<sum_op, float16>);
    static_assert(squall::reduction_op<avg_op, std::int64_t>);
    static_assert(squall::reduction_op<min_op, bfloat16>);
    static_assert(squall::reduction_op<max_op, double>);
    struct not_an_op {};
    static_assert(!squall::reduction_op<not_an_op, float>);
    CHECK(sum_op::name == "sum");
    CHECK(avg_op::name == "avg");
  }
}
