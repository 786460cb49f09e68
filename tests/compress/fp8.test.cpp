// SPDX-License-Identifier: Apache-2.0
// The 8-bit float compressor (`fp8_compressor`, issue 17) against references computed here in
// double from the input alone: the per-element error bound of round-to-nearest (half an ulp of
// the format's 3 or 2 fraction bits, or half its subnormal step, in units of max |g| / m), the
// bucket's largest element sent exactly, stochastic rounding's unbiasedness over 4,000
// encodings, the wire size, NaN handling and decode's validation (a NaN code, the other format).
#include <squall/backend/host.hpp>
#include <squall/compress/by_name.hpp>
#include <squall/compress/quantize.hpp>
#include <squall/core/float8.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "../support/data.hpp"
#include "../support/float8_reference.hpp"
#include "../support/host_codec.hpp"

namespace {

using squall::fp8_compressor;
using squall::fp8_format;

template <class T>
std::vector<T> round_trip(const fp8_compressor& c, const std::vector<T>& g,
                          squall::random_stream stream = {}) {
  const auto payload = squall::test::encode_on_host(c, g, stream);
  REQUIRE(payload.size() == c.max_payload_bytes(squall::dtype_of<T>, g.size()));
  return squall::test::decode_on_host(c, payload, g.size(), T(-12345));
}

// The format's constants, in double: largest finite m, fraction bits, the subnormal step.
struct format_constants {
  double m;
  int fraction_bits;
  double subnormal_step;
};
format_constants constants_of(fp8_format f) {
  return f == fp8_format::e4m3 ? format_constants{448.0, 3, std::ldexp(1.0, -9)}
                               : format_constants{57344.0, 2, std::ldexp(1.0, -16)};
}

#if defined(SQUALL_HAS_AVX2_PHILOX)
/// The fp8 kernels' instruction sets this CPU runs, widest first, the generic loop last.
std::vector<squall::kernels::detail::float8_isa> isas_here() {
  using squall::kernels::detail::float8_isa;
  std::vector<float8_isa> isas;
  if (squall::detail::cpu_has_avx512f()) isas.push_back(float8_isa::avx512);
  if (squall::detail::cpu_has_avx2()) isas.push_back(float8_isa::avx2);
  isas.push_back(float8_isa::generic);
  return isas;
}
#endif

}  // namespace

