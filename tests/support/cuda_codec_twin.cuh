// SPDX-License-Identifier: Apache-2.0
#pragma once
// The check every deterministic CUDA compressor twin passes: encode on the host and on the
// device must give the same payload (size and bytes), and the host payload decoded on both
// must give the same tensor bit for bit (the device decode must also overwrite all of `out`).

#include <squall/cuda.cuh>

#include <doctest/doctest.h>

#include <cstddef>
#include <vector>

#include "cuda_device.cuh"
#include "data.hpp"

namespace squall::test {

/// `misalign`: the device input starts that many elements into its allocation (an address
/// that is not a multiple of 16 bytes for misalign 1).
template <class C, class T>
void check_codec_twin(const C& c, const std::vector<T>& g, random_stream stream = {},
                      std::size_t misalign = 0) {
  const std::size_t count = g.size();
  CAPTURE(count);
  CAPTURE(misalign);
  const std::size_t room = c.max_payload_bytes(dtype_of<T>, count);
  const auto encode = [&](const auto& backend, auto in, auto payload) {
    if constexpr (requires { c.encode(backend, in, payload, stream); }) {
      return c.encode(backend, in, payload, stream);
    } else {
      return c.encode(backend, in, payload);
    }
  };
  std::vector<std::byte> expected(room);
  const std::size_t size =
      encode(host_backend{}, host_view<const T>(g), host_view<std::byte>(expected));
  expected.resize(size);

  std::vector<T> shifted(misalign, T(0));
  shifted.insert(shifted.end(), g.begin(), g.end());
  device_vector<T> in(shifted);
  device_vector<std::byte> payload{std::vector<std::byte>(room)};
  const cuda_backend gpu;
  REQUIRE(encode(gpu, device_view<const T>(in.view().data() + misalign, count), payload.view()) ==
          size);
  gpu.synchronize();
  auto got = payload.to_host();
  got.resize(size);
  REQUIRE(got == expected);

  std::vector<T> host_out(count);
  c.decode(host_backend{}, host_view<const std::byte>(expected), host_view<T>(host_out));
  device_vector<std::byte> host_payload(expected);
  device_vector<T> out{std::vector<T>(count, T(7))};  // decode must overwrite all of it
  c.decode(gpu, device_view<const std::byte>(host_payload.view()), out.view());
  gpu.synchronize();
  const auto decoded = out.to_host();
  for (std::size_t i = 0; i < count; ++i) REQUIRE(bits_of(decoded[i]) == bits_of(host_out[i]));
}

}  // namespace squall::test
