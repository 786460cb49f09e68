// SPDX-License-Identifier: Apache-2.0
// Host reduce kernels beside memcpy of the same bytes, in one run (Google Benchmark).
// bytes_per_second counts the bytes each loop moves: reduce_into reads dst and src and writes
// dst (3 x count x sizeof(T)); memcpy reads and writes (2 x bytes), so the two are comparable
// as memory traffic. Sizes are element counts.
// copy/apart:N: memcpy and kernels::copy_bytes of a page-aligned source to a destination N
// bytes into its page (16: a heap buffer filled from a window or registered segment), the
// case copy_bytes takes backwards; apart:0 is the plain case. Sizes there are bytes.
// cross_memory/apart:N: the same through the kernel (process_vm_readv of this process's own
// memory), plain and through detail::shm::cross_memory, which bounces the kernel's slow case
// (1-31 bytes apart) as shm_transport's cross-memory copies do.

#include <squall/detail/math.hpp>
#include <squall/kernels/host/reduce.hpp>
#include <squall/transport/detail/cross_memory.hpp>

#include <benchmark/benchmark.h>
#include <sys/uio.h>

#include <cstdint>
#include <cstring>
#include <span>
#include <unistd.h>
#include <vector>

#include "memcpy_baseline.hpp"

namespace {

constexpr std::int64_t min_count = 1 << 10;
constexpr std::int64_t max_count = 1 << 24;

void memcpy_baseline(benchmark::State& state) {
  const auto bytes = static_cast<std::size_t>(state.range(0)) * sizeof(float);
  squall::bench::copy_loop(state, bytes);
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * 2 * bytes));
}

template <class T, class Op>
void reduce_into(benchmark::State& state) {
  const auto count = static_cast<std::size_t>(state.range(0));
  std::vector<T> src(count, static_cast<T>(1));
  std::vector<T> dst(count, static_cast<T>(0));
  for (auto _ : state) {
    squall::kernels::reduce_into(squall::host_backend{}, Op{}, squall::host_view<T>(dst),
                                 squall::host_view<const T>(src));
    benchmark::DoNotOptimize(dst.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * 3 * count * sizeof(T)));
}

/// Four inputs folded into a fifth buffer: `kernels::reduce_many` (one pass) or `reduce` and
/// two `reduce_into` (three passes), as the one-shot allreduce of 4 ranks reduces its block.
/// bytes_per_second counts what the fold needs, 4 reads and a write (5 x count x sizeof(T)),
/// alike for both, so the two rates compare as times do.
template <class T, class Op, bool Fused>
void fold4(benchmark::State& state) {
  const auto count = static_cast<std::size_t>(state.range(0));
  std::vector<std::vector<T>> in(4, std::vector<T>(count, static_cast<T>(1)));
  std::vector<T> dst(count, static_cast<T>(0));
  const T* srcs[] = {in[0].data(), in[1].data(), in[2].data(), in[3].data()};
  const auto view = [count](const T* p) { return squall::host_view<const T>(p, count); };
  for (auto _ : state) {
    if constexpr (Fused) {
      squall::kernels::reduce_many(squall::host_backend{}, Op{}, squall::host_view<T>(dst),
                                   std::span<const T* const>(srcs));
    } else {
      squall::kernels::reduce(squall::host_backend{}, Op{}, squall::host_view<T>(dst),
                              view(srcs[0]), view(srcs[1]));
      for (int j = 2; j < 4; ++j) {
        squall::kernels::reduce_into(squall::host_backend{}, Op{}, squall::host_view<T>(dst),
                                     view(srcs[j]));
      }
    }
    benchmark::DoNotOptimize(dst.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * 5 * count * sizeof(T)));
}

/// A benchmark's source (page-aligned) and destination (`apart` bytes into its page), from
/// its arguments (bytes, apart).
struct apart_buffers {
  static constexpr std::size_t page = squall::kernels::aliased_copy::page;
  explicit apart_buffers(const benchmark::State& state)
      : bytes(static_cast<std::size_t>(state.range(0))),
        src_memory(bytes + page, std::byte{1}),
        dst_memory(bytes + 2 * page),
        src(aligned(src_memory.data())),
        dst(aligned(dst_memory.data()) + static_cast<std::size_t>(state.range(1))) {}
  static std::byte* aligned(std::byte* p) {
    const auto at = reinterpret_cast<std::uintptr_t>(p);
    return p + (squall::detail::align_up(at, page) - at);
  }
  std::size_t bytes;
  std::vector<std::byte> src_memory;
  std::vector<std::byte> dst_memory;
  std::byte* src;
  std::byte* dst;
};

