// SPDX-License-Identifier: Apache-2.0
// The sparsifying compressors (compress/sparsify.hpp): encode/decode loops, and exact top-k
// selection beside std::nth_element on the same data and the same k, 16 Mi floats, one core.
//
// topk/<k>/<count>: topk_compressor{exact}.encode of the gradient, the whole encode (radix
// select and the ascending-index write of k pairs). nth_element/<k>/<count>: copies the
// gradient and runs std::nth_element with |a| > |b| on it (the copy is inside the timed loop,
// as nth_element permutes its input; topk does not need one). Both report bytes_per_second
// over the float input. first_non_finite/<count>: the search `options::check_finite` and the
// compressors' `check_finite` run on every input before anything moves (all finite: the whole
// input read).
#include <squall/compress/sparsify.hpp>

#include <algorithm>  // nth_element, copy
#include <cmath>      // fabs

#include "compress_common.hpp"

namespace squall::bench {
namespace {

void topk_loop(benchmark::State& state, std::size_t k) {
  const auto n = static_cast<std::size_t>(state.range(0));
  const topk_compressor c{.ratio = static_cast<double>(k) / static_cast<double>(n)};
  if (c.entries(n) != k) state.SkipWithError("ratio does not give k");
  encode_loop(state, c);
}

void nth_element_loop(benchmark::State& state, std::size_t k) {
  const auto n = static_cast<std::size_t>(state.range(0));
  const std::vector<float> in = gradient(n);
  std::vector<float> work(n);
  for (auto _ : state) {
    std::copy(in.begin(), in.end(), work.begin());
    std::nth_element(work.begin(), work.begin() + static_cast<std::ptrdiff_t>(k - 1), work.end(),
                     [](float a, float b) { return std::fabs(a) > std::fabs(b); });
    benchmark::DoNotOptimize(work.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * n * sizeof(float)));
}

void first_non_finite_loop(benchmark::State& state) {
  const auto n = static_cast<std::size_t>(state.range(0));
  const std::vector<float> in = gradient(n);
  for (auto _ : state) {
    benchmark::DoNotOptimize(first_non_finite(host_backend{}, host_view<const float>(in)));
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * n * sizeof(float)));
}

}  // namespace

void register_sparsify_benchmarks() {
  benchmark::RegisterBenchmark("first_non_finite", first_non_finite_loop)->Arg(compress_count);
  for (const std::size_t k : {std::size_t{167772}, std::size_t{16777}}) {
    benchmark::RegisterBenchmark(("topk/" + std::to_string(k)).c_str(),
                                 [k](benchmark::State& s) { topk_loop(s, k); })
        ->Arg(compress_count)
        ->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark(("nth_element/" + std::to_string(k)).c_str(),
                                 [k](benchmark::State& s) { nth_element_loop(s, k); })
        ->Arg(compress_count)
        ->Unit(benchmark::kMillisecond);
  }
  register_codec("topk_1pct", topk_compressor{.ratio = 0.01});
  register_codec("topk_sampled_1pct",
                 topk_compressor{.ratio = 0.01, .method = topk_method::sampled_threshold});
  register_codec("randomk_1pct", randomk_compressor{.ratio = 0.01});
  // gradient() is uniform on [-1, 1]: tau = 0.99 passes about 1% of it.
  register_codec("threshold", threshold_compressor{.tau = 0.99});
}

}  // namespace squall::bench
