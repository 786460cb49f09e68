// SPDX-License-Identifier: Apache-2.0
// The OFP8 wire types against independent references: every one of the 256 codes of each
// format decoded by the specification's formula in double; rounding from float against a brute
// force search for the nearest finite code (ties to the even code, saturating); stochastic
// rounding against its expectation.
#include <squall/core/float8.hpp>

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "../support/float8_reference.hpp"

namespace {

/// The value of `code` by the OFP8 specification, in double (tests/support/float8_reference.hpp).
template <class T>
double reference_value(std::uint8_t code) {
  return squall::test::float8_reference_value<typename T::format>(code);
}

/// The code RNE with saturation gives for finite or infinite `x`: the nearest finite code
/// (ties: the one whose lowest bit is 0), the largest finite one beyond the range.
template <class T>
std::uint8_t reference_round(float x) {
  const double v = std::fabs(static_cast<double>(x));
  const std::uint8_t sign = std::signbit(x) ? 0x80 : 0;
  if (v >= reference_value<T>(T::format::max_finite)) {
    return static_cast<std::uint8_t>(sign | T::format::max_finite);  // saturating
  }
  std::uint8_t best = 0;
  double best_distance = std::numeric_limits<double>::infinity();
  for (int c = 0; c <= T::format::max_finite; ++c) {
    const double distance = std::fabs(reference_value<T>(static_cast<std::uint8_t>(c)) - v);
    if (distance < best_distance || (distance == best_distance && (c & 1) == 0)) {
      best = static_cast<std::uint8_t>(c);
      best_distance = distance;
    }
  }
  return static_cast<std::uint8_t>(sign | best);
}

template <class T>
void check_every_code() {
  for (int c = 0; c < 256; ++c) {
    const auto code = static_cast<std::uint8_t>(c);
    CAPTURE(c);
    const double want = reference_value<T>(code);
    const float got = T::from_bits(code);
    if (std::isnan(want)) {
      CHECK(std::isnan(got));
      CHECK(T(got).bits() == (code & 0x80 ? 0x80 | T::format::quiet_nan : T::format::quiet_nan));
      continue;
    }
    CHECK(static_cast<double>(got) == want);
    CHECK(std::signbit(got) == ((code & 0x80) != 0));
    if (std::isinf(want)) {
      CHECK(T(got).bits() == ((code & 0x80) | T::format::max_finite));  // saturates
    } else {
      CHECK(T(got).bits() == code);  // every finite code round-trips, -0 included
    }
  }
}

template <class T>
void check_rounding(std::uint32_t seed) {
  std::mt19937 random(seed);
  // float bit patterns whose exponent covers the format's range and beyond on both sides,
  // and the midpoints between neighbouring codes (the ties), and their float neighbours
  std::vector<float> values;
  const int low = 127 - T::format::bias - T::format::man_bits - 3;
  const int high = 127 + (T::format::exp_bits == 4 ? 9 : 16) + 2;
  std::uniform_int_distribution<std::uint32_t> mantissa(0, (1u << 23) - 1);
  std::uniform_int_distribution<int> exponent(low, high);
  for (int i = 0; i < 100000; ++i) {
    const std::uint32_t bits = (static_cast<std::uint32_t>(exponent(random)) << 23) |
                               mantissa(random) | ((random() & 1u) << 31);
    float f;
    std::memcpy(&f, &bits, 4);
    values.push_back(f);
  }
  for (int c = 0; c < T::format::max_finite; ++c) {
    const double mid = (reference_value<T>(static_cast<std::uint8_t>(c)) +
                        reference_value<T>(static_cast<std::uint8_t>(c + 1))) /
                       2;
    const auto f = static_cast<float>(mid);  // exact: at most 5 significant bits
    REQUIRE(static_cast<double>(f) == mid);
    values.push_back(f);
    values.push_back(-f);
    values.push_back(std::nextafter(f, 0.0f));
    values.push_back(std::nextafter(f, 1e9f));
  }
  values.push_back(std::numeric_limits<float>::infinity());
  values.push_back(-std::numeric_limits<float>::infinity());
  values.push_back(std::numeric_limits<float>::max());
  values.push_back(std::numeric_limits<float>::denorm_min());
  values.push_back(0.0f);
  values.push_back(-0.0f);
  int wrong = 0;
  for (const float x : values) {
    if (T(x).bits() != reference_round<T>(x)) {
      if (++wrong <= 5) {
        INFO("x = " << x << " got " << int(T(x).bits()) << " want " << int(reference_round<T>(x)));
        CHECK(false);
      }
    }
  }
  CHECK(wrong == 0);
  // the branch-free conversion equals the reference form on every float tried
  int differ = 0;
  for (const float x : values) {
    differ += squall::detail::float_to_float8<typename T::format>(x) !=
              squall::detail::float_to_float8_reference<typename T::format>(x);
  }
  CHECK(differ == 0);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  CHECK(T(nan).bits() == T::format::quiet_nan);
  CHECK(T(-nan).bits() == (0x80 | T::format::quiet_nan));
  CHECK(std::isnan(static_cast<float>(T(nan))));
}

template <class T>
void check_stochastic(std::uint32_t seed) {
  std::mt19937 random(seed);
  std::uniform_real_distribution<float> pick(-1.2f * float(T::from_bits(T::format::max_finite)),
                                             1.2f * float(T::from_bits(T::format::max_finite)));
  constexpr int draws = 20000;
  for (int v = 0; v < 200; ++v) {
    // magnitudes spread over the range: a uniform value, scaled down by a random power of two
    const float x = std::ldexp(pick(random), -static_cast<int>(random() % 20));
    CAPTURE(x);
    const float nearest = T(x);
    const std::uint8_t toward_zero_code = static_cast<std::uint8_t>(
        std::fabs(nearest) > std::fabs(x) ? T(x).bits() - 1 : T(x).bits());
    double sum = 0;
    for (int d = 0; d < draws; ++d) {
      const T s = T::stochastic(x, static_cast<std::uint32_t>(random()));
      // always one of the two neighbours of x (the same sign)
      const bool neighbour = (s.bits() & 0x7f) == (toward_zero_code & 0x7f) ||
                             (s.bits() & 0x7f) == (toward_zero_code & 0x7f) + 1;
      if (!neighbour) {
        CHECK(neighbour);
        break;
      }
      sum += static_cast<float>(s);
    }
    const double max_finite = float(T::from_bits(T::format::max_finite));
    if (std::fabs(x) >= max_finite) {
      CHECK(sum / draws == std::copysign(max_finite, x));  // saturates
      continue;
    }
    // unbiased: |mean - x| within 5 standard errors of a two-point draw one step apart
    const double below = float(T::from_bits(toward_zero_code));
    const double step = std::fabs(float(T::from_bits(toward_zero_code + 1)) - below);
    CHECK(std::fabs(sum / draws - x) <= 5 * (step / 2) / std::sqrt(double(draws)) + 1e-12);
  }
}

}  // namespace

