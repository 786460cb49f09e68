// SPDX-License-Identifier: Apache-2.0
#pragma once
// What the compressor benchmarks share: the float input, encode and decode loops over one
// compressor, and their registration under the names scripts pair (encode/<name>/<count>,
// decode/<name>/<count>). bytes_per_second counts the float input's bytes (count x 4).

#include <squall/backend/host.hpp>
#include <squall/core/buffer.hpp>
#include <squall/core/types.hpp>

#include <benchmark/benchmark.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace squall::bench {

/// 16 Mi floats: the size.
inline constexpr std::int64_t compress_count = std::int64_t{1} << 24;

/// A gradient-like input: values in [-1, 1], no two neighbours equal, a deterministic pattern.
inline std::vector<float> gradient(std::size_t n) {
  std::vector<float> g(n);
  std::uint64_t x = 0x9e3779b97f4a7c15ull;
  for (std::size_t i = 0; i < n; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    g[i] = static_cast<float>(static_cast<double>(x >> 11) * 0x1.0p-52 - 1.0);
  }
  return g;
}

template <class C>
void encode_loop(benchmark::State& state, C c) {
  const auto n = static_cast<std::size_t>(state.range(0));
  const std::vector<float> in = gradient(n);
  std::vector<std::byte> payload(c.max_payload_bytes(dtype::float32, n));
  for (auto _ : state) {
    benchmark::DoNotOptimize(
        c.encode(host_backend{}, host_view<const float>(in), host_view<std::byte>(payload)));
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * n * sizeof(float)));
}

template <class C>
void decode_loop(benchmark::State& state, C c) {
  const auto n = static_cast<std::size_t>(state.range(0));
  const std::vector<float> in = gradient(n);
  std::vector<std::byte> payload(c.max_payload_bytes(dtype::float32, n));
  const std::size_t size =
      c.encode(host_backend{}, host_view<const float>(in), host_view<std::byte>(payload));
  std::vector<float> out(n);
  for (auto _ : state) {
    c.decode(host_backend{}, host_view<const std::byte>(payload.data(), size),
             host_view<float>(out));
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * n * sizeof(float)));
}

/// Registers encode/<label>/<count> and decode/<label>/<count> for compressor `c`.
template <class C>
void register_codec(const std::string& label, C c) {
  benchmark::RegisterBenchmark(("encode/" + label).c_str(), [c](benchmark::State& s) {
    encode_loop(s, c);
  })->Arg(compress_count);
  benchmark::RegisterBenchmark(("decode/" + label).c_str(), [c](benchmark::State& s) {
    decode_loop(s, c);
  })->Arg(compress_count);
}

// Each compressor family registers its benchmarks (bench/compress_*.cpp).
void register_quantize_benchmarks();
void register_sparsify_benchmarks();
void register_sketch_benchmarks();

}  // namespace squall::bench
