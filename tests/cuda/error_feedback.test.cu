// SPDX-License-Identifier: Apache-2.0
// error_feedback<C> on the device against the host, bit for bit, over several steps: the
// residual update (reduce_into with sum_op, subtract_into) is one rounding per element on
// both sides, and the wrapped compressors used here (cast, top-k, random-k, QSGD) are
// deterministic twins, so payloads and residuals must stay equal. Both device forms are
// checked: a device residual (the view overload) and the host-resident state (staged).

#include <squall/cuda.cuh>

#include <doctest/doctest.h>

#include <algorithm>  // equal
#include <cstddef>
#include <cstdint>
#include <vector>

#include "../support/cuda_device.cuh"
#include "../support/data.hpp"

namespace test = squall::test;
using squall::cuda_backend;
using squall::device_view;
using squall::host_backend;
using squall::host_view;

namespace {

template <class C, class T>
void check_feedback(const C& inner, std::size_t count) {
  CAPTURE(count);
  const squall::error_feedback<C> ef{inner};
  const std::size_t room = ef.max_payload_bytes(squall::dtype_of<T>, count);
  const cuda_backend gpu;
  squall::error_feedback_state<T> host_state(count);
  squall::error_feedback_state<T> staged_state(count);  // host memory, device encode
  test::device_vector<T> residual{std::vector<T>(count, T(0))};
  std::vector<std::byte> expected(room);
  std::vector<T> scratch(count);
  test::device_vector<std::byte> payload{std::vector<std::byte>(room)};
  test::device_vector<T> device_scratch{std::vector<T>(count)};
  for (std::uint64_t step = 0; step < 3; ++step) {
    CAPTURE(step);
    const auto g = test::normal_values<T>(count, 1000 * step + count);
    const squall::random_stream stream{step, 1};
    const std::size_t size =
        ef.encode(host_backend{}, host_state, host_view<const T>(g), host_view<std::byte>(expected),
                  host_view<T>(scratch), stream);
    test::device_vector<T> in(g);
    for (const bool staged : {false, true}) {
      CAPTURE(staged);
      const std::size_t written =
          staged ? ef.encode(gpu, staged_state, device_view<const T>(in.view()), payload.view(),
                             device_scratch.view(), stream)
                 : ef.encode(gpu, residual.view(), device_view<const T>(in.view()), payload.view(),
                             device_scratch.view(), stream);
      gpu.synchronize();
      REQUIRE(written == size);
      auto got = payload.to_host();
      REQUIRE(std::equal(got.begin(), got.begin() + static_cast<std::ptrdiff_t>(size),
                         expected.begin()));
    }
    const auto device_residual = residual.to_host();
    for (std::size_t i = 0; i < count; ++i) {
      REQUIRE(test::bits_of(device_residual[i]) == test::bits_of(host_state.residual()[i]));
      REQUIRE(test::bits_of(staged_state.residual()[i]) == test::bits_of(host_state.residual()[i]));
    }
  }
}

}  // namespace

TEST_SUITE("cuda") {
  TEST_CASE_TEMPLATE(
      "device error feedback equals the host bit for bit" * doctest::skip(test::no_cuda_device()),
      T, float, double) {
    for (const std::size_t count : test::device_test_counts) {
      check_feedback<squall::cast_compressor<squall::float16>, T>({}, count);
      check_feedback<squall::topk_compressor, T>({.ratio = 0.01}, count);
      check_feedback<squall::randomk_compressor, T>({.ratio = 0.05, .seed = 3}, count);
      check_feedback<squall::qsgd_compressor<4>, T>({}, count);
    }
  }

  TEST_CASE_TEMPLATE("device error feedback of 16-bit elements equals the host bit for bit" *
                         doctest::skip(test::no_cuda_device()),
                     T, squall::float16, squall::bfloat16) {
    for (const std::size_t count : test::device_test_counts) {
      check_feedback<squall::cast_compressor<squall::bfloat16>, T>({}, count);
      check_feedback<squall::cast_compressor<squall::float16>, T>({}, count);
    }
  }
}
