// SPDX-License-Identifier: Apache-2.0
// The bucketed quantizers (compress/quantize.hpp), default buckets of 512.
#include <squall/compress/quantize.hpp>

#include "compress_common.hpp"

namespace squall::bench {

void register_quantize_benchmarks() {
  register_codec("int8", int8_compressor{});
  register_codec("sign", sign_compressor{});
  register_codec("sign_vote", sign_vote_compressor{});
  register_codec("terngrad", terngrad_compressor{});
  register_codec("qsgd4", qsgd_compressor<4>{});
  register_codec("qsgd127", qsgd_compressor<127>{});
}

}  // namespace squall::bench
