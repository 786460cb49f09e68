// SPDX-License-Identifier: Apache-2.0
// libFuzzer target: the decoders of compress/cast.hpp (cast_compressor<float16>,
// cast_compressor<bfloat16>), into float and double. Input layout: fuzz_common.hpp.
#include <squall/compress/cast.hpp>

#include "fuzz_common.hpp"

namespace {

struct cast_family {
  static constexpr std::size_t compressors = 2;
  template <class F>
  static void with(std::size_t index, std::uint8_t /*parameter*/, F&& f) {
    if (index == 0)
      f(squall::cast_compressor<squall::float16>{});
    else
      f(squall::cast_compressor<squall::bfloat16>{});
  }
};

}  // namespace

SQUALL_FUZZ_TARGET(cast_family)
