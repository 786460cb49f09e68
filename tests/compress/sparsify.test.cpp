// SPDX-License-Identifier: Apache-2.0
// topk_compressor, randomk_compressor and threshold_compressor (compress/sparsify.hpp) against
// independent references: a full std::sort of (|g|, index) for top-k, the exact set |g| >= tau
// for threshold, the stratum layout and binomial selection frequencies for random-k, the
// payload-size formulas of docs/compressors.md, and every fault decode must reject. The
// payloads are parsed here from the documented layout, not with the library's decoder.
#include <squall/backend/host.hpp>
#include <squall/compress/error_feedback.hpp>
#include <squall/compress/sparsify.hpp>
#include <squall/compress/traits.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <type_traits>
#include <vector>

#include "../support/host_codec.hpp"

namespace {

using squall::host_backend;
using squall::host_view;
using squall::random_stream;
using squall::randomk_compressor;
using squall::threshold_compressor;
using squall::topk_compressor;
using squall::topk_method;

template <class C, class T>
std::vector<std::byte> encode(const C& c, const std::vector<T>& in, random_stream stream = {}) {
  return squall::test::encode_on_host(c, in, stream);
}

template <class C, class T>
std::vector<T> decode(const C& c, const std::vector<std::byte>& payload, std::size_t count) {
  return squall::test::decode_on_host(c, payload, count, T(-7));  // must overwrite every element
}

template <class T>
struct sparse_entries {
  std::vector<std::uint64_t> index;
  std::vector<T> value;
};

// Parses the documented sparse body: u64 k at 16, k u32 (count <= 2^32) indices, k values.
template <class T>
sparse_entries<T> parse(const std::vector<std::byte>& p) {
  REQUIRE(p.size() >= 24);
  std::uint64_t k = 0;
  std::memcpy(&k, p.data() + 16, 8);
  REQUIRE(p.size() == 24 + k * (4 + sizeof(T)));
  sparse_entries<T> e;
  for (std::uint64_t j = 0; j < k; ++j) {
    std::uint32_t i;
    T v;
    std::memcpy(&i, p.data() + 24 + 4 * j, 4);
    std::memcpy(&v, p.data() + 24 + 4 * k + sizeof(T) * j, sizeof(T));
    e.index.push_back(i);
    e.value.push_back(v);
  }
  return e;
}

// k = max(1, round(ratio x count)) clamped to count, computed here independently.
std::size_t expected_k(double ratio, std::size_t count) {
  if (count == 0) return 0;
  const auto r = static_cast<std::size_t>(std::llround(ratio * static_cast<double>(count)));
  return std::min(count, std::max<std::size_t>(1, r));
}

// The reference top k: a full sort of (|g| desc, index asc), the first k, indices ascending.
template <class T>
std::vector<std::uint64_t> reference_topk(const std::vector<T>& g, std::size_t k) {
  std::vector<std::uint64_t> order(g.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](std::uint64_t a, std::uint64_t b) {
    const T ma = std::fabs(g[a]), mb = std::fabs(g[b]);
    return ma != mb ? ma > mb : a < b;
  });
  order.resize(k);
  std::sort(order.begin(), order.end());
  return order;
}

enum class shape { gaussian, ties, negative, heavy };

template <class T>
std::vector<T> make(shape s, std::size_t n, unsigned seed) {
  std::mt19937_64 gen(seed);
  std::normal_distribution<double> normal;
  std::student_t_distribution<double> student(1.5);
  std::uniform_int_distribution<int> small(-3, 3);
  std::vector<T> g(n);
  for (auto& x : g) {
    switch (s) {
      case shape::gaussian:
        x = static_cast<T>(normal(gen));
        break;
      case shape::ties:
        x = static_cast<T>(small(gen)) * T(0.5);
        break;
      case shape::negative:
        x = -std::fabs(static_cast<T>(normal(gen)));
        break;
      case shape::heavy:
        x = static_cast<T>(student(gen));
        break;
    }
  }
  return g;
}

