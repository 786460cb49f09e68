// SPDX-License-Identifier: Apache-2.0
// float16 and bfloat16 against bit-level references built from the formats' definitions:
// every one of the 65536 patterns of each, every rounding midpoint, and random inputs.

#include <squall/core/types.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <utility>
#include <vector>

namespace {

using squall::bfloat16;
using squall::float16;

// The value of a 16-bit pattern from the format's definition (sign, biased exponent, fraction),
// computed in double with ldexp: independent of squall's bit manipulation.
template <int ExpBits, int ManBits>
double decode_by_definition(std::uint16_t bits) {
  const int bias = (1 << (ExpBits - 1)) - 1;
  const double sign = (bits >> 15) != 0 ? -1.0 : 1.0;
  const int exponent = (bits >> ManBits) & ((1 << ExpBits) - 1);
  const int fraction = bits & ((1 << ManBits) - 1);
  if (exponent == (1 << ExpBits) - 1) {
    return fraction == 0 ? sign * std::numeric_limits<double>::infinity()
                         : std::numeric_limits<double>::quiet_NaN();
  }
  if (exponent == 0) return sign * std::ldexp(static_cast<double>(fraction), 1 - bias - ManBits);
  return sign *
         std::ldexp(1.0 + std::ldexp(static_cast<double>(fraction), -ManBits), exponent - bias);
}

template <class T>
double decode_reference(std::uint16_t bits) {
  if constexpr (std::is_same_v<T, float16>) {
    return decode_by_definition<5, 10>(bits);
  } else {
    return decode_by_definition<8, 7>(bits);
  }
}

// The finite non-negative values of T in increasing order, with their bits.
template <class T>
std::vector<std::pair<double, std::uint16_t>> finite_ladder() {
  std::vector<std::pair<double, std::uint16_t>> ladder;
  for (std::uint32_t b = 0; b < 0x8000; ++b) {
    const double v = decode_reference<T>(static_cast<std::uint16_t>(b));
    if (std::isfinite(v)) ladder.emplace_back(v, static_cast<std::uint16_t>(b));
  }
  std::sort(ladder.begin(), ladder.end());
  return ladder;
}

// Round to nearest, ties to the even pattern, by search in the ladder; overflow past
// max + ulp/2 (a tie there goes to infinity, the even neighbour) gives infinity.
template <class T>
std::uint16_t round_reference(double x, const std::vector<std::pair<double, std::uint16_t>>& ladder,
                              std::uint16_t inf_bits) {
  const std::uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  const double a = std::fabs(x);
  const double max = ladder.back().first;
  const double ulp = max - ladder[ladder.size() - 2].first;
  if (a >= max + ulp / 2) return sign | inf_bits;
  auto hi = std::lower_bound(ladder.begin(), ladder.end(), std::make_pair(a, std::uint16_t{0}));
  if (hi == ladder.end()) return sign | ladder.back().second;
  if (hi->first == a || hi == ladder.begin()) return sign | hi->second;
  auto lo = hi - 1;
  const double below = a - lo->first;
  const double above = hi->first - a;
  if (below < above) return sign | lo->second;
  if (above < below) return sign | hi->second;
  return sign | ((lo->second & 1) == 0 ? lo->second : hi->second);
}

template <class T>
constexpr std::uint16_t inf_bits() {
  return std::is_same_v<T, float16> ? 0x7c00 : 0x7f80;
}

}  // namespace

