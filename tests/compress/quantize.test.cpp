// SPDX-License-Identifier: Apache-2.0
// The bucketed quantizers (int8, sign, sign_vote, terngrad, qsgd) against the papers'
// definitions and bounds, computed here in double from the input alone: int8's half step,
// the scaled sign's mean |g|, TernGrad's and QSGD's unbiasedness over 10^4 independent
// encodings, QSGD's variance bound (Alistarh et al. 2017, Lemma 3.1), the wire size formula
// of docs/compressors.md, the Philox keying, NaN/Inf handling and decode's validation.
#include <squall/backend/host.hpp>
#include <squall/compress/error_feedback.hpp>
#include <squall/compress/quantize.hpp>
#include <squall/compress/traits.hpp>

#include <doctest/doctest.h>

#include <Random123/philox.h>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "../support/data.hpp"
#include "../support/host_codec.hpp"

namespace {

using squall::host_backend;
using squall::host_view;
using squall::random_stream;

// the quantizers' payloads have a fixed size: encode writes all of max_payload_bytes
template <class C, class T>
std::vector<std::byte> encode(const C& c, const std::vector<T>& in, random_stream stream = {}) {
  auto payload = squall::test::encode_on_host(c, in, stream);
  REQUIRE(payload.size() == c.max_payload_bytes(squall::dtype_of<T>, in.size()));
  return payload;
}

template <class C, class T>
std::vector<T> decode(const C& c, const std::vector<std::byte>& payload, std::size_t count) {
  return squall::test::decode_on_host(c, payload, count, T(-12345));
}

// [begin, end) of bucket b for `bucket` elements per bucket.
std::pair<std::size_t, std::size_t> bucket_range(std::size_t b, std::size_t bucket, std::size_t n) {
  return {b * bucket, std::min(n, (b + 1) * bucket)};
}

template <class T>
double max_abs(const std::vector<T>& v, std::size_t begin, std::size_t end) {
  double m = 0;
  for (std::size_t i = begin; i < end; ++i) m = std::max(m, std::fabs(static_cast<double>(v[i])));
  return m;
}

// The kernels' decode of `x`'s codes (scheme Q, buckets of `bucket`) with plain and with
// non-temporal stores (to a place one element off the alignment): the same bits.
template <squall::kernels::quantize_scheme Q, class T>
void check_streamed_decode(const std::vector<T>& x, std::size_t bucket) {
  const std::size_t count = x.size();
  std::vector<T> scales((count + bucket - 1) / bucket);
  std::vector<std::uint8_t> codes((count * Q.width + 7) / 8);
  squall::kernels::quantize<Q>(host_backend{}, x.data(), count, bucket, scales.data(), codes.data(),
                               5, random_stream{1, 2});
  std::vector<T> plain(count);
  std::vector<T> streamed(count + 1);
  CHECK(squall::kernels::dequantize<Q>(host_backend{}, scales.data(), codes.data(), count, bucket,
                                       plain.data(),
                                       std::numeric_limits<std::size_t>::max()) == count);
  CHECK(squall::kernels::dequantize<Q>(host_backend{}, scales.data(), codes.data(), count, bucket,
                                       streamed.data() + 1, 0) == count);
  for (std::size_t i = 0; i < count; ++i) {
    REQUIRE(squall::test::bits_of(streamed[i + 1]) == squall::test::bits_of(plain[i]));
  }
}

// The signed levels q (code - s) of a quantizer payload of `count` elements in `buckets`
// buckets, read from its bytes (docs/compressors.md: 32 bytes of header and prefix, the
// scales, then the codes of `width` bits, low bits first).
template <class T>
std::vector<int> levels_of(const std::vector<std::byte>& payload, std::size_t count,
                           std::size_t buckets, unsigned width, int s) {
  const std::size_t codes = 32 + buckets * sizeof(T);
  std::vector<int> q(count);
  for (std::size_t k = 0; k < count; ++k) {
    const auto byte = static_cast<unsigned>(payload[codes + k * width / 8]);
    q[k] = static_cast<int>((byte >> (k * width % 8)) & ((1u << width) - 1)) - s;
  }
  return q;
}

template <class T>
T scale_of(const std::vector<std::byte>& payload, std::size_t b) {
  T scale;
  std::memcpy(&scale, payload.data() + 32 + b * sizeof(T), sizeof scale);
  return scale;
}

}  // namespace

