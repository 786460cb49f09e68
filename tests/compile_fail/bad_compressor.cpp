// SPDX-License-Identifier: Apache-2.0
// Must not compile: a compressor that does not declare its aggregations.
#include <squall/concepts.hpp>

#include <cstddef>
#include <string_view>

struct my_compressor {
  static constexpr std::string_view name = "mine";
  std::size_t max_payload_bytes(squall::dtype, std::size_t count) const { return count; }
};
static_assert(squall::check_compressor<my_compressor>());
