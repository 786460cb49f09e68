// SPDX-License-Identifier: Apache-2.0
// cast_compressor<float16 | bfloat16>: properties against independent references (the
// compiler's _Float16 conversion; the half-unit-in-the-last-place bound of round to nearest),
// the compression ratio formula of docs/compressors.md, and decode's validation.
#include <squall/backend/host.hpp>
#include <squall/compress/cast.hpp>
#include <squall/compress/traits.hpp>

#include <doctest/doctest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

namespace {

using squall::bfloat16;
using squall::float16;
using squall::host_backend;
using squall::host_view;

template <class To, class T>
std::vector<std::byte> encode(const std::vector<T>& in) {
  const squall::cast_compressor<To> c;
  std::vector<std::byte> payload(c.max_payload_bytes(squall::dtype_of<T>, in.size()));
  const std::size_t written =
      c.encode(host_backend{}, host_view<const T>(in), host_view<std::byte>(payload));
  REQUIRE(written == payload.size());
  return payload;
}

template <class To, class T>
std::vector<T> round_trip(const std::vector<T>& in) {
  const auto payload = encode<To>(in);
  std::vector<T> out(in.size());
  squall::cast_compressor<To>{}.decode(host_backend{}, host_view<const std::byte>(payload),
                                       host_view<T>(out));
  return out;
}

// The spacing of To's values at |y| (y a finite value of To): the distance to the next value
// away from zero, from the bits, not from any conversion routine under test.
template <class To>
double ulp_at(double y) {
  const To v(y);
  const To next = To::from_bits(static_cast<std::uint16_t>(v.bits() + 1));
  return std::fabs(static_cast<double>(static_cast<float>(next)) -
                   std::fabs(static_cast<double>(static_cast<float>(v))));
}

// Floats spread over To's normal range, both signs.
template <class To>
std::vector<float> spread(std::size_t n, unsigned seed) {
  std::mt19937 gen(seed);
  const int low = std::same_as<To, float16> ? -14 : -120;
  const int high = std::same_as<To, float16> ? 14 : 120;  // below 65504, float16's largest
  std::uniform_int_distribution<int> exponent(low, high);
  std::uniform_real_distribution<float> mantissa(1.0f, 2.0f);
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i)
    v[i] = std::ldexp(mantissa(gen), exponent(gen)) * (i % 2 ? -1.0f : 1.0f);
  return v;
}

}  // namespace