TEST_SUITE("float8") {
  TEST_CASE("float8: the branch-free conversion equals the reference on every float") {
    // all 2^32 bit patterns would take minutes; every exponent with 2^16 mantissas each
    int differ = 0;
    for (std::uint32_t e = 0; e < 256; ++e) {
      for (std::uint32_t m = 0; m < (1u << 23); m += 127) {
        for (const std::uint32_t s : {0u, 1u}) {
          const std::uint32_t bits = (s << 31) | (e << 23) | m;
          float x;
          std::memcpy(&x, &bits, 4);
          using squall::detail::e4m3_format;
          using squall::detail::e5m2_format;
          differ += squall::detail::float_to_float8<e4m3_format>(x) !=
                    squall::detail::float_to_float8_reference<e4m3_format>(x);
          differ += squall::detail::float_to_float8<e5m2_format>(x) !=
                    squall::detail::float_to_float8_reference<e5m2_format>(x);
        }
      }
    }
    CHECK(differ == 0);
  }

  TEST_CASE("float8: the branch-free stochastic conversion equals the reference") {
    // every exponent, 2^23 / 509 mantissas each, both signs, a random word per value, the same
    // word shifted right by 0-31 bits (the small words that decide the values far below the
    // subnormal step), its top 16 bits (a float's draw, `draw_as_word`), and the words at the
    // ends: 0 and 2^32 - 1
    int differ = 0;
    std::uint32_t word = 0x9e3779b9u;
    for (std::uint32_t e = 0; e < 256; ++e) {
      for (std::uint32_t m = 0; m < (1u << 23); m += 509) {
        for (const std::uint32_t s : {0u, 1u}) {
          const std::uint32_t bits = (s << 31) | (e << 23) | m;
          float x;
          std::memcpy(&x, &bits, 4);
          word ^= word << 13;
          word ^= word >> 17;
          word ^= word << 5;
          using squall::detail::e4m3_format;
          using squall::detail::e5m2_format;
          for (const std::uint32_t r :
               {word, word >> (word % 32u), word & 0xffff0000u, 0u, 0xffffffffu}) {
            differ += squall::detail::float_to_float8_stochastic<e4m3_format>(x, r) !=
                      squall::detail::float_to_float8_stochastic_reference<e4m3_format>(x, r);
            differ += squall::detail::float_to_float8_stochastic<e5m2_format>(x, r) !=
                      squall::detail::float_to_float8_stochastic_reference<e5m2_format>(x, r);
          }
        }
      }
    }
    CHECK(differ == 0);
  }

  TEST_CASE(
      "float8_e4m3: every code decodes as the OFP8 specification says, also with DAZ and FTZ") {
    squall::test::in_both_float_modes(check_every_code<squall::float8_e4m3>);
    CHECK(float(squall::float8_e4m3::from_bits(0x7e)) == 448.0f);
    CHECK(float(squall::float8_e4m3::from_bits(0x01)) == std::ldexp(1.0f, -9));
  }
  TEST_CASE(
      "float8_e5m2: every code decodes as the OFP8 specification says, also with DAZ and FTZ") {
    squall::test::in_both_float_modes(check_every_code<squall::float8_e5m2>);
    CHECK(float(squall::float8_e5m2::from_bits(0x7b)) == 57344.0f);
    CHECK(float(squall::float8_e5m2::from_bits(0x01)) == std::ldexp(1.0f, -16));
  }
  TEST_CASE("float8 from float: nearest, ties to even, saturating, against a brute-force search") {
    check_rounding<squall::float8_e4m3>(1);
    check_rounding<squall::float8_e5m2>(2);
  }
  TEST_CASE("float8 stochastic rounding: a neighbour each time, unbiased on average") {
    check_stochastic<squall::float8_e4m3>(3);
    check_stochastic<squall::float8_e5m2>(4);
  }
  TEST_CASE("float8 conversions are constexpr") {
    static_assert(squall::float8_e4m3(1.0f).bits() == 0x38);
    static_assert(squall::float8_e5m2(1.0f).bits() == 0x3c);
    static_assert(float(squall::float8_e4m3::from_bits(0x38)) == 1.0f);
    static_assert(squall::float8_e4m3(1000.0f).bits() == 0x7e);
  }
}
