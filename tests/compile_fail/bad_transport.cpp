// SPDX-License-Identifier: Apache-2.0
// Must not compile: a transport whose send returns a bool instead of a completion.
#include <squall/concepts.hpp>

#include <cstddef>

struct my_completion {
  void wait() {}
  bool test() { return true; }
};
struct my_transport {
  using memory_space = squall::host_memory;
  int rank() const { return 0; }
  int size() const { return 1; }
  bool send(int, squall::buffer_view<const std::byte>) { return true; }
  my_completion recv(int, squall::buffer_view<std::byte>) { return {}; }
  my_completion barrier() { return {}; }
};
static_assert(squall::check_transport<my_transport>());