TEST_SUITE("cast") {
  TEST_CASE_TEMPLATE("a zero gradient round-trips to zeros", To, float16, bfloat16) {
    const std::vector<float> zeros(1000, 0.0f);
    for (float x : round_trip<To>(zeros)) REQUIRE(x == 0.0f);
    const std::vector<double> dzeros(7, 0.0);
    for (double x : round_trip<To>(dzeros)) REQUIRE(x == 0.0);
  }

  TEST_CASE_TEMPLATE("every value within half a unit in the last place of To", To, float16,
                     bfloat16) {
    const std::vector<float> in = spread<To>(200000, 7);
    const std::vector<float> out = round_trip<To>(in);
    for (std::size_t i = 0; i < in.size(); ++i) {
      const double err = std::fabs(static_cast<double>(out[i]) - static_cast<double>(in[i]));
      REQUIRE(err <= 0.5 * ulp_at<To>(out[i]));
    }
  }

#if defined(__FLT16_MAX__)  // the compiler has _Float16 here (g++ 12; clang from 15 on x86)
  TEST_CASE("float16 casts agree bit for bit with the compiler's _Float16") {
    const std::vector<float> in = spread<float16>(200000, 11);
    const std::vector<float> out = round_trip<float16>(in);
    for (std::size_t i = 0; i < in.size(); ++i) {
      REQUIRE(out[i] == static_cast<float>(static_cast<_Float16>(in[i])));
    }
  }
#endif

  TEST_CASE("double inputs round once, not through float") {
    // 1 + 2^-11 + 2^-30 lies above the midpoint of 1 and 1 + 2^-10: nearest is 1 + 2^-10.
    // Through float it would first become the midpoint itself and then round to even, 1.
    const std::vector<double> in = {1.0 + std::ldexp(1.0, -11) + std::ldexp(1.0, -30)};
    CHECK(round_trip<float16>(in)[0] == 1.0 + std::ldexp(1.0, -10));
  }

  TEST_CASE_TEMPLATE("NaN stays NaN, infinities and overflow become infinities", To, float16,
                     bfloat16) {
    const float inf = std::numeric_limits<float>::infinity();
    const float big = std::same_as<To, float16> ? 1e6f : std::numeric_limits<float>::max();
    const std::vector<float> in = {std::numeric_limits<float>::quiet_NaN(), inf, -inf, big, -big};
    const std::vector<float> out = round_trip<To>(in);
    CHECK(std::isnan(out[0]));
    CHECK(out[1] == inf);
    CHECK(out[2] == -inf);
    CHECK(out[3] == inf);
    CHECK(out[4] == -inf);
  }

  TEST_CASE_TEMPLATE("bits per element on the wire: 16 + 128 / count", To, float16, bfloat16) {
    for (std::size_t count :
         {std::size_t{0}, std::size_t{1}, std::size_t{1000}, std::size_t{1} << 20}) {
      const std::size_t bytes =
          squall::cast_compressor<To>{}.max_payload_bytes(squall::dtype::float32, count);
      CHECK(bytes * 8 == 16 * count + 128);
    }
    CHECK_THROWS_AS(squall::cast_compressor<To>{}.max_payload_bytes(
                        squall::dtype::float32, std::numeric_limits<std::size_t>::max() / 2),
                    squall::invalid_argument);
  }

  TEST_CASE("decode rejects every inconsistent payload") {
    const std::vector<float> in(10, 1.5f);
    const auto good = encode<float16>(in);
    std::vector<float> out(10);
    const squall::cast_compressor<float16> c;
    auto decode = [&](const std::vector<std::byte>& p, std::size_t count = 10) {
      std::vector<float> o(count);
      c.decode(host_backend{}, host_view<const std::byte>(p), host_view<float>(o));
    };
    decode(good);  // the unchanged payload is fine
    auto with = [&](std::size_t at, std::uint8_t value) {
      auto p = good;
      p[at] = std::byte{value};
      return p;
    };
    CHECK_THROWS_WITH_AS(decode(with(0, 0)), doctest::Contains("magic"), squall::invalid_argument);
    CHECK_THROWS_WITH_AS(decode(with(2, 2)), doctest::Contains("kind 2 where kind 1"),
                         squall::invalid_argument);
    CHECK_THROWS_WITH_AS(decode(with(3, 9)), doctest::Contains("version 9"),
                         squall::invalid_argument);
    CHECK_THROWS_WITH_AS(decode(with(5, 1)), doctest::Contains("reserved"),
                         squall::invalid_argument);
    CHECK_THROWS_WITH_AS(decode(good, 11), doctest::Contains("10 elements decoded into 11"),
                         squall::invalid_argument);
    auto truncated = good;
    truncated.pop_back();
    CHECK_THROWS_WITH_AS(decode(truncated), doctest::Contains("bytes for 10 elements"),
                         squall::invalid_argument);
    auto longer = good;
    longer.push_back(std::byte{0});
    CHECK_THROWS_AS(decode(longer), squall::invalid_argument);
    CHECK_THROWS_WITH_AS(decode(std::vector<std::byte>(good.begin(), good.begin() + 8)),
                         doctest::Contains("shorter than its 16-byte header"),
                         squall::invalid_argument);
    // a float payload decoded as double
    std::vector<double> d(10);
    CHECK_THROWS_WITH_AS(
        c.decode(host_backend{}, host_view<const std::byte>(good), host_view<double>(d)),
        doctest::Contains("float32 elements decoded as float64"), squall::invalid_argument);
    // a bfloat16 payload decoded by the float16 compressor
    const auto other = encode<bfloat16>(in);
    CHECK_THROWS_AS(decode(other), squall::invalid_argument);
    // a buffer too small to encode into
    std::vector<std::byte> small(good.size() - 1);
    CHECK_THROWS_AS(
        c.encode(host_backend{}, host_view<const float>(in), host_view<std::byte>(small)),
        squall::invalid_argument);
  }

  TEST_CASE("cast compressors model the compressor roles") {
    static_assert(squall::compressor_for<squall::cast_compressor<float16>, float, host_backend>);
    static_assert(squall::compressor_for<squall::cast_compressor<bfloat16>, double, host_backend>);
    static_assert(squall::compression_traits<squall::cast_compressor<float16>>::linear);
    static_assert(squall::compression_traits<squall::cast_compressor<float16>>::fixed_size);
    CHECK(squall::cast_compressor<bfloat16>::name == "cast_bfloat16");
  }
}