TEST_SUITE("quantize") {
  TEST_CASE_TEMPLATE("a decode with non-temporal stores gives the plain decode's bits", T, float,
                     double) {
    // buckets of 512 and of 3000 (a block of 1024 split across buckets), a tail of 7
    for (const std::size_t bucket : {std::size_t{512}, std::size_t{3000}}) {
      CAPTURE(bucket);
      const auto x = squall::test::normal_values<T>(6007, bucket);
      check_streamed_decode<squall::int8_spec::scheme>(x, bucket);
      check_streamed_decode<squall::qsgd_spec<4>::scheme>(x, bucket);
      check_streamed_decode<squall::terngrad_spec::scheme>(x, bucket);
      check_streamed_decode<squall::sign_spec::scheme>(x, bucket);
      check_streamed_decode<squall::fp8_spec<1, false>::scheme>(x, bucket);
      check_streamed_decode<squall::fp8_spec<2, true>::scheme>(x, bucket);
    }
  }

  TEST_CASE_TEMPLATE("a zero gradient decodes to zeros, for every count", T, float, double) {
    for (std::size_t n : {0, 1, 7, 8, 511, 512, 513, 1500}) {
      const std::vector<T> zero(n, T(0));
      auto check = [&](const auto& c) {
        const auto out = decode<std::decay_t<decltype(c)>, T>(c, encode(c, zero, {3, 1}), n);
        for (std::size_t i = 0; i < n; ++i) REQUIRE(out[i] == T(0));
      };
      check(squall::int8_compressor{});
      check(squall::sign_compressor{});
      check(squall::sign_vote_compressor{});
      check(squall::terngrad_compressor{});
      check(squall::qsgd_compressor<4>{});
      check(squall::qsgd_compressor<127>{});
    }
  }

  TEST_CASE_TEMPLATE("int8 is within half a quantization step of the input", T, float, double) {
    for (std::size_t bucket : {8, 64, 512, 0}) {
      const std::size_t n = 3001;
      auto g = squall::test::normal_values<T>(n, 7 + static_cast<unsigned>(bucket), 3.0);
      g[17] = T(1e-42);  // tiny, and a bucket of subnormals below
      for (std::size_t i = 64; i < 72; ++i) g[i] = std::numeric_limits<T>::denorm_min() * T(i - 63);
      squall::int8_compressor c;
      c.bucket = bucket;
      const auto out = decode<squall::int8_compressor, T>(c, encode(c, g), n);
      const std::size_t b_size = bucket == 0 ? n : bucket;
      for (std::size_t b = 0; b * b_size < n; ++b) {
        const auto [begin, end] = bucket_range(b, b_size, n);
        const double step = max_abs(g, begin, end) / 127.0;
        for (std::size_t i = begin; i < end; ++i) {
          const double err = std::fabs(static_cast<double>(out[i]) - static_cast<double>(g[i]));
          // half a step, plus the roundings of |g| x 127 / scale and of the decoded product
          REQUIRE(err <= step * (0.5 + 1e-5) + 4 * std::numeric_limits<T>::denorm_min());
        }
      }
    }
  }

  TEST_CASE_TEMPLATE("sign sends sign(g) times the bucket's mean |g|; the vote form one mean", T,
                     float, double) {
    const std::size_t n = 1037;
    auto g = squall::test::normal_values<T>(n, 11);
    g[5] = T(0);
    g[6] = T(-0.0);
    auto check = [&](const auto& c, std::size_t b_size) {
      const auto out = decode<std::decay_t<decltype(c)>, T>(c, encode(c, g), n);
      for (std::size_t b = 0; b * b_size < n; ++b) {
        const auto [begin, end] = bucket_range(b, b_size, n);
        double mean = 0;
        for (std::size_t i = begin; i < end; ++i) mean += std::fabs(static_cast<double>(g[i]));
        mean /= static_cast<double>(end - begin);
        for (std::size_t i = begin; i < end; ++i) {
          const double expected = g[i] < T(0) ? -mean : mean;  // zero counts as positive
          REQUIRE(static_cast<double>(out[i]) == doctest::Approx(expected).epsilon(1e-6));
        }
      }
    };
    check(squall::sign_compressor{}, 512);
    check(squall::sign_vote_compressor{}, n);
    squall::sign_compressor small;
    small.bucket = 16;
    check(small, 16);
  }

  TEST_CASE_TEMPLATE("terngrad and qsgd are unbiased: 10^4 encodings within 5 standard errors", T,
                     float, double) {
    // One bucket of 64 elements, so each element's level distribution follows from the input
    // alone: |g_i| / scale x s = l + p, the level is l + 1 with probability p, and the decoded
    // value's variance is (scale / s)^2 p (1 - p).
    const std::size_t n = 64;
    const int trials = 10000;
    auto g = squall::test::normal_values<T>(n, 21);
    g[3] = T(0);
    auto check = [&](const auto& c, double scale, double s) {
      std::vector<double> sum(n, 0.0);
      for (int t = 0; t < trials; ++t) {
        const auto out = decode<std::decay_t<decltype(c)>, T>(
            c, encode(c, g, {static_cast<std::uint64_t>(t), 2}), n);
        for (std::size_t i = 0; i < n; ++i) sum[i] += static_cast<double>(out[i]);
      }
      for (std::size_t i = 0; i < n; ++i) {
        const double x = std::fabs(static_cast<double>(g[i])) / scale * s;
        const double p = x - std::floor(x);
        const double se = scale / s * std::sqrt(p * (1 - p) / trials);
        const double mean = sum[i] / trials;
        INFO("element " << i << " g " << static_cast<double>(g[i]) << " mean " << mean);
        REQUIRE(std::fabs(mean - static_cast<double>(g[i])) <= 5 * se + 1e-5 * scale);
      }
    };
    double norm = 0;
    for (T v : g) norm += static_cast<double>(v) * static_cast<double>(v);
    norm = std::sqrt(norm);
    check(squall::terngrad_compressor{}, max_abs(g, 0, n), 1.0);
    check(squall::qsgd_compressor<1>{}, norm, 1.0);
    check(squall::qsgd_compressor<4>{}, norm, 4.0);
    check(squall::qsgd_compressor<16>{}, norm, 16.0);
  }

  TEST_CASE("qsgd's variance is within min(n / s^2, sqrt(n) / s) ||v||^2 (Lemma 3.1)") {
    const int trials = 2000;
    auto check = [&](const auto& c, double s, std::size_t n) {
      const auto g = squall::test::normal_values<float>(n, 5 + static_cast<unsigned>(n));
      double norm2 = 0;
      for (float v : g) norm2 += static_cast<double>(v) * static_cast<double>(v);
      double sq = 0;
      for (int t = 0; t < trials; ++t) {
        const auto out = decode<std::decay_t<decltype(c)>, float>(
            c, encode(c, g, {static_cast<std::uint64_t>(t), 0}), n);
        for (std::size_t i = 0; i < n; ++i) {
          const double d = static_cast<double>(out[i]) - static_cast<double>(g[i]);
          sq += d * d;
        }
      }
      const double variance = sq / trials;
      const double bound =
          std::min(static_cast<double>(n) / (s * s), std::sqrt(static_cast<double>(n)) / s) * norm2;
      MESSAGE("qsgd s=" << s << " n=" << n << ": E||Q(v)-v||^2 / bound = " << variance / bound);
      REQUIRE(variance <= bound);
    };
    for (std::size_t n : {16, 64, 512}) {
      squall::qsgd_compressor<1> q1;
      q1.bucket = n;
      check(q1, 1, n);
      squall::qsgd_compressor<4> q4;
      q4.bucket = n;
      check(q4, 4, n);
      squall::qsgd_compressor<32> q32;
      q32.bucket = n;
      check(q32, 32, n);
    }
  }

  TEST_CASE(
      "stochastic rounding draws Random123's Philox4x32-10 keyed by (seed, step, rank, element)") {
    // qsgd<1> on one bucket: a double element i rounds up iff its 32-bit word, taken from
    // Random123 directly here, is below p x 2^32.
    const std::size_t n = 40;
    const auto g = squall::test::normal_values<double>(n, 3);
    squall::qsgd_compressor<1> c;
    c.seed = 0x1234567890abcdefull;
    const random_stream stream{77, 3};
    const auto out = decode<squall::qsgd_compressor<1>, double>(c, encode(c, g, stream), n);
    double norm = 0;
    for (double v : g) norm += v * v;
    norm = std::sqrt(norm);
    for (std::size_t i = 0; i < n; ++i) {
      const r123::Philox4x32::ctr_type ctr = {{static_cast<std::uint32_t>(i / 4), 0, 77, 3}};
      const r123::Philox4x32::key_type key = {{0x90abcdefu, 0x12345678u}};
      const std::uint32_t word = r123::Philox4x32{}(ctr, key).v[i % 4];
      const double p = std::fabs(g[i]) / norm;
      const bool up = static_cast<double>(word) < p * 4294967296.0;
      REQUIRE(std::fabs(out[i]) == doctest::Approx(up ? norm : 0.0));
    }
    // float draws 16 bits: element i's is half i % 2 (low first) of word i / 2, so block
    // i / 8; up iff that half is below p x 2^16 (elements within one unit of it are skipped:
    // p here is in double, the kernel's in float)
    const std::size_t m = 200;
    const auto gf = squall::test::normal_values<float>(m, 4);
    const auto outf = decode<squall::qsgd_compressor<1>, float>(c, encode(c, gf, stream), m);
    double normf = 0;
    for (float v : gf) normf += static_cast<double>(v) * v;
    normf = std::sqrt(normf);
    std::size_t decided = 0;
    for (std::size_t i = 0; i < m; ++i) {
      const r123::Philox4x32::ctr_type ctr = {{static_cast<std::uint32_t>(i / 8), 0, 77, 3}};
      const r123::Philox4x32::key_type key = {{0x90abcdefu, 0x12345678u}};
      const std::uint32_t word = r123::Philox4x32{}(ctr, key).v[(i / 2) % 4];
      const double half = static_cast<double>((word >> (16 * (i % 2))) & 0xffffu);
      const double threshold = std::fabs(gf[i]) / normf * 65536.0;
      if (std::fabs(half - threshold) <= 1) continue;
      ++decided;
      CAPTURE(i);
      REQUIRE(std::fabs(outf[i]) == doctest::Approx(half < threshold ? normf : 0.0).epsilon(1e-6));
      REQUIRE(squall::stochastic_draw<float>(c.seed, stream, i) ==
              (i % 2 == 0 ? word << 16 : word & 0xffff0000u));
    }
    CHECK(decided > m * 9 / 10);
    // the CUDA twin's four draws a thread (`stochastic_draws4`) are the same numbers, float
    // and double, across a block boundary and a counter past 2^32 blocks
    for (const std::uint64_t quad :
         {std::uint64_t{0}, std::uint64_t{1}, std::uint64_t{7}, (std::uint64_t{1} << 33) + 3}) {
      std::uint32_t four[4], four_double[4];
      squall::stochastic_draws4<float>(c.seed, stream, quad, four);
      squall::stochastic_draws4<double>(c.seed, stream, quad, four_double);
      for (std::uint64_t t = 0; t < 4; ++t) {
        REQUIRE(four[t] == squall::stochastic_draw<float>(c.seed, stream, 4 * quad + t));
        REQUIRE(four_double[t] == squall::stochastic_draw<double>(c.seed, stream, 4 * quad + t));
        REQUIRE(four_double[t] == squall::random_word(c.seed, stream, 4 * quad + t));
      }
    }
    // the same key gives the same payload; another step or rank another one
    CHECK(encode(c, g, stream) == encode(c, g, stream));
    CHECK(encode(c, g, stream) != encode(c, g, {78, 3}));
    CHECK(encode(c, g, stream) != encode(c, g, {77, 4}));
  }

  TEST_CASE("the lane-parallel Philox equals Random123's, word for word") {
    // philox_fill computes 64 blocks per pass (AVX-512) or 32 (AVX2), then 16 or 8; check each
    // width the CPU has (forced narrower in turn), partial passes, a block counter that carries
    // into its high word (inside each width's pass), and keys with both halves set.
    using squall::detail::philox_isa;
    for (const philox_isa isa : {philox_isa::best, philox_isa::avx2, philox_isa::scalar}) {
      for (const std::uint64_t first :
           {std::uint64_t{0}, std::uint64_t{5}, (std::uint64_t{1} << 32) - 7,
            (std::uint64_t{1} << 32) - 12, (std::uint64_t{1} << 32) - 40,
            (std::uint64_t{1} << 32) - 100}) {
        for (const std::size_t blocks :
             {std::size_t{1}, std::size_t{8}, std::size_t{16}, std::size_t{31}, std::size_t{32},
              std::size_t{40}, std::size_t{64}, std::size_t{77}, std::size_t{200}}) {
          CAPTURE(static_cast<int>(isa));
          CAPTURE(first);
          CAPTURE(blocks);
          const std::uint64_t seed = 0xfedcba9876543210ull + first;
          const random_stream stream{0x1'0000'0003ull, 0xdeadbeefu};
          std::vector<std::uint32_t> words(4 * blocks);
          squall::detail::philox_fill_on(isa, seed, stream, first, blocks, words.data());
          for (std::size_t j = 0; j < blocks; ++j) {
            const std::uint64_t b = first + j;
            const r123::Philox4x32::ctr_type ctr = {{static_cast<std::uint32_t>(b),
                                                     static_cast<std::uint32_t>(b >> 32), 3u,
                                                     0xdeadbeefu}};
            const r123::Philox4x32::key_type key = {
                {static_cast<std::uint32_t>(seed), static_cast<std::uint32_t>(seed >> 32)}};
            const auto r = r123::Philox4x32{}(ctr, key);
            for (std::size_t t = 0; t < 4; ++t) REQUIRE(words[4 * j + t] == r.v[t]);
          }
        }
      }
    }
  }

  TEST_CASE_TEMPLATE("bits on the wire per element follow the formula of docs/compressors.md", T,
                     float, double) {
    // 8 x (32 + ceil(n / bucket) x sizeof(T) + ceil(n x width / 8)) / n
    auto check = [](const auto& c, unsigned width, std::size_t bucket, std::size_t n) {
      const auto payload = encode(c, std::vector<T>(n, T(1)));
      const std::size_t buckets = (n + bucket - 1) / bucket;
      const double bits = 8.0 *
                          static_cast<double>(32 + buckets * sizeof(T) + (n * width + 7) / 8) /
                          static_cast<double>(n);
      CHECK(8.0 * static_cast<double>(payload.size()) / static_cast<double>(n) == bits);
    };
    for (std::size_t n : {1, 100, 4096, 100003}) {
      check(squall::int8_compressor{}, 8, 512, n);
      check(squall::sign_compressor{}, 1, 512, n);
      check(squall::sign_vote_compressor{}, 1, n, n);
      check(squall::terngrad_compressor{}, 2, 512, n);
      check(squall::qsgd_compressor<1>{}, 2, 512, n);
      check(squall::qsgd_compressor<4>{}, 4, 512, n);
      check(squall::qsgd_compressor<7>{}, 4, 512, n);
      check(squall::qsgd_compressor<8>{}, 8, 512, n);
    }
  }

  TEST_CASE("NaN and Inf: a bucket holding one decodes to NaN, or check_finite names it") {
    const std::size_t n = 2048;
    for (float bad :
         {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
          -std::numeric_limits<float>::infinity()}) {
      auto g = squall::test::normal_values<float>(n, 9);
      g[700] = bad;  // bucket 1 of 512
      auto check = [&](auto c) {
        using C = decltype(c);
        const auto out = decode<C, float>(c, encode(c, g), n);
        for (std::size_t i = 0; i < n; ++i) {
          if (i >= 512 && i < 1024) {
            REQUIRE(std::isnan(out[i]));
          } else {
            REQUIRE(std::isfinite(out[i]));
          }
        }
        c.check_finite = true;
        std::vector<std::byte> payload(c.max_payload_bytes(squall::dtype::float32, n));
        CHECK_THROWS_WITH_AS(
            c.encode(host_backend{}, host_view<const float>(g), host_view<std::byte>(payload)),
            doctest::Contains("element 700 is not finite"), squall::invalid_argument);
      };
      check(squall::int8_compressor{});
      check(squall::sign_compressor{});
      check(squall::terngrad_compressor{});
      check(squall::qsgd_compressor<4>{});
    }
  }

  TEST_CASE("decode rejects every malformed payload with invalid_argument") {
    const std::size_t n = 1000;
    const auto g = squall::test::normal_values<float>(n, 1);
    const squall::qsgd_compressor<4> c;
    const auto good = encode(c, g);
    std::vector<float> out(n);
    auto rejects = [&](std::vector<std::byte> p, const char* what, std::size_t count = 1000) {
      std::vector<float> o(count);
      CHECK_THROWS_WITH_AS(
          c.decode(host_backend{}, host_view<const std::byte>(p), host_view<float>(o)),
          doctest::Contains(what), squall::invalid_argument);
    };
    auto with = [&](std::size_t offset, auto value) {
      auto p = good;
      std::memcpy(p.data() + offset, &value, sizeof value);
      return p;
    };
    rejects({good.begin(), good.begin() + 10}, "shorter than its 16-byte header");
    rejects({good.begin(), good.begin() + 20}, "ends inside its bucket");
    rejects({good.begin(), good.end() - 1}, "bytes where");
    auto longer = good;
    longer.push_back(std::byte{0});
    rejects(longer, "bytes where");
    rejects(with(2, std::uint8_t{3}), "kind");
    rejects(with(16, std::uint64_t{0}), "bucket of 0");
    rejects(with(16, std::uint64_t{12}), "bucket of 12");
    rejects(with(16, std::uint64_t{2000}), "bucket of 2000");
    rejects(with(16, std::uint64_t{256}), "bytes where");  // more scales than the size holds
    rejects(with(24, std::uint32_t{5}), "5 levels");
    rejects(with(28, std::uint32_t{1}), "reserved word");
    rejects(good, "elements decoded into", n - 1);
    // 2s + 1 = 9 levels in 4-bit codes: the codes 9..15 are no level. The last byte holds
    // elements 998 (low nibble) and 999.
    rejects(with(good.size() - 1, std::uint8_t{0xf9}),
            "code of element 998 is above the top level 8");
    rejects(with(good.size() - 1, std::uint8_t{0x98}),
            "code of element 999 is above the top level 8");
    {
      // terngrad: 3 levels in 2-bit codes (code 3 is none); int8: 255 levels in bytes (255)
      auto corrupt_last = [&](const auto& c2, std::uint8_t last, const char* what) {
        auto p = encode(c2, g);
        p.back() = std::byte{last};
        std::vector<float> o(n);
        CHECK_THROWS_WITH_AS(
            c2.decode(host_backend{}, host_view<const std::byte>(p), host_view<float>(o)),
            doctest::Contains(what), squall::invalid_argument);
      };
      corrupt_last(squall::terngrad_compressor{}, 0xc0,
                   "code of element 999 is above the top level 2");
      corrupt_last(squall::int8_compressor{}, 0xff,
                   "code of element 999 is above the top level 254");
    }
    std::vector<double> wrong_type(n);
    CHECK_THROWS_AS(
        c.decode(host_backend{}, host_view<const std::byte>(good), host_view<double>(wrong_type)),
        squall::invalid_argument);
    c.decode(host_backend{}, host_view<const std::byte>(good),
             host_view<float>(out));  // still fine
    squall::int8_compressor odd;
    odd.bucket = 12;
    CHECK_THROWS_WITH_AS(odd.max_payload_bytes(squall::dtype::float32, n),
                         doctest::Contains("not a multiple of 8"), squall::invalid_argument);
    CHECK_THROWS_AS(odd.max_payload_bytes(squall::dtype::int32, n), squall::invalid_argument);
  }

  TEST_CASE("the aggregations the collectives dispatch on") {
    const auto allowed = [](auto c) {
      return squall::compression_traits<decltype(c)>::aggregations.names();
    };
    CHECK(allowed(squall::int8_compressor{}) == "per_hop, gather");
    CHECK(allowed(squall::sign_compressor{}) == "per_hop, gather");
    CHECK(allowed(squall::sign_vote_compressor{}) == "gather");
    CHECK(squall::compression_traits<squall::sign_vote_compressor>::majority_vote);
    CHECK_FALSE(squall::compression_traits<squall::sign_compressor>::majority_vote);
    CHECK(allowed(squall::terngrad_compressor{}) == "per_hop, gather");
    CHECK(allowed(squall::qsgd_compressor<4>{}) == "per_hop, gather");
    CHECK(squall::compression_traits<squall::qsgd_compressor<4>>::fixed_size);
  }

  TEST_CASE_TEMPLATE("fit_scale: the same codes, each scale s sum q g / sum q^2, nearer g", T,
                     float, double) {
    // Against a serial double fit from the payload's own codes: the codes are the unfitted
    // encoder's, each usable bucket's scale is the least-squares one, so its decoded values are
    // no farther from g than the unfitted scale's and nearer than 0 (a contraction). Buckets of
    // 512 (the last one short, one all zero, one with a NaN), 2048 (two blocks of the host
    // loop), and one for the whole tensor.
    auto check = [&](auto c, int s, std::size_t count, std::size_t bucket) {
      CAPTURE(c.name);
      CAPTURE(count);
      CAPTURE(bucket);
      c.bucket = bucket;
      auto g = squall::test::normal_values<T>(count, 40 + count);
      if (bucket == 512) {
        std::fill(g.begin() + 512, g.begin() + 1024, T(0));
        g[1100] = std::numeric_limits<T>::quiet_NaN();
      }
      auto fit = c;
      fit.fit_scale = true;
      const auto plain = encode(c, g, {7, 1});
      const auto fitted = encode(fit, g, {7, 1});
      const std::size_t size = bucket == 0 ? count : bucket;
      const std::size_t buckets = (count + size - 1) / size;
      const std::size_t codes = 32 + buckets * sizeof(T);
      REQUIRE(fitted.size() == plain.size());
      CHECK(std::memcmp(fitted.data(), plain.data(), 32) == 0);
      CHECK(std::memcmp(fitted.data() + codes, plain.data() + codes, plain.size() - codes) == 0);
      const auto q = levels_of<T>(fitted, count, buckets, c.scheme.width, s);
      const auto dp = decode<decltype(c), T>(c, plain, count);
      const auto df = decode<decltype(c), T>(c, fitted, count);
      std::size_t refitted = 0;
      for (std::size_t b = 0; b < buckets; ++b) {
        CAPTURE(b);
        const auto [begin, end] = bucket_range(b, size, count);
        double dot = 0, square = 0, norm2 = 0, err_plain = 0, err_fit = 0;
        for (std::size_t i = begin; i < end; ++i) {
          const auto x = static_cast<double>(g[i]);
          dot += q[i] * x;
          square += static_cast<double>(q[i]) * q[i];
          norm2 += x * x;
          err_plain += (static_cast<double>(dp[i]) - x) * (static_cast<double>(dp[i]) - x);
          err_fit += (static_cast<double>(df[i]) - x) * (static_cast<double>(df[i]) - x);
        }
        const T sent = scale_of<T>(plain, b);
        const T got = scale_of<T>(fitted, b);
        if (!(sent > T(0)) || !std::isfinite(sent) || square == 0) {
          REQUIRE(squall::test::bits_of(got) == squall::test::bits_of(sent));
          continue;
        }
        ++refitted;
        // the kernel rounds each product and a lane's 32 rows of a block in T, then sums in
        // double in another order: terms of one sign, so at most 33 roundings of T (2^-24
        // each for float, 16.5 epsilons) and n of double apart
        const double expected = s * dot / square;
        const double order = static_cast<double>(end - begin) * 0x1p-52;
        REQUIRE(std::fabs(static_cast<double>(got) - expected) <=
                (17 * std::numeric_limits<T>::epsilon() + order) * expected);
        REQUIRE(err_fit <= err_plain * (1 + 1e-6));
        REQUIRE(err_fit < norm2);
      }
      CHECK(refitted == buckets - (bucket == 512 ? 2 : 0));
    };
    for (const auto& [count, bucket] :
         {std::pair<std::size_t, std::size_t>{2000, 512}, {5000, 2048}, {300, 0}}) {
      check(squall::terngrad_compressor{}, 1, count, bucket);
      check(squall::qsgd_compressor<4>{}, 4, count, bucket);
      check(squall::qsgd_compressor<16>{}, 16, count, bucket);
      check(squall::int8_compressor{}, 127, count, bucket);
    }
    squall::sign_compressor sign;
    sign.fit_scale = true;
    CHECK_THROWS_WITH_AS(encode(sign, std::vector<T>(64, T(1))),
                         doctest::Contains("fit_scale takes integer levels"),
                         squall::invalid_argument);
  }

  TEST_CASE("error feedback around fitted qsgd:4 and terngrad: the residual contracts each step") {
    // ||residual after|| < ||residual before + g|| at every step (the fit makes C a
    // contraction); without the fit these two grow it (docs/performance.md), reported only.
    const std::size_t n = 4096;
    auto run = [&](auto c) {
      const squall::error_feedback<decltype(c)> ef{c};
      squall::error_feedback_state<float> state(n);
      std::vector<std::byte> payload(ef.max_payload_bytes(squall::dtype::float32, n));
      std::vector<float> scratch(n);
      double last = 0;
      bool contracted = true;
      for (std::uint64_t step = 0; step < 60; ++step) {
        const auto g = squall::test::normal_values<float>(n, 300 + static_cast<unsigned>(step));
        double before = 0;
        for (std::size_t i = 0; i < n; ++i) {
          const double r = static_cast<double>(state.residual()[i]) + g[i];
          before += r * r;
        }
        ef.encode(host_backend{}, state, host_view<const float>(g), host_view<std::byte>(payload),
                  host_view<float>(scratch), random_stream{step, 0});
        last = 0;
        for (std::size_t i = 0; i < n; ++i) {
          last += static_cast<double>(state.residual()[i]) * state.residual()[i];
        }
        contracted = contracted && last < before;
      }
      return std::pair{contracted, std::sqrt(last / n)};
    };
    for (const bool fit : {true, false}) {
      squall::qsgd_compressor<4> q;
      q.fit_scale = fit;
      squall::terngrad_compressor t;
      t.fit_scale = fit;
      const auto [q_contracted, q_rms] = run(q);
      const auto [t_contracted, t_rms] = run(t);
      MESSAGE(std::string(fit ? "fitted" : "unfitted")
              << ": residual rms after 60 steps of N(0, 1): qsgd:4 " << q_rms << ", terngrad "
              << t_rms);
      if (fit) {
        CHECK(q_contracted);
        CHECK(t_contracted);
      }
    }
  }

  TEST_CASE("error feedback around terngrad conserves mass and advances the stream") {
    // sum of decoded payloads + final residual = sum of gradients, to float roundings
    const std::size_t n = 777;
    const squall::error_feedback<squall::terngrad_compressor> ef;
    squall::error_feedback_state<float> state(n);
    std::vector<double> sent(n, 0.0), total(n, 0.0);
    std::vector<std::byte> payload(ef.max_payload_bytes(squall::dtype::float32, n));
    std::vector<float> scratch(n), out(n);
    for (std::uint64_t step = 0; step < 100; ++step) {
      const auto g = squall::test::normal_values<float>(n, 100 + static_cast<unsigned>(step));
      const std::size_t size =
          ef.encode(host_backend{}, state, host_view<const float>(g), host_view<std::byte>(payload),
                    host_view<float>(scratch), random_stream{step, 0});
      ef.decode(host_backend{}, host_view<const std::byte>(payload.data(), size),
                host_view<float>(out));
      for (std::size_t i = 0; i < n; ++i) {
        sent[i] += out[i];
        total[i] += g[i];
      }
    }
    const auto r = state.residual();
    for (std::size_t i = 0; i < n; ++i) {
      // each step rounds the residual twice in float (|r| < 8 here): 200 x 2^-21 < 1e-3
      REQUIRE(std::fabs(sent[i] + r[i] - total[i]) <= 1e-3);
    }
  }
}
