// SPDX-License-Identifier: Apache-2.0
// The CUDA quantizers against their host twins, byte for byte: the same scale rule, the same
// per-element code (quantize_code), the same Philox words, so a device payload that differs
// from the host's is a device-side bug. The host side is tested against the papers in
// tests/compress/quantize.test.cpp.

#include <squall/cuda.cuh>

#include <doctest/doctest.h>

#include <cstddef>
#include <cstdint>
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
      for (const auto format : {squall::fp8_format::e4m3, squall::fp8_format::e5m2}) {
        for (const bool stochastic : {false, true}) {
          check_twin<squall::fp8_compressor, T>({.format = format, .stochastic = stochastic},
                                                count);
        }
      }
    }
  }
}
