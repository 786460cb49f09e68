// SPDX-License-Identifier: Apache-2.0
// handle_cache (cuda_ipc_transport's opened peer allocations), on the host: a hit finds the
// entry and makes it the most recently used, a full cache closes the least recently used
// first, erase and erase_if close what they remove, and every entry is closed at the end.

#include <squall/transport/detail/handle_cache.hpp>

#include <doctest/doctest.h>

#include <string>
#include <utility>
#include <vector>

namespace {

using cache = squall::detail::handle_cache<int, std::string>;
using closed_log = std::vector<std::pair<int, std::string>>;

cache make(std::size_t capacity, closed_log& closed) {
  return {capacity,
          [&closed](const int& key, std::string& value) { closed.emplace_back(key, value); }};
}

}  // namespace

TEST_CASE("handle_cache finds, evicts the least recently used, erases and closes everything") {
  closed_log closed;
  {
    auto c = make(2, closed);
    CHECK(c.find(1) == nullptr);
    c.insert(1, "mapped-1");
    c.insert(2, "mapped-2");
    REQUIRE(c.find(1) != nullptr);  // a hit: 1 is now the most recently used
    CHECK(*c.find(1) == "mapped-1");
    CHECK(c.hits() == 2);
    CHECK(c.misses() == 2);
    c.insert(3, "mapped-3");  // full: 2, the least recently used, is closed
    REQUIRE(closed.size() == 1);
    CHECK(closed[0] == std::pair<int, std::string>{2, "mapped-2"});
    CHECK(c.find(2) == nullptr);
    CHECK(c.size() == 2);
    c.erase(3);
    CHECK(closed.back().first == 3);
    c.erase(42);  // absent: nothing closed
    CHECK(closed.size() == 2);
    c.insert(4, "mapped-4");
    c.insert(6, "mapped-6");  // evicts 1 (older than 4)
    CHECK(closed.back().first == 1);
    CHECK(c.erase_if([](int k) { return k % 2 == 0; }) == 2);
    CHECK(c.size() == 0);
    c.insert(7, "mapped-7");
  }
  // 7 closed at the end; each entry closed once
  CHECK(closed.size() == 6);
  CHECK(closed.back() == std::pair<int, std::string>{7, "mapped-7"});
}

TEST_CASE("handle_cache refuses a capacity of 0") {
  closed_log closed;
  CHECK_THROWS_AS(make(0, closed), squall::invalid_argument);
}
