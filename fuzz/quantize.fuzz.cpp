// SPDX-License-Identifier: Apache-2.0
// libFuzzer target: the decoders of compress/quantize.hpp (int8, int4, sign, sign_vote,
// terngrad, qsgd with 1, 4 and 127 levels: code widths 2, 4 and 8; fp8 E4M3 and E5M2), of
// homomorphic quantization (compress/homomorphic.hpp) and of the chains of compress/chain.hpp
// (topk>int4, randomk>topk>int4), into float and double. The parameter byte sets the
// quantizers' bucket (mutate mode) to (parameter % 128) x 8 elements (0: one bucket) and their
// seed, and its bit 7 least-squares scales for the integer levels (int8, terngrad, qsgd);
// decode reads the bucket from the payload. hq: bits 2 + parameter % 7, rotated for an
// even parameter; chains: ratios from the parameter. Layout: fuzz_common.hpp.
#include <squall/compress/chain.hpp>
#include <squall/compress/homomorphic.hpp>
#include <squall/compress/quantize.hpp>

#include "fuzz_common.hpp"

namespace {

struct quantize_family {
  static constexpr std::size_t compressors = 13;
  template <class C>
  static C configured(std::uint8_t parameter) {
    C c;
    c.bucket = static_cast<std::uint64_t>(parameter % 128) * 8;
    c.seed = parameter;
    return c;
  }
  /// The integer-level quantizers also with least-squares scales (`fit_scale`): bit 7.
  template <class C>
  static C fitted(std::uint8_t parameter) {
    C c = configured<C>(parameter);
    c.fit_scale = (parameter & 0x80) != 0;
    return c;
  }
  template <class F>
  static void with(std::size_t index, std::uint8_t parameter, F&& f) {
    switch (index) {
      case 0:
        f(fitted<squall::int8_compressor>(parameter));
        break;
      case 1:
        f(configured<squall::sign_compressor>(parameter));
        break;
      case 2:
        f(configured<squall::sign_vote_compressor>(parameter));
        break;
      case 3:
        f(fitted<squall::terngrad_compressor>(parameter));
        break;
      case 4:
        f(fitted<squall::qsgd_compressor<4>>(parameter));
        break;
      case 5:
        f(fitted<squall::qsgd_compressor<1>>(parameter));
        break;
      case 6: {
        auto c = configured<squall::fp8_compressor>(parameter);
        c.stochastic = (parameter & 1) != 0;
        f(c);
        break;
      }
      case 7: {
        auto c = configured<squall::fp8_compressor>(parameter);
        c.format = squall::fp8_format::e5m2;
        c.stochastic = (parameter & 1) != 0;
        f(c);
        break;
      }
      case 8:
        f(configured<squall::int4_compressor>(parameter));
        break;
      case 9:
        f(squall::homomorphic_compressor{
            .bits = 2u + parameter % 7u, .rotate = parameter % 2 == 0, .seed = parameter});
        break;
      case 10:
        f(squall::chain<squall::topk_compressor, squall::int4_compressor>{
            {.ratio = (parameter % 64 + 1) / 64.0},
            configured<squall::int4_compressor>(parameter)});
        break;
      case 11:
        f(squall::chain<squall::randomk_compressor,
                        squall::chain<squall::topk_compressor, squall::int4_compressor>>{
            {.ratio = (parameter % 16 + 1) / 16.0, .seed = parameter},
            {{.ratio = (parameter / 16 % 16 + 1) / 16.0}, {}}});
        break;
      default:
        f(fitted<squall::qsgd_compressor<127>>(parameter));
        break;
    }
  }
};

}  // namespace

SQUALL_FUZZ_TARGET(quantize_family)
