// SPDX-License-Identifier: Apache-2.0
// The CUDA quantizers against their host twins, byte for byte: the same scale rule, the same
// per-element code (quantize_code), the same Philox words, so a device payload that differs
// from the host's is a device-side bug (least-squares scales included). The host side is tested
// against the papers in tests/compress/quantize.test.cpp.

#include <squall/cuda.cuh>

#include <doctest/doctest.h>

#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
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

template <class C, class T>
void check_twin(C c, std::size_t count) {
  test::check_codec_twin(c, test::random_values<T>(count, 300 + count),
                         squall::random_stream{5, 1});
}

/// Every quantizer kind (1, 2, 4 and 8-bit codes, max, L2 and mean scales, stochastic or
/// not) with `bucket` elements per scale on `g`.
template <class T>
void check_every_scheme(std::uint64_t bucket, const std::vector<T>& g, std::size_t misalign) {
  const squall::random_stream stream{7, 2};
  CAPTURE(bucket);
  test::check_codec_twin(squall::int8_compressor{.bucket = bucket}, g, stream, misalign);
  test::check_codec_twin(squall::sign_compressor{.bucket = bucket}, g, stream, misalign);
  test::check_codec_twin(squall::terngrad_compressor{.bucket = bucket}, g, stream, misalign);
  test::check_codec_twin(squall::qsgd_compressor<4>{.bucket = bucket}, g, stream, misalign);
  // least-squares scales (`fit_scale`): the fit kernel sums in the host's order
  test::check_codec_twin(squall::int8_compressor{.bucket = bucket, .fit_scale = true}, g, stream,
                         misalign);
  test::check_codec_twin(squall::terngrad_compressor{.bucket = bucket, .fit_scale = true}, g,
                         stream, misalign);
  test::check_codec_twin(squall::qsgd_compressor<4>{.bucket = bucket, .fit_scale = true}, g, stream,
                         misalign);
  test::check_codec_twin(squall::fp8_compressor{.stochastic = true, .bucket = bucket}, g, stream,
                         misalign);
}

}  // namespace

TEST_SUITE("cuda") {
  TEST_CASE_TEMPLATE("device quantizers equal their host twins byte for byte" *
                         doctest::skip(test::no_cuda_device()),
                     T, float, double) {
    for (const std::size_t count :
         {std::size_t{0}, std::size_t{1}, std::size_t{1000}, std::size_t{1024 * 1024 + 3}}) {
      check_twin<squall::int8_compressor, T>({}, count);
      check_twin<squall::sign_compressor, T>({}, count);
      check_twin<squall::sign_vote_compressor, T>({}, count);
      check_twin<squall::terngrad_compressor, T>({}, count);
      check_twin<squall::qsgd_compressor<4>, T>({}, count);
      check_twin<squall::qsgd_compressor<127>, T>({}, count);
      check_twin<squall::qsgd_compressor<4>, T>({.fit_scale = true}, count);
      check_twin<squall::terngrad_compressor, T>({.fit_scale = true}, count);
      for (const auto format : {squall::fp8_format::e4m3, squall::fp8_format::e5m2}) {
        for (const bool stochastic : {false, true}) {
          check_twin<squall::fp8_compressor, T>({.format = format, .stochastic = stochastic},
                                                count);
        }
      }
    }
  }

  // Buckets up to 512 elements are coded from registers, larger ones read twice: both kernels,
  // buckets that end mid-way through a lane's 4 elements or a 128-element chunk, a short last
  // bucket, an input that is not 16-byte aligned, and NaN and Inf in some buckets (sent with a
  // NaN scale and zero codes).
  TEST_CASE_TEMPLATE(
      "device quantizers equal their host twins for every bucket size, a "
      "misaligned input and non-finite values" *
          doctest::skip(test::no_cuda_device()),
      T, float, double) {
    std::vector<T> g = test::random_values<T>(5003, 77);
    g[100] = std::numeric_limits<T>::quiet_NaN();
    g[2049] = std::numeric_limits<T>::infinity();
    g[4000] = -std::numeric_limits<T>::infinity();
    for (const std::uint64_t bucket : {8u, 24u, 128u, 136u, 256u, 504u, 512u, 520u, 2048u}) {
      for (const std::size_t misalign : {std::size_t{0}, std::size_t{1}}) {
        check_every_scheme(bucket, g, misalign);
      }
    }
    check_every_scheme<T>(0, test::random_values<T>(301, 78), 1);  // one bucket of 301
    // many buckets per warp (the grid-stride loop) and full buckets without bounds checks
    check_every_scheme<T>(512, test::random_values<T>(40'000'003, 80), 0);
  }

  TEST_CASE_TEMPLATE(
      "a device quantizer with check_finite names the first non-finite element "
      "as the host does" *
          doctest::skip(test::no_cuda_device()),
      T, float, double) {
    std::vector<T> g = test::random_values<T>(3000, 79);
    g[2999] = std::numeric_limits<T>::infinity();
    g[1234] = std::numeric_limits<T>::quiet_NaN();
    const squall::int8_compressor c{.check_finite = true};
    const auto message = [&](const auto& backend, auto in, auto payload) {
      try {
        c.encode(backend, in, payload);
      } catch (const squall::invalid_argument& e) {
        return std::string(e.what());
      }
      return std::string("no exception");
    };
    const std::size_t room = c.max_payload_bytes(squall::dtype_of<T>, g.size());
    std::vector<std::byte> host_payload(room);
    const std::string expected =
        message(host_backend{}, host_view<const T>(g), host_view<std::byte>(host_payload));
    CHECK(expected.find("1234") != std::string::npos);
    test::device_vector<T> in(g);
    test::device_vector<std::byte> payload{std::vector<std::byte>(room)};
    CHECK(message(cuda_backend{}, device_view<const T>(in.view()), payload.view()) == expected);
  }
}