TEST_SUITE("types") {
  TEST_CASE_TEMPLATE("every 16-bit pattern widens exactly and round-trips", T, float16, bfloat16) {
    std::size_t checked = 0;
    for (std::uint32_t b = 0; b <= 0xffff; ++b) {
      const auto bits = static_cast<std::uint16_t>(b);
      const T value = T::from_bits(bits);
      const float wide = value;
      const double reference = decode_reference<T>(bits);
      if (std::isnan(reference)) {
        REQUIRE(std::isnan(wide));
        // NaN stays NaN through a round trip, quieted, with its sign.
        const std::uint16_t back = T(wide).bits();
        REQUIRE(std::isnan(static_cast<float>(T::from_bits(back))));
        REQUIRE((back & 0x8000) == (bits & 0x8000));
      } else {
        REQUIRE(static_cast<double>(wide) == reference);
        REQUIRE(std::signbit(wide) == ((bits & 0x8000) != 0));
        REQUIRE(T(wide).bits() == bits);
        REQUIRE(T(static_cast<double>(wide)).bits() == bits);
      }
      ++checked;
    }
    CHECK(checked == 65536);
  }

  TEST_CASE_TEMPLATE("every rounding midpoint rounds to even, and its neighbours to nearest", T,
                     float16, bfloat16) {
    const auto ladder = finite_ladder<T>();
    for (std::size_t i = 0; i + 1 < ladder.size(); ++i) {
      const auto [lo, lo_bits] = ladder[i];
      const auto [hi, hi_bits] = ladder[i + 1];
      const double mid = (lo + hi) / 2;  // exact in float: at most 12 significant bits
      const auto midf = static_cast<float>(mid);
      REQUIRE(static_cast<double>(midf) == mid);
      const std::uint16_t even = (lo_bits & 1) == 0 ? lo_bits : hi_bits;
      for (const float sign : {1.0f, -1.0f}) {
        const std::uint16_t s = sign < 0 ? 0x8000 : 0;
        REQUIRE(T(sign * midf).bits() == (s | even));
        REQUIRE(T(sign * std::nextafter(midf, 0.0f)).bits() == (s | lo_bits));
        REQUIRE(T(sign * std::nextafter(midf, std::numeric_limits<float>::infinity())).bits() ==
                (s | hi_bits));
        // From double directly: one rounding, so just below the midpoint goes down even where
        // rounding through float would first land on the midpoint.
        REQUIRE(T(sign * mid).bits() == (s | even));
        REQUIRE(T(sign * std::nextafter(mid, 0.0)).bits() == (s | lo_bits));
        REQUIRE(T(sign * std::nextafter(mid, std::numeric_limits<double>::infinity())).bits() ==
                (s | hi_bits));
      }
    }
    // Past the largest finite value: the tie at max + ulp/2 goes to infinity (the even side).
    const double max = ladder.back().first;
    const double ulp = max - ladder[ladder.size() - 2].first;
    CHECK(T(max + ulp / 2).bits() == inf_bits<T>());
    CHECK(T(std::nextafter(max + ulp / 2, 0.0)).bits() == ladder.back().second);
    CHECK(T(-(max + ulp / 2)).bits() == (0x8000 | inf_bits<T>()));
    CHECK(T(std::numeric_limits<float>::infinity()).bits() == inf_bits<T>());
    CHECK(T(1e300).bits() == inf_bits<T>());
    // Below half the smallest subnormal: zero, keeping the sign.
    const double tiny = ladder[1].first;
    CHECK(T(tiny / 2).bits() == 0);
    CHECK(T(std::nextafter(tiny / 2, 1.0)).bits() == ladder[1].second);
    CHECK(T(-tiny / 4).bits() == 0x8000);
    CHECK(T(std::numeric_limits<float>::denorm_min()).bits() == 0);
  }

  TEST_CASE_TEMPLATE("random floats and doubles round as the reference does", T, float16,
                     bfloat16) {
    const auto ladder = finite_ladder<T>();
    std::mt19937 gen(12345);
    for (int i = 0; i < 1'000'000; ++i) {
      const float f = std::bit_cast<float>(static_cast<std::uint32_t>(gen()));
      if (std::isnan(f)) continue;
      REQUIRE(T(f).bits() == round_reference<T>(f, ladder, inf_bits<T>()));
    }
    std::mt19937_64 gen64(6789);
    std::uniform_real_distribution<double> magnitude(-40.0, 40.0);
    for (int i = 0; i < 200'000; ++i) {
      const double d =
          std::ldexp(static_cast<double>(gen64()) / 0x1p64, static_cast<int>(magnitude(gen64)));
      REQUIRE(T(d).bits() == round_reference<T>(d, ladder, inf_bits<T>()));
      REQUIRE(T(-d).bits() == round_reference<T>(-d, ladder, inf_bits<T>()));
    }
  }

#if defined(__FLT16_MAX__)
  TEST_CASE("float16 agrees with the compiler's _Float16 conversion") {
    std::mt19937 gen(424242);
    for (int i = 0; i < 2'000'000; ++i) {
      const float f = std::bit_cast<float>(static_cast<std::uint32_t>(gen()));
      if (std::isnan(f)) continue;
      const auto expected = std::bit_cast<std::uint16_t>(static_cast<_Float16>(f));
      REQUIRE(float16(f).bits() == expected);
    }
  }
#endif

  TEST_CASE("integer constructors and dtype traits") {
    CHECK(static_cast<float>(float16(3)) == 3.0f);
    CHECK(static_cast<float>(bfloat16(-7)) == -7.0f);
    CHECK(float16(2049).bits() == float16(2048.0f).bits());  // tie to even
    CHECK(squall::dtype_of<float> == squall::dtype::float32);
    CHECK(squall::dtype_of<double> == squall::dtype::float64);
    CHECK(squall::dtype_of<std::int32_t> == squall::dtype::int32);
    CHECK(squall::dtype_of<std::int64_t> == squall::dtype::int64);
    CHECK(squall::dtype_of<float16> == squall::dtype::float16);
    CHECK(squall::dtype_of<bfloat16> == squall::dtype::bfloat16);
    CHECK(squall::size_of(squall::dtype::bfloat16) == 2);
    CHECK(squall::size_of(squall::dtype::int64) == 8);
    CHECK(squall::to_string(squall::dtype::float16) == "float16");
    static_assert(std::is_same_v<squall::accumulator_of<float16>, float>);
    static_assert(std::is_same_v<squall::accumulator_of<bfloat16>, float>);
    static_assert(std::is_same_v<squall::accumulator_of<std::int32_t>, std::int32_t>);
    static_assert(!squall::element<char>);
    static_assert(!squall::element<unsigned>);
  }
}
