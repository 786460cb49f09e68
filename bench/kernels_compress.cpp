// SPDX-License-Identifier: Apache-2.0
// Host compressor kernels beside memcpy of the same float input, in one run (Google
// Benchmark). Names pair for scripts: memcpy/<count>, encode/<compressor>/<count>,
// decode/<compressor>/<count>, topk/<k>/<count> beside nth_element/<k>/<count>;
// bytes_per_second counts the float input's bytes (count x 4) for every one of them, so
// encode / memcpy is the fraction of copy bandwidth reached.

#include <squall/compress/cast.hpp>

#include "compress_common.hpp"
#include "memcpy_baseline.hpp"

namespace {

void memcpy_baseline(benchmark::State& state) {
  const auto bytes = static_cast<std::size_t>(state.range(0)) * sizeof(float);
  squall::bench::copy_loop(state, bytes);
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * bytes));
}

}  // namespace

int main(int argc, char** argv) {
  using namespace squall::bench;
  benchmark::RegisterBenchmark("memcpy", memcpy_baseline)->Arg(compress_count);
  register_codec("cast_float16", squall::cast_compressor<squall::float16>{});
  register_codec("cast_bfloat16", squall::cast_compressor<squall::bfloat16>{});
  register_quantize_benchmarks();
  register_sparsify_benchmarks();
  register_sketch_benchmarks();
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
