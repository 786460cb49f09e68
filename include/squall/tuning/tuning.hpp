// SPDX-License-Identifier: Apache-2.0
#pragma once
/// Tuning is data: structs passed to plans and, as template arguments, to kernels.

#include <squall/core/aggregation.hpp>

#include <cstddef>  // size_t
#include <vector>

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
  /// From this many bytes up, the one-shot allreduce on a `peer_memory_transport` reads the
  /// peers' inputs and writes the peers' outputs directly (no staging copy, one barrier, one
  /// address exchange); below, it stages through the windows (two barriers, lower latency).
  /// Measured with squall-bench --peer-memory on the 2-core machine, float sums, time in us,
  /// direct memory / windows: 2 ranks: 16 KiB 4.7 / 5.4, 64 KiB 7.6 / 14.2, 256 KiB 20.5 /
  /// 48.4; 4 ranks (oversubscribed): 16 KiB 27.1 / 11.7, 64 KiB 36.1 / 32.1, 256 KiB 73.7 /
  /// 105.4. 64 KiB is where neither rank count loses much.
  std::size_t peer_memory_bytes = std::size_t{64} << 10;
  /// A broadcast and a reduce-scatter, and an allreduce and an allgather of 3 ranks or more,
  /// copy through the windows (into the publishing rank's window, a barrier, out of it) above
  /// `peer_memory_bytes` too, up to this many bytes published per rank (the broadcast's data,
  /// the allgather's block, the reduce-scatter's and allreduce's whole input) where they fit
  /// half a window, unless the job has registered memory
  /// (`shm_transport::register_memory`: then `peer_memory_bytes` alone decides, and
  /// registered buffers keep their single plain copy). A cross-memory copy pins every page it
  /// touches (0.25-0.4 us per 4 KiB page on the 2-core machine; 10-17 GB/s of traffic at
  /// best), and an allgather's peer-memory path makes P - 1 of them per rank where the windows
  /// make one plain copy in and P - 1 out. Measured with squall-bench `--fresh` (inputs just
  /// written), 64 KiB-1 MiB (docs/performance.md): broadcast 2.3-2.4x faster at 2 ranks and
  /// 3.2-5.5x at 4 (oversubscribed), allgather 1.4-2.3x at 4; an allgather of 2 ranks was
  /// 0.64-0.99x, so it keeps the peer-memory path. At 128 KiB-1 MiB (medians of ten paired
  /// runs): reduce-scatter 1.36-1.90x faster at 2 ranks and 1.26-2.00x at 4; allreduce
  /// 1.22-1.52x at 3 and 1.10-1.59x at 4, but 0.87-0.99x at 2 (it keeps the peer-memory
  /// path). 0: never. An allreduce has a bound of its own, below.
  std::size_t window_copy_bytes = std::size_t{2} << 20;
  /// The same bound for the allreduce of 3 ranks or more (its whole input published per
  /// rank); `as_window_copy`: `window_copy_bytes`. Which path is faster is the machine's: the
  /// AMD VM measured the windows 1.10-1.59x faster at 128 KiB-1 MiB with 4 ranks, an Intel
  /// VM the peers' memory 1.3-1.6x faster from 256 KiB (docs/performance.md), so
  /// `communicator::calibrate_windows` measures both on the ranks at hand and sets this.
  /// 0: never.
  std::size_t allreduce_window_copy_bytes = as_window_copy;
  static constexpr std::size_t as_window_copy = ~std::size_t{0};
  /// An allreduce of two ranks whose input is at most this many bytes (and that fits half a
  /// window, below `peer_memory_bytes`) runs in one barrier: both ranks publish their inputs
  /// and each reduces the whole result out of both windows (`allreduce_windows_whole`; a + b
  /// is b + a, so the same bits as the slices), instead of reducing its half and copying the
  /// other's back after a second barrier. Measured with squall-bench `--whole-reduce` on the
  /// 2-core Intel VM, three runs, us: 16 KiB 5.2 / 5.5 / 4.8 before, 4.4 / 5.1 / 4.7 after,
  /// 32 KiB 9.1 / 9.8 / 8.5 against 7.7 / 8.5 / 8.0; at 3 and 4 ranks, where every rank
  /// would read P inputs instead of one slice of each, it was as fast or slower. 0: never.
  std::size_t whole_reduce_bytes = std::size_t{64} << 10;
  /// From this many bytes of output a peer-memory collective writes its outputs (its own, and
  /// the peers' where it reaches them through registered memory) with non-temporal stores:
  /// each reduced piece is made in a cache-sized scratch and streamed out, so no output line
  /// is read before it is written and the outputs do not evict the inputs (issue 22). About
  /// the last-level cache (32 MiB on the 2-core machine); 0: never.
  std::size_t non_temporal_bytes = std::size_t{32} << 20;
  /// How a compressed allreduce sums payloads: `automatic` runs the compressor's first
  /// allowed aggregation (its `aggregations`) that the topology can run: linear for cast,
  /// randomk and count_sketch, low_rank for PowerSGD, per_hop for int8, qsgd, terngrad and sign
  /// where the topology's schedule allows it (else gather), gather for topk, threshold and
  /// sign_vote. Naming one the compressor does not allow, or per_hop where the schedule does
  /// not allow it, throws `invalid_argument` at the call.
  squall::aggregation aggregation = squall::aggregation::automatic;
  /// How many chunks a compressed allreduce on the linear or gather aggregation cuts a tensor
  /// into on the host backend, so that a second thread encodes chunk c + 1 and decodes chunk
  /// c - 1 while the calling thread moves chunk c (algorithm/compressed/overlap.hpp). 1: no
  /// overlap. 0 (automatic): one chunk per 4 MiB of the tensor, at most 8, for a compressor
  /// whose chunks encode as the whole tensor does (cast, threshold, the quantizers with a
  /// bucket), none for the others. 2 to 32: that many, also where a chunk means something
  /// else (top-k then keeps the k x n_c / n largest of each chunk); more throws
  /// `invalid_argument` at the call. Every rank must ask for the same (a mismatch check
  /// compares the chunks). The other aggregations (per_hop, gtopk, low_rank), the compressed
  /// allgather and other backends do not overlap.
  std::size_t overlap_chunks = 0;
  /// A staged allreduce (a backend whose memory the transport cannot carry: CUDA buffers over
  /// shm or MPI) of more than this many bytes runs in pieces of this size where the backend can
  /// wait for part of its work (CUDA: events): every piece's copy to host memory is enqueued
  /// at once, and piece k is allreduced as soon as its copy is done, while the later pieces
  /// are still being copied and piece k - 1 is copied back. Each piece is its own allreduce,
  /// so a float sum's order of additions follows the pieces. 0: one piece. Every rank must
  /// give the same (as with every setting here).
  std::size_t staging_chunk_bytes = std::size_t{4} << 20;
  friend constexpr bool operator==(const collective_tuning&, const collective_tuning&) = default;
};

/// What `calibrate_windows` measured and chose: per size (bytes of a rank's input), the
/// slowest rank's best time of an allreduce through the windows and through the peers'
/// memory, and the bound it set (`collective_tuning::allreduce_window_copy_bytes`).
struct window_calibration {
  std::vector<std::size_t> sizes;
  std::vector<double> windows_seconds;
  std::vector<double> peers_seconds;
  std::size_t bound = 0;
  double seconds = 0;     ///< what the calibration took on this rank
  bool measured = false;  ///< false: no choice here (see `communicator::calibrate_windows`)
};

}  // namespace squall
