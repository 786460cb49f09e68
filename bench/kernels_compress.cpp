// SPDX-License-Identifier: Apache-2.0
// Host compressor kernels beside memcpy of the same float input, in one run (Google
// Benchmark). Names pair for scripts: memcpy/<count>, encode/<compressor>/<count>,
// decode/<compressor>/<count>; bytes_per_second counts the float input's bytes (count x 4)
// for every one of them, so encode / memcpy is the fraction of copy bandwidth reached.

#include <squall/backend/host.hpp>
#include <squall/compress/cast.hpp>

#include <benchmark/benchmark.h>

#include "memcpy_baseline.hpp"

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace {

constexpr std::int64_t count = std::int64_t{1} << 24;

void memcpy_baseline(benchmark::State& state) {
  const auto bytes = static_cast<std::size_t>(state.range(0)) * sizeof(float);
  squall::bench::copy_loop(state, bytes);
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * bytes));
}

std::vector<float> gradient(std::size_t n) {
  std::vector<float> g(n);
  for (std::size_t i = 0; i < n; ++i) g[i] = static_cast<float>(static_cast<int>(i % 2001) - 1000) * 1e-3f;
  return g;
}

template <class C>
void encode(benchmark::State& state) {
  const auto n = static_cast<std::size_t>(state.range(0));
  const C c{};
  const std::vector<float> in = gradient(n);
  std::vector<std::byte> payload(c.max_payload_bytes(squall::dtype::float32, n));
  for (auto _ : state) {
    benchmark::DoNotOptimize(c.encode(squall::host_backend{}, squall::host_view<const float>(in),
                                      squall::host_view<std::byte>(payload)));
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * n * sizeof(float)));
}

template <class C>
void decode(benchmark::State& state) {
  const auto n = static_cast<std::size_t>(state.range(0));
  const C c{};
  const std::vector<float> in = gradient(n);
  std::vector<std::byte> payload(c.max_payload_bytes(squall::dtype::float32, n));
  c.encode(squall::host_backend{}, squall::host_view<const float>(in), squall::host_view<std::byte>(payload));
  std::vector<float> out(n);
  for (auto _ : state) {
    c.decode(squall::host_backend{}, squall::host_view<const std::byte>(payload), squall::host_view<float>(out));
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * n * sizeof(float)));
}

template <class C>
void register_codec() {
  const std::string name(C::name);
  benchmark::RegisterBenchmark(("encode/" + name).c_str(), encode<C>)->Arg(count);
  benchmark::RegisterBenchmark(("decode/" + name).c_str(), decode<C>)->Arg(count);
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::RegisterBenchmark("memcpy", memcpy_baseline)->Arg(count);
  register_codec<squall::cast_compressor<squall::float16>>();
  register_codec<squall::cast_compressor<squall::bfloat16>>();
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
