// SPDX-License-Identifier: Apache-2.0
#pragma once
/// Tuning is data: structs passed to plans and, as template arguments, to kernels.

#include <cstddef>  // size_t

namespace squall {

/// Launch shape of a CUDA kernel; a class-type template argument, so each shape is its own
/// instantiation and the compiler unrolls `items_per_thread`.
struct kernel_tuning {
  int threads_per_block = 256;
  int items_per_thread = 4;
  friend constexpr bool operator==(const kernel_tuning&, const kernel_tuning&) = default;
};

/// The elementwise kernels' default: 256 threads x 4 items keeps a memory-bound loop at full
/// bandwidth on sm_80/sm_90 with enough blocks in flight. Compiled, not yet measured on a GPU
/// (no device was lent to the session that chose it); docs/performance.md tracks this.
inline constexpr kernel_tuning elementwise_tuning{.threads_per_block = 256, .items_per_thread = 4};

/// How the executor cuts a collective: each block of a schedule moves in pieces of at most
/// `chunk_bytes`, and at most `pipeline_depth` sends stay in flight before the oldest is
/// waited for. `max_chunk_bytes`-style small values force many pieces in tests.
struct collective_tuning {
  std::size_t chunk_bytes = std::size_t{256} << 10;
  std::size_t pipeline_depth = 8;
  /// From this many bytes up, the one-shot allreduce on a `peer_readable_transport` reads the
  /// peers' own buffers (no staging copy, one more barrier); below, it stages through the
  /// windows (two barriers, lower latency). Measured with squall-bench --read-peers on the
  /// 2-core machine, float sums: at 256 KiB reading took 35 us against 46 us staged (2 ranks)
  /// and 110 against 128 us (4 ranks); at 64 KiB staging won, 13 against 15 us (2 ranks).
  std::size_t read_peers_bytes = std::size_t{256} << 10;
  friend constexpr bool operator==(const collective_tuning&, const collective_tuning&) = default;
};

}  // namespace squall
