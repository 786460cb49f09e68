// SPDX-License-Identifier: Apache-2.0
// The sketching compressors beside memcpy (bench/kernels_compress.cpp registers memcpy):
// count_sketch is the configuration measured against issue 5's 25%-of-memcpy encode target
// (3 rows of 65536 counters: 768 KiB of float counters, which stay in L2); count_sketch_r5
// is the 5-row sketch of the same width, count_sketch_r1 the single row (the scatter of one
// read-modify-write per row and element bounds encode, so rows cost about linearly);
// count_sketch_c4096 is 3 rows of 4096 (48 KiB: the counters stay in L1, the regime where a
// random read-modify-write costs least);
// powersgd_r4 is one rank-4 power iteration on the 4096 x 4096 view of 16 Mi floats.
#include <squall/compress/sketch.hpp>

#include "compress_common.hpp"

namespace squall::bench {
void register_sketch_benchmarks() {
  register_codec("count_sketch", count_sketch_compressor<3, 65536>{});
  register_codec("count_sketch_r5", count_sketch_compressor<5, 65536>{});
  register_codec("count_sketch_r1", count_sketch_compressor<1, 65536>{});
  register_codec("count_sketch_c4096", count_sketch_compressor<3, 4096>{});
  register_codec("powersgd_r4", powersgd_compressor{.rank = 4});
}
}  // namespace squall::bench
