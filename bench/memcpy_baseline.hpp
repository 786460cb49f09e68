// SPDX-License-Identifier: Apache-2.0
#pragma once
// The memcpy every kernel benchmark is measured beside: `bytes` copied per iteration.

#include <benchmark/benchmark.h>

#include <cstddef>
#include <cstring>
#include <vector>

namespace squall::bench {

inline void copy_loop(benchmark::State& state, std::size_t bytes) {
  std::vector<char> src(bytes, 1);
  std::vector<char> dst(bytes, 0);
  for (auto _ : state) {
    std::memcpy(dst.data(), src.data(), bytes);
    benchmark::DoNotOptimize(dst.data());
    benchmark::ClobberMemory();
  }
}

}  // namespace squall::bench
