// SPDX-License-Identifier: Apache-2.0
// count_sketch_compressor and powersgd_compressor against independent references: a serial
// double count sketch built from the documented hash formula, a full sort for the heavy
// hitters, the Chebyshev + median recovery bound of Charikar et al. (ICALP 2002), exact
// low-rank recovery and the Eckart-Young error of PowerSGD (Vogels et al., NeurIPS 2019),
// the payload size formulas of docs/compressors.md, and decode's validation; FetchSGD
// (Rothchild et al., ICML 2020) against DGC's momentum correction with masking (Lin et al.,
// ICLR 2018) where no two coordinates share a bucket, and its state's checks.
#include <squall/backend/host.hpp>
#include <squall/compress/fetchsgd.hpp>
#include <squall/compress/sketch.hpp>
#include <squall/compress/state.hpp>
#include <squall/compress/traits.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <utility>
#include <vector>

#include "../support/host_codec.hpp"

namespace {

using squall::host_backend;
using squall::host_view;

template <class C, class T>
std::vector<std::byte> encode(const C& c, const std::vector<T>& in,
                              squall::random_stream stream = {}) {
  auto payload = squall::test::encode_on_host(c, in, stream);
  REQUIRE(payload.size() == c.max_payload_bytes(squall::dtype_of<T>, in.size()));  // fixed size
  return payload;
}

template <class C, class T>
std::vector<T> decode(const C& c, const std::vector<std::byte>& payload, std::size_t count) {
  return squall::test::decode_on_host(c, payload, count, T(-7));
}

template <class C, class T>
std::vector<T> estimates(const C& c, const std::vector<std::byte>& payload, std::size_t count) {
  std::vector<T> out(count, T(-7));
  c.estimate(host_backend{}, host_view<const std::byte>(payload), host_view<T>(out));
  return out;
}

// The sketch values of a count-sketch payload, as T.
template <class T>
std::vector<T> sketch_values(const std::vector<std::byte>& payload, std::size_t n) {
  std::vector<T> v(n);
  std::memcpy(v.data(), payload.data() + 40, n * sizeof(T));
  return v;
}

// The documented hash, written out here from the formula (not from the kernels' helpers):
// w = a i + b mod 2^64 with (a, b) from Philox block `row` of (seed, step, shared_rank);
// sign = the top bit (1 means -1), bucket = the log2(cols) bits below it.
struct reference_hash {
  std::uint64_t a = 0;
  std::uint64_t b = 0;
  unsigned bits = 0;
  reference_hash(std::uint64_t seed, std::uint64_t step, std::size_t row, std::size_t cols) {
    const squall::philox_block x = squall::philox(seed, {step, squall::shared_rank}, row);
    a = x.word[0] | (std::uint64_t{x.word[1]} << 32);
    b = x.word[2] | (std::uint64_t{x.word[3]} << 32);
    while ((std::size_t{1} << bits) < cols) ++bits;
  }
  std::size_t bucket(std::size_t i) const {
    const std::uint64_t w = a * i + b;
    return static_cast<std::size_t>((w >> (63 - bits)) & ((std::uint64_t{1} << bits) - 1));
  }
  double sign(std::size_t i) const {
    const std::uint64_t w = a * i + b;
    return (w >> 63) ? -1.0 : 1.0;
  }
};

// The count sketch of `g`, serially in double, with each bucket's error bound for a float
// sum: (terms - 1) eps_float sum |terms| (Higham's recursive-summation bound, first order).
struct reference_sketch {
  std::vector<double> value;
  std::vector<double> bound;
  reference_sketch(const std::vector<double>& g, std::size_t rows, std::size_t cols,
                   std::uint64_t seed, std::uint64_t step)
      : value(rows * cols, 0.0), bound(rows * cols, 0.0) {
    std::vector<double> mass(rows * cols, 0.0), terms(rows * cols, 0.0);
    for (std::size_t r = 0; r < rows; ++r) {
      const reference_hash h(seed, step, r, cols);
      for (std::size_t i = 0; i < g.size(); ++i) {
        value[r * cols + h.bucket(i)] += h.sign(i) * g[i];
        mass[r * cols + h.bucket(i)] += std::fabs(g[i]);
        terms[r * cols + h.bucket(i)] += 1.0;
      }
    }
    for (std::size_t e = 0; e < bound.size(); ++e) bound[e] = 1.01 * terms[e] * 0x1p-24 * mass[e];
  }
};

// Pr[Binomial(rows, p) >= ceil(rows / 2)]: the median of `rows` independent row estimates is
// off by at least t only if at least ceil(rows / 2) of them are.
double median_failure_bound(std::size_t rows, double p) {
  double total = 0.0;
  for (std::size_t j = (rows + 1) / 2; j <= rows; ++j) {
    double binom = 1.0;
    for (std::size_t e = 0; e < j; ++e)
      binom = binom * static_cast<double>(rows - e) / static_cast<double>(e + 1);
    total += binom * std::pow(p, static_cast<double>(j)) *
             std::pow(1.0 - p, static_cast<double>(rows - j));
  }
  return total;
}

std::vector<float> normal_floats(std::size_t n, unsigned seed, float sd = 1.0f) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> d(0.0f, sd);
  std::vector<float> v(n);
  for (auto& x : v) x = d(gen);
  return v;
}

}  // namespace

