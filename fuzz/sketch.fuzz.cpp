// SPDX-License-Identifier: Apache-2.0
// libFuzzer target: the decoders of compress/sketch.hpp and fetchsgd.hpp:
// count_sketch_compressor<1, 1>, <3, 64> and <5, 1024>, fetchsgd_compressor<3, 64> (its
// stateless decode and a step on a fresh state), and powersgd_compressor, into float and
// double. The parameter byte
// sets the count sketch's heavy_hitters (parameter % 64; 0: Cols / 4) and PowerSGD's rank
// (1 + parameter % 8) and columns (0, the default square view, when bit 7 is clear; else
// parameter % 16 + 1). Decode depends on those; the rest comes from the payload.
// Layout: fuzz_common.hpp.
#include <squall/compress/fetchsgd.hpp>
#include <squall/compress/sketch.hpp>

#include "fuzz_common.hpp"

namespace {

struct sketch_family {
  static constexpr std::size_t compressors = 5;
  template <std::size_t Rows, std::size_t Cols>
  static squall::count_sketch_compressor<Rows, Cols> sketch(std::uint8_t parameter) {
    squall::count_sketch_compressor<Rows, Cols> c;
    c.heavy_hitters = parameter % 64;
    c.seed = parameter;
    return c;
  }
  template <class F>
  static void with(std::size_t index, std::uint8_t parameter, F&& f) {
    switch (index) {
      case 0:
        f(sketch<1, 1>(parameter));
        break;
      case 1:
        f(sketch<3, 64>(parameter));
        break;
      case 2:
        f(sketch<5, 1024>(parameter));
        break;
      case 3: {
        squall::fetchsgd_compressor<3, 64> c;
        c.heavy_hitters = parameter % 64;
        c.seed = parameter;
        f(c);
        break;
      }
      default: {
        squall::powersgd_compressor c;
        c.rank = 1 + parameter % 8;
        c.columns = parameter & 0x80 ? parameter % 16 + 1 : 0;
        c.seed = parameter;
        f(c);
      }
    }
  }
};

}  // namespace

SQUALL_FUZZ_TARGET(sketch_family)
