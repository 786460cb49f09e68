// SPDX-License-Identifier: Apache-2.0
// Must not compile: a topology without a schedule.
#include <squall/concepts.hpp>

#include <string_view>

struct my_topology {
  static constexpr std::string_view name = "mine";
};
static_assert(squall::check_topology<my_topology>());