TEST_SUITE("sketch") {
  // ---- count sketch ------------------------------------------------------------------------

  TEST_CASE("count_sketch: traits, zero gradient and count 0") {
    using C = squall::count_sketch_compressor<3, 256>;
    static_assert(squall::compression_traits<C>::linear);
    static_assert(squall::compression_traits<C>::fixed_size);
    static_assert(squall::compressor_for<C, float, host_backend>);
    static_assert(squall::compressor_for<C, double, host_backend>);
    const C c{.seed = 9};
    const std::vector<float> zero(1000, 0.0f);
    for (const auto& v : {decode<C, float>(c, encode(c, zero), 1000),
                          estimates<C, float>(c, encode(c, zero), 1000)}) {
      for (float x : v) REQUIRE(x == 0.0f);
    }
    const std::vector<double> none;
    const auto payload = encode(c, none);
    CHECK(payload.size() == 40 + 3 * 256 * 8);
    CHECK(decode<C, double>(c, payload, 0).empty());
  }

  TEST_CASE("count_sketch: the sketch equals a serial double reference from the hash formula") {
    using C = squall::count_sketch_compressor<5, 64>;
    const C c{.seed = 0x1234567890abcdefull};
    const std::vector<float> g = normal_floats(3001, 1);
    const std::vector<double> gd(g.begin(), g.end());
    for (std::uint64_t step : {0ull, 1ull, 77ull}) {
      const auto payload = encode(c, g, {step, 3});  // the rank word is ignored
      std::uint64_t seed = 0, stored_step = 0;
      std::memcpy(&seed, payload.data() + 16, 8);
      std::memcpy(&stored_step, payload.data() + 24, 8);
      CHECK(seed == c.seed);
      CHECK(stored_step == step);
      const auto got = sketch_values<float>(payload, 5 * 64);
      const reference_sketch want(gd, 5, 64, c.seed, step);
      for (std::size_t e = 0; e < got.size(); ++e) {
        REQUIRE(std::fabs(got[e] - want.value[e]) <= want.bound[e]);
      }
      // the estimates: medians of the reference's signed buckets
      const auto est = estimates<C, float>(c, payload, g.size());
      for (std::size_t i = 0; i < g.size(); ++i) {
        std::vector<double> row(5);
        for (std::size_t r = 0; r < 5; ++r) {
          const reference_hash h(c.seed, step, r, 64);
          row[r] = h.sign(i) * static_cast<double>(got[r * 64 + h.bucket(i)]);
        }
        std::sort(row.begin(), row.end());
        REQUIRE(est[i] == static_cast<float>(row[2]));
      }
    }
  }

  TEST_CASE("count_sketch: sketches of one seed and step add (linear)") {
    using C = squall::count_sketch_compressor<3, 128>;
    const C c{.seed = 42};
    const std::vector<float> a = normal_floats(5000, 2);
    const std::vector<float> b = normal_floats(5000, 3, 4.0f);
    std::vector<float> sum(a.size());
    for (std::size_t i = 0; i < a.size(); ++i) sum[i] = a[i] + b[i];
    const auto sa = sketch_values<float>(encode(c, a, {5, 0}), 3 * 128);
    const auto sb = sketch_values<float>(encode(c, b, {5, 1}), 3 * 128);  // another rank
    const auto ss = sketch_values<float>(encode(c, sum, {5, 2}), 3 * 128);
    // bound: the three float bucket sums' error bounds from the double reference, plus the
    // rounding of a + b (at most eps / 2 relative per element, covered by counting the third
    // bound twice) and of the final addition
    const std::vector<double> ad(a.begin(), a.end()), bd(b.begin(), b.end()),
        sd(sum.begin(), sum.end());
    const reference_sketch ra(ad, 3, 128, c.seed, 5), rb(bd, 3, 128, c.seed, 5),
        rs(sd, 3, 128, c.seed, 5);
    double worst = 0.0;
    for (std::size_t e = 0; e < 3 * 128; ++e) {
      const double diff = std::fabs(static_cast<double>(sa[e]) + sb[e] - ss[e]);
      const double bound = ra.bound[e] + rb.bound[e] + 2.0 * rs.bound[e] +
                           0x1p-24 * std::fabs(static_cast<double>(sa[e]) + sb[e]);
      REQUIRE(diff <= bound);
      worst = std::max(worst, diff / bound);
    }
    MESSAGE("largest |S(a) + S(b) - S(a + b)| as a fraction of its rounding bound: " << worst);
    // another step hashes differently: no longer additive
    const auto other = sketch_values<float>(encode(c, b, {6, 1}), 3 * 128);
    CHECK(other != sb);
  }

  TEST_CASE("count_sketch: decode keeps the k largest estimates (full-sort reference)") {
    using C = squall::count_sketch_compressor<3, 64>;
    for (std::size_t k : {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{5000}}) {
      const C c{.seed = 3, .heavy_hitters = k};
      const std::vector<float> g = normal_floats(2000, 4);
      const auto payload = encode(c, g);
      const auto est = estimates<C, float>(c, payload, g.size());
      const auto out = decode<C, float>(c, payload, g.size());
      const std::size_t keep = std::min<std::size_t>(k == 0 ? 64 / 4 : k, g.size());
      std::vector<std::size_t> order(g.size());
      std::iota(order.begin(), order.end(), 0);
      std::sort(order.begin(), order.end(), [&](std::size_t x, std::size_t y) {
        const float ax = std::fabs(est[x]), ay = std::fabs(est[y]);
        return ax > ay || (ax == ay && x < y);
      });
      std::vector<char> kept(g.size(), 0);
      for (std::size_t e = 0; e < keep; ++e) kept[order[e]] = 1;
      for (std::size_t i = 0; i < g.size(); ++i) REQUIRE(out[i] == (kept[i] ? est[i] : 0.0f));
    }
    // ties go to the lower index: in a 1 x 1 sketch every estimate is +-S (S the one bucket,
    // odd for 9 ones, so not 0), all of one magnitude
    using one_bucket = squall::count_sketch_compressor<1, 1>;
    const one_bucket one{.heavy_hitters = 3};
    const auto payload = encode(one, std::vector<double>(9, 1.0));
    const auto est = estimates<one_bucket, double>(one, payload, 9);
    const auto out = decode<one_bucket, double>(one, payload, 9);
    for (std::size_t i = 0; i < 9; ++i) {
      CHECK(std::fabs(est[i]) == std::fabs(est[0]));
      CHECK(out[i] == (i < 3 ? est[i] : 0.0));
    }
    CHECK(est[0] != 0.0);
  }

  // Recovery (Charikar, Chen, Farach-Colton 2002, Lemma 3; SketchSGD's heavy hitters). For a
  // coordinate i, row r's estimate s_r(i) S[r][h_r(i)] = g_i + sum_{j != i} s_r(i) s_r(j)
  // g_j [h_r(j) = h_r(i)] has mean g_i and variance sum_{j != i} g_j^2 / Cols <= ||g||^2 / Cols
  // (pairwise independent h and s). Chebyshev: Pr[|error_r| >= eps ||g|| / 2] <= p =
  // 4 / (eps^2 Cols). The rows are independent (independent Philox draws), and the median is
  // off by eps ||g|| / 2 or more only if at least ceil(Rows / 2) rows are, so a coordinate
  // fails with probability at most delta = Pr[Binomial(Rows, p) >= ceil(Rows / 2)].
  //
  // Each of 1000 trials plants H heavy coordinates of magnitude f ||g|| >= eps ||g|| among 16384
  // N(0, 1) ones (so ||g||^2 = 16384 / (1 - H f^2) up to the noise's own norm) with a fresh seed; a
  // heavy coordinate fails if its estimate errs by eps ||g|| / 2 or more, or (for Rows >= 3,
  // where k = Cols / 4 exceeds the coordinates that can compete) if decode drops it. Failures
  // F over N = trials x H coordinates must satisfy F <= N delta + 4 sqrt(N delta) + 1: if the
  // true rate is at most delta, exceeding that has probability below 1e-4 (a 4-sigma normal
  // tail of the binomial, the +1 covering small N delta); the heavy coordinates of one trial
  // share the sketch, so their failures are not quite independent, which the 4 sigma absorbs.
  TEST_CASE_TEMPLATE("count_sketch: heavy hitters recovered within the Chebyshev-median bound",
                     Case, std::integral_constant<int, 0>, std::integral_constant<int, 1>,
                     std::integral_constant<int, 2>) {
    constexpr std::size_t rows = Case::value == 0 ? 1 : Case::value == 1 ? 3 : 5;
    constexpr std::size_t cols = Case::value == 0 ? 64 : Case::value == 1 ? 256 : 1024;
    const double eps = Case::value == 0 ? 0.5 : Case::value == 1 ? 0.3 : 0.2;
    const std::size_t heavy = Case::value == 0 ? 2 : Case::value == 1 ? 4 : 8;
    const double f = Case::value == 0 ? 0.55 : Case::value == 1 ? 0.32 : 0.25;
    const bool check_presence = rows >= 3;
    using C = squall::count_sketch_compressor<rows, cols>;
    const std::size_t n = 16384;
    const std::size_t trials = 1000;
    const double p = 4.0 / (eps * eps * static_cast<double>(cols));
    const double delta = median_failure_bound(rows, p);
    std::size_t failures = 0;
    std::size_t row_failures = 0;  // one row's estimate (row 0), against p
    std::size_t coordinates = 0;   // tested: |g_i| >= eps ||g||
    for (std::size_t t = 0; t < trials; ++t) {
      const C c{.seed = 1000 + t};
      std::vector<float> g = normal_floats(n, static_cast<unsigned>(t + 7));
      const double noise =
          std::sqrt(static_cast<double>(n) / (1.0 - static_cast<double>(heavy) * f * f));
      std::mt19937 gen(static_cast<unsigned>(t));
      std::vector<std::size_t> where;
      while (where.size() < heavy) {
        const std::size_t i = gen() % n;
        if (std::find(where.begin(), where.end(), i) == where.end()) where.push_back(i);
      }
      for (std::size_t e = 0; e < heavy; ++e)
        g[where[e]] = static_cast<float>((e % 2 ? -1.0 : 1.0) * f * noise);
      double norm = 0.0;
      for (float x : g) norm += static_cast<double>(x) * x;
      norm = std::sqrt(norm);
      const auto payload = encode(c, g);
      const auto est = estimates<C, float>(c, payload, n);
      const auto out = decode<C, float>(c, payload, n);
      const auto values = sketch_values<float>(payload, rows * cols);
      const reference_hash h0(c.seed, 0, 0, cols);
      for (std::size_t i = 0; i < n; ++i) {
        if (std::fabs(g[i]) < eps * norm) continue;  // every coordinate >= eps ||g|| is tested
        ++coordinates;
        const bool far = std::fabs(static_cast<double>(est[i]) - g[i]) >= eps * norm / 2;
        const bool dropped = check_presence && out[i] != est[i];
        failures += (far || dropped) ? 1 : 0;
        const double row0 = h0.sign(i) * values[h0.bucket(i)];
        row_failures += std::fabs(row0 - g[i]) >= eps * norm / 2 ? 1 : 0;
      }
    }
    REQUIRE(coordinates >= trials * heavy);  // the planted ones at least
    const double tested = static_cast<double>(coordinates);
    const double allowed = tested * delta + 4.0 * std::sqrt(tested * delta) + 1.0;
    const double row_allowed = tested * p + 4.0 * std::sqrt(tested * p) + 1.0;
    MESSAGE("count_sketch<" << rows << ", " << cols << ">, eps " << eps << ": " << failures
                            << " of " << tested << " heavy coordinates failed (rate "
                            << failures / tested << ", bound " << delta << "); one row: rate "
                            << row_failures / tested << ", Chebyshev bound " << p);
    CHECK(static_cast<double>(failures) <= allowed);
    CHECK(static_cast<double>(row_failures) <= row_allowed);
  }

  // The hash family's promises (kernels/host/sketch.hpp), measured over 20000 steps (fresh
  // Philox draws) for fixed index pairs, near and far apart (up to 2^47): bucket collisions
  // of two indices at rate 1 / Cols, signs agreeing at rate 1 / 2, a bucket's sign
  // independent of its bucket, and two rows independent (joint collision 1 / Cols^2). Each
  // rate must lie within 5 binomial standard deviations of its promise.
  TEST_CASE("count_sketch: hash pairwise independence and row independence (statistics)") {
    const std::size_t cols = 64;
    const std::size_t steps = 20000;
    const auto within = [&](std::size_t hits, double rate) {
      const double n = static_cast<double>(steps);
      return std::fabs(static_cast<double>(hits) - n * rate) <=
             5.0 * std::sqrt(n * rate * (1 - rate)) + 1.0;
    };
    const std::pair<std::uint64_t, std::uint64_t> pairs[] = {{0, 1},
                                                             {1, 2},
                                                             {5, 1000},
                                                             {4096, 8192},
                                                             {(1ull << 31) - 1, (1ull << 40) + 3},
                                                             {3, (1ull << 47) + 3}};
    for (const auto& pair : pairs) {
      const std::uint64_t i = pair.first, j = pair.second;  // named: INFO captures them
      std::size_t collide = 0, same_sign = 0, both_rows = 0, low_half_and_plus = 0;
      for (std::size_t step = 0; step < steps; ++step) {
        const reference_hash h0(77, step, 0, cols), h1(77, step, 1, cols);
        const bool c0 = h0.bucket(i) == h0.bucket(j);
        collide += c0 ? 1 : 0;
        same_sign += h0.sign(i) == h0.sign(j) ? 1 : 0;
        both_rows += (c0 && h1.bucket(i) == h1.bucket(j)) ? 1 : 0;
        low_half_and_plus += (h0.bucket(i) < cols / 2 && h0.sign(i) > 0) ? 1 : 0;
      }
      INFO("pair " << i << ", " << j);
      CHECK(within(collide, 1.0 / cols));
      CHECK(within(same_sign, 0.5));
      CHECK(within(both_rows, 1.0 / (cols * cols)));
      CHECK(within(low_half_and_plus, 0.25));
    }
    // the kernels' helpers agree with the formula written out here
    const auto h = squall::kernels::make_sketch_row_hash(77, {9, squall::shared_rank}, 2);
    const reference_hash ref(77, 9, 2, cols);
    for (std::uint64_t i : {0ull, 1ull, 12345ull, 1ull << 40}) {
      const std::uint64_t w = squall::kernels::sketch_word(h, i);
      CHECK(squall::kernels::sketch_bucket(w, 6) == ref.bucket(i));
      CHECK((squall::kernels::sketch_sign_bit(w) ? -1.0 : 1.0) == ref.sign(i));
    }
  }

  TEST_CASE("count_sketch: NaN pollutes exactly the estimates sharing its buckets; check_finite") {
    using C = squall::count_sketch_compressor<3, 64>;
    const C c{.seed = 5};
    std::vector<float> g = normal_floats(1000, 8);
    g[5] = std::nanf("");
    const auto est = estimates<C, float>(c, encode(c, g), g.size());
    for (std::size_t i = 0; i < g.size(); ++i) {
      bool shares = false;
      for (std::size_t r = 0; r < 3; ++r) {
        const reference_hash h(c.seed, 0, r, 64);
        shares = shares || h.bucket(i) == h.bucket(5);
      }
      REQUIRE(std::isnan(est[i]) == shares);
    }
    const auto out = decode<C, float>(c, encode(c, g), g.size());
    CHECK(std::isnan(out[5]));  // NaN ranks highest in the selection
    g[5] = std::numeric_limits<float>::infinity();
    const auto inf = estimates<C, float>(c, encode(c, g), g.size());
    CHECK(std::isinf(inf[5]));
    C strict = c;
    strict.check_finite = true;
    std::vector<std::byte> payload(strict.max_payload_bytes(squall::dtype::float32, g.size()));
    CHECK_THROWS_WITH_AS(
        strict.encode(host_backend{}, host_view<const float>(g), host_view<std::byte>(payload)),
        doctest::Contains("element 5 is not finite"), squall::invalid_argument);
  }

  TEST_CASE("count_sketch: payload size formula") {
    // (16 + 24) bytes of header and fields, then Rows x Cols values: (320 + 8 sizeof(T) Rows
    // Cols) / count bits per element, whatever the count.
    const squall::count_sketch_compressor<3, 65536> big;
    const std::size_t count = std::size_t{1} << 24;
    const double bits =
        8.0 * static_cast<double>(big.max_payload_bytes(squall::dtype::float32, count)) / count;
    CHECK(bits == doctest::Approx((128.0 + 192.0 + 32.0 * 3 * 65536) / count).epsilon(1e-15));
    CHECK(big.max_payload_bytes(squall::dtype::float64, 7) == 40 + 3 * 65536 * 8);
    const squall::count_sketch_compressor<5, 32> small;
    for (std::size_t n : {0, 1, 31, 1000}) {
      CHECK(encode(small, std::vector<float>(n, 1.0f)).size() == (320 + 32 * 5 * 32) / 8);
    }
    CHECK_THROWS_AS((void)small.max_payload_bytes(squall::dtype::int32, 4),
                    squall::invalid_argument);
  }

  TEST_CASE("count_sketch: decode rejects malformed payloads") {
    using C = squall::count_sketch_compressor<3, 16>;
    const C c;
    const std::vector<float> g = normal_floats(100, 9);
    const auto good = encode(c, g);
    const auto rejects = [&](std::vector<std::byte> bad, std::size_t count = 100) {
      std::vector<float> out(count);
      CHECK_THROWS_AS(
          c.decode(host_backend{}, host_view<const std::byte>(bad), host_view<float>(out)),
          squall::invalid_argument);
      CHECK_THROWS_AS(
          c.estimate(host_backend{}, host_view<const std::byte>(bad), host_view<float>(out)),
          squall::invalid_argument);
    };
    for (std::size_t size : {0, 15, 16, 39, 40, 41})
      rejects(std::vector<std::byte>(good.begin(), good.begin() + size));
    auto longer = good;
    longer.push_back(std::byte{0});
    rejects(longer);
    rejects(std::vector<std::byte>(good.begin(), good.end() - 1));
    auto kind = good;
    kind[2] = std::byte{12};
    rejects(kind);
    auto parameter = good;
    parameter[6] = std::byte{5};
    rejects(parameter);
    auto rows = good;
    rows[32] = std::byte{5};
    rejects(rows);
    auto cols = good;
    cols[36] = std::byte{32};
    rejects(cols);
    auto huge = good;
    huge[39] = std::byte{0xff};
    rejects(huge);
    rejects(good, 99);             // count differs
    std::vector<double> out(100);  // element type differs
    CHECK_THROWS_AS(
        c.decode(host_backend{}, host_view<const std::byte>(good), host_view<double>(out)),
        squall::invalid_argument);
    // another sketch shape
    const squall::count_sketch_compressor<3, 32> wider;
    std::vector<float> o(100);
    CHECK_THROWS_AS(
        wider.decode(host_backend{}, host_view<const std::byte>(good), host_view<float>(o)),
        squall::invalid_argument);
    // random corruption: every outcome is a decode or an invalid_argument (ASan checks bounds)
    std::mt19937 gen(11);
    for (int t = 0; t < 2000; ++t) {
      auto bad = good;
      const int flips = 1 + static_cast<int>(gen() % 4);
      for (int e = 0; e < flips; ++e) bad[gen() % bad.size()] = static_cast<std::byte>(gen());
      if (gen() % 4 == 0) bad.resize(gen() % (bad.size() + 8));
      try {
        c.decode(host_backend{}, host_view<const std::byte>(bad), host_view<float>(o));
      } catch (const squall::invalid_argument&) {
      }
    }
  }

  // ---- PowerSGD ----------------------------------------------------------------------------

  // M = A B^T for random A (m x r'), B (c x r'), as the row-major elements of the m x c view
  // truncated to `count`.
  std::vector<double> low_rank(std::size_t m, std::size_t c, std::size_t r, std::size_t count,
                               unsigned seed) {
    std::mt19937 gen(seed);
    std::normal_distribution<double> d(0.0, 1.0);
    std::vector<double> a(m * r), b(c * r);
    for (auto& x : a) x = d(gen);
    for (auto& x : b) x = d(gen);
    std::vector<double> g(count);
    for (std::size_t e = 0; e < count; ++e) {
      const std::size_t i = e / c, j = e % c;
      for (std::size_t k = 0; k < r; ++k) g[e] += a[i * r + k] * b[j * r + k];
    }
    return g;
  }

  template <class T>
  double relative_error(const std::vector<T>& got, const std::vector<double>& want) {
    double num = 0.0, den = 0.0;
    for (std::size_t i = 0; i < want.size(); ++i) {
      num += (static_cast<double>(got[i]) - want[i]) * (static_cast<double>(got[i]) - want[i]);
      den += want[i] * want[i];
    }
    return den == 0.0 ? std::sqrt(num) : std::sqrt(num / den);
  }

  TEST_CASE_TEMPLATE("powersgd: exact on inputs of rank <= r", T, float, double) {
    const double tolerance = std::same_as<T, float> ? 1e-4 : 1e-10;
    struct shape_case {
      std::size_t count, columns, data_rank;
    };
    // count 1000, c = ceil(sqrt(1000)) = 32, m = 32: the last row's tail (24 elements) is zero
    // padding, which can add one to the view's rank, so r' <= r - 1 there; 48 x 64 divides.
    for (const shape_case s :
         {shape_case{1000, 0, 3}, shape_case{48 * 64, 64, 4}, shape_case{48 * 64 - 5, 64, 3},
          shape_case{7, 0, 1}, shape_case{1, 0, 1}}) {
      const squall::powersgd_compressor c{.rank = 4, .columns = s.columns, .seed = 17};
      const auto shape = c.shape(s.count);
      const std::vector<double> want = low_rank(shape.rows, shape.columns, s.data_rank, s.count, 1);
      const std::vector<T> g(want.begin(), want.end());
      const auto stateless =
          decode<squall::powersgd_compressor, T>(c, encode(c, g, {3, 0}), g.size());
      CHECK(relative_error(stateless, want) < tolerance);
      auto state = c.make_state<T>(g.size());
      std::vector<std::byte> payload(c.max_payload_bytes(squall::dtype_of<T>, g.size()));
      for (int step = 0; step < 3; ++step) {  // warm-started steps stay exact
        REQUIRE(c.encode(host_backend{}, state, host_view<const T>(g),
                         host_view<std::byte>(payload)) == payload.size());
        const auto out = decode<squall::powersgd_compressor, T>(c, payload, g.size());
        CHECK(relative_error(out, want) < tolerance);
      }
    }
  }

  TEST_CASE("powersgd: warm-started iterations reach the best rank-r error (Eckart-Young)") {
    // M = U diag(sigma) V^T with orthonormal U (m x 8), V (c x 8) made by a QR in this test;
    // the best rank-4 Frobenius error is sqrt(sum_{i > 4} sigma_i^2).
    const std::size_t m = 40, c = 30, k = 8;
    const double sigma[k] = {10, 8, 6, 5, 1, 0.5, 0.25, 0.1};
    const auto orthonormal = [](std::size_t rows, unsigned seed) {
      std::mt19937 gen(seed);
      std::normal_distribution<double> d(0.0, 1.0);
      std::vector<std::vector<double>> u(8, std::vector<double>(rows));
      for (std::size_t e = 0; e < 8; ++e) {
        for (auto& x : u[e]) x = d(gen);
        for (int pass = 0; pass < 2; ++pass) {
          for (std::size_t f = 0; f < e; ++f) {
            double dot = 0.0;
            for (std::size_t i = 0; i < rows; ++i) dot += u[e][i] * u[f][i];
            for (std::size_t i = 0; i < rows; ++i) u[e][i] -= dot * u[f][i];
          }
        }
        double norm = 0.0;
        for (double x : u[e]) norm += x * x;
        for (auto& x : u[e]) x /= std::sqrt(norm);
      }
      return u;
    };
    const auto u = orthonormal(m, 1);
    const auto v = orthonormal(c, 2);
    std::vector<double> g(m * c, 0.0);
    for (std::size_t i = 0; i < m; ++i) {
      for (std::size_t j = 0; j < c; ++j) {
        for (std::size_t e = 0; e < k; ++e) g[i * c + j] += sigma[e] * u[e][i] * v[e][j];
      }
    }
    double best = 0.0, total = 0.0;
    for (std::size_t e = 0; e < k; ++e) {
      total += sigma[e] * sigma[e];
      if (e >= 4) best += sigma[e] * sigma[e];
    }
    best = std::sqrt(best);
    const squall::powersgd_compressor comp{.rank = 4, .columns = c, .seed = 3};
    auto state = comp.make_state<double>(g.size());
    std::vector<std::byte> payload(comp.max_payload_bytes(squall::dtype::float64, g.size()));
    double error = 0.0;
    for (int step = 0; step < 30; ++step) {
      comp.encode(host_backend{}, state, host_view<const double>(g), host_view<std::byte>(payload));
      const auto out = decode<squall::powersgd_compressor, double>(comp, payload, g.size());
      error = relative_error(out, g) * std::sqrt(total);
      if (step == 0) CHECK(error <= std::sqrt(total));  // a projection never adds energy
    }
    MESSAGE("PowerSGD rank 4 after 30 warm-started steps: error " << error << ", best " << best);
    CHECK(error <= 1.001 * best);
    CHECK(error >= best * (1 - 1e-9));
  }

  TEST_CASE("powersgd: orthogonalize gives orthonormal columns; a zero column stays zero") {
    const squall::powersgd_compressor c{.rank = 4};
    const std::vector<float> random = normal_floats(100 * 4, 12);
    std::vector<float> p = random;
    c.orthogonalize(host_backend{}, host_view<float>(p));
    for (std::size_t a = 0; a < 4; ++a) {
      for (std::size_t b = 0; b < 4; ++b) {
        double dot = 0.0;
        for (std::size_t i = 0; i < 100; ++i)
          dot += static_cast<double>(p[i * 4 + a]) * p[i * 4 + b];
        CHECK(std::fabs(dot - (a == b ? 1.0 : 0.0)) < 1e-5);
      }
    }
    std::vector<float> z = random;
    for (std::size_t i = 0; i < 100; ++i) z[i * 4 + 2] = 0.0f;
    c.orthogonalize(host_backend{}, host_view<float>(z));
    for (std::size_t i = 0; i < 100; ++i) {
      REQUIRE(!std::isnan(z[i * 4 + 0]));
      REQUIRE(z[i * 4 + 2] == 0.0f);
      REQUIRE(!std::isnan(z[i * 4 + 3]));
    }
    std::vector<double> zero(50 * 4, 0.0);
    c.orthogonalize(host_backend{}, host_view<double>(zero));
    for (double x : zero) REQUIRE(x == 0.0);
    std::vector<float> odd(10);
    CHECK_THROWS_AS(c.orthogonalize(host_backend{}, host_view<float>(odd)),
                    squall::invalid_argument);
  }

  TEST_CASE("powersgd: the public pieces compose to encode's one-rank result") {
    const squall::powersgd_compressor c{.rank = 2, .columns = 0, .seed = 8};
    const std::vector<double> g = low_rank(9, 9, 1, 77, 3);  // rank 1, + 1 for the padding
    auto state = c.make_state<double>(g.size());
    std::vector<double> q(state.q().data(), state.q().data() + state.q().count());
    const auto shape = c.shape(g.size());
    REQUIRE(shape.rows == 9);
    REQUIRE(shape.columns == 9);
    std::vector<double> p(shape.rows * 2), out(g.size());
    c.multiply(host_backend{}, host_view<const double>(g), host_view<const double>(q),
               host_view<double>(p));
    c.orthogonalize(host_backend{}, host_view<double>(p));
    c.multiply_transposed(host_backend{}, host_view<const double>(g), host_view<const double>(p),
                          host_view<double>(q));
    c.decompress(host_backend{}, host_view<const double>(p), host_view<const double>(q),
                 host_view<double>(out));
    std::vector<std::byte> payload(c.max_payload_bytes(squall::dtype::float64, g.size()));
    c.encode(host_backend{}, state, host_view<const double>(g), host_view<std::byte>(payload));
    CHECK(decode<squall::powersgd_compressor, double>(c, payload, g.size()) == out);
    CHECK(std::vector<double>(state.q().data(), state.q().data() + state.q().count()) == q);
    CHECK(relative_error(out, g) < 1e-10);
    std::vector<double> short_q(3);
    CHECK_THROWS_AS(c.multiply(host_backend{}, host_view<const double>(g),
                               host_view<const double>(short_q), host_view<double>(p)),
                    squall::invalid_argument);
  }

  TEST_CASE("powersgd: a state's own view (a layer's matrix) instead of the square one") {
    // 16 x 25 of rank 2 (a conv layer's 16 filters of 25 weights): exact in its own view at
    // rank 2, not in the default 20 x 20 view of the same 400 elements
    const squall::powersgd_compressor c{.rank = 2, .seed = 5};
    const std::vector<double> want = low_rank(16, 25, 2, 400, 9);
    const std::vector<float> g(want.begin(), want.end());
    const squall::powersgd_shape view = squall::powersgd_shape::of(400, 25);
    REQUIRE(view.rows == 16);
    auto own = c.make_state<float>(400, view);
    CHECK(own.rows() == 16);
    CHECK(own.columns() == 25);
    CHECK(own.q().count() == 25 * 2);
    const std::size_t bytes = c.payload_bytes(squall::dtype::float32, view);
    CHECK(bytes == 32 + (16 + 25) * 2 * 4);
    std::vector<std::byte> payload(bytes);
    for (int step = 0; step < 2; ++step) {
      REQUIRE(c.encode(host_backend{}, own, host_view<const float>(g),
                       host_view<std::byte>(payload)) == bytes);
      CHECK(relative_error(decode<squall::powersgd_compressor, float>(c, payload, 400), want) <
            1e-5);
    }
    auto square = c.make_state<float>(400);
    std::vector<std::byte> square_payload(c.max_payload_bytes(squall::dtype::float32, 400));
    c.encode(host_backend{}, square, host_view<const float>(g),
             host_view<std::byte>(square_payload));
    CHECK(relative_error(decode<squall::powersgd_compressor, float>(c, square_payload, 400), want) >
          0.05);
    // the pieces take the factors' view
    std::vector<float> q(own.q().data(), own.q().data() + own.q().count()), p(16 * 2), out(400);
    c.multiply(host_backend{}, host_view<const float>(g), host_view<const float>(q),
               host_view<float>(p));
    c.orthogonalize(host_backend{}, host_view<float>(p));
    c.multiply_transposed(host_backend{}, host_view<const float>(g), host_view<const float>(p),
                          host_view<float>(q));
    c.decompress(host_backend{}, host_view<const float>(p), host_view<const float>(q),
                 host_view<float>(out));
    CHECK(relative_error(out, want) < 1e-5);
    // views that do not cover the tensor are refused, naming them
    CHECK(squall::powersgd_shape{0, 0}.covers(0));
    CHECK(squall::powersgd_shape::of(0, 7).covers(0));
    CHECK_FALSE(squall::powersgd_shape{1, 0}.covers(0));
    CHECK(squall::powersgd_shape{3, 5}.covers(11));
    CHECK(squall::powersgd_shape{3, 5}.covers(15));
    CHECK_FALSE(squall::powersgd_shape{3, 5}.covers(10));
    CHECK_FALSE(squall::powersgd_shape{3, 5}.covers(16));
    try {
      (void)c.make_state<float>(400, squall::powersgd_shape{15, 25});
      FAIL("a 15 x 25 view of 400 elements was taken");
    } catch (const squall::invalid_argument& e) {
      CHECK(std::string(e.what()).find("15 x 25 view of 400 elements") != std::string::npos);
    }
    CHECK_THROWS_AS((void)c.make_state<float>(400, squall::powersgd_shape{400, 0}),
                    squall::invalid_argument);
    std::vector<std::byte> small(bytes - 1);
    CHECK_THROWS_AS(
        c.encode(host_backend{}, own, host_view<const float>(g), host_view<std::byte>(small)),
        squall::invalid_argument);
    const std::vector<float> other(375);  // 15 rows of 25, not 16
    CHECK_THROWS_AS(
        c.encode(host_backend{}, own, host_view<const float>(other), host_view<std::byte>(payload)),
        squall::invalid_argument);
    std::vector<float> q_wrong(24 * 2);  // a 17 x 24 view's Q with a 16 x 25 view's P
    CHECK_THROWS_AS(c.multiply(host_backend{}, host_view<const float>(g),
                               host_view<const float>(q_wrong), host_view<float>(p)),
                    squall::invalid_argument);
    // a payload of one view does not decode as another count, nor under another rank
    CHECK_THROWS_AS((decode<squall::powersgd_compressor, float>(c, payload, 375)),
                    squall::invalid_argument);
    CHECK_THROWS_AS((decode<squall::powersgd_compressor, float>(
                        squall::powersgd_compressor{.rank = 3}, payload, 400)),
                    squall::invalid_argument);
    // saved and restored with its view
    auto back = squall::powersgd_state<float>::restore(host_view<const std::byte>(own.save()));
    CHECK(back.rows() == 16);
    CHECK(back.columns() == 25);
  }

  TEST_CASE("powersgd: zero gradient and count 0") {
    const squall::powersgd_compressor c;
    const std::vector<float> zero(1000, 0.0f);
    for (float x : decode<squall::powersgd_compressor, float>(c, encode(c, zero), zero.size()))
      REQUIRE(x == 0.0f);
    auto state = c.make_state<float>(0);
    CHECK(state.rows() == 0);
    CHECK(state.columns() == 0);
    const std::vector<float> none;
    const auto payload = encode(c, none);
    CHECK(payload.size() == 32);
    CHECK(decode<squall::powersgd_compressor, float>(c, payload, 0).empty());
    std::vector<std::byte> p2(32);
    CHECK(c.encode(host_backend{}, state, host_view<const float>(none), host_view<std::byte>(p2)) ==
          32);
  }

  TEST_CASE("powersgd: payload size formula and shape") {
    // (16 + 16) bytes, then P (m x r) and Q (c x r): (256 + 8 sizeof(T) (m + c) r) / count bits.
    const squall::powersgd_compressor c{.rank = 4};
    for (std::size_t count : {std::size_t{1}, std::size_t{2}, std::size_t{1000},
                              std::size_t{1} << 24, (std::size_t{1} << 24) + 1}) {
      std::size_t cols = 0;
      while (cols * cols < count) ++cols;  // ceil(sqrt) by counting up
      const std::size_t rows = (count + cols - 1) / cols;
      CHECK(c.shape(count).columns == cols);
      CHECK(c.shape(count).rows == rows);
      const double bits =
          8.0 * static_cast<double>(c.max_payload_bytes(squall::dtype::float32, count)) / count;
      CHECK(bits == doctest::Approx((256.0 + 32.0 * (rows + cols) * 4) / count).epsilon(1e-15));
    }
    CHECK(c.shape(0).rows == 0);
    const squall::powersgd_compressor wide{.rank = 2, .columns = 100};
    CHECK(wide.shape(1001).rows == 11);
    CHECK(encode(wide, std::vector<double>(1001, 1.0)).size() == 32 + (11 + 100) * 2 * 8);
    CHECK_THROWS_AS(
        (void)squall::powersgd_compressor{.rank = 0}.max_payload_bytes(squall::dtype::float32, 4),
        squall::invalid_argument);
    CHECK_THROWS_AS((void)squall::powersgd_compressor{.rank = 70000}.max_payload_bytes(
                        squall::dtype::float32, 4),
                    squall::invalid_argument);
  }

  TEST_CASE("powersgd: state save / restore round trip and rejections") {
    const squall::powersgd_compressor c{.rank = 3, .seed = 4};
    const std::vector<float> g = normal_floats(500, 13);
    auto state = c.make_state<float>(g.size());
    std::vector<std::byte> payload(c.max_payload_bytes(squall::dtype::float32, g.size()));
    c.encode(host_backend{}, state, host_view<const float>(g), host_view<std::byte>(payload));
    const auto bytes = state.save();
    CHECK(bytes.size() == 32 + 23 * 3 * 4);  // c = ceil(sqrt(500)) = 23
    auto back = squall::powersgd_state<float>::restore(host_view<const std::byte>(bytes));
    CHECK(back.rows() == state.rows());
    CHECK(back.columns() == state.columns());
    CHECK(back.rank() == 3);
    CHECK(std::equal(back.q().data(), back.q().data() + back.q().count(), state.q().data()));
    std::vector<std::byte> p1(payload.size()), p2(payload.size());
    c.encode(host_backend{}, state, host_view<const float>(g), host_view<std::byte>(p1));
    c.encode(host_backend{}, back, host_view<const float>(g), host_view<std::byte>(p2));
    CHECK(p1 == p2);

    const auto rejects = [](std::vector<std::byte> bad) {
      CHECK_THROWS_AS(squall::powersgd_state<float>::restore(host_view<const std::byte>(bad)),
                      squall::invalid_argument);
    };
    rejects({});
    rejects(std::vector<std::byte>(bytes.begin(), bytes.begin() + 31));
    rejects(std::vector<std::byte>(bytes.begin(), bytes.end() - 1));
    auto extra = bytes;
    extra.push_back(std::byte{0});
    rejects(extra);
    auto magic = bytes;
    magic[0] = std::byte{0};
    rejects(magic);
    auto version = bytes;
    version[4] = std::byte{2};
    rejects(version);
    std::vector<std::byte> rank0 = bytes;
    for (std::size_t e = 24; e < 32 && e < rank0.size(); ++e) rank0[e] = std::byte{0};
    rejects(rank0);
    auto huge = bytes;
    huge[23] = std::byte{0x7f};  // c enormous
    rejects(huge);
    CHECK_THROWS_AS(squall::powersgd_state<double>::restore(host_view<const std::byte>(bytes)),
                    squall::invalid_argument);

    // a state made for another shape or rank
    const std::vector<float> other = normal_floats(2000, 14);
    std::vector<std::byte> big(c.max_payload_bytes(squall::dtype::float32, other.size()));
    CHECK_THROWS_WITH_AS(
        c.encode(host_backend{}, state, host_view<const float>(other), host_view<std::byte>(big)),
        doctest::Contains("state for"), squall::invalid_argument);
    const squall::powersgd_compressor rank2{.rank = 2, .seed = 4};
    std::vector<std::byte> p3(rank2.max_payload_bytes(squall::dtype::float32, g.size()));
    CHECK_THROWS_AS(
        rank2.encode(host_backend{}, state, host_view<const float>(g), host_view<std::byte>(p3)),
        squall::invalid_argument);
    std::vector<std::byte> small(10);
    CHECK_THROWS_AS(
        c.encode(host_backend{}, state, host_view<const float>(g), host_view<std::byte>(small)),
        squall::invalid_argument);
  }

  TEST_CASE("powersgd: decode rejects malformed payloads") {
    const squall::powersgd_compressor c{.rank = 2};
    const std::vector<float> g = normal_floats(50, 15);  // c = 8, m = 7
    const auto good = encode(c, g);
    const auto rejects = [&](const squall::powersgd_compressor& with, std::vector<std::byte> bad,
                             std::size_t count = 50) {
      std::vector<float> out(count);
      CHECK_THROWS_AS(
          with.decode(host_backend{}, host_view<const std::byte>(bad), host_view<float>(out)),
          squall::invalid_argument);
    };
    for (std::size_t size : {0, 15, 16, 31, 32, 33})
      rejects(c, std::vector<std::byte>(good.begin(), good.begin() + size));
    rejects(c, std::vector<std::byte>(good.begin(), good.end() - 1));
    auto longer = good;
    longer.push_back(std::byte{0});
    rejects(c, longer);
    auto kind = good;
    kind[2] = std::byte{11};
    rejects(c, kind);
    rejects(squall::powersgd_compressor{.rank = 3}, good);  // wrong rank
    auto m = good;
    m[16] = std::byte{8};  // m * c inconsistent with count
    rejects(c, m);
    auto cols = good;
    cols[24] = std::byte{10};
    rejects(c, cols);
    auto huge = good;
    huge[23] = std::byte{0x80};  // m = 2^63 + 7
    rejects(c, huge);
    // the payload carries its view: a compressor of another default view decodes it alike
    CHECK(decode<squall::powersgd_compressor, float>(
              squall::powersgd_compressor{.rank = 2, .columns = 10}, good, 50) ==
          decode<squall::powersgd_compressor, float>(c, good, 50));
    rejects(c, good, 49);
    std::mt19937 gen(16);
    std::vector<float> out(50);
    for (int t = 0; t < 2000; ++t) {
      auto bad = good;
      const int flips = 1 + static_cast<int>(gen() % 4);
      for (int e = 0; e < flips; ++e) bad[gen() % bad.size()] = static_cast<std::byte>(gen());
      if (gen() % 4 == 0) bad.resize(gen() % (bad.size() + 8));
      try {
        c.decode(host_backend{}, host_view<const std::byte>(bad), host_view<float>(out));
      } catch (const squall::invalid_argument&) {
      }
    }
  }

  // ---- FetchSGD ----------------------------------------------------------------------------

  TEST_CASE("fetchsgd: one hash for every step; the stateless decode is count_sketch's") {
    const squall::fetchsgd_compressor<3, 64> f{.seed = 4, .heavy_hitters = 5};
    const squall::count_sketch_compressor<3, 64> cs{.seed = 4, .heavy_hitters = 5};
    const auto g = normal_floats(300, 3);
    const auto at0 = encode(f, g, {0, 1});
    REQUIRE(encode(f, g, {17, 2}) == at0);  // the stream's step and rank are not used
    REQUIRE(at0 == encode(cs, g, {0, 9}));  // the count sketch of step 0
    REQUIRE(decode<decltype(f), float>(f, at0, 300) == decode<decltype(cs), float>(cs, at0, 300));
    // a fresh state's first step is the same decode
    auto state = f.make_state<float>(300);
    std::vector<float> out(300, -7.0f);
    f.decode(host_backend{}, state, host_view<const std::byte>(at0), host_view<float>(out));
    REQUIRE(out == decode<decltype(f), float>(f, at0, 300));
  }

  TEST_CASE("fetchsgd: without shared buckets, DGC's momentum correction with masking") {
    // Eight coordinates in 1024 columns: find a seed under which no two share a bucket in any
    // row; the median of three equal estimates is then the exact value, and FetchSGD must be
    // DGC on the summed gradient: u = rho u + g; v += u; send the top k of v; u = v = 0 there.
    constexpr std::size_t n = 8;
    constexpr std::size_t cols = 1024;
    std::uint64_t seed = 0;
    for (;; ++seed) {
      bool clash = false;
      for (std::size_t r = 0; r < 3 && !clash; ++r) {
        const reference_hash h(seed, 0, r, cols);
        for (std::size_t i = 0; i < n && !clash; ++i) {
          for (std::size_t j = i + 1; j < n; ++j) clash = clash || h.bucket(i) == h.bucket(j);
        }
      }
      if (!clash) break;
    }
    const squall::fetchsgd_compressor<3, cols> f{
        .seed = seed, .heavy_hitters = 2, .momentum = 0.75};
    auto state = f.make_state<double>(n);
    std::vector<double> u(n, 0.0), v(n, 0.0);
    std::mt19937 gen(5);
    std::uniform_int_distribution<int> pick(-16, 16);
    for (int step = 0; step < 40; ++step) {
      CAPTURE(step);
      std::vector<double> g(n);
      for (auto& x : g) x = pick(gen) / 4.0;  // dyadic: every sum below is exact
      const auto payload = encode(f, g);
      std::vector<double> got(n, -7.0);
      f.decode(host_backend{}, state, host_view<const std::byte>(payload), host_view<double>(got));
      std::vector<double> want(n, 0.0);
      for (std::size_t i = 0; i < n; ++i) {
        u[i] = f.momentum * u[i] + g[i];
        v[i] += u[i];
      }
      std::vector<std::size_t> order(n);
      std::iota(order.begin(), order.end(), std::size_t{0});
      std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
        return std::fabs(v[a]) > std::fabs(v[b]);
      });
      for (std::size_t j = 0; j < 2; ++j) want[order[j]] = v[order[j]];
      for (std::size_t i = 0; i < n; ++i) {
        if (want[i] != 0.0) u[i] = v[i] = 0.0;
      }
      REQUIRE(got == want);
    }
  }

  TEST_CASE("fetchsgd: a payload of another seed, count or size is refused; the state kept") {
    const squall::fetchsgd_compressor<3, 64> f{.seed = 4, .momentum = 0.5};
    const auto g = normal_floats(100, 8);
    auto state = f.make_state<float>(100);
    std::vector<float> out(100);
    const auto step = [&](const squall::fetchsgd_compressor<3, 64>& c,
                          const std::vector<std::byte>& payload, std::size_t count) {
      std::vector<float> o(count);
      c.decode(host_backend{}, state, host_view<const std::byte>(payload), host_view<float>(o));
    };
    const auto good = encode(f, g);
    step(f, good, 100);
    const auto before = state.save();
    const squall::count_sketch_compressor<3, 64> other_step{.seed = 4};
    CHECK_THROWS_AS(step(f, encode(other_step, g, {3, 0}), 100), squall::invalid_argument);
    CHECK_THROWS_AS(step(squall::fetchsgd_compressor<3, 64>{.seed = 5}, good, 100),
                    squall::invalid_argument);
    CHECK_THROWS_AS(step(f, good, 99), squall::invalid_argument);
    auto shorter = good;
    shorter.pop_back();
    CHECK_THROWS_AS(step(f, shorter, 100), squall::invalid_argument);
    CHECK_THROWS_AS(step(squall::fetchsgd_compressor<3, 64>{.seed = 4, .momentum = 1.0}, good, 100),
                    squall::invalid_argument);
    REQUIRE(state.save() == before);
    CHECK_THROWS_AS((squall::fetchsgd_compressor<3, 64>{.momentum = -0.1}.make_state<float>(1)),
                    squall::invalid_argument);
  }

  TEST_CASE("fetchsgd: the state saves and restores, refusing another shape or type") {
    using C = squall::fetchsgd_compressor<3, 64>;
    const C f{.seed = 2, .momentum = 0.5};
    squall::compression_state<C, float> a(f, 200);
    std::vector<float> out(200);
    for (int s = 0; s < 3; ++s) {
      const auto payload = encode(f, normal_floats(200, 20 + s));
      f.decode(host_backend{}, a.own(), host_view<const std::byte>(payload), host_view<float>(out));
    }
    const auto saved = a.save();
    squall::compression_state<C, float> b(f, 200);
    b.restore(host_view<const std::byte>(saved));
    REQUIRE(b.save() == saved);
    const auto own = a.own().save();
    using state_64 = squall::fetchsgd_state<float, 3, 64>;
    REQUIRE(state_64::restore(host_view<const std::byte>(own)).save() == own);
    CHECK_THROWS_AS(
        (squall::fetchsgd_state<float, 3, 128>::restore(host_view<const std::byte>(own))),
        squall::invalid_argument);
    CHECK_THROWS_AS(
        (squall::fetchsgd_state<double, 3, 64>::restore(host_view<const std::byte>(own))),
        squall::invalid_argument);
    auto cut = own;
    cut.pop_back();
    CHECK_THROWS_AS(state_64::restore(host_view<const std::byte>(cut)), squall::invalid_argument);
    squall::compression_state<squall::count_sketch_compressor<3, 64>, float> plain(200);
    CHECK_THROWS_AS(plain.restore(host_view<const std::byte>(saved)), squall::invalid_argument);
  }
}
