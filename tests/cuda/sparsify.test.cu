// SPDX-License-Identifier: Apache-2.0
// The CUDA sparsifiers against their host twins, byte for byte: top-k (exact and sampled
// threshold), random-k and threshold are deterministic, so a device payload or a decoded
// tensor that differs from the host's is a device-side bug. The data have many ties (multiples
// of 1/128 in [-8, 8]), which pins down the tie rule (lower index first), and NaN and
// infinities, which pin down the order of the magnitude keys (NaN highest). The host side is
// tested against full sorts and the papers in tests/compress/sparsify.test.cpp.

#include <squall/cuda.cuh>

#include <doctest/doctest.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <utility>  // swap
#include <vector>

#include "../support/cuda_codec_twin.cuh"
#include "../support/cuda_device.cuh"
#include "../support/data.hpp"

namespace test = squall::test;
using squall::cuda_backend;
using squall::device_view;
using squall::host_backend;
using squall::host_view;

namespace {

enum class data_kind { ties, continuous, non_finite };

template <class T>
std::vector<T> make_data(data_kind kind, std::size_t count, std::uint64_t seed) {
  if (kind == data_kind::continuous) return test::normal_values<T>(count, seed);
  auto out = test::random_values<T>(count, seed);
  if (kind == data_kind::non_finite) {
    for (std::size_t i = 3; i < count; i += 1009) {
      out[i] = i % 3 == 0   ? std::numeric_limits<T>::quiet_NaN()
               : i % 3 == 1 ? std::numeric_limits<T>::infinity()
                            : -std::numeric_limits<T>::infinity();
    }
  }
  return out;
}

constexpr data_kind kinds[] = {data_kind::ties, data_kind::continuous, data_kind::non_finite};

/// A message the call throws (empty if none).
template <class F>
std::string thrown(F f) {
  try {
    f();
  } catch (const squall::invalid_argument& e) {
    return e.what();
  }
  return {};
}

}  // namespace

