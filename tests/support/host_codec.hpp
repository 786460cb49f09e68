// SPDX-License-Identifier: Apache-2.0
#pragma once
// A compressor's host encode and decode as the property tests call them: encode into a buffer
// of `max_payload_bytes`, checked to fit and cut to what was written; decode into a tensor
// filled with `fill` first, so an element decode forgets to write shows.

#include <squall/backend/host.hpp>
#include <squall/core/buffer.hpp>
#include <squall/core/random.hpp>
#include <squall/core/types.hpp>

#include <doctest/doctest.h>

#include <cstddef>
#include <vector>

namespace squall::test {

template <class C, class T>
std::vector<std::byte> encode_on_host(const C& c, const std::vector<T>& in,
                                      random_stream stream = {}) {
  std::vector<std::byte> payload(c.max_payload_bytes(dtype_of<T>, in.size()));
  const std::size_t written =
      c.encode(host_backend{}, host_view<const T>(in), host_view<std::byte>(payload), stream);
  REQUIRE(written <= payload.size());
  payload.resize(written);
  return payload;
}

template <class T, class C>
std::vector<T> decode_on_host(const C& c, const std::vector<std::byte>& payload, std::size_t count,
                              T fill) {
  std::vector<T> out(count, fill);
  c.decode(host_backend{}, host_view<const std::byte>(payload), host_view<T>(out));
  return out;
}

}  // namespace squall::test
