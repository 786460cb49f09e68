// SPDX-License-Identifier: Apache-2.0
// Must not compile: a backend without synchronize(). Expected: one error line naming it.
#include <squall/concepts.hpp>

#include <string_view>

struct my_backend {
  using memory_space = squall::host_memory;
  static constexpr std::string_view name = "mine";
};
static_assert(squall::check_backend<my_backend>());
