// SPDX-License-Identifier: Apache-2.0
// The CUDA cast compressor against its host twin, byte for byte: the device conversions use
// the host's bit routines (core/types.hpp), so every value -- NaN payloads, infinities,
// subnormals and overflow included -- must give the host's bits. The host side is tested
// against the IEEE rounding in tests/unit/cast.test.cpp.

#include <squall/cuda.cuh>

#include <doctest/doctest.h>

#include <bit>  // bit_cast
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <random>
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

/// Values of every magnitude float16 and bfloat16 meet (2^-30 .. 2^20, both signs), and at
/// fixed places NaNs with payloads, infinities, zeros, float subnormals and values beyond
/// float16's range.
template <class T>
std::vector<T> mixed_values(std::size_t count, std::uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::uniform_real_distribution<double> mantissa(1.0, 2.0);
  std::uniform_int_distribution<int> exponent(-30, 20);
  const float specials[] = {std::bit_cast<float>(0x7fc01234u),
                            std::bit_cast<float>(0xffa00001u),
                            std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(),
                            0.0f,
                            -0.0f,
                            std::numeric_limits<float>::denorm_min(),
                            70000.0f,
                            -65520.0f,
                            65519.0f,
                            3e-8f,
                            6e-8f};
  std::vector<T> out(count);
  for (std::size_t i = 0; i < count; ++i) {
    double v = std::ldexp(mantissa(gen), exponent(gen)) * (gen() % 2 == 0 ? 1.0 : -1.0);
    if (i % 97 < std::size(specials)) v = static_cast<double>(specials[i % 97]);
    if constexpr (std::is_same_v<T, double>) {
      out[i] = v;
    } else {
      out[i] = T(static_cast<float>(v));
    }
  }
  return out;
}

template <class To, class T>
void check_cast(std::size_t count) {
  test::check_codec_twin(squall::cast_compressor<To>{}, mixed_values<T>(count, 400 + count));
}

}  // namespace

TEST_SUITE("cuda") {
  TEST_CASE_TEMPLATE(
      "device cast equals its host twin byte for byte" * doctest::skip(test::no_cuda_device()), T,
      float, double, squall::float16, squall::bfloat16) {
    for (const std::size_t count : test::device_test_counts) {
      check_cast<squall::float16, T>(count);
      check_cast<squall::bfloat16, T>(count);
    }
  }

  TEST_CASE("device cast decode rejects what the host rejects" *
            doctest::skip(test::no_cuda_device())) {
    const squall::cast_compressor<squall::float16> c;
    const std::vector<float> g = {1.0f, 2.0f, 3.0f};
    std::vector<std::byte> bytes(c.max_payload_bytes(squall::dtype::float32, 3));
    c.encode(host_backend{}, host_view<const float>(g), host_view<std::byte>(bytes));
    bytes[2] = std::byte{99};  // the kind
    test::device_vector<std::byte> payload(bytes);
    test::device_vector<float> out{std::vector<float>(3)};
    CHECK_THROWS_WITH_AS(
        c.decode(cuda_backend{}, device_view<const std::byte>(payload.view()), out.view()),
        doctest::Contains("kind 99"), squall::invalid_argument);
    test::device_vector<std::byte> short_payload{std::vector<std::byte>(7)};
    CHECK_THROWS_WITH_AS(
        c.decode(cuda_backend{}, device_view<const std::byte>(short_payload.view()), out.view()),
        doctest::Contains("shorter than its 16-byte header"), squall::invalid_argument);
  }
}
