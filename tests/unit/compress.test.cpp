// SPDX-License-Identifier: Apache-2.0
// identity_compressor: the payload is the input's bytes; malformed payloads are rejected.

#include <squall/compress/none.hpp>

#include <doctest/doctest.h>

#include <cstddef>
#include <cstring>
#include <limits>
#include <vector>

#include "../support/data.hpp"

using squall::host_backend;
using squall::host_view;

TEST_SUITE("compress") {
  TEST_CASE_TEMPLATE("identity round-trips every element type bit for bit", T,
                     SQUALL_TEST_ELEMENT_TYPES) {
    const squall::identity_compressor c;
    const auto in = squall::test::random_values<T>(999, 5);
    std::vector<std::byte> payload(c.max_payload_bytes(squall::dtype_of<T>, in.size()));
    REQUIRE(payload.size() == in.size() * sizeof(T));
    const std::size_t written =
        c.encode(host_backend{}, host_view<const T>(in), host_view<std::byte>(payload));
    CHECK(written == payload.size());
    CHECK(std::memcmp(payload.data(), in.data(), written) == 0);
    std::vector<T> out(in.size());
    c.decode(host_backend{}, host_view<const std::byte>(payload), host_view<T>(out));
    CHECK(std::memcmp(out.data(), in.data(), written) == 0);
  }

  TEST_CASE("identity rejects short buffers and mis-sized payloads") {
    const squall::identity_compressor c;
    std::vector<float> in(10, 1.0f);
    std::vector<std::byte> small(39);
    CHECK_THROWS_AS(
        c.encode(host_backend{}, host_view<const float>(in), host_view<std::byte>(small)),
        squall::invalid_argument);
    std::vector<float> out(11);
    std::vector<std::byte> payload(40);
    CHECK_THROWS_WITH_AS(
        c.decode(host_backend{}, host_view<const std::byte>(payload), host_view<float>(out)),
        doctest::Contains("payload of 40 bytes for 11 elements"), squall::invalid_argument);
    CHECK_THROWS_AS(
        c.max_payload_bytes(squall::dtype::float64, std::numeric_limits<std::size_t>::max() / 4),
        squall::invalid_argument);
  }
}
