// SPDX-License-Identifier: Apache-2.0
// The bucketed quantizers (compress/quantize.hpp), default buckets of 512 (TernGrad and QSGD
// also with least-squares scales), the 8-bit floats,
// and homomorphic quantization (compress/homomorphic.hpp: its encode is one rank's, the
// local range and the codes, each rotating the input).
#include <squall/compress/homomorphic.hpp>
#include <squall/compress/quantize.hpp>

#include "compress_common.hpp"

namespace squall::bench {

void register_quantize_benchmarks() {
  register_codec("int8", int8_compressor{});
  register_codec("sign", sign_compressor{});
  register_codec("sign_vote", sign_vote_compressor{});
  register_codec("terngrad", terngrad_compressor{});
  register_codec("qsgd4", qsgd_compressor<4>{});
  register_codec("terngrad_fit", terngrad_compressor{.fit_scale = true});
  register_codec("qsgd4_fit", qsgd_compressor<4>{.fit_scale = true});
  register_codec("qsgd127", qsgd_compressor<127>{});
  register_codec("fp8_e4m3", fp8_compressor{});
  register_codec("fp8_e5m2", fp8_compressor{.format = fp8_format::e5m2});
  register_codec("fp8_e4m3_sr", fp8_compressor{.stochastic = true});
  register_codec("hq4", homomorphic_compressor{});
  register_codec("hq8", homomorphic_compressor{.bits = 8});
  register_codec("hq4_unrotated", homomorphic_compressor{.rotate = false});
}

}  // namespace squall::bench
