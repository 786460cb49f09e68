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
/// How a compressed allreduce sums sparse payloads (topk, threshold).
enum class sparse_algorithm {
  /// Every rank gathers every rank's (index, value) list and sums them: O(k P) bytes per rank,
  /// the exact sum of the sparse vectors.
  allgather,
  /// gTop-k (Shi et al., "A Distributed Synchronous SGD Algorithm with Global Top-k
  /// Sparsification for Low Bandwidth Networks", ICDCS 2019, arXiv 1901.04359): pairwise
  /// merges up a tree keep the global k largest, then a broadcast of the k winners:
  /// O(k log P) bytes per rank.
  gtopk,
};

/// How a compressed allreduce sums requantized payloads (int8, qsgd, terngrad, sign).
enum class requantize_algorithm {
  /// per_hop on ring and tree topologies, gather on the others.
  automatic,
  /// Decode, add and re-encode at each hop of the ring or tree (as CGX does): the bytes of a
  /// dense ring or tree times the compression, an error that grows with the hops.
  per_hop,
  /// Gather every rank's payload, decode and sum them all: O(P) payloads per rank, one
  /// quantization per input.
  gather,
};

struct collective_tuning {
  std::size_t chunk_bytes = std::size_t{256} << 10;
  std::size_t pipeline_depth = 8;
  /// From this many bytes up, the one-shot allreduce on a `peer_memory_transport` reads the
  /// peers' inputs and writes the peers' outputs directly (no staging copy, one barrier, one
  /// address exchange); below, it stages through the windows (two barriers, lower latency).
  /// Measured with squall-bench --peer-memory on the 2-core machine, float sums, time in us,
  /// direct memory / windows: 2 ranks: 16 KiB 4.7 / 5.4, 64 KiB 7.6 / 14.2, 256 KiB 20.5 /
  /// 48.4; 4 ranks (oversubscribed): 16 KiB 27.1 / 11.7, 64 KiB 36.1 / 32.1, 256 KiB 73.7 /
  /// 105.4. 64 KiB is where neither rank count loses much.
  std::size_t peer_memory_bytes = std::size_t{64} << 10;
  /// The algorithm of a compressed allreduce of sparse payloads.
  squall::sparse_algorithm sparse = squall::sparse_algorithm::allgather;
  /// The algorithm of a compressed allreduce of requantized payloads.
  squall::requantize_algorithm requantize = squall::requantize_algorithm::automatic;
  friend constexpr bool operator==(const collective_tuning&, const collective_tuning&) = default;
};

}  // namespace squall