// Runs f and checks that it throws squall::invalid_argument whose message holds `needle`.
template <class F>
void check_rejects(F&& f, const std::string& needle) {
  bool threw = false;
  try {
    f();
  } catch (const squall::invalid_argument& e) {
    threw = true;
    INFO("message: " << e.what());
    CHECK(std::string(e.what()).find(needle) != std::string::npos);
  }
  CHECK_MESSAGE(threw, "expected invalid_argument with '" << needle << "'");
}

}  // namespace

TEST_SUITE("sparsify") {
  TEST_CASE_TEMPLATE("a zero gradient, count 0 and count 1", T, float, double) {
    const std::vector<T> zeros(1000, T(0));
    const topk_compressor topk;
    const randomk_compressor randomk;
    const threshold_compressor threshold;
    for (T x : decode<topk_compressor, T>(topk, encode(topk, zeros), zeros.size())) REQUIRE(x == 0);
    for (T x : decode<randomk_compressor, T>(randomk, encode(randomk, zeros), zeros.size()))
      REQUIRE(x == 0);
    const auto tp = encode(threshold, zeros);
    CHECK(parse<T>(tp).index.empty());  // nothing reaches tau
    for (T x : decode<threshold_compressor, T>(threshold, tp, zeros.size())) REQUIRE(x == 0);

    const std::vector<T> empty;
    CHECK(encode(topk, empty).size() == 24);
    CHECK(encode(threshold, empty).size() == 24);
    CHECK(encode(randomk, empty).size() == 40);
    CHECK(decode<topk_compressor, T>(topk, encode(topk, empty), 0).empty());
    CHECK(decode<randomk_compressor, T>(randomk, encode(randomk, empty), 0).empty());

    const std::vector<T> one{T(-2.5)};
    CHECK(decode<topk_compressor, T>(topk, encode(topk, one), 1)[0] == T(-2.5));
    CHECK(decode<randomk_compressor, T>(randomk, encode(randomk, one), 1)[0] == T(-2.5));
    CHECK(decode<threshold_compressor, T>(threshold, encode(threshold, one), 1)[0] == T(-0.01));
  }

  TEST_CASE("k: max(1, round(ratio x count)), clamped to count") {
    for (std::size_t n : {1u, 2u, 10u, 99u, 1000u, 12345u}) {
      for (double r : {0.0, 1e-9, 0.001, 0.01, 0.05, 0.5, 0.999, 1.0, 3.0}) {
        CHECK(topk_compressor{.ratio = r}.entries(n) == expected_k(r, n));
        CHECK(randomk_compressor{.ratio = r}.entries(n) == expected_k(r, n));
      }
    }
    CHECK(topk_compressor{.ratio = 1e300}.entries(5) == 5);
    check_rejects([] { (void)topk_compressor{.ratio = -0.1}.entries(10); }, "ratio");
    check_rejects([] { (void)topk_compressor{.ratio = std::nan("")}.entries(10); }, "ratio");
    // ratio 3 of 7 elements sends all 7, in order
    const std::vector<float> g{1, -2, 3, -4, 5, -6, 7};
    const auto e = parse<float>(encode(topk_compressor{.ratio = 3.0}, g));
    CHECK(e.index == std::vector<std::uint64_t>{0, 1, 2, 3, 4, 5, 6});
    CHECK(e.value == g);
  }

  TEST_CASE_TEMPLATE("exact top-k equals a full sort of (|g|, index)", T, float, double) {
    for (shape s : {shape::gaussian, shape::ties, shape::negative, shape::heavy}) {
      for (std::size_t n : {1u, 2u, 3u, 17u, 100u, 1000u, 4099u, 30011u, 100000u}) {
        const std::vector<T> g =
            make<T>(s, n, static_cast<unsigned>(n) * 7 + static_cast<unsigned>(s));
        for (double ratio : {0.01, 0.001, 0.5, 1.0}) {
          CAPTURE(static_cast<int>(s));
          CAPTURE(n);
          CAPTURE(ratio);
          const topk_compressor c{.ratio = ratio};
          const std::size_t k = expected_k(ratio, n);
          const auto payload = encode(c, g);
          const auto e = parse<T>(payload);
          REQUIRE(e.index == reference_topk(g, k));
          for (std::size_t j = 0; j < k; ++j) REQUIRE(e.value[j] == g[e.index[j]]);
          // decode: the entries in place, zeros elsewhere
          const std::vector<T> out = decode<topk_compressor, T>(c, payload, n);
          std::size_t nonzero_kept = 0;
          for (std::size_t j = 0; j < k; ++j) nonzero_kept += out[e.index[j]] == g[e.index[j]];
          REQUIRE(nonzero_kept == k);
          REQUIRE(std::count(out.begin(), out.end(), T(0)) >= static_cast<std::ptrdiff_t>(n - k));
        }
      }
    }
  }

  TEST_CASE("exact top-k: all equal magnitudes take the lowest indices") {
    std::vector<float> g(50000);
    for (std::size_t i = 0; i < g.size(); ++i) g[i] = i % 2 ? 1.5f : -1.5f;
    const auto e = parse<float>(encode(topk_compressor{.ratio = 0.01}, g));
    REQUIRE(e.index.size() == 500);
    for (std::size_t j = 0; j < 500; ++j) REQUIRE(e.index[j] == j);
  }

  TEST_CASE_TEMPLATE("sampled threshold: true entries, at most k, recall", T, float, double) {
    const std::size_t n = std::size_t{1} << 20;
    const double ratio = 0.01;
    const std::size_t k = expected_k(ratio, n);
    // The estimated threshold is the ks-th largest of s samples (ks = round(k s / n) = 105 here);
    // the fraction of elements above it is a Beta(ks, s - ks + 1) draw, whose relative spread is
    // 1/sqrt(ks) = 0.098. When it undershoots, recall = survivors / k; when it overshoots, the
    // exact top k is sent (recall 1). Floor: 5 standard deviations below 1.
    const double ks =
        std::round(static_cast<double>(k) * 0.01 * static_cast<double>(n) / static_cast<double>(n));
    const double floor = 1.0 - 5.0 / std::sqrt(ks);
    for (shape s : {shape::gaussian, shape::heavy}) {
      const std::vector<T> g = make<T>(s, n, 11 + static_cast<unsigned>(s));
      const auto reference = reference_topk(g, k);
      double sum = 0, low = 1;
      const int steps = 6;
      for (int step = 0; step < steps; ++step) {
        const topk_compressor c{
            .ratio = ratio, .method = topk_method::sampled_threshold, .seed = 42};
        const auto payload = encode(c, g, random_stream{static_cast<std::uint64_t>(step), 3});
        const auto e = parse<T>(payload);
        REQUIRE(e.index.size() <= k);
        for (std::size_t j = 0; j < e.index.size(); ++j) {
          REQUIRE(e.index[j] < n);
          if (j) REQUIRE(e.index[j] > e.index[j - 1]);
          REQUIRE(e.value[j] == g[e.index[j]]);
        }
        std::vector<std::uint64_t> common;
        std::set_intersection(e.index.begin(), e.index.end(), reference.begin(), reference.end(),
                              std::back_inserter(common));
        const double recall = static_cast<double>(common.size()) / static_cast<double>(k);
        sum += recall;
        low = std::min(low, recall);
        (void)decode<topk_compressor, T>(c, payload, n);  // the payload is valid
      }
      MESSAGE(std::string(s == shape::gaussian ? "gaussian" : "student-t(1.5)")
              << " " << sizeof(T) * 8 << "-bit, n = 2^20, ratio 1%, sample_ratio 1%: mean recall "
              << sum / steps << ", min " << low << " (floor " << floor << ")");
      CHECK(low >= floor);
    }
  }

  TEST_CASE("randomk: shared indices, one per stratum, linear payloads") {
    const std::size_t n = 1000;
    const randomk_compressor c{.ratio = 0.03, .seed = 99};
    const std::size_t k = expected_k(0.03, n);  // 30 strata of 33 or 34 elements
    std::vector<float> a(n), b(n);
    for (std::size_t i = 0; i < n; ++i) {
      a[i] = 1.0f + static_cast<float>(i);
      b[i] = 0.25f - static_cast<float>(i) * 0.5f;
    }
    const auto pa = encode(c, a, random_stream{7, 0});
    const auto pb = encode(c, b, random_stream{7, 5});  // another rank, same step
    const auto pc = encode(c, a, random_stream{8, 0});  // another step
    CHECK(pa.size() == 40 + k * 4);
    const auto positions = [&](const std::vector<std::byte>& p) {
      const std::vector<float> out = decode<randomk_compressor, float>(c, p, n);
      std::vector<std::size_t> where;
      for (std::size_t i = 0; i < n; ++i) {
        if (out[i] != 0.0f) where.push_back(i);
      }
      return where;
    };
    const auto ia = positions(pa);
    REQUIRE(ia.size() == k);
    CHECK(ia == positions(pb));
    CHECK(ia != positions(pc));
    CHECK(ia == c.indices(n, 7));
    // one index per stratum: the first n % k strata hold n / k + 1 elements
    std::size_t begin = 0;
    for (std::size_t j = 0; j < k; ++j) {
      const std::size_t size = n / k + (j < n % k ? 1 : 0);
      CHECK(ia[j] >= begin);
      CHECK(ia[j] < begin + size);
      begin += size;
    }
    // the values are the gradient's, unscaled
    const std::vector<float> da = decode<randomk_compressor, float>(c, pa, n);
    for (std::size_t i : ia) CHECK(da[i] == a[i]);
    // linear: the payload with summed value arrays decodes to the sum of the decodes
    std::vector<std::byte> sum = pa;
    for (std::size_t j = 0; j < k; ++j) {
      float x, y;
      std::memcpy(&x, pa.data() + 40 + 4 * j, 4);
      std::memcpy(&y, pb.data() + 40 + 4 * j, 4);
      const float z = x + y;
      std::memcpy(sum.data() + 40 + 4 * j, &z, 4);
    }
    const std::vector<float> db = decode<randomk_compressor, float>(c, pb, n);
    const std::vector<float> ds = decode<randomk_compressor, float>(c, sum, n);
    for (std::size_t i = 0; i < n; ++i) REQUIRE(ds[i] == da[i] + db[i]);
    static_assert(squall::compression_traits<randomk_compressor>::linear);
    static_assert(squall::compression_traits<randomk_compressor>::fixed_size);
  }

  TEST_CASE("randomk: each element is picked with probability 1 / stratum size") {
    const std::size_t n = 1000;
    const randomk_compressor c{.ratio = 0.03, .seed = 5};
    const std::size_t k = c.entries(n);
    const int steps = 20000;
    std::vector<int> hits(n, 0);
    for (int step = 0; step < steps; ++step) {
      for (std::size_t i : c.indices(n, static_cast<std::uint64_t>(step))) ++hits[i];
    }
    double chi2 = 0;
    double worst = 0;
    for (std::size_t i = 0; i < n; ++i) {
      // the stratum of i: the first n % k strata have n / k + 1 elements
      const std::size_t big = n / k + 1, split = (n % k) * big;
      const double size = static_cast<double>(i < split ? big : n / k);
      const double p = 1.0 / size, expected = steps * p;
      const double se = std::sqrt(steps * p * (1 - p));
      worst = std::max(worst, std::fabs(hits[i] - expected) / se);
      chi2 += (hits[i] - expected) * (hits[i] - expected) / expected;
    }
    // n - k degrees of freedom (one constraint per stratum): mean 970, sd sqrt(2 x 970) = 44
    const double dof = static_cast<double>(n - k);
    MESSAGE("randomk frequencies: chi-square " << chi2 << " on " << dof << " dof, worst |z| "
                                               << worst);
    CHECK(worst < 5.0);
    CHECK(std::fabs(chi2 - dof) < 5.0 * std::sqrt(2.0 * dof));
  }

  TEST_CASE_TEMPLATE("threshold: exactly |g| >= tau, each sent as +-tau", T, float, double) {
    const double tau = 0.1;  // not a float: the test is |g| >= tau as real numbers
    std::vector<T> g = make<T>(shape::gaussian, 20000, 3);
    for (auto& x : g) x *= T(0.1);
    const T t = static_cast<T>(tau);
    g[0] = t;
    g[1] = -std::nextafter(t, T(0));
    g[2] = std::nextafter(t, T(1));
    g[3] = -t;
    const threshold_compressor c{.tau = tau};
    const auto payload = encode(c, g);
    const auto e = parse<T>(payload);
    std::vector<std::uint64_t> expected;
    for (std::size_t i = 0; i < g.size(); ++i) {
      if (std::fabs(static_cast<double>(g[i])) >= tau) expected.push_back(i);
    }
    REQUIRE(e.index == expected);
    for (std::size_t j = 0; j < e.index.size(); ++j) {
      REQUIRE(e.value[j] == (g[e.index[j]] < 0 ? -t : t));
    }
    const std::vector<T> out = decode<threshold_compressor, T>(c, payload, g.size());
    std::size_t j = 0;
    for (std::size_t i = 0; i < g.size(); ++i) {
      if (j < expected.size() && expected[j] == i) {
        REQUIRE(std::fabs(out[i]) == t);
        ++j;
      } else {
        REQUIRE(out[i] == T(0));
      }
    }
    for (double bad : {0.0, -1.0, std::nan(""), std::numeric_limits<double>::infinity()}) {
      check_rejects([&] { (void)encode(threshold_compressor{.tau = bad}, g); }, "tau");
    }
  }

  TEST_CASE("bits on the wire per element match the documented formulas") {
    for (std::size_t n : {1u, 1000u, 65536u}) {
      std::vector<float> f = make<float>(shape::gaussian, n, 1);
      std::vector<double> d(f.begin(), f.end());
      const std::size_t k = expected_k(0.01, n);
      const double count = static_cast<double>(n);
      // topk: 128 header + 64 k + k x (32-bit index + value)
      CHECK(encode(topk_compressor{}, f).size() * 8.0 / count ==
            (192.0 + k * (32.0 + 32.0)) / count);
      CHECK(encode(topk_compressor{}, d).size() * 8.0 / count ==
            (192.0 + k * (32.0 + 64.0)) / count);
      // randomk: 128 header + 3 x 64 (seed, step, k) + k values
      CHECK(encode(randomk_compressor{}, f).size() * 8.0 / count == (320.0 + k * 32.0) / count);
      CHECK(encode(randomk_compressor{}, d).size() * 8.0 / count == (320.0 + k * 64.0) / count);
      // threshold: as topk with m = the number of |g| >= tau
      const auto tp = encode(threshold_compressor{.tau = 1.0}, f);
      const double m = static_cast<double>(parse<float>(tp).index.size());
      CHECK(tp.size() * 8.0 / count == (192.0 + m * 64.0) / count);
    }
    // beyond 2^32 elements the indices are u64
    const std::size_t big = (std::size_t{1} << 32) + 1;
    const std::size_t kb = expected_k(0.01, big);
    CHECK(topk_compressor{}.max_payload_bytes(squall::dtype::float32, big) == 24 + kb * (8 + 4));
    CHECK(topk_compressor{}.max_payload_bytes(squall::dtype::float32, big - 1) ==
          24 + expected_k(0.01, big - 1) * (4 + 4));
    CHECK(threshold_compressor{}.max_payload_bytes(squall::dtype::float64, 100) == 24 + 100 * 12);
    check_rejects(
        [] {
          (void)threshold_compressor{}.max_payload_bytes(squall::dtype::float64,
                                                         std::size_t{1} << 62);
        },
        "overflows");
  }

  TEST_CASE("sparse decode rejects every malformed payload") {
    const std::vector<float> g{0.5f, -3.0f, 0.25f, 4.0f, 1.0f, -0.125f, 2.0f, 0.0f};
    const topk_compressor c{.ratio = 0.5};  // k = 4: indices 1 3 4 6
    const auto good = encode(c, g);
    REQUIRE(parse<float>(good).index == std::vector<std::uint64_t>{1, 3, 4, 6});
    const auto run = [&](const std::vector<std::byte>& p) {
      (void)decode<topk_compressor, float>(c, p, g.size());
    };
    const auto set_u32 = [](std::vector<std::byte>& p, std::size_t at, std::uint32_t v) {
      std::memcpy(p.data() + at, &v, 4);
    };
    const auto set_u64 = [](std::vector<std::byte>& p, std::size_t at, std::uint64_t v) {
      std::memcpy(p.data() + at, &v, 8);
    };

    check_rejects([&] { run(std::vector<std::byte>(good.begin(), good.begin() + 10)); },
                  "16-byte header");
    check_rejects([&] { run(std::vector<std::byte>(good.begin(), good.begin() + 20)); },
                  "entry count");
    check_rejects(
        [&] { (void)decode<threshold_compressor, float>(threshold_compressor{}, good, g.size()); },
        "kind");
    check_rejects([&] { (void)decode<topk_compressor, double>(c, good, g.size()); }, "decoded as");
    check_rejects([&] { (void)decode<topk_compressor, float>(c, good, g.size() + 1); },
                  "decoded into");
    auto p = good;
    set_u64(p, 16, 9);
    check_rejects([&] { run(p); }, "9 entries for 8 elements");
    p = good;
    set_u64(p, 16, 3);
    check_rejects([&] { run(p); }, "bytes for 3 entries");
    p = good;
    p.push_back(std::byte{0});
    check_rejects([&] { run(p); }, "bytes for 4 entries");
    p = good;
    p.pop_back();
    check_rejects([&] { run(p); }, "bytes for 4 entries");
    p = good;
    set_u32(p, 24 + 4 * 2, 8);
    check_rejects([&] { run(p); }, "index 8 at position 2 is out of range for 8 elements");
    p = good;
    set_u32(p, 24 + 4 * 2, 2);
    check_rejects([&] { run(p); }, "index 2 at position 2 is not above the previous 3");
    p = good;
    set_u32(p, 24 + 4 * 3, 4);
    check_rejects([&] { run(p); }, "index 4 at position 3 repeats the previous 4");

    // k near 2^64 with a short payload: the size check must not overflow
    std::vector<float> huge_out(std::size_t{1} << 10);
    auto h = encode(topk_compressor{}, huge_out);
    for (std::uint64_t k : {std::uint64_t{1} << 62, std::numeric_limits<std::uint64_t>::max()}) {
      set_u64(h, 16, k);
      check_rejects(
          [&] { (void)decode<topk_compressor, float>(topk_compressor{}, h, huge_out.size()); },
          "entries for");
    }
    // a failed decode leaves out untouched
    std::vector<float> out(g.size(), 9.0f);
    p = good;
    set_u32(p, 24 + 4 * 3, 4);
    CHECK_THROWS_AS(c.decode(host_backend{}, host_view<const std::byte>(p), host_view<float>(out)),
                    squall::invalid_argument);
    for (float x : out) CHECK(x == 9.0f);
  }

  TEST_CASE_TEMPLATE(
      "decode_add and decode_subtract: out +- decode, on the k entries only; a bad payload "
      "changes nothing",
      T, float, double) {
    std::mt19937 rng(7);
    std::normal_distribution<double> normal;
    const std::size_t count = 1000;
    std::vector<T> g(count);
    std::vector<T> base(count);
    for (std::size_t i = 0; i < count; ++i) {
      g[i] = static_cast<T>(normal(rng));
      base[i] = static_cast<T>(normal(rng));
    }
    const auto check = [&](const auto& c) {
      const auto payload = encode(c, g);
      const std::vector<T> decoded = decode<std::decay_t<decltype(c)>, T>(c, payload, count);
      std::vector<T> sum = base;
      c.decode_add(host_backend{}, host_view<const std::byte>(payload), host_view<T>(sum));
      for (std::size_t i = 0; i < count; ++i) {
        CAPTURE(i);
        CHECK(sum[i] == static_cast<T>(base[i] + decoded[i]));  // the same rounding as an add
      }
      // error feedback forwards it
      const squall::error_feedback<std::decay_t<decltype(c)>> ef{c};
      std::vector<T> again = base;
      ef.decode_add(host_backend{}, host_view<const std::byte>(payload), host_view<T>(again));
      CHECK(again == sum);
      // a malformed payload (a repeated index) throws and adds nothing
      auto bad = payload;
      REQUIRE(parse<T>(bad).index.size() >= 2);
      std::memcpy(bad.data() + 24 + 4, bad.data() + 24, 4);
      std::vector<T> untouched = base;
      CHECK_THROWS_AS(
          c.decode_add(host_backend{}, host_view<const std::byte>(bad), host_view<T>(untouched)),
          squall::invalid_argument);
      CHECK(untouched == base);
      // decode_subtract: error feedback's residual update, the same rounding as a subtraction
      std::vector<T> difference = base;
      c.decode_subtract(host_backend{}, host_view<const std::byte>(payload),
                        host_view<T>(difference));
      for (std::size_t i = 0; i < count; ++i) {
        CAPTURE(i);
        CHECK(difference[i] == static_cast<T>(base[i] - decoded[i]));
      }
      CHECK_THROWS_AS(c.decode_subtract(host_backend{}, host_view<const std::byte>(bad),
                                        host_view<T>(untouched)),
                      squall::invalid_argument);
      CHECK(untouched == base);
    };
    check(topk_compressor{.ratio = 0.05});
    check(threshold_compressor{.tau = 1.5});
  }

  TEST_CASE("randomk decode rejects a short payload, a wrong k and a wrong size") {
    const std::vector<double> g = make<double>(shape::gaussian, 500, 2);
    const randomk_compressor c{.ratio = 0.1};
    const auto good = encode(c, g);
    const auto run = [&](const randomk_compressor& d, const std::vector<std::byte>& p) {
      (void)decode<randomk_compressor, double>(d, p, g.size());
    };
    check_rejects([&] { run(c, std::vector<std::byte>(good.begin(), good.begin() + 39)); },
                  "seed, step and k");
    check_rejects([&] { run(randomk_compressor{.ratio = 0.2}, good); }, "gives 100");
    auto p = good;
    p.pop_back();
    check_rejects([&] { run(c, p); }, "bytes for 50 values");
    check_rejects([&] { (void)decode<topk_compressor, double>(topk_compressor{}, good, g.size()); },
                  "kind");
  }

  TEST_CASE("decoders survive arbitrary corruption: they throw or decode, never overrun") {
    std::mt19937 gen(17);
    const std::vector<float> g = make<float>(shape::heavy, 300, 4);
    const topk_compressor topk{.ratio = 0.05};
    const randomk_compressor randomk{.ratio = 0.05};
    const std::vector<std::vector<std::byte>> payloads{encode(topk, g), encode(randomk, g)};
    std::vector<float> out(g.size());
    int thrown = 0;
    for (int trial = 0; trial < 4000; ++trial) {
      std::vector<std::byte> p = payloads[trial % 2];
      const int edits = 1 + trial % 3;
      for (int e = 0; e < edits; ++e) {
        p[gen() % p.size()] = static_cast<std::byte>(gen());
      }
      if (trial % 7 == 0) p.resize(gen() % (p.size() + 8));
      try {
        if (trial % 2 == 0) {
          topk.decode(host_backend{}, host_view<const std::byte>(p), host_view<float>(out));
        } else {
          randomk.decode(host_backend{}, host_view<const std::byte>(p), host_view<float>(out));
        }
      } catch (const squall::invalid_argument&) {
        ++thrown;
      }
    }
    CHECK(thrown > 0);
  }

  TEST_CASE_TEMPLATE("first_non_finite: the first NaN or infinity wherever it lies", T, float,
                     double) {
    // blocks of 256 are tested by their largest magnitude, then searched: bad elements at and
    // beside the blocks' ends, in the tail after the last whole block, two in one block, and
    // finite extremes (the largest value, a subnormal, -0) that must not count
    constexpr T nan = std::numeric_limits<T>::quiet_NaN();
    constexpr T inf = std::numeric_limits<T>::infinity();
    for (const std::size_t n : {std::size_t{300}, std::size_t{2049}}) {
      std::vector<T> x(n, T(1));
      x[3] = std::numeric_limits<T>::max();
      x[4] = -std::numeric_limits<T>::max();
      x[5] = std::numeric_limits<T>::denorm_min();
      x[6] = T(-0.0);
      const auto first = [&x] {
        return squall::kernels::first_non_finite(host_backend{}, host_view<const T>(x));
      };
      CHECK(first() == n);
      for (const std::size_t at : {std::size_t{0}, std::size_t{255}, std::size_t{256},
                                   std::size_t{257}, std::size_t{299}, n - 1}) {
        for (const T bad : {nan, -nan, inf, -inf}) {
          CAPTURE(n);
          CAPTURE(at);
          CAPTURE(bad);
          x[at] = bad;
          CHECK(first() == at);
          if (at + 7 < n) {
            x[at + 7] = nan;  // a second one later: the first is still named
            CHECK(first() == at);
            x[at + 7] = T(1);
          }
          x[at] = T(1);
        }
      }
    }
  }

  TEST_CASE("NaN and infinities: check_finite throws naming the index; otherwise NaN propagates") {
    std::vector<float> g(100, 0.001f);
    g[37] = std::numeric_limits<float>::quiet_NaN();
    g[60] = -std::numeric_limits<float>::infinity();
    check_rejects([&] { (void)encode(topk_compressor{.check_finite = true}, g); },
                  "element 37 is not finite: NaN");
    check_rejects([&] { (void)encode(randomk_compressor{.check_finite = true}, g); },
                  "element 37 is not finite: NaN");
    check_rejects([&] { (void)encode(threshold_compressor{.check_finite = true}, g); },
                  "element 37 is not finite: NaN");
    g[37] = 1.0f;
    check_rejects([&] { (void)encode(topk_compressor{.check_finite = true}, g); },
                  "element 60 is not finite: infinite");
    g[37] = -std::numeric_limits<float>::quiet_NaN();

    // without check_finite: NaN ranks as the largest magnitude, then -Inf
    const topk_compressor top2{.ratio = 0.02};
    const auto e = parse<float>(encode(top2, g));
    REQUIRE(e.index == std::vector<std::uint64_t>{37, 60});
    const std::vector<float> out = decode<topk_compressor, float>(top2, encode(top2, g), g.size());
    CHECK(std::isnan(out[37]));
    CHECK(out[60] == -std::numeric_limits<float>::infinity());
    // sampled threshold with NaN in the sample: still valid, NaN still selected
    const topk_compressor sampled{
        .ratio = 0.02, .method = topk_method::sampled_threshold, .sample_ratio = 1.0};
    const auto es = parse<float>(encode(sampled, g));
    CHECK(std::find(es.index.begin(), es.index.end(), 37u) != es.index.end());
    // threshold: NaN passes and is sent as NaN, -Inf as -tau
    const threshold_compressor th{.tau = 0.5};
    const std::vector<float> to = decode<threshold_compressor, float>(th, encode(th, g), g.size());
    CHECK(std::isnan(to[37]));
    CHECK(to[60] == -0.5f);
    // randomk sends what it picks as it is
    const std::vector<float> all_nan(10, std::numeric_limits<float>::quiet_NaN());
    const std::vector<float> ro = decode<randomk_compressor, float>(
        randomk_compressor{.ratio = 0.5}, encode(randomk_compressor{.ratio = 0.5}, all_nan), 10);
    CHECK(std::count_if(ro.begin(), ro.end(), [](float x) { return std::isnan(x); }) == 5);
  }

  TEST_CASE("with error_feedback, top-k sends everything eventually") {
    // sum of what was sent + residual == sum of the gradients (error_feedback's invariant,
    // checked against a serial double sum)
    const std::size_t n = 2000;
    const squall::error_feedback<topk_compressor> ef{.inner = topk_compressor{.ratio = 0.05}};
    squall::error_feedback_state<double> state(n);
    std::vector<double> sent(n, 0.0), total(n, 0.0), scratch(n);
    std::vector<std::byte> payload(ef.max_payload_bytes(squall::dtype::float64, n));
    for (int step = 0; step < 20; ++step) {
      const std::vector<double> g = make<double>(shape::gaussian, n, 100 + step);
      const std::size_t size = ef.encode(host_backend{}, state, host_view<const double>(g),
                                         host_view<std::byte>(payload), host_view<double>(scratch));
      const std::vector<double> got = decode<topk_compressor, double>(
          ef.inner,
          std::vector<std::byte>(payload.begin(),
                                 payload.begin() + static_cast<std::ptrdiff_t>(size)),
          n);
      for (std::size_t i = 0; i < n; ++i) {
        sent[i] += got[i];
        total[i] += g[i];
      }
    }
    for (std::size_t i = 0; i < n; ++i)
      REQUIRE(sent[i] + state.residual()[i] == doctest::Approx(total[i]).epsilon(1e-9));
  }
}
