// SPDX-License-Identifier: Apache-2.0
// libFuzzer target: the decoders of compress/sparsify.hpp (topk, randomk, threshold), into
// float and double. The parameter byte sets the ratio (topk, randomk: parameter / 200, so
// values above 1 occur), topk's method (bit 0) and threshold's tau (2^-(parameter % 24)).
// randomk's decode depends on its ratio; the others read everything from the payload.
// Layout: fuzz_common.hpp.
#include <squall/compress/sparsify.hpp>

#include <cmath>

#include "fuzz_common.hpp"

namespace {

struct sparsify_family {
  static constexpr std::size_t compressors = 3;
  template <class F>
  static void with(std::size_t index, std::uint8_t parameter, F&& f) {
    const double ratio = parameter / 200.0;
    if (index == 0) {
      squall::topk_compressor c;
      c.ratio = ratio;
      c.method =
          parameter & 1 ? squall::topk_method::sampled_threshold : squall::topk_method::exact;
      c.sample_ratio = 0.05;
      c.seed = parameter;
      f(c);
    } else if (index == 1) {
      squall::randomk_compressor c;
      c.ratio = ratio;
      c.seed = parameter;
      f(c);
    } else {
      squall::threshold_compressor c;
      c.tau = std::ldexp(1.0, -(parameter % 24));
      f(c);
    }
  }
};

}  // namespace

SQUALL_FUZZ_TARGET(sparsify_family)
