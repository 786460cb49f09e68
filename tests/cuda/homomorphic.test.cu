// SPDX-License-Identifier: Apache-2.0
// The CUDA homomorphic quantizer (kernels/cuda/homomorphic.cuh) against its host twin, byte
// for byte: the same signs, rotation, draws and codes, so a device payload that differs from
// the host's is a device-side bug (the phases the kernels run are also checked on the host,
// thread by thread, in tests/compress/homomorphic.test.cpp). Unclipped (clip 0) the scale is
// the exact max |y|, so the whole encode is the host's; clipped, the rms comes from sums in
// another order, so the device's range is checked within 1e-6 and the codes against a range
// agreed on the host.

#include <squall/cuda.cuh>

#include <doctest/doctest.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>  // memcpy
#include <limits>
#include <string>
#include <vector>

#include "../support/compressed_reference.hpp"  // what_of
#include "../support/cuda_codec_twin.cuh"
#include "../support/cuda_device.cuh"
#include "../support/data.hpp"

namespace test = squall::test;
using squall::cuda_backend;
using squall::device_view;
using squall::host_backend;
using squall::host_view;

namespace {

/// The payload of `in` encoded against `agreed` on `backend` (device input and payload for
/// the CUDA backend), copied to the host.
template <class T>
std::vector<std::byte> hq_encoded(const squall::homomorphic_compressor& c, const std::vector<T>& in,
                                  squall::agreed_range agreed, bool on_device) {
  const squall::random_stream stream{3, 1};
  std::vector<std::byte> payload(c.max_payload_bytes(squall::dtype_of<T>, in.size(), agreed.ranks));
  if (!on_device) {
    payload.resize(c.encode(host_backend{}, host_view<const T>(in), host_view<std::byte>(payload),
                            stream, agreed));
    return payload;
  }
  test::device_vector<T> d_in(in);
  test::device_vector<std::byte> d_payload(payload);
  const std::size_t size =
      c.encode(cuda_backend{}, device_view<const T>(d_in.view()), d_payload.view(), stream, agreed);
  auto out = d_payload.to_host();
  out.resize(size);
  return out;
}

}  // namespace

TEST_SUITE("cuda") {
  TEST_CASE_TEMPLATE("the device hq codec equals its host twin byte for byte (unclipped)" *
                         doctest::skip(test::no_cuda_device()),
                     T, float, double) {
    for (const std::size_t count : test::device_test_counts) {
      for (const unsigned bits : {2u, 4u, 8u}) {
        for (const bool rotate : {true, false}) {
          CAPTURE(bits);
          CAPTURE(rotate);
          test::check_codec_twin(
              squall::homomorphic_compressor{.bits = bits, .rotate = rotate, .clip = 0, .seed = 5},
              test::random_values<T>(count, 900 + count), squall::random_stream{7, 2});
        }
      }
    }
  }

  TEST_CASE_TEMPLATE(
      "the device hq range is the host's within 1e-6, and against one agreed range the "
      "payloads of P ranks are the host's" *
          doctest::skip(test::no_cuda_device()),
      T, float, double) {
    const squall::homomorphic_compressor c{.bits = 4, .seed = 9};
    for (const std::size_t count : {std::size_t{1000}, std::size_t{1024 * 1024 + 3}}) {
      CAPTURE(count);
      const auto x = test::random_values<T>(count, 950);
      const auto host = c.local_range(host_backend{}, host_view<const T>(x), 3);
      test::device_vector<T> d_x(x);
      const auto device = c.local_range(cuda_backend{}, device_view<const T>(d_x.view()), 3);
      CHECK(std::abs(device.max_abs - host.max_abs) <= 1e-6 * host.max_abs);
      CHECK(std::abs(device.rms - host.rms) <= 1e-6 * host.rms);
      for (const std::uint32_t ranks : {1u, 3u, 4u}) {
        const squall::agreed_range agreed{.max_abs = host.max_abs, .rms = host.rms, .ranks = ranks};
        CHECK(hq_encoded(c, x, agreed, true) == hq_encoded(c, x, agreed, false));
      }
    }
  }

  TEST_CASE_TEMPLATE(
      "the device hq codec: check_finite names the first non-finite element, and a corrupt "
      "field is refused, as on the host" *
          doctest::skip(test::no_cuda_device()),
      T, float, double) {
    std::vector<T> g = test::random_values<T>(5000, 960);
    g[4321] = std::numeric_limits<T>::infinity();
    g[1234] = std::numeric_limits<T>::quiet_NaN();
    const squall::homomorphic_compressor c{.check_finite = true};
    const squall::agreed_range agreed{.max_abs = 4, .rms = 1, .ranks = 1};
    std::vector<std::byte> payload(c.max_payload_bytes(squall::dtype_of<T>, g.size(), 1));
    const std::string expected = test::what_of([&] {
      c.encode(host_backend{}, host_view<const T>(g), host_view<std::byte>(payload),
               squall::random_stream{}, agreed);
    });
    CHECK(expected.find("1234") != std::string::npos);
    test::device_vector<T> in(g);
    test::device_vector<std::byte> d_payload(payload);
    CHECK(test::what_of([&] {
            c.encode(cuda_backend{}, device_view<const T>(in.view()), d_payload.view(),
                     squall::random_stream{}, agreed);
          }) == expected);

    // a field of element 2000 set to all ones: above 2L for one rank
    const auto clean = test::random_values<T>(5000, 961);
    const squall::homomorphic_compressor plain{};
    std::vector<std::byte> good(plain.max_payload_bytes(squall::dtype_of<T>, clean.size(), 1));
    good.resize(plain.encode(host_backend{}, host_view<const T>(clean), host_view<std::byte>(good),
                             squall::random_stream{}, agreed));
    const unsigned field = squall::kernels::hq_field_bits(plain.bits, 1);
    const auto at = squall::kernels::hq_place_of(2000, 64 / field);
    std::uint64_t word = 0;
    std::byte* w = good.data() + squall::homomorphic_compressor::body_offset + 8 + 8 * at.word;
    std::memcpy(&word, w, 8);
    word |= ((std::uint64_t{1} << field) - 1) << (at.field * field);
    std::memcpy(w, &word, 8);
    std::vector<T> out(clean.size());
    const std::string refused = test::what_of(
        [&] { plain.decode(host_backend{}, host_view<const std::byte>(good), host_view<T>(out)); });
    CHECK(refused.find("2000") != std::string::npos);
    test::device_vector<std::byte> d_good(good);
    test::device_vector<T> d_out(out);
    CHECK(test::what_of([&] {
            plain.decode(cuda_backend{}, device_view<const std::byte>(d_good.view()), d_out.view());
          }) == refused);
  }
}
