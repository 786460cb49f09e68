// SPDX-License-Identifier: Apache-2.0
// buffer_view: bounds, memory spaces, and counts above 2^31 elements.

#include <squall/core/buffer.hpp>
#include <squall/detail/bytes.hpp>
#include <squall/detail/math.hpp>

#include <doctest/doctest.h>
#include <sys/mman.h>

#include <cstddef>
#include <cstdint>
#include <limits>
#include <vector>

using squall::buffer_view;
using squall::device_memory;
using squall::host_view;

namespace {
template <class V>
concept indexable = requires(V v) {
  v[0];
};
}  // namespace

TEST_SUITE("buffer") {
  TEST_CASE("views of containers, subviews and const conversion") {
    std::vector<int> v(10);
    host_view<int> view = v;
    CHECK(view.count() == 10);
    CHECK(view.size_bytes() == 40);
    const host_view<const int> cview = view;
    CHECK(cview.data() == v.data());
    auto sub = view.subview(3, 4);
    sub[0] = 7;
    CHECK(v[3] == 7);
    CHECK(view.subview(10, 0).empty());
    CHECK_THROWS_AS(view.subview(7, 4), squall::invalid_argument);
    CHECK_THROWS_AS(view.subview(11, 0), squall::invalid_argument);
    CHECK_THROWS_WITH_AS(view.subview(std::numeric_limits<std::size_t>::max(), 2),
                         doctest::Contains("outside a view of 10"), squall::invalid_argument);
  }

  TEST_CASE("null pointers and overflowing sizes are rejected") {
    CHECK_THROWS_AS(host_view<float>(nullptr, 1), squall::invalid_argument);
    CHECK(host_view<float>(nullptr, 0).empty());
    float x = 0;
    CHECK_THROWS_AS(host_view<float>(&x, std::numeric_limits<std::size_t>::max() / 2),
                    squall::invalid_argument);
  }

  TEST_CASE("device views carry their memory space and no host access") {
    using dview = buffer_view<float, device_memory>;
    static_assert(std::is_same_v<dview::memory_space, device_memory>);
    static_assert(!indexable<dview>);
    static_assert(indexable<host_view<float>>);
    static_assert(!std::is_convertible_v<dview, host_view<float>>);
    static_assert(!std::is_convertible_v<std::vector<float>&, dview>);
  }

  TEST_CASE("counts above 2^31 elements index and slice correctly") {
    // Reserve 12 GiB of address space without backing it: nothing is touched.
    constexpr std::size_t count = (std::size_t{3} << 30);  // 3 Gi floats
    void* base = mmap(nullptr, count * sizeof(float), PROT_NONE,
                      MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    REQUIRE(base != MAP_FAILED);
    const host_view<float> view(static_cast<float*>(base), count);
    CHECK(view.count() == count);
    CHECK(view.size_bytes() == count * 4);
    const std::size_t offset = (std::size_t{1} << 31) + 5;
    const auto tail = view.subview(offset, count - offset);
    CHECK(tail.data() == static_cast<float*>(base) + offset);
    CHECK(tail.count() == count - offset);
    const auto bytes = squall::detail::as_bytes(tail);
    CHECK(bytes.count() == (count - offset) * 4);
    CHECK_THROWS_AS(view.subview(offset, count), squall::invalid_argument);
    munmap(base, count * sizeof(float));
  }

  TEST_CASE("split_range tiles a count into near-equal parts") {
    for (std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{1000003},
                              (std::size_t{1} << 33) + 3}) {
      for (std::size_t parts = 1; parts <= 9; ++parts) {
        std::size_t next = 0;
        for (std::size_t p = 0; p < parts; ++p) {
          const auto r = squall::detail::split_range(count, parts, p);
          REQUIRE(r.begin == next);
          REQUIRE(r.count >= count / parts);
          REQUIRE(r.count <= count / parts + 1);
          next = r.end();
        }
        REQUIRE(next == count);
      }
    }
    CHECK(squall::detail::div_up(0, 4) == 0);
    CHECK(squall::detail::div_up(9, 4) == 3);
    CHECK(squall::detail::align_up(9, 8) == 16);
    CHECK(squall::detail::div_up(std::numeric_limits<std::size_t>::max(), 2) ==
          std::numeric_limits<std::size_t>::max() / 2 + 1);
  }
}