/// `bytes` from a page-aligned source to a destination `apart` bytes into its page, by
/// memcpy or by `copy_bytes`.
template <bool Squall>
void copy_apart(benchmark::State& state) {
  apart_buffers b(state);
  for (auto _ : state) {
    if constexpr (Squall) {
      squall::kernels::copy_bytes(b.dst, b.src, b.bytes);
    } else {
      std::memcpy(b.dst, b.src, b.bytes);
    }
    benchmark::DoNotOptimize(b.dst);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * 2 * b.bytes));
}

/// `bytes` of this process read by the kernel from a page-aligned address to one `apart`
/// bytes into its page: one process_vm_readv, or `cross_memory::copy` (to the end).
template <bool Squall>
void cross_memory_apart(benchmark::State& state) {
  apart_buffers b(state);
  const std::size_t bytes = b.bytes;
  const auto src = reinterpret_cast<std::uint64_t>(b.src);
  std::byte* dst = b.dst;
  const pid_t self = getpid();
  squall::detail::shm::cross_memory cross;
  for (auto _ : state) {
    if constexpr (Squall) {
      for (std::size_t done = 0; done < bytes;) {
        const ssize_t got = cross.copy(self, dst + done, src + done, bytes - done, false);
        if (got <= 0) state.SkipWithError("process_vm_readv failed");
        if (got <= 0) break;
        done += static_cast<std::size_t>(got);
      }
    } else {
      iovec local{dst, bytes};
      iovec remote{reinterpret_cast<void*>(src), bytes};
      if (process_vm_readv(self, &local, 1, &remote, 1, 0) != static_cast<ssize_t>(bytes)) {
        state.SkipWithError("process_vm_readv failed");
      }
    }
    benchmark::DoNotOptimize(dst);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * 2 * bytes));
}

void cross_memory_sizes(benchmark::internal::Benchmark* b) {
  for (const std::int64_t apart : {0, 16, 64}) {
    for (std::int64_t bytes = 16 << 10; bytes <= (1 << 20); bytes *= 4) b->Args({bytes, apart});
  }
  b->ArgNames({"bytes", "apart"});
}

void copy_sizes(benchmark::internal::Benchmark* b) {
  for (const std::int64_t apart : {0, 16}) {
    for (std::int64_t bytes = 4 << 10; bytes <= (4 << 20); bytes *= 4) b->Args({bytes, apart});
  }
  b->ArgNames({"bytes", "apart"});
}

}  // namespace

BENCHMARK_TEMPLATE(copy_apart, false)->Name("copy/memcpy")->Apply(copy_sizes);
BENCHMARK_TEMPLATE(copy_apart, true)->Name("copy/copy_bytes")->Apply(copy_sizes);
BENCHMARK_TEMPLATE(cross_memory_apart, false)
    ->Name("cross_memory/process_vm_readv")
    ->Apply(cross_memory_sizes);
BENCHMARK_TEMPLATE(cross_memory_apart, true)
    ->Name("cross_memory/bounced")
    ->Apply(cross_memory_sizes);
BENCHMARK_TEMPLATE(fold4, float, squall::sum_op, false)
    ->Name("fold4/chain/float/sum")
    ->Arg(8 << 10)
    ->Arg(64 << 10)
    ->Arg(16 << 20);
BENCHMARK_TEMPLATE(fold4, float, squall::sum_op, true)
    ->Name("fold4/fused/float/sum")
    ->Arg(8 << 10)
    ->Arg(64 << 10)
    ->Arg(16 << 20);
BENCHMARK(memcpy_baseline)->Name("memcpy")->RangeMultiplier(16)->Range(min_count, max_count);
BENCHMARK_TEMPLATE(reduce_into, float, squall::sum_op)
    ->Name("reduce_into/float/sum")
    ->RangeMultiplier(16)
    ->Range(min_count, max_count);
BENCHMARK_TEMPLATE(reduce_into, float, squall::max_op)
    ->Name("reduce_into/float/max")
    ->RangeMultiplier(16)
    ->Range(min_count, max_count);
BENCHMARK_TEMPLATE(reduce_into, double, squall::sum_op)
    ->Name("reduce_into/double/sum")
    ->RangeMultiplier(16)
    ->Range(min_count, max_count);
BENCHMARK_TEMPLATE(reduce_into, std::int32_t, squall::sum_op)
    ->Name("reduce_into/int32/sum")
    ->RangeMultiplier(16)
    ->Range(min_count, max_count);
BENCHMARK_TEMPLATE(reduce_into, squall::float16, squall::sum_op)
    ->Name("reduce_into/float16/sum")
    ->RangeMultiplier(16)
    ->Range(min_count, max_count);
BENCHMARK_TEMPLATE(reduce_into, squall::bfloat16, squall::sum_op)
    ->Name("reduce_into/bfloat16/sum")
    ->RangeMultiplier(16)
    ->Range(min_count, max_count);

BENCHMARK_MAIN();