TEST_SUITE("cuda") {
  TEST_CASE_TEMPLATE(
      "device top-k equals its host twin byte for byte" * doctest::skip(test::no_cuda_device()), T,
      float, double) {
    for (const std::size_t count : test::device_test_counts) {
      for (const data_kind kind : kinds) {
        CAPTURE(count);
        CAPTURE(static_cast<int>(kind));
        const auto g = make_data<T>(kind, count, 500 + count);
        for (const double ratio : {0.001, 0.01, 0.3, 1.0}) {
          CAPTURE(ratio);
          squall::topk_compressor c;
          c.ratio = ratio;
          test::check_codec_twin(c, g, {});
          // the sampled threshold: with ties more than k pass and the exact top k is sent,
          // with continuous data the sampled cut is sent
          c.method = squall::topk_method::sampled_threshold;
          c.seed = 11;
          test::check_codec_twin(c, g, {3, 2});
          c.sample_ratio = 0.2;
          test::check_codec_twin(c, g, {4, 1});
        }
      }
    }
  }

  TEST_CASE_TEMPLATE("device random-k and threshold equal their host twins byte for byte" *
                         doctest::skip(test::no_cuda_device()),
                     T, float, double) {
    for (const std::size_t count : test::device_test_counts) {
      for (const data_kind kind : kinds) {
        CAPTURE(count);
        CAPTURE(static_cast<int>(kind));
        const auto g = make_data<T>(kind, count, 600 + count);
        for (const double ratio : {0.01, 0.5, 1.0}) {
          squall::randomk_compressor r;
          r.ratio = ratio;
          r.seed = 21;
          test::check_codec_twin(r, g, {9, 4});
        }
        for (const double tau : {0.5, 4.0, 1e300}) {
          squall::threshold_compressor t;
          t.tau = tau;
          test::check_codec_twin(t, g, {});
        }
      }
    }
  }

  TEST_CASE("device sparsifiers throw what the host throws" *
            doctest::skip(test::no_cuda_device())) {
    const cuda_backend gpu;
    const std::size_t count = 5000;
    auto g = make_data<float>(data_kind::ties, count, 7);
    squall::topk_compressor c;
    c.ratio = 0.01;
    std::vector<std::byte> bytes(c.max_payload_bytes(squall::dtype::float32, count));
    c.encode(host_backend{}, host_view<const float>(g), host_view<std::byte>(bytes));
    std::vector<float> host_out(count);
    test::device_vector<float> out{std::vector<float>(count)};

    // indices out of order, repeated, out of range: the same message, naming the position
    for (int fault = 0; fault < 3; ++fault) {
      auto bad = bytes;
      std::uint32_t index[2];
      std::memcpy(index, bad.data() + 24 + 4 * 7, 8);
      if (fault == 0) std::swap(index[0], index[1]);
      if (fault == 1) index[1] = index[0];
      if (fault == 2) index[1] = static_cast<std::uint32_t>(count);
      std::memcpy(bad.data() + 24 + 4 * 7, index, 8);
      const std::string expected = thrown([&] {
        c.decode(host_backend{}, host_view<const std::byte>(bad), host_view<float>(host_out));
      });
      REQUIRE(!expected.empty());
      test::device_vector<std::byte> payload(bad);
      CHECK(thrown([&] {
              c.decode(gpu, device_view<const std::byte>(payload.view()), out.view());
            }) == expected);
    }

    // check_finite: the first non-finite element, and its kind
    g[1234] = std::numeric_limits<float>::infinity();
    g[2345] = std::numeric_limits<float>::quiet_NaN();
    c.check_finite = true;
    const std::string expected = thrown(
        [&] { c.encode(host_backend{}, host_view<const float>(g), host_view<std::byte>(bytes)); });
    REQUIRE(!expected.empty());
    test::device_vector<float> in(g);
    test::device_vector<std::byte> payload{std::vector<std::byte>(bytes.size())};
    CHECK(thrown([&] { c.encode(gpu, device_view<const float>(in.view()), payload.view()); }) ==
          expected);
    squall::threshold_compressor t;
    t.check_finite = true;
    g[1234] = 0.0f;  // now the NaN comes first
    test::device_vector<float> in2(g);
    std::vector<std::byte> host_bytes(t.max_payload_bytes(squall::dtype::float32, count));
    test::device_vector<std::byte> payload2{host_bytes};
    const std::string nan_message = thrown([&] {
      t.encode(host_backend{}, host_view<const float>(g), host_view<std::byte>(host_bytes));
    });
    REQUIRE(nan_message.find("NaN") != std::string::npos);
    CHECK(thrown([&] { t.encode(gpu, device_view<const float>(in2.view()), payload2.view()); }) ==
          nan_message);
  }

  TEST_CASE("device write_selected takes the lowest-indexed ties, as the host" *
            doctest::skip(test::no_cuda_device())) {
    // a cut with ties that the compressors do not produce themselves: every tie count
    namespace kernels = squall::kernels;
    const auto g = test::random_values<float>(20000, 8);
    test::device_vector<float> in(g);
    const auto key = kernels::magnitude_key(1.0f);
    const std::size_t above = kernels::count_at_least(host_backend{}, host_view<const float>(g),
                                                      static_cast<std::uint32_t>(key + 1));
    const std::size_t equal =
        kernels::count_at_least(host_backend{}, host_view<const float>(g), key) - above;
    REQUIRE(equal > 2);
    for (const std::size_t ties : {std::size_t{0}, std::size_t{1}, equal / 2, equal, equal + 5}) {
      CAPTURE(ties);
      const std::size_t n = above + (ties < equal ? ties : equal);
      std::vector<std::byte> expected(n * 8);
      const std::size_t written = kernels::write_selected<std::uint32_t>(
          host_backend{}, host_view<const float>(g), key, ties, expected.data(),
          expected.data() + n * 4, true, 0.25f);
      REQUIRE(written == n);
      test::device_vector<std::byte> got{std::vector<std::byte>(n * 8)};
      std::byte* base = got.view().data();
      CHECK(kernels::write_selected<std::uint32_t>(cuda_backend{},
                                                   device_view<const float>(in.view()), key, ties,
                                                   base, base + n * 4, true, 0.25f) == n);
      CHECK(got.to_host() == expected);
    }
  }
}
