// SPDX-License-Identifier: Apache-2.0
// The CUDA reduce kernels against their host twins, bit for bit: the same functors, the same
// order (one combine per element), so any difference is a device-side bug.

#include <squall/cuda.cuh>

#include <doctest/doctest.h>

#include <cstdint>
#include <vector>

#include "../support/cuda_device.cuh"
#include "../support/data.hpp"

namespace kernels = squall::kernels;
namespace test = squall::test;
using squall::cuda_backend;
using squall::device_view;
using squall::host_backend;
using squall::host_view;

namespace {

template <class T, class Op>
void check_twin(Op op, std::size_t count) {
  CAPTURE(count);
  const auto a = test::random_values<T>(count, 100 + count);
  const auto b = test::random_values<T>(count, 200 + count);

  auto expected = a;
  kernels::reduce_into(host_backend{}, op, host_view<T>(expected), host_view<const T>(b));
  kernels::finalize(host_backend{}, op, host_view<T>(expected), 3);

  test::device_vector<T> dst(a);
  test::device_vector<T> src(b);
  const cuda_backend gpu(0, nullptr);
  kernels::reduce_into(gpu, op, dst.view(), device_view<const T>(src.view()));
  kernels::finalize(gpu, op, dst.view(), 3);
  gpu.synchronize();
  const auto got = dst.to_host();
  for (std::size_t i = 0; i < count; ++i)
    REQUIRE(test::bits_of(got[i]) == test::bits_of(expected[i]));
}

}  // namespace

TEST_SUITE("cuda") {
  TEST_CASE_TEMPLATE(
      "device reduce_into equals the host twin bitwise" * doctest::skip(test::no_cuda_device()), T,
      SQUALL_TEST_ELEMENT_TYPES) {
    for (const std::size_t count : test::device_test_counts) {
      check_twin<T>(squall::sum_op{}, count);
      check_twin<T>(squall::min_op{}, count);
      check_twin<T>(squall::max_op{}, count);
      check_twin<T>(squall::avg_op{}, count);
    }
  }

  TEST_CASE("device reduce with aliasing and copy" * doctest::skip(test::no_cuda_device())) {
    const auto a = test::random_values<float>(5000, 1);
    test::device_vector<float> x(a);
    test::device_vector<float> y(std::vector<float>(a.size(), 0.0f));
    const cuda_backend gpu;
    kernels::copy(gpu, y.view(), device_view<const float>(x.view()));
    kernels::reduce(gpu, squall::sum_op{}, y.view(), device_view<const float>(x.view()),
                    device_view<const float>(y.view()));
    gpu.synchronize();
    const auto got = y.to_host();
    for (std::size_t i = 0; i < a.size(); ++i) REQUIRE(got[i] == a[i] + a[i]);
    CHECK_THROWS_AS(kernels::copy(gpu, y.view().subview(0, 3), device_view<const float>(x.view())),
                    squall::invalid_argument);
  }
}