TEST_SUITE("fp8") {
  TEST_CASE_TEMPLATE("fp8, to nearest: within half an ulp, the bucket's largest exact", T, float,
                     double) {
    for (const fp8_format f : {fp8_format::e4m3, fp8_format::e5m2}) {
      for (const std::size_t bucket : {8, 64, 512, 0}) {
        CAPTURE(static_cast<int>(f));
        CAPTURE(bucket);
        const std::size_t n = 3001;
        auto g = squall::test::normal_values<T>(n, 5 + bucket, 2.0);
        g[10] = T(1e-30);  // far below the bucket's scale: flushed to zero or a subnormal
        for (std::size_t i = 100; i < 108; ++i) g[i] = T(0);
        fp8_compressor c{.format = f, .bucket = bucket};
        const auto out = round_trip(c, g);
        const auto k = constants_of(f);
        const std::size_t size = bucket == 0 ? n : bucket;
        for (std::size_t begin = 0; begin < n; begin += size) {
          const std::size_t end = std::min(n, begin + size);
          double scale = 0;
          for (std::size_t i = begin; i < end; ++i) {
            scale = std::max(scale, std::fabs(static_cast<double>(g[i])));
          }
          for (std::size_t i = begin; i < end; ++i) {
            const double x = static_cast<double>(g[i]);
            const double err = std::fabs(static_cast<double>(out[i]) - x);
            // half an ulp of the format, or half its subnormal step (in units of scale / m),
            // plus the roundings of the float product and of the decode
            const double bound = std::max(std::fabs(x) * std::ldexp(1.0, -k.fraction_bits - 1),
                                          scale / k.m * k.subnormal_step / 2);
            INFO("element " << i << " g " << x << " decoded " << static_cast<double>(out[i]));
            REQUIRE(err <= bound * (1 + 1e-5) + std::fabs(x) * 4e-7);
            if (std::fabs(x) == scale) {
              REQUIRE(static_cast<double>(out[i]) == doctest::Approx(x).epsilon(1e-6));
            }
          }
        }
      }
    }
  }

  TEST_CASE("fp8, stochastic: a neighbour each time, unbiased over 4,000 encodings") {
    for (const fp8_format f : {fp8_format::e4m3, fp8_format::e5m2}) {
      CAPTURE(static_cast<int>(f));
      const std::size_t n = 64;
      const int trials = 4000;
      auto g = squall::test::normal_values<float>(n, 31, 1.0);
      g[7] = 0.0f;
      const fp8_compressor c{.format = f, .stochastic = true, .bucket = 0, .seed = 17};
      double scale = 0;
      for (const float v : g) scale = std::max(scale, std::fabs(static_cast<double>(v)));
      const auto k = constants_of(f);
      std::vector<double> sum(n, 0.0);
      for (int t = 0; t < trials; ++t) {
        const auto out = round_trip(c, g, {static_cast<std::uint64_t>(t), 1});
        for (std::size_t i = 0; i < n; ++i) sum[i] += static_cast<double>(out[i]);
      }
      for (std::size_t i = 0; i < n; ++i) {
        // the two codes around |g| x m / scale, from the format's own conversions
        const auto x = static_cast<float>(std::fabs(static_cast<double>(g[i])) * k.m / scale);
        double below, above;
        if (f == fp8_format::e4m3) {
          squall::float8_e4m3 near(x);
          below = float(near) > x ? float(squall::float8_e4m3::from_bits(near.bits() - 1))
                                  : float(near);
          above = float(squall::float8_e4m3::from_bits(squall::float8_e4m3(below).bits() + 1));
        } else {
          squall::float8_e5m2 near(x);
          below = float(near) > x ? float(squall::float8_e5m2::from_bits(near.bits() - 1))
                                  : float(near);
          above = float(squall::float8_e5m2::from_bits(squall::float8_e5m2(below).bits() + 1));
        }
        // at the format's largest value (the bucket's largest element) nothing is above
        const bool top = !std::isfinite(above);
        const double p = x <= below || top ? 0.0 : (x - below) / (above - below);
        const double step = top ? 0.0 : above - below;
        const double se = step * scale / k.m * std::sqrt(p * (1 - p) / trials);
        const double mean = sum[i] / trials;
        INFO("element " << i << " g " << g[i] << " mean " << mean);
        REQUIRE(std::fabs(mean - static_cast<double>(g[i])) <= 5 * se + 1e-6 * scale);
      }
    }
  }

#if defined(SQUALL_HAS_AVX2_PHILOX)
  TEST_CASE("fp8: the AVX-512 and AVX2 codes are the generic conversions'") {
    // every exponent (subnormal, normal, Inf and NaN patterns), 2^23 / 8191 mantissas each
    // and the ties, both signs, a 16-bit draw each, times 1 and times a bucket's 448 / scale; a
    // count that is not a multiple of 16, so the tail goes through the generic loop; both
    // formats and roundings, on each instruction set the CPU has
    namespace d = squall::kernels::detail;
    if (!squall::detail::cpu_has_avx512f()) {
      MESSAGE("this CPU has no AVX-512: the AVX-512 fp8 codes are not run here");
    }
    std::vector<float> in;
    const auto add = [&](std::uint32_t e, std::uint32_t m) {
      for (const std::uint32_t sign : {0u, 1u}) {
        const std::uint32_t bits = (sign << 31) | (e << 23) | m;
        float x;
        std::memcpy(&x, &bits, sizeof x);
        in.push_back(x);
      }
    };
    for (std::uint32_t e = 0; e < 256; ++e) {
      for (std::uint32_t m = 0; m < (1u << 23); m += 8191) add(e, m);
      // the ties to nearest of both formats (half a step, either lowest kept bit) and the ends
      for (const std::uint32_t m : {0x80000u, 0x180000u, 0x100000u, 0x300000u, 0x7fffffu, 1u})
        add(e, m);
    }
    in.push_back(0.0f);
    const std::size_t n = in.size() - in.size() % 16 + 5;
    in.resize(n, 1.5f);
    std::vector<std::uint16_t> draws(n);
    std::uint32_t r = 2463534242u;
    for (auto& w : draws) {
      r ^= r << 13;
      r ^= r >> 17;
      r ^= r << 5;
      w = static_cast<std::uint16_t>(r >> 7);
    }
    draws[0] = 0;
    draws[1] = 0xffff;
    const auto* bytes = reinterpret_cast<const unsigned char*>(draws.data());
    // the codes of a block through `quantize_codes` on `isa`, against the conversion itself
    const auto differ = [&]<squall::kernels::quantize_scheme Q>(d::float8_isa isa, float inverse) {
      using format = squall::detail::float8_format_of<Q.float8>;
      std::vector<std::uint8_t> codes(n);
      d::quantize_codes<Q>(in.data(), n, inverse, bytes, codes.data(), isa);
      std::size_t count = 0;
      for (std::size_t k = 0; k < n; ++k) {
        const float x = in[k] * inverse;
        const std::uint8_t expected = Q.stochastic
                                          ? squall::detail::float_to_float8_stochastic<format>(
                                                x, squall::draw_as_word<float>(draws[k]))
                                          : squall::detail::float_to_float8<format>(x);
        count += codes[k] != expected;
      }
      return count;
    };
    for (const auto isa : isas_here()) {
      for (const float inverse : {1.0f, 448.0f / 3.7f}) {
        CAPTURE(static_cast<int>(isa));
        CAPTURE(inverse);
        CHECK(differ.template operator()<squall::fp8_spec<1, false>::scheme>(isa, inverse) == 0);
        CHECK(differ.template operator()<squall::fp8_spec<2, false>::scheme>(isa, inverse) == 0);
        CHECK(differ.template operator()<squall::fp8_spec<1, true>::scheme>(isa, inverse) == 0);
        CHECK(differ.template operator()<squall::fp8_spec<2, true>::scheme>(isa, inverse) == 0);
      }
    }
  }

  TEST_CASE("fp8: the AVX-512 and AVX2 decodes are the OFP8 values times the scale") {
    // every code of both formats in a shuffled order, 1,300 of them (the tail of 4 through the
    // generic loop), against each code's value by the specification (in double, exact in
    // float) times the scale then 1 / m in float, the decode's order; with the default
    // floating-point modes and with denormals-are-zero and flush-to-zero set (the decode reads
    // no subnormal float, so its values change only where a product is subnormal, as the
    // reference's do); on each instruction set the CPU has
    namespace d = squall::kernels::detail;
    std::vector<std::uint8_t> codes(1300);
    for (std::size_t k = 0; k < codes.size(); ++k) codes[k] = static_cast<std::uint8_t>(k);
    std::shuffle(codes.begin(), codes.end(), std::mt19937(17));
    const auto differ = [&]<squall::kernels::quantize_scheme Q>(d::float8_isa isa, float scale,
                                                                std::size_t n) {
      using format = squall::detail::float8_format_of<Q.float8>;
      std::vector<float> out(n);
      const bool valid = d::dequantize_codes<Q>(codes.data(), n, scale, out.data(), isa);
      bool any_invalid = false;
      std::size_t count = 0;
      for (std::size_t k = 0; k < n; ++k) {
        any_invalid = any_invalid || (codes[k] & 0x7f) > format::max_finite;
        const double value = squall::test::float8_reference_value<format>(codes[k]);
        const float expected =
            static_cast<float>(value) * scale * (1.0f / static_cast<float>(Q.levels));
        if (std::isnan(expected)) {
          count += !std::isnan(out[k]);
        } else {
          count += std::memcmp(&expected, &out[k], sizeof expected) != 0;
        }
      }
      count += valid == any_invalid;  // the validity the decode reports
      return count;
    };
    const auto run = [&] {
      for (const auto isa : isas_here()) {
        for (const float scale : {1.0f, 3.7f, 1e-35f, 6e37f}) {
          for (const std::size_t n : {codes.size(), std::size_t{16}, std::size_t{0}}) {
            CAPTURE(static_cast<int>(isa));
            CAPTURE(scale);
            CAPTURE(n);
            CHECK(differ.template operator()<squall::fp8_spec<1, false>::scheme>(isa, scale, n) ==
                  0);
            CHECK(differ.template operator()<squall::fp8_spec<2, false>::scheme>(isa, scale, n) ==
                  0);
          }
        }
      }
    };
    squall::test::in_both_float_modes(run);
  }
#endif

  TEST_CASE("fp8: 8 bits per element and a scale per bucket; zeros decode to zeros") {
    for (const std::size_t n : {0, 1, 7, 8, 511, 512, 513, 1500}) {
      const fp8_compressor c{};
      const std::size_t buckets = n == 0 ? 0 : (n + 511) / 512;
      CHECK(c.max_payload_bytes(squall::dtype::float32, n) == 32 + 4 * buckets + n);
      CHECK(c.max_payload_bytes(squall::dtype::float64, n) == 32 + 8 * buckets + n);
      const auto out = round_trip(c, std::vector<float>(n, 0.0f));
      CHECK(std::all_of(out.begin(), out.end(), [](float x) { return x == 0.0f; }));
    }
  }

  TEST_CASE("fp8: a NaN makes its bucket NaN, or check_finite names it") {
    std::vector<float> g(1024, 1.0f);
    g[600] = std::numeric_limits<float>::quiet_NaN();
    const auto out = round_trip(fp8_compressor{}, g);
    CHECK(std::all_of(out.begin(), out.begin() + 512, [](float x) { return x == 1.0f; }));
    CHECK(std::all_of(out.begin() + 512, out.end(), [](float x) { return std::isnan(x); }));
    fp8_compressor strict{.check_finite = true};
    try {
      (void)squall::test::encode_on_host(strict, g);
      FAIL("no error");
    } catch (const squall::invalid_argument& e) {
      CHECK(std::string(e.what()).find("600") != std::string::npos);
    }
  }

  TEST_CASE("fp8 decode rejects a NaN code, and a payload of the other format") {
    const std::vector<float> g = squall::test::normal_values<float>(100, 3);
    const fp8_compressor e4m3{};
    auto payload = squall::test::encode_on_host(e4m3, g);
    const fp8_compressor e5m2{.format = fp8_format::e5m2};
    try {
      (void)squall::test::decode_on_host(e5m2, payload, g.size(), 0.0f);
      FAIL("no error");
    } catch (const squall::invalid_argument& e) {
      CHECK(std::string(e.what()).find("57344 are expected") != std::string::npos);
    }
    payload[payload.size() - 3] = std::byte{0x7f};  // element 97: E4M3's NaN
    try {
      (void)squall::test::decode_on_host(e4m3, payload, g.size(), 0.0f);
      FAIL("no error");
    } catch (const squall::invalid_argument& e) {
      CHECK(std::string(e.what()).find("element 97 is an 8-bit float NaN") != std::string::npos);
    }
    const fp8_compressor bad{.format = static_cast<fp8_format>(3)};
    CHECK_THROWS_AS((void)bad.max_payload_bytes(squall::dtype::float32, 4),
                    squall::invalid_argument);
  }

  TEST_CASE("fp8 by name: cast:e4m3, cast:e5m2 and their _sr forms") {
    const auto format_of = [](const std::string& text) {
      return squall::visit_compressor(squall::parse_compressor(text), [](const auto& c) {
        using C = std::decay_t<decltype(c)>;
        if constexpr (std::is_same_v<C, fp8_compressor>) {
          return static_cast<int>(c.format) * 10 + (c.stochastic ? 1 : 0);
        } else {
          return -1;
        }
      });
    };
    CHECK(format_of("cast:e4m3") == 10);
    CHECK(format_of("cast:e5m2") == 20);
    CHECK(format_of("cast:e4m3_sr") == 11);
    CHECK(format_of("cast:e5m2_sr") == 21);
    CHECK(format_of("cast:bf16") == -1);
    CHECK_THROWS_AS(format_of("cast:e3m4"), squall::invalid_argument);
  }
}
