// SPDX-License-Identifier: Apache-2.0
// libsquall_mpi.so: squall's collectives under an unmodified MPI program, through MPI's
// profiling interface. Preload it (LD_PRELOAD, `mpiexec -x LD_PRELOAD=...` with Open MPI,
// `-genv LD_PRELOAD ...` with MPICH) or link it before the MPI library.
//
// It defines MPI_Allreduce, MPI_Allgather, MPI_Reduce_scatter_block, MPI_Bcast, MPI_Barrier,
// MPI_Allgatherv and MPI_Reduce_scatter (taken where every block is alike), the non-blocking
// forms MPI_Iallreduce, MPI_Iallgather, MPI_Ireduce_scatter_block, MPI_Ibcast and
// MPI_Ireduce_scatter (alike blocks) (and MPI_Init, MPI_Init_thread, MPI_Finalize to set up and
// tear down; the completion calls MPI_Wait, MPI_Test, their -all, -any and -some forms,
// MPI_Request_get_status, MPI_Request_free and MPI_Cancel, which pass everything but squall's
// requests to MPI). A call it can prove it handles identically on every rank runs squall's
// communicator on a private duplicate of the caller's communicator: shared memory when every rank
// of the communicator is on this host; across hosts, in tiers (shared memory inside each host,
// mpi_transport between hosts): the allreduce and the broadcast always, reduce_scatter_block and
// allgather where the hosts hold alike many ranks (else those two on mpi_transport). Everything
// else goes to PMPI_* unchanged.
//
// The same route on every rank. Whether a call is handled depends only on what MPI requires
// every rank to pass alike: the type signature (not the datatype handle: ranks may describe
// the same signature with different handles and layouts; a non-contiguous layout is packed),
// the count, the op, the root, MPI_IN_PLACE (allgather) and the configuration, which every
// rank hashes at MPI_Init and compares in one small PMPI_Allreduce (ranks that disagree turn
// squall off for the whole job and say so). Handled, among the collectives
// SQUALL_MPI_COLLECTIVES names:
// - allreduce and reduce_scatter_block: every element of the signature one of float, double,
//   int32 or int64 (MPI_INT, MPI_INT32_T, MPI_LONG, ... by size; Fortran's MPI_REAL,
//   MPI_DOUBLE_PRECISION, MPI_INTEGER and their sized forms too), op MPI_SUM, MPI_MIN or
//   MPI_MAX, at least SQUALL_MPI_MIN_BYTES bytes in all;
// - allgather and bcast: any signature whose bytes per rank are a multiple of 4, at least
//   SQUALL_MPI_MIN_BYTES bytes in all (the data moves as 32-bit words, no arithmetic); by
//   default bcast only up to 1 MiB and on communicators within one host (shared memory),
//   where squall's broadcast copies through its windows;
// - allgatherv and reduce_scatter: blocks alike as allgather and reduce_scatter_block (the
//   counts are the same on every rank, as MPI requires); of different sizes as the -v forms'
//   section below says (an allgatherv's of whole words through communicator::allgatherv on one
//   host, a reduce-scatter's in squall's own split where they lie); an allgatherv's
//   displacements are each rank's own;
// - barrier: once squall holds state for the communicator (a handled call made it);
// - iallreduce, iallgather, ireduce_scatter_block, ibcast, ireduce_scatter, iallgatherv and
//   ibarrier: as their blocking forms, from SQUALL_MPI_IALLREDUCE_MIN_BYTES, once squall holds
//   the communicator (as barrier; MPI_COMM_WORLD from MPI_Init), on communicators within one
//   host (shared memory) and, where every rank's MPI gives MPI_THREAD_MULTIPLE, across hosts
//   (in tiers as above);
// - never: intercommunicators, user-defined ops, MPI_PROD and the logical, bitwise and
//   MAXLOC/MINLOC ops, mixed-type signatures, the other non-blocking forms (MPI_Ireduce and
//   friends), the other collectives, MPI_Init not called through this library (then it stays
//   off), MPICH's `use mpi_f08` callers and the non-blocking calls of Open MPI's (mpif.h,
//   `use mpi` and the blocking calls of `use mpi_f08` under Open MPI, mpif.h and `use mpi`
//   under MPICH are taken: the Fortran section at the end).
//
// Environment (read at MPI_Init; every rank must agree):
//   SQUALL_MPI_ENABLE     1 (default) or 0: everything falls through.
//   SQUALL_MPI_MIN_BYTES  smallest call handled, in bytes (default 8192, where squall-mpi-bench
//                         found squall ahead at P = 2; suffix K, M, G).
//   SQUALL_MPI_IALLREDUCE_MIN_BYTES  smallest MPI_Iallreduce, MPI_Iallgather,
//                         MPI_Ireduce_scatter_block and MPI_Ibcast handled (default 256K: below
//                         it the progress thread's hand-off made MPI_Iallreduce slower than
//                         Open MPI's).
//   SQUALL_MPI_WINDOW_COPY_BYTES  auto (default): collective_tuning::window_copy_bytes stays
//                         squall's 2M, and the allreduce's own bound is measured on the first
//                         shared-memory communicator of each size (3 ranks or more) at its
//                         first call (communicator::calibrate_windows; about 0.1 s), later
//                         ones of that size reusing it where every rank holds it; or a byte
//                         count: window_copy_bytes for every collective, nothing measured (0:
//                         cross-memory reads from 64 KiB; which path copies faster is the
//                         machine's: docs/performance.md).
//   SQUALL_MPI_TOPOLOGY   automatic (default), ring, tree, direct or halving_doubling.
//   SQUALL_MPI_TRANSPORT  auto (default: shared memory on one host; across hosts in tiers, as
//                         above), shm or mpi (mpi_transport alone, even on one host).
//   SQUALL_RANKS_PER_NODE k: nodes of k consecutive ranks of each communicator instead of the
//                         hosts (to run the tiers on one host).
//   SQUALL_MPI_COLLECTIVES  which ones squall may take: a comma list of allreduce, allgather,
//                         reduce_scatter_block, bcast, barrier, iallreduce, iallgather,
//                         ireduce_scatter_block, ibcast, allgatherv, reduce_scatter,
//                         ireduce_scatter, iallgatherv, ibarrier, or all
//                         (default: all but ibcast, barrier and ibarrier, no faster than Open
//                         MPI's at P = 2, and iallgather and iallgatherv, slower at P = 4; bcast
//                         within one host up to 1 MiB).
//                         Naming bcast takes every MPI_Bcast from SQUALL_MPI_MIN_BYTES, on any
//                         communicator.
//   SQUALL_MPI_COMPRESSOR cast[:fp16|bf16|e4m3|e5m2|e4m3_sr|e5m2_sr], int8 or hq[:BITS]: lossy
//                         compression of float32 MPI_SUM allreduces (off by default).
//   SQUALL_MPI_COMPRESSOR_COMMS  compress only on communicators of these names (comma list).
//   SQUALL_MPI_VERBOSE    1: rank 0 of each communicator says once what squall handles on it.
//   SQUALL_MPI_STATS      1: at MPI_Finalize rank 0 prints the job's counts and bytes per call.
//   SQUALL_MPI_SHARED_HEAP  off (default), or a byte count: allocations of at least that many
//                         bytes come from squall's shared heap, which the peers map
//                         (interpose/shared_heap.cpp, the library's malloc).
// A malformed value is named on stderr and turns squall off (never a guess).
//
// Errors: a squall error (a dead peer, a deadline) is printed with squall's message and
// handed to the communicator's MPI error handler as MPI_ERR_OTHER, as MPI's own failure would
// be; with MPI_ERRORS_RETURN the call returns MPI_ERR_OTHER.

#include <squall/algorithm/communicator.hpp>
#include <squall/compress/by_name.hpp>
#include <squall/detail/math.hpp>  // fnv1a64
#include <squall/kernels/host/copy.hpp>
#include <squall/topology/automatic.hpp>
#include <squall/transport/mpi.hpp>
#include <squall/transport/shm.hpp>

#include <mpi.h>

#include <algorithm>  // find, min
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>  // lround
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <dlfcn.h>  // dlsym: the MPI's own Fortran bindings
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <thread>       // this_thread
#include <type_traits>  // is_same_v
#include <unistd.h>     // getpid
#include <utility>      // exchange
#include <variant>
#include <vector>

namespace {

using squall::host_view;

// ---- configuration ------------------------------------------------------------------------

enum call_kind : int {
  allreduce,
  allgather,
  reduce_scatter_block,
  bcast,
  barrier,
  iallreduce,
  iallgather,
  ireduce_scatter_block,
  ibcast,
  allgatherv,
  reduce_scatter,
  ireduce_scatter,
  iallgatherv,
  ibarrier,
  kinds
};
constexpr std::array<const char*, kinds> call_names = {
    "MPI_Allreduce",   "MPI_Allgather",  "MPI_Reduce_scatter_block", "MPI_Bcast",
    "MPI_Barrier",     "MPI_Iallreduce", "MPI_Iallgather",           "MPI_Ireduce_scatter_block",
    "MPI_Ibcast",      "MPI_Allgatherv", "MPI_Reduce_scatter",       "MPI_Ireduce_scatter",
    "MPI_Iallgatherv", "MPI_Ibarrier"};

/// The collectives' names in SQUALL_MPI_COLLECTIVES.
constexpr std::array<std::string_view, kinds> collective_names = {
    "allreduce",      "allgather",       "reduce_scatter_block",  "bcast",   "barrier",
    "iallreduce",     "iallgather",      "ireduce_scatter_block", "ibcast",  "allgatherv",
    "reduce_scatter", "ireduce_scatter", "iallgatherv",           "ibarrier"};

/// The non-empty items of a comma-separated list ("a,,b" -> a, b).
std::vector<std::string_view> comma_list(std::string_view text) {
  std::vector<std::string_view> items;
  while (!text.empty()) {
    const std::size_t comma = std::min(text.find(','), text.size());
    if (comma > 0) items.push_back(text.substr(0, comma));
    text.remove_prefix(std::min(comma + 1, text.size()));
  }
  return items;
}

/// The largest MPI_Bcast squall takes by default (`config::bcast_by_default`): a power of two
/// whose broadcast fits half of a default window (collective_tuning::window_copy_bytes, the
/// window's signature area aside), so it copies through the windows.
constexpr std::uint64_t default_bcast_bytes = std::uint64_t{1} << 20;

struct config {
  bool enable = true;
  std::uint64_t min_bytes = 8192;
  /// SQUALL_MPI_IALLREDUCE_MIN_BYTES: the smallest MPI_Iallreduce squall takes (and at least
  /// `min_bytes`), and the smallest of the other non-blocking collectives: below 256 KiB the
  /// hand-off to squall's progress thread and the polling wait cost more than squall saves
  /// (squall-mpi-bench --op iallreduce: 0.45-0.86x of Open MPI's time at 16-64 KiB, P = 2).
  std::uint64_t iallreduce_min_bytes = std::uint64_t{256} << 10;
  /// SQUALL_MPI_WINDOW_COPY_BYTES: `collective_tuning::window_copy_bytes` of squall's
  /// shared-memory communicators (which copy cheaper, the windows or cross-memory reads, is
  /// the machine's: docs/performance.md).
  static constexpr std::uint64_t default_window_copy_bytes =
      squall::collective_tuning{}.window_copy_bytes;
  std::uint64_t window_copy_bytes = default_window_copy_bytes;
  /// SQUALL_MPI_WINDOW_COPY_BYTES=auto (the default): `communicator::calibrate_windows` on the
  /// first shared-memory communicator of each size when it is made (`window_bounds`).
  bool calibrate_windows = true;
  std::string topology = "automatic";
  std::string transport = "auto";
  /// SQUALL_RANKS_PER_NODE: that many consecutive ranks of a communicator form one node (to
  /// run the hierarchical path on one host); 0: the ranks that share memory.
  int ranks_per_node = 0;
  bool verbose = false;
  bool stats = false;
  /// SQUALL_MPI_COLLECTIVES: which collectives squall may take. MPI_Ibcast, the barrier and
  /// MPI_Ibarrier are off by default: squall-mpi-bench found them at parity or behind Open
  /// MPI's at P = 2 (docs/performance.md), and the library must not make a program slower; so
  /// are MPI_Iallgather and MPI_Iallgatherv (ahead at P = 2 up to 4 MiB, but 0.78-1.02x of
  /// Open MPI's time at P = 4).
  /// MPI_Bcast is on by default within the bounds of `bcast_by_default`.
  std::array<bool, kinds> takes = {true, true,  true, true, false, true,  false,
                                   true, false, true, true, true,  false, false};
  /// SQUALL_MPI_COLLECTIVES unset: squall takes an MPI_Bcast only up to `default_bcast_bytes`
  /// and on communicators within one host, where its broadcast copies through the
  /// shared-memory windows (1.5-4.2x faster than Open MPI's at 16 KiB-1 MiB, P = 2 and 4);
  /// from 2 MiB it reads the root's memory with cross-memory copies, 0.83-0.98x of Open MPI's
  /// speed at 2-8 MiB, and across hosts it would run on MPI point to point. Naming bcast lifts
  /// both bounds.
  bool bcast_by_default = true;
  /// SQUALL_MPI_SHARED_HEAP: allocations of at least this many bytes come from the shared
  /// heap (interpose/shared_heap.cpp reads it, before any constructor; here it is checked and
  /// reported). 0: none. Not in `hash`: it changes no route, only whether a peer's buffer is
  /// reached through a mapping or by cross-memory copy, which give the same bits.
  std::uint64_t shared_heap_bytes = 0;
  std::string compressor;                  ///< SQUALL_MPI_COMPRESSOR; empty: none
  std::vector<std::string> compress_only;  ///< SQUALL_MPI_COMPRESSOR_COMMS; empty: every one
  std::string problem;  ///< the first malformed variable, named; squall is then off

  static config from_environment() {
    config c;
    const auto flag = [&c](const char* name, bool& value) {
      const char* text = std::getenv(name);
      if (text == nullptr) return;
      if (std::string_view(text) == "1") {
        value = true;
      } else if (std::string_view(text) == "0") {
        value = false;
      } else if (c.problem.empty()) {
        c.problem = std::string(name) + "='" + text + "' is not 0 or 1";
      }
    };
    flag("SQUALL_MPI_ENABLE", c.enable);
    flag("SQUALL_MPI_VERBOSE", c.verbose);
    flag("SQUALL_MPI_STATS", c.stats);
    const auto bytes = [&](const char* name, std::uint64_t& value) {
      const char* text = std::getenv(name);
      if (text == nullptr) return;
      char* end = nullptr;
      const unsigned long long digits = std::strtoull(text, &end, 10);
      const std::string_view suffix = end;
      const int shift = suffix.empty()  ? 0
                        : suffix == "K" ? 10
                        : suffix == "M" ? 20
                        : suffix == "G" ? 30
                                        : -1;
      if (end == text || *text == '-' || shift < 0) {
        if (c.problem.empty()) {
          c.problem = std::string(name) + "='" + text +
                      "' is not a byte count (digits, optionally K, M or G)";
        }
      } else {
        value = static_cast<std::uint64_t>(digits) << shift;
      }
    };
    bytes("SQUALL_MPI_MIN_BYTES", c.min_bytes);
    bytes("SQUALL_MPI_IALLREDUCE_MIN_BYTES", c.iallreduce_min_bytes);
    bytes("SQUALL_MPI_SHARED_HEAP", c.shared_heap_bytes);
    if (const char* text = std::getenv("SQUALL_MPI_WINDOW_COPY_BYTES");
        text != nullptr && std::string_view(text) != "auto") {
      c.calibrate_windows = false;
      bytes("SQUALL_MPI_WINDOW_COPY_BYTES", c.window_copy_bytes);
    }
    if (const char* text = std::getenv("SQUALL_MPI_TOPOLOGY")) {
      c.topology = text;
      try {
        (void)squall::cost_model::of_name(c.topology);
      } catch (const squall::error& e) {
        if (c.problem.empty()) c.problem = "SQUALL_MPI_TOPOLOGY: " + e.detail();
      }
    }
    if (const char* text = std::getenv("SQUALL_MPI_TRANSPORT")) {
      c.transport = text;
      if (c.transport != "auto" && c.transport != "shm" && c.transport != "mpi" &&
          c.problem.empty()) {
        c.problem = std::string("SQUALL_MPI_TRANSPORT='") + text + "' is not auto, shm or mpi";
      }
    }
    if (const char* text = std::getenv(squall::ranks_per_node_env_var); text != nullptr && *text) {
      char* end = nullptr;
      const long value = std::strtol(text, &end, 10);
      if (*end != '\0' || value <= 0 || value > INT32_MAX) {
        if (c.problem.empty()) {
          c.problem = std::string(squall::ranks_per_node_env_var) + "='" + text +
                      "' is not a positive whole number";
        }
      } else {
        c.ranks_per_node = static_cast<int>(value);
      }
    }
    if (const char* text = std::getenv("SQUALL_MPI_COLLECTIVES")) {
      c.takes = {};
      c.bcast_by_default = false;
      for (const std::string_view name : comma_list(text)) {
        if (name == "all") {
          c.takes.fill(true);
          continue;
        }
        const auto* which = std::find(collective_names.begin(), collective_names.end(), name);
        if (which != collective_names.end()) {
          c.takes[static_cast<std::size_t>(which - collective_names.begin())] = true;
        } else if (c.problem.empty()) {
          c.problem = "SQUALL_MPI_COLLECTIVES: '" + std::string(name) +
                      "' is not all, allreduce, allgather, reduce_scatter_block, bcast, barrier, "
                      "iallreduce, iallgather, ireduce_scatter_block, ibcast, allgatherv, "
                      "reduce_scatter, ireduce_scatter, iallgatherv or ibarrier";
        }
      }
    }
    if (const char* text = std::getenv("SQUALL_MPI_COMPRESSOR"); text != nullptr && *text) {
      c.compressor = text;
      try {
        const squall::compressor_choice choice = squall::parse_compressor(c.compressor);
        if (choice.error_feedback || choice.aggregation || choice.chunks) {
          throw squall::invalid_argument({.operation = "compressor"},
                                         "'" + c.compressor + "': no +ef, @ or / here");
        }
        squall::visit_elementwise_compressor(choice, [](auto) {});
      } catch (const squall::error& e) {
        if (c.problem.empty()) {
          c.problem = "SQUALL_MPI_COMPRESSOR: " + e.detail() + " (cast[:fp16|bf16|e4m3|e5m2|" +
                      "e4m3_sr|e5m2_sr], int8 or hq[:BITS])";
        }
      }
    }
    if (const char* text = std::getenv("SQUALL_MPI_COMPRESSOR_COMMS")) {
      for (const std::string_view name : comma_list(text)) c.compress_only.emplace_back(name);
    }
    if (!c.problem.empty()) c.enable = false;
    return c;
  }

  /// What every rank must hold alike: every setting, since each changes a route or, with
  /// `stats`, a collective at MPI_Finalize.
  std::uint64_t hash() const {
    std::string text = std::to_string(enable) + "/" + std::to_string(min_bytes) + "/" +
                       std::to_string(iallreduce_min_bytes) + "/" +
                       std::to_string(window_copy_bytes) + (calibrate_windows ? "auto/" : "/") +
                       topology + "/" + transport + "/" + std::to_string(ranks_per_node) + "/" +
                       compressor + "/" + std::to_string(verbose) + std::to_string(stats) +
                       std::to_string(bcast_by_default) + "/";
    for (const bool take : takes) text += take ? '1' : '0';
    for (const std::string& name : compress_only) text += "/" + name;
    return squall::detail::fnv1a64(text.data(), text.size());
  }
};

// ---- per-call counters (SQUALL_MPI_STATS) ---------------------------------------------------

/// [kind][0: handled, 1: passed to MPI] calls or bytes.
template <class N>
using per_call = std::array<std::array<N, 2>, kinds>;

struct counters {
  per_call<std::atomic<unsigned long long>> calls{};
  per_call<std::atomic<unsigned long long>> bytes{};
};

/// `counts` as plain numbers.
per_call<unsigned long long> snapshot(const per_call<std::atomic<unsigned long long>>& counts) {
  per_call<unsigned long long> plain{};
  for (int k = 0; k < kinds; ++k) {
    for (int h = 0; h < 2; ++h) plain[k][h] = counts[k][h].load(std::memory_order_relaxed);
  }
  return plain;
}

// ---- element types of a signature --------------------------------------------------------------

enum class base { none, f32, f64, i32, i64 };

base named_base(MPI_Datatype type) {
  if (type == MPI_FLOAT) return base::f32;
  if (type == MPI_DOUBLE) return base::f64;
  // Fortran's (the handles a Fortran caller's types convert to), by their size
  const bool is_real =
      type == MPI_REAL || type == MPI_DOUBLE_PRECISION || type == MPI_REAL4 || type == MPI_REAL8;
  const bool is_int = type == MPI_INT || type == MPI_INT32_T || type == MPI_INT64_T ||
                      type == MPI_LONG || type == MPI_LONG_LONG || type == MPI_LONG_LONG_INT ||
                      type == MPI_INTEGER || type == MPI_INTEGER4 || type == MPI_INTEGER8;
  if (!is_int && !is_real) return base::none;
  int size = 0;
  PMPI_Type_size(type, &size);
  if (is_real) return size == 4 ? base::f32 : size == 8 ? base::f64 : base::none;
  return size == 4 ? base::i32 : size == 8 ? base::i64 : base::none;
}

/// The one element type every element of `type`'s signature has, or none (mixed, or one squall
/// does not reduce). Walks derived types through their envelopes.
base signature_base(MPI_Datatype type) {
  int ints = 0, addresses = 0, types = 0, combiner = 0;
  if (PMPI_Type_get_envelope(type, &ints, &addresses, &types, &combiner) != MPI_SUCCESS) {
    return base::none;
  }
  if (combiner == MPI_COMBINER_NAMED) return named_base(type);
  if (types == 0) return base::none;
  std::vector<int> int_args(static_cast<std::size_t>(ints));
  std::vector<MPI_Aint> address_args(static_cast<std::size_t>(addresses));
  std::vector<MPI_Datatype> parts(static_cast<std::size_t>(types));
  if (PMPI_Type_get_contents(type, ints, addresses, types, int_args.data(), address_args.data(),
                             parts.data()) != MPI_SUCCESS) {
    return base::none;
  }
  std::optional<base> common;
  for (MPI_Datatype part : parts) {
    const base b = signature_base(part);
    common = (!common || *common == b) ? b : base::none;
    int part_ints = 0, part_addresses = 0, part_types = 0, part_combiner = 0;
    PMPI_Type_get_envelope(part, &part_ints, &part_addresses, &part_types, &part_combiner);
    if (part_combiner != MPI_COMBINER_NAMED) PMPI_Type_free(&part);
  }
  return common.value_or(base::none);
}

/// A count as the large-count (`_c`) forms of MPI 4 pass it; the int forms widen to it.
using count_type = std::int64_t;

/// `count` items of `type`: their bytes, and whether they lie in memory as those bytes (else
/// they are packed and unpacked around squall's call).
struct layout {
  std::uint64_t bytes = 0;
  bool contiguous = false;
  MPI_Count item_bytes = 0;
  MPI_Count extent = 0;
};

layout layout_of(count_type count, MPI_Datatype type) {
  MPI_Count size = 0, lb = 0, extent = 0, true_lb = 0, true_extent = 0;
  PMPI_Type_size_x(type, &size);
  PMPI_Type_get_extent_x(type, &lb, &extent);
  PMPI_Type_get_true_extent_x(type, &true_lb, &true_extent);
  const bool contiguous = true_lb == 0 && true_extent == size && extent == size && lb == 0;
  return {.bytes = static_cast<std::uint64_t>(count) * static_cast<std::uint64_t>(size),
          .contiguous = contiguous || count == 0,
          .item_bytes = size,
          .extent = extent};
}

/// `count` items of `type` at `data` as plain bytes: the buffer itself when contiguous, else a
/// packed copy (`pack` fills it, `unpack` writes it back), packed in pieces of at most 2^31 - 1
/// bytes so that MPI's int sizes never overflow.
class staged {
 public:
  staged(void* data, count_type count, MPI_Datatype type, MPI_Comm comm)
      : data_(static_cast<std::byte*>(data)),
        count_(count),
        type_(type),
        comm_(comm),
        layout_(layout_of(count, type)) {
    if (!layout_.contiguous) copy_.resize(layout_.bytes);
  }
  std::byte* bytes() { return layout_.contiguous ? data_ : copy_.data(); }
  std::uint64_t size() const { return layout_.bytes; }
  void pack() { pieces(true); }
  void unpack() { pieces(false); }

 private:
  void pieces(bool packing) {
    if (layout_.contiguous) return;
    const count_type per_piece =
        std::max<count_type>(1, INT32_MAX / std::max<MPI_Count>(layout_.item_bytes, 1));
    for (count_type first = 0; first < count_; first += per_piece) {
      const int items = static_cast<int>(std::min(per_piece, count_ - first));
      const std::uint64_t piece_bytes =
          static_cast<std::uint64_t>(items) * static_cast<std::uint64_t>(layout_.item_bytes);
      if (piece_bytes > INT32_MAX) {
        throw squall::invalid_argument({.operation = "squall_mpi"},
                                       "a datatype of more than 2^31 bytes cannot be packed");
      }
      std::byte* items_at = data_ + first * layout_.extent;
      std::byte* packed_at = copy_.data() + static_cast<std::uint64_t>(first) *
                                                static_cast<std::uint64_t>(layout_.item_bytes);
      int position = 0;
      const int code = packing ? PMPI_Pack(items_at, items, type_, packed_at,
                                           static_cast<int>(piece_bytes), &position, comm_)
                               : PMPI_Unpack(packed_at, static_cast<int>(piece_bytes), &position,
                                             items_at, items, type_, comm_);
      const char* what = packing ? "MPI_Pack" : "MPI_Unpack";
      squall::detail::mpi_check(code, {.operation = "squall_mpi"}, what);
      if (static_cast<std::uint64_t>(position) != piece_bytes) {
        throw squall::invalid_argument(
            {.operation = "squall_mpi"},
            std::string(what) + " did not give the datatype's bytes as they lie in memory (" +
                std::to_string(position) + " of " + std::to_string(piece_bytes) + ")");
      }
    }
  }
  std::byte* data_;
  count_type count_;
  MPI_Datatype type_;
  MPI_Comm comm_;
  layout layout_;
  std::vector<std::byte> copy_;
};

/// An allgather's packed result `out` with this rank's `block` bytes in place, as 32-bit words:
/// packed from the receive buffer (MPI_IN_PLACE) or the send buffer's packed bytes copied in.
/// Returns where that block starts.
std::int32_t* own_block(staged& out, const void* sendbuf, count_type sendcount,
                        MPI_Datatype sendtype, std::uint64_t block, int rank, MPI_Comm comm) {
  std::int32_t* mine = reinterpret_cast<std::int32_t*>(out.bytes()) +
                       static_cast<std::size_t>(rank) * static_cast<std::size_t>(block / 4);
  if (sendbuf == MPI_IN_PLACE) {
    out.pack();  // this rank's block is its input
    return mine;
  }
  staged in(const_cast<void*>(sendbuf), sendcount, sendtype, comm);
  if (in.size() != block) {
    throw squall::mismatch_error({.operation = "squall_mpi allgather"},
                                 "the send and receive signatures differ in size");
  }
  in.pack();
  squall::kernels::copy_bytes(mine, in.bytes(), block);
  return mine;
}

/// An allreduce's buffers as squall sees them, packed: `out` (the input too, in place:
/// MPI_IN_PLACE) and `in` (otherwise).
struct allreduce_buffers {
  staged out;
  std::optional<staged> in;
  allreduce_buffers(const void* sendbuf, void* recvbuf, count_type count, MPI_Datatype type,
                    MPI_Comm comm)
      : out(recvbuf, count, type, comm) {
    if (sendbuf == MPI_IN_PLACE) {
      out.pack();
    } else {
      in.emplace(const_cast<void*>(sendbuf), count, type, comm);
      in->pack();
    }
  }
  bool in_place() const { return !in; }
  /// The input copied into `out`, for the paths that reduce in place.
  void input_to_output() {
    if (in) squall::kernels::copy_bytes(out.bytes(), in->bytes(), out.size());
  }
};

// ---- per-communicator state ---------------------------------------------------------------

/// squall's communicator for one MPI communicator, with compressor `C` for float sums
/// (`identity_compressor`: none), and the compression state of each count it has reduced.
/// Keyed by count, which every rank passes alike (an MPI call names no tensor, and there is no
/// error feedback whose residual would need one).
template <class Transport, class C>
struct squall_communicator {
  using transport_type = Transport;
  using type = squall::communicator<Transport, squall::automatic_topology, C>;
  static constexpr bool compresses = !std::is_same_v<C, squall::identity_compressor>;
  std::unique_ptr<type> comm;
  std::map<std::size_t, typename type::template state_type<float>> states;
};

/// squall's communicators over `Transport`: with no compressor or one of those
/// SQUALL_MPI_COMPRESSOR may name (`visit_elementwise_compressor`).
template <class Transport>
using communicators_over =
    std::variant<squall_communicator<Transport, squall::identity_compressor>,
                 squall_communicator<Transport, squall::cast_compressor<squall::bfloat16>>,
                 squall_communicator<Transport, squall::cast_compressor<squall::float16>>,
                 squall_communicator<Transport, squall::fp8_compressor>,
                 squall_communicator<Transport, squall::int8_compressor>,
                 squall_communicator<Transport, squall::homomorphic_compressor>>;

template <class A, class B>
struct joined;
template <class... A, class... B>
struct joined<std::variant<A...>, std::variant<B...>> {
  using type = std::variant<A..., B...>;
};
/// Any of them, over shared memory or MPI.
using any_communicator = joined<communicators_over<squall::shm_transport>,
                                communicators_over<squall::mpi_transport>>::type;

/// The allreduce of a communicator that spans nodes: shared memory inside each node, MPI
/// between them. With nodes of one size every rank crosses with its share (reduce-scatter in
/// the node, allreduce of the share among the ranks of the same place in every node, allgather
/// in the node); otherwise only each node's first rank crosses (allreduce in the node,
/// allreduce among those ranks, broadcast in the node).
struct tiers {
  /// Where a rank of the communicator sits: the rank of its node's first rank, its rank in
  /// the node and in its communicator across nodes (-1: it has none).
  struct place {
    int leader = 0;
    int local = 0;
    int cross = -1;
  };
  static_assert(sizeof(place) == 3 * sizeof(int));  // gathered as 3 MPI_INTs
  MPI_Comm node_comm = MPI_COMM_NULL;               ///< the ranks of this node
  MPI_Comm cross_comm = MPI_COMM_NULL;  ///< the ranks this one reduces with across nodes, or null
  bool shares = false;                  ///< every rank crosses with its share (nodes of one size)
  bool compressing = false;             ///< float sums are compressed across nodes
  squall_communicator<squall::shm_transport, squall::identity_compressor> node;
  communicators_over<squall::mpi_transport> cross;
  std::vector<place> places;    ///< by rank of the communicator
  int rank = 0;                 ///< this rank's, in the communicator
  std::vector<std::byte> work;  ///< the blocks in tier order (reduce_scatter_block, allgather)
  /// The order of the calls in tiers: the non-blocking ones on a thread of their own (squall's
  /// progress engine; where the program's MPI gives MPI_THREAD_MULTIPLE), the blocking ones
  /// inline or behind those (`call_order::ordered`).
  squall::detail::call_order calls{squall::options{}.resolved_deadline()};

  /// Where rank `r`'s block lies among the blocks in tier order (nodes of one size): those
  /// of the ranks of each place in the node, in turn, each in the order of its ranks across.
  std::size_t tier_index(int r) const {
    const place& p = places[static_cast<std::size_t>(r)];
    const std::size_t across = places.size() / static_cast<std::size_t>(node.comm->size());
    return static_cast<std::size_t>(p.local) * across + static_cast<std::size_t>(p.cross);
  }
  /// `bytes` of scratch, kept for the next call.
  std::byte* scratch(std::size_t bytes) {
    if (work.size() < bytes) work.resize(bytes);
    return work.data();
  }

  ~tiers() {
    calls.finish();  // runs what is queued, then stops its thread, before the tiers go
    node = {};
    cross = {};
    if (cross_comm != MPI_COMM_NULL) PMPI_Comm_free(&cross_comm);
    if (node_comm != MPI_COMM_NULL) PMPI_Comm_free(&node_comm);
  }
};

struct comm_state {
  MPI_Comm user = MPI_COMM_NULL;  ///< the caller's communicator (the attribute's owner)
  MPI_Comm own = MPI_COMM_NULL;   ///< squall's private duplicate
  any_communicator impl;
  std::unique_ptr<tiers> hierarchy;  ///< the allreduce across nodes, where the ranks span nodes
  std::string transport;             ///< how squall moves the bytes, for the verbose line
  bool one_host = false;             ///< on shared memory (`transport`), not MPI

  ~comm_state() {
    hierarchy.reset();
    impl = any_communicator{};
    if (own != MPI_COMM_NULL) PMPI_Comm_free(&own);
  }
};

/// A non-blocking collective squall runs: its request on the progress thread of the
/// communicator's squall communicator, what ends it on the program's thread once done (`finish`:
/// a non-contiguous layout's packed copy unpacked; it holds the buffers as squall sees them) and
/// where a failure is reported.
struct pending_call {
  call_kind kind = iallreduce;
  squall::request work;
  std::function<void()> finish;
  const comm_state* state = nullptr;  ///< whose communicator runs it
  MPI_Comm user = MPI_COMM_NULL;      ///< the caller's communicator (its error handler)
  int* code = nullptr;                ///< the generalized request's outcome (`grequest_query`)
};

struct library {
  std::mutex lock;          ///< guards `states` and the counters (MPI_THREAD_MULTIPLE)
  std::mutex pending_lock;  ///< guards `pending`
  /// The non-blocking calls squall runs, by the generalized request the program holds.
  std::map<MPI_Request, std::unique_ptr<pending_call>> pending;
  std::atomic<std::size_t> in_flight{0};  ///< `pending`'s size, read without the lock
  bool agreed = false;                    ///< every rank holds the same settings (MPI_Init said)
  bool thread_multiple = false;           ///< every rank's MPI gives MPI_THREAD_MULTIPLE
  bool on = false;                        ///< agreed and enabled
  config settings;
  int keyval = MPI_KEYVAL_INVALID;
  std::map<comm_state*, std::unique_ptr<comm_state>> states;
  counters count;
  unsigned long long compressed = 0;  ///< allreduce calls squall compressed
  unsigned long long tiered = 0;      ///< calls squall ran in tiers (across nodes)
  unsigned long long jobs = 0;        ///< shared-memory jobs this process started (their names)
  /// The allreduce's window bound `calibrate_windows` chose on this process's first
  /// shared-memory communicator of each size (by size), for the later ones of that size.
  std::map<int, std::size_t> window_bounds;
};

library& lib() {
  static library* instance = new library;  // never destroyed: MPI may call back at exit
  return *instance;
}

// initial-exec: a flag in the static TLS block, read without a __tls_get_addr call (the
// library is loaded at start, by LD_PRELOAD or as a dependency). Set while squall runs a call,
// so that its own MPI calls are never intercepted.
__attribute__((tls_model("initial-exec"))) thread_local bool inside = false;

/// Whether this call is squall's own: made while squall runs a call on this thread (`inside`)
/// or on one of squall's progress threads (its MPI transport's barriers across hosts call
/// MPI_Ibarrier there).
bool own_call() { return inside || squall::detail::on_progress_thread; }

void note(call_kind kind, bool handled, std::uint64_t bytes) {
  if (own_call()) return;  // squall's own calls are not the program's
  // A relaxed load and store, not a locked add: the fall-through path stays a few ns; threads
  // calling at once (MPI_THREAD_MULTIPLE) may lose a count, never corrupt one.
  const auto add = [](std::atomic<unsigned long long>& n, std::uint64_t v) {
    n.store(n.load(std::memory_order_relaxed) + v, std::memory_order_relaxed);
  };
  counters& c = lib().count;
  add(c.calls[kind][handled ? 0 : 1], 1);
  add(c.bytes[kind][handled ? 0 : 1], bytes);
}

/// `count` items of `type` in bytes (one cheap MPI query: what every call asks first, so that
/// a call too small for squall reaches MPI at once).
std::uint64_t bytes_of(count_type count, MPI_Datatype type) {
  MPI_Count size = 0;
  if (type == MPI_FLOAT) {  // the common ones without a call (it costs the small calls 5%)
    size = sizeof(float);
  } else if (type == MPI_DOUBLE) {
    size = sizeof(double);
  } else if (type == MPI_INT) {
    size = sizeof(int);
  } else {
    PMPI_Type_size_x(type, &size);
  }
  return static_cast<std::uint64_t>(count) * static_cast<std::uint64_t>(size);
}

/// Whether `comm` is an intracommunicator (not null): the -v forms read their count arrays,
/// whose length is the size of a group, only then.
bool intracommunicator(MPI_Comm comm) {
  int inter = 0;
  return comm != MPI_COMM_NULL && PMPI_Comm_test_inter(comm, &inter) == MPI_SUCCESS && inter == 0;
}

/// Whether a call `kind` of `bytes` on `comm` may go to squall at all: squall is on and takes
/// `kind`, the call is not squall's own, it is big enough and `comm` is an intracommunicator.
bool usable(call_kind kind, MPI_Comm comm, std::uint64_t bytes) {
  const library& l = lib();
  return l.on && !own_call() && l.settings.takes[kind] && bytes >= l.settings.min_bytes &&
         intracommunicator(comm);
}

void finish_pending_of(const comm_state* state);

int delete_state(MPI_Comm, int, void* value, void*) {
  library& l = lib();
  finish_pending_of(static_cast<const comm_state*>(value));  // its requests end first
  std::unique_ptr<comm_state> state;
  {
    const std::lock_guard guard(l.lock);
    const auto it = l.states.find(static_cast<comm_state*>(value));
    if (it == l.states.end()) return MPI_SUCCESS;
    state = std::move(it->second);
    l.states.erase(it);
  }
  const bool was_inside = std::exchange(inside, true);
  state.reset();
  inside = was_inside;
  return MPI_SUCCESS;
}

std::string name_of(MPI_Comm comm) {
  std::array<char, MPI_MAX_OBJECT_NAME> text{};
  int length = 0;
  PMPI_Comm_get_name(comm, text.data(), &length);
  return length > 0 ? std::string(text.data(), static_cast<std::size_t>(length)) : "unnamed";
}

/// A shared-memory job of `comm`'s ranks: rank 0 names it (its pid and a counter: unique on
/// the host) and draws its key.
squall::shm_transport shm_over(MPI_Comm comm) {
  int size = 0, rank = 0;
  PMPI_Comm_size(comm, &size);
  PMPI_Comm_rank(comm, &rank);
  std::array<std::uint64_t, 3> job{};
  if (rank == 0) {
    job = {static_cast<std::uint64_t>(getpid()), ++lib().jobs,
           std::random_device{}() * 0x100000001ull};
  }
  PMPI_Bcast(job.data(), 3, MPI_UINT64_T, 0, comm);
  return squall::shm_transport(
      squall::shm_job{.name = "mpi-" + std::to_string(job[0]) + "-" + std::to_string(job[1]),
                      .rank = rank,
                      .size = size,
                      .key = job[2] | 1});
}

/// The largest and the smallest of every rank's `value` on `comm` (one MAX-allreduce of the
/// value and its negation): the ranks agree where the two are equal.
struct extremes {
  std::int64_t largest;
  std::int64_t smallest;
};
extremes extremes_of(std::int64_t value, MPI_Comm comm) {
  std::array<std::int64_t, 2> both = {value, -value};
  PMPI_Allreduce(MPI_IN_PLACE, both.data(), 2, MPI_INT64_T, MPI_MAX, comm);
  return {both[0], -both[1]};
}

/// Builds squall's communicator for `comm`: a collective call on every rank of it, made at
/// the first call on `comm` that squall handles (the same call on every rank).
comm_state& make_state(MPI_Comm comm) {
  library& l = lib();
  auto state = std::make_unique<comm_state>();
  state->user = comm;
  squall::detail::mpi_check(PMPI_Comm_dup(comm, &state->own), {.operation = "squall_mpi"},
                            "MPI_Comm_dup");
  int size = 0, rank = 0;
  PMPI_Comm_size(state->own, &size);
  PMPI_Comm_rank(state->own, &rank);
  // The nodes: SQUALL_RANKS_PER_NODE consecutive ranks, else the ranks that share memory.
  MPI_Comm node = MPI_COMM_NULL;
  if (l.settings.ranks_per_node > 0) {
    PMPI_Comm_split(state->own, rank / l.settings.ranks_per_node, rank, &node);
  } else {
    PMPI_Comm_split_type(state->own, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node);
  }
  int local_rank = 0, local_size = 0;
  PMPI_Comm_rank(node, &local_rank);
  PMPI_Comm_size(node, &local_size);
  const extremes widths = extremes_of(local_size, state->own);  // the nodes' rank counts
  const bool one_node = widths.smallest == size;
  const bool use_shm =
      l.settings.transport == "shm" || (l.settings.transport == "auto" && one_node);
  if (use_shm && !one_node) {
    PMPI_Comm_free(&node);
    throw squall::invalid_argument(
        {.operation = "squall_mpi"},
        "SQUALL_MPI_TRANSPORT=shm but the communicator '" + name_of(comm) + "' spans nodes");
  }
  const bool hierarchical = l.settings.transport == "auto" && !one_node && widths.largest > 1;
  const squall::automatic_topology topology{.model =
                                                squall::cost_model::of_name(l.settings.topology)};
  squall::collective_tuning tuning;
  tuning.window_copy_bytes = static_cast<std::size_t>(l.settings.window_copy_bytes);
  // Compress here only if every rank's name of the communicator is on the list (names are
  // set per rank, so they are agreed).
  const std::vector<std::string>& only = l.settings.compress_only;
  int compress =
      !l.settings.compressor.empty() &&
              (only.empty() || std::find(only.begin(), only.end(), name_of(comm)) != only.end())
          ? 1
          : 0;
  PMPI_Allreduce(MPI_IN_PLACE, &compress, 1, MPI_INT, MPI_MIN, state->own);
  // squall's communicator over `transport` into `target`, with the compressor where float
  // sums are compressed (`compressing`), else none.
  const auto install = [&](auto& target, auto transport, bool compressing) {
    using transport_type = decltype(transport);
    const auto with = [&]<class C>(C compressor) {
      using holder = squall_communicator<transport_type, C>;
      target = holder{
          std::make_unique<typename holder::type>(std::move(transport), topology,
                                                  std::move(compressor), squall::options{}, tuning),
          {}};
    };
    if (compressing) {
      squall::visit_elementwise_compressor(squall::parse_compressor(l.settings.compressor), with);
    } else {
      with(squall::identity_compressor{});
    }
  };
  // SQUALL_MPI_WINDOW_COPY_BYTES=auto: where the allreduce of a shared-memory communicator
  // over `over` (`ranks` ranks) copies through the windows. `remembered` sets in `with`,
  // before the communicator is made, the bound an earlier communicator of as many ranks
  // measured in this process, where every rank of `over` holds the same one, and returns
  // true; else `measure(holder)` measures it once the communicator is made (nothing where
  // there is no choice) and remembers it. What was chosen goes into the verbose line.
  std::string calibrated;
  const auto chose = [&](std::size_t bound, const std::string& how) {
    calibrated = ", the allreduce through the windows up to " + std::to_string(bound) + " bytes (" +
                 how + ")";
  };
  const auto remembered = [&](MPI_Comm over, int ranks, squall::collective_tuning& with) {
    std::int64_t mine = -1;  // none
    {
      const std::lock_guard guard(l.lock);
      if (const auto it = l.window_bounds.find(ranks); it != l.window_bounds.end()) {
        mine = static_cast<std::int64_t>(it->second);
      }
    }
    const extremes held = extremes_of(mine, over);
    if (held.smallest < 0 || held.largest != held.smallest) return false;
    with.allreduce_window_copy_bytes = static_cast<std::size_t>(held.largest);
    chose(with.allreduce_window_copy_bytes,
          "measured earlier on " + std::to_string(ranks) + " ranks");
    return true;
  };
  const auto measure = [&](auto& holder, int ranks) {
    const squall::window_calibration m = holder.comm->calibrate_windows();
    if (!m.measured) return;
    {
      const std::lock_guard guard(l.lock);
      l.window_bounds.insert_or_assign(ranks, m.bound);
    }
    chose(m.bound, "measured in " + std::to_string(std::lround(m.seconds * 1e3)) + " ms");
  };
  // a fixed bound (SQUALL_MPI_WINDOW_COPY_BYTES a byte count): nothing to remember or measure
  const bool fixed = !l.settings.calibrate_windows;
  if (use_shm) {
    PMPI_Comm_free(&node);
    const bool known = fixed || remembered(state->own, size, tuning);
    install(state->impl, shm_over(state->own), compress == 1);
    if (!known) std::visit([&](auto& holder) { measure(holder, size); }, state->impl);
    state->transport = "shared memory";
    state->one_host = true;
  } else if (!hierarchical) {
    PMPI_Comm_free(&node);
    install(state->impl, squall::mpi_transport(state->own), compress == 1);
    state->transport = "MPI";
  } else {
    // The other collectives run over MPI on the whole communicator; the allreduce in tiers.
    install(state->impl, squall::mpi_transport(state->own), false);
    auto t = std::make_unique<tiers>();
    t->node_comm = node;
    t->shares = widths.largest == widths.smallest;
    t->compressing = compress == 1;
    const int color = t->shares || local_rank == 0 ? local_rank : MPI_UNDEFINED;
    PMPI_Comm_split(state->own, color, rank, &t->cross_comm);
    squall::collective_tuning node_tuning = tuning;
    const bool known = fixed || remembered(node, local_size, node_tuning);
    t->node = {std::make_unique<
                   squall_communicator<squall::shm_transport, squall::identity_compressor>::type>(
                   shm_over(node), topology, squall::options{}, node_tuning),
               {}};
    if (!known) measure(t->node, local_size);
    if (t->cross_comm != MPI_COMM_NULL) {
      install(t->cross, squall::mpi_transport(t->cross_comm), compress == 1);
    }
    tiers::place mine{.leader = rank, .local = local_rank, .cross = -1};
    PMPI_Bcast(&mine.leader, 1, MPI_INT, 0, node);
    if (t->cross_comm != MPI_COMM_NULL) PMPI_Comm_rank(t->cross_comm, &mine.cross);
    t->rank = rank;
    t->places.resize(static_cast<std::size_t>(size));
    PMPI_Allgather(&mine, 3, MPI_INT, t->places.data(), 3, MPI_INT, state->own);
    state->transport =
        std::string(t->shares ? "MPI; allreduce, reduce_scatter_block, allgather and bcast"
                              : "MPI; allreduce and bcast") +
        " in tiers: shared memory inside nodes of " + std::to_string(widths.smallest) + "-" +
        std::to_string(widths.largest) + " ranks, MPI across them from " +
        (t->shares ? "every rank (its share)"
                   : "each node's first rank; reduce_scatter_block and allgather on MPI");
    state->hierarchy = std::move(t);
  }
  if (l.settings.verbose && rank == 0) {
    const std::string compressed = compress == 1
                                       ? ", float sums compressed with " + l.settings.compressor +
                                             (hierarchical ? " across nodes" : "")
                                       : "";
    const std::string bcasts = !l.settings.bcast_by_default ? ""
                               : state->one_host            ? ", MPI_Bcast up to 1 MiB"
                                                            : ", MPI_Bcast left to MPI";
    const std::string windows =
        (l.settings.window_copy_bytes == config::default_window_copy_bytes
             ? ""
             : ", window copies up to " + std::to_string(l.settings.window_copy_bytes) + " bytes") +
        calibrated;
    const std::string heap =
        l.settings.shared_heap_bytes == 0
            ? ""
            : ", allocations of >= " + std::to_string(l.settings.shared_heap_bytes) +
                  " bytes on the shared heap";
    std::fprintf(stderr,
                 "squall_mpi: communicator '%s' (%d ranks): squall's collectives over %s, "
                 "topology %s, for calls of >= %llu bytes%s%s%s%s; the rest goes to MPI\n",
                 name_of(comm).c_str(), size, state->transport.c_str(), l.settings.topology.c_str(),
                 static_cast<unsigned long long>(l.settings.min_bytes), bcasts.c_str(),
                 compressed.c_str(), windows.c_str(), heap.c_str());
  }
  comm_state& result = *state;
  {
    const std::lock_guard guard(l.lock);
    l.states.emplace(state.get(), std::move(state));
  }
  PMPI_Comm_set_attr(comm, l.keyval, &result);
  return result;
}

comm_state* existing_state(MPI_Comm comm) {
  void* value = nullptr;
  int found = 0;
  PMPI_Comm_get_attr(comm, lib().keyval, &value, &found);
  return found != 0 ? static_cast<comm_state*>(value) : nullptr;
}

/// Runs `body(state)` with `comm`'s `comm_state` (made on first use); a squall error goes to
/// `comm`'s error handler as MPI_ERR_OTHER.
template <class Body>
int run_state(MPI_Comm comm, Body&& body) {
  inside = true;
  int code = MPI_SUCCESS;
  try {
    comm_state* state = existing_state(comm);
    if (state == nullptr) state = &make_state(comm);
    body(*state);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "squall_mpi: %s\n", e.what());
    code = MPI_ERR_OTHER;
  }
  inside = false;
  if (code != MPI_SUCCESS) PMPI_Comm_call_errhandler(comm, code);
  return code;
}

/// Runs `body(holder)` on `comm`'s `squall_communicator` for the whole communicator.
template <class Body>
int run(MPI_Comm comm, Body&& body) {
  return run_state(comm, [&](comm_state& state) { std::visit(body, state.impl); });
}

template <class F>
void with_type(base b, F&& f) {
  switch (b) {
    case base::f32:
      return f(float{});
    case base::f64:
      return f(double{});
    case base::i32:
      return f(std::int32_t{});
    case base::i64:
      return f(std::int64_t{});
    case base::none:
      return;
  }
}

template <class F>
void with_op(MPI_Op op, F&& f) {
  if (op == MPI_SUM) return f(squall::sum_op{});
  if (op == MPI_MIN) return f(squall::min_op{});
  return f(squall::max_op{});
}

bool reducible(MPI_Op op) { return op == MPI_SUM || op == MPI_MIN || op == MPI_MAX; }

template <class T>
std::size_t elements(std::uint64_t bytes) {
  return static_cast<std::size_t>(bytes / sizeof(T));
}

/// MPI_COMM_WORLD's state made at MPI_Init, on every rank or on none, so that MPI_Iallreduce
/// and the other non-blocking calls (which take only communicators squall already holds) reach
/// squall in a program whose
/// first collective on the world is non-blocking. A rank that fails says why; then every rank
/// drops its state and the world's calls make it lazily, as any communicator's.
void hold_world() {
  const bool was_inside = std::exchange(inside, true);
  int made = 1;
  try {
    make_state(MPI_COMM_WORLD);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "squall_mpi: MPI_COMM_WORLD's state at MPI_Init: %s\n", e.what());
    made = 0;
  }
  PMPI_Allreduce(MPI_IN_PLACE, &made, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (made == 0 && existing_state(MPI_COMM_WORLD) != nullptr) {
    PMPI_Comm_delete_attr(MPI_COMM_WORLD, lib().keyval);
  }
  inside = was_inside;
}

/// After PMPI_Init(_thread), once: reads the settings and agrees them across MPI_COMM_WORLD.
/// Every rank takes part, whatever its settings: the hashes' max equals a rank's own hash, and
/// the complements' max its complement, only when all hashes are equal.
void start() {
  library& l = lib();
  if (l.keyval != MPI_KEYVAL_INVALID) return;  // a Fortran binding that calls MPI_Init itself
  l.settings = config::from_environment();
  const std::uint64_t mine = l.settings.hash();
  std::array<std::uint64_t, 2> hashes = {mine, ~mine};
  PMPI_Allreduce(MPI_IN_PLACE, hashes.data(), 2, MPI_UINT64_T, MPI_MAX, MPI_COMM_WORLD);
  int agreed = hashes[0] == mine && hashes[1] == ~mine ? 1 : 0;
  PMPI_Allreduce(MPI_IN_PLACE, &agreed, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  int rank = 0;
  PMPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (!l.settings.problem.empty()) {
    std::fprintf(stderr, "squall_mpi (rank %d): %s; squall is off, MPI does every call\n", rank,
                 l.settings.problem.c_str());
  }
  if (agreed == 0 && rank == 0) {
    std::fprintf(stderr,
                 "squall_mpi: the ranks' SQUALL_MPI_* settings differ; squall is off, MPI does "
                 "every call\n");
  }
  // Whether squall's own threads may call MPI (non-blocking calls across hosts): only where
  // every rank's MPI gives MPI_THREAD_MULTIPLE, so that every rank routes them alike.
  int provided = MPI_THREAD_SINGLE;
  PMPI_Query_thread(&provided);
  int multiple = provided == MPI_THREAD_MULTIPLE ? 1 : 0;
  PMPI_Allreduce(MPI_IN_PLACE, &multiple, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  l.thread_multiple = multiple == 1;
  PMPI_Comm_create_keyval(MPI_COMM_NULL_COPY_FN, delete_state, &l.keyval, nullptr);
  l.agreed = agreed == 1;
  l.on = l.agreed && l.settings.enable;
  const auto& takes = l.settings.takes;
  if (l.on && (takes[iallreduce] || takes[iallgather] || takes[ireduce_scatter_block] ||
               takes[ibcast] || takes[ireduce_scatter])) {
    hold_world();
  }
}

/// Before PMPI_Finalize: the job's counts (SQUALL_MPI_STATS), then every communicator squall
/// still holds is freed (MPI_COMM_WORLD's and MPI_COMM_SELF's and any the program never freed).
void stop() {
  library& l = lib();
  if (l.keyval == MPI_KEYVAL_INVALID) return;
  if (l.agreed && l.settings.stats) {  // a collective: only where every rank asked
    const per_call<unsigned long long> calls = snapshot(l.count.calls);
    const per_call<unsigned long long> bytes = snapshot(l.count.bytes);
    per_call<unsigned long long> total_calls{}, total_bytes{};
    PMPI_Reduce(calls.data(), total_calls.data(), kinds * 2, MPI_UNSIGNED_LONG_LONG, MPI_SUM, 0,
                MPI_COMM_WORLD);
    PMPI_Reduce(bytes.data(), total_bytes.data(), kinds * 2, MPI_UNSIGNED_LONG_LONG, MPI_SUM, 0,
                MPI_COMM_WORLD);
    std::array<unsigned long long, 2> mine = {l.compressed, l.tiered}, sums{};
    PMPI_Reduce(mine.data(), sums.data(), 2, MPI_UNSIGNED_LONG_LONG, MPI_SUM, 0, MPI_COMM_WORLD);
    const auto [compressed, tiered] = sums;
    int rank = 0, size = 0;
    PMPI_Comm_rank(MPI_COMM_WORLD, &rank);
    PMPI_Comm_size(MPI_COMM_WORLD, &size);
    if (rank == 0) {
      std::fprintf(stderr, "squall_mpi stats, all %d ranks (calls and bytes per rank summed):\n",
                   size);
      for (int k = 0; k < kinds; ++k) {
        std::fprintf(stderr,
                     "  %-25s squall %10llu calls %14llu bytes   MPI %10llu calls %14llu bytes\n",
                     call_names[static_cast<std::size_t>(k)], total_calls[k][0], total_bytes[k][0],
                     total_calls[k][1], total_bytes[k][1]);
      }
      if (!l.settings.compressor.empty()) {
        std::fprintf(stderr, "  float sums squall compressed with %s: %llu calls\n",
                     l.settings.compressor.c_str(), compressed);
      }
      if (tiered > 0) {
        std::fprintf(stderr, "  calls in tiers across nodes: %llu\n", tiered);
      }
    }
  }
  finish_pending_of(nullptr);  // every non-blocking call still running (the program's error)
  std::vector<MPI_Comm> held;
  {
    const std::lock_guard guard(l.lock);
    for (const auto& [key, state] : l.states) held.push_back(state->user);
  }
  for (MPI_Comm comm : held) PMPI_Comm_delete_attr(comm, l.keyval);
  PMPI_Comm_free_keyval(&l.keyval);
  l.on = false;
}

// ---- the collectives, for any count type ------------------------------------------------

/// `holder`'s compression state for float sums of `count` elements, made on first use.
template <class Holder>
auto& state_of_count(Holder& holder, std::size_t count) {
  auto state = holder.states.find(count);
  if (state == holder.states.end()) {
    state = holder.states.emplace(count, holder.comm->template make_state<float>(count)).first;
  }
  return state->second;
}

/// `data` (`count` elements) reduced in place over `holder`'s ranks: compressed where the
/// holder has a compressor and the call is a float sum, else exact.
template <class Holder, class T, class Op>
void allreduce_in_place(Holder& holder, T* data, std::size_t count, Op op) {
  auto& squall_comm = *holder.comm;
  if constexpr (Holder::compresses && std::is_same_v<T, float> &&
                std::is_same_v<Op, squall::sum_op>) {
    squall_comm.allreduce(host_view<float>(data, count), state_of_count(holder, count), op);
  } else {
    squall_comm.allreduce(host_view<T>(data, count), op);
  }
}

/// `data` (`count` elements) reduced in place over a communicator that spans nodes (`tiers`).
/// With nodes of one size, the part of the count that the node's width divides goes through
/// the shares; the rest (fewer elements than the width) is reduced in the node and then across
/// by every rank, which all hold the same bits of it after the same steps.
template <class T, class Op>
void tiered_allreduce(tiers& t, T* data, std::size_t count, Op op) {
  auto& node = *t.node.comm;
  const auto across = [&](T* part, std::size_t n) {
    if (t.cross_comm == MPI_COMM_NULL || n == 0) return;
    std::visit([&](auto& holder) { allreduce_in_place(holder, part, n, op); }, t.cross);
  };
  if (!t.shares) {
    node.allreduce(host_view<T>(data, count), op);
    across(data, count);
    node.broadcast(host_view<T>(data, count), 0);
    return;
  }
  const auto width = static_cast<std::size_t>(node.size());
  const std::size_t even = count - count % width;
  if (even > 0) {
    node.reduce_scatter(host_view<T>(data, even), op);
    T* share = data + node.block_offset(even);
    across(share, even / width);
    node.allgather(host_view<const T>(share, even / width), host_view<T>(data, even));
  }
  if (even < count) {
    node.allreduce(host_view<T>(data + even, count - even), op);
    across(data + even, count - even);
  }
}

/// The tiers of `state` where every rank crosses with its share (nodes of one size), else null:
/// where reduce_scatter_block and allgather run in tiers.
tiers* shares_tiers(comm_state& state) {
  return state.hierarchy && state.hierarchy->shares ? state.hierarchy.get() : nullptr;
}

/// One more call squall ran in tiers across nodes.
void note_tiered() {
  const std::lock_guard guard(lib().lock);
  ++lib().tiered;
}

/// A reduce_scatter_block over a communicator that spans nodes of one size (`tiers::shares`):
/// `whole` (a block of `block` elements for every rank, in rank order) into this rank's block
/// `mine`. The blocks go into tier order; each rank reduces, inside its node, the blocks of the
/// ranks of its place in every node, then those among the ranks of its place across nodes:
/// each rank crosses with its share, as the allreduce's tiers.
template <class T, class Op>
void tiered_reduce_scatter(tiers& t, const T* whole, T* mine, std::size_t block, Op op) {
  auto& node = *t.node.comm;
  const std::size_t ranks = t.places.size();
  const std::size_t across = ranks / static_cast<std::size_t>(node.size());
  T* ordered = reinterpret_cast<T*>(t.scratch((ranks + across) * block * sizeof(T)));
  for (std::size_t r = 0; r < ranks; ++r) {
    squall::kernels::copy_bytes(ordered + t.tier_index(static_cast<int>(r)) * block,
                                whole + r * block, block * sizeof(T));
  }
  T* place_blocks = ordered + ranks * block;  // the blocks of this rank's place, node-reduced
  node.reduce_scatter(host_view<const T>(ordered, ranks * block),
                      host_view<T>(place_blocks, across * block), op);
  std::visit(
      [&](auto& holder) {
        holder.comm->reduce_scatter(host_view<const T>(place_blocks, across * block),
                                    host_view<T>(mine, block), op);
      },
      t.cross);
}

/// An allgather over a communicator that spans nodes of one size: this rank's `words` at
/// `mine` into `whole` (every rank's, in rank order). Across nodes first (each rank gathers
/// the blocks of the ranks of its place in every node), then inside the node (each place's
/// gathered blocks), then from tier order into rank order.
void tiered_allgather(tiers& t, const std::int32_t* mine, std::int32_t* whole, std::size_t words) {
  auto& node = *t.node.comm;
  const std::size_t ranks = t.places.size();
  const std::size_t across = ranks / static_cast<std::size_t>(node.size());
  auto* ordered = reinterpret_cast<std::int32_t*>(t.scratch(ranks * words * sizeof(std::int32_t)));
  // this place's blocks where the node's allgather puts this rank's input
  std::int32_t* place_blocks = ordered + static_cast<std::size_t>(node.rank()) * across * words;
  std::visit(
      [&](auto& holder) {
        holder.comm->allgather(host_view<const std::int32_t>(mine, words),
                               host_view<std::int32_t>(place_blocks, across * words));
      },
      t.cross);
  node.allgather(host_view<const std::int32_t>(place_blocks, across * words),
                 host_view<std::int32_t>(ordered, ranks * words));
  for (std::size_t r = 0; r < ranks; ++r) {
    squall::kernels::copy_bytes(whole + r * words,
                                ordered + t.tier_index(static_cast<int>(r)) * words,
                                words * sizeof(std::int32_t));
  }
}

/// Refuses a broadcast's root outside the communicator (on every rank, before anything moves:
/// the tiers' table is indexed by it).
void check_root(const tiers& t, int root) {
  const int ranks = static_cast<int>(t.places.size());
  if (root < 0 || root >= ranks) {
    throw squall::invalid_argument(
        {.operation = "squall broadcast"},
        "root " + std::to_string(root) + " outside [0, " + std::to_string(ranks) + ")");
  }
}

/// A broadcast over a communicator that spans nodes: `root`'s `words` at `data` to every rank.
/// Nodes of one size: across nodes among the ranks of the root's place, then inside every node
/// from that place. Otherwise (only the nodes' first ranks cross): inside the root's node, across
/// among the first ranks, then inside the other nodes.
void tiered_broadcast(tiers& t, std::int32_t* data, std::size_t words, int root) {
  auto& node = *t.node.comm;
  const host_view<std::int32_t> all(data, words);
  check_root(t, root);
  const tiers::place& from = t.places[static_cast<std::size_t>(root)];
  const auto across = [&](int cross_root) {
    std::visit([&](auto& holder) { holder.comm->broadcast(all, cross_root); }, t.cross);
  };
  if (t.shares) {
    if (node.rank() == from.local) across(from.cross);
    node.broadcast(all, from.local);
    return;
  }
  const bool roots_node = t.places[static_cast<std::size_t>(t.rank)].leader == from.leader;
  if (roots_node) node.broadcast(all, from.local);
  if (t.cross_comm != MPI_COMM_NULL) {
    across(t.places[static_cast<std::size_t>(from.leader)].cross);
  }
  if (!roots_node) node.broadcast(all, 0);
}

template <class Fallback>
int allreduce_call(const void* sendbuf, void* recvbuf, count_type count, MPI_Datatype datatype,
                   MPI_Op op, MPI_Comm comm, Fallback fallback) {
  const std::uint64_t bytes = bytes_of(count, datatype);
  const base b =
      usable(allreduce, comm, bytes) && reducible(op) ? signature_base(datatype) : base::none;
  if (b == base::none) {
    note(allreduce, false, bytes);
    return fallback();
  }
  note(allreduce, true, bytes);
  return run_state(comm, [&](comm_state& state) {
    allreduce_buffers buffers(sendbuf, recvbuf, count, datatype, comm);
    staged& out = buffers.out;
    const bool in_place = buffers.in_place();
    with_type(b, [&]<class T>(T) {
      with_op(op, [&](auto squall_op) {
        T* result = reinterpret_cast<T*>(out.bytes());
        const std::size_t n = elements<T>(bytes);
        constexpr bool float_sum =
            std::is_same_v<T, float> && std::is_same_v<decltype(squall_op), squall::sum_op>;
        if (state.hierarchy) {
          buffers.input_to_output();
          state.hierarchy->calls.ordered(state.hierarchy->rank, [&] {
            tiered_allreduce(*state.hierarchy, result, n, squall_op);
          });
          note_tiered();
          if (float_sum && state.hierarchy->compressing) {
            const std::lock_guard guard(lib().lock);
            ++lib().compressed;
          }
          return;
        }
        std::visit(
            [&](auto& holder) {
              using holder_type = std::remove_reference_t<decltype(holder)>;
              // The compressed allreduce works in place: the input goes to the output first.
              constexpr bool one_buffer = holder_type::compresses && float_sum;
              if (in_place || one_buffer) {
                buffers.input_to_output();
                allreduce_in_place(holder, result, n, squall_op);
                if (one_buffer) {
                  const std::lock_guard guard(lib().lock);
                  ++lib().compressed;
                }
              } else {
                holder.comm->allreduce(
                    host_view<const T>(reinterpret_cast<const T*>(buffers.in->bytes()), n),
                    host_view<T>(result, n), squall_op);
              }
            },
            state.impl);
      });
    });
    out.unpack();
  });
}

// ---- the non-blocking collectives ---------------------------------------------------------
//
// An MPI_Iallreduce (MPI_Iallgather, MPI_Ireduce_scatter_block, MPI_Ibcast) squall handles
// starts squall's iallreduce (iallgather, ireduce_scatter, ibroadcast; its progress thread
// moves it) and gives the program a generalized request (MPI_Grequest_start), which MPI completes
// only when told to (MPI_Grequest_complete). squall tells it from the program's own thread, inside
// the completion calls it intercepts (MPI_Wait, MPI_Test and their -all, -any and -some forms,
// MPI_Request_get_status): those look the program's requests up in `library::pending`,
// complete the ones squall has finished, then call PMPI_* on the whole array. A blocking one
// polls (squall's requests and PMPI_Test* of the whole array, which also moves MPI's own
// requests on) until done, so that a program waiting on squall's request while a peer waits on
// one of its MPI sends still progresses. On one host (shared memory) no MPI call is made from
// squall's thread: any thread level works. Across hosts squall's thread calls MPI (on squall's
// own communicators), so there only where every rank's MPI gives MPI_THREAD_MULTIPLE; the
// tiered forms run on the tiers' own progress engine (`tiers::calls`). Only once squall holds the
// communicator, as MPI_Barrier: making its state is a blocking collective (MPI_Comm_dup, the
// shared-memory job), which a non-blocking call must not be (a peer may first wait for a message
// this rank sends after it); MPI_COMM_WORLD's is made at MPI_Init (`hold_world`), others' by the
// first blocking call squall takes on them. Freeing or cancelling a pending one is erroneous in MPI
// (3.1, section 5.12) and is refused with MPI_ERR_REQUEST.

int grequest_query(void* code, MPI_Status* status) {
  PMPI_Status_set_elements(status, MPI_BYTE, 0);
  PMPI_Status_set_cancelled(status, 0);
  status->MPI_SOURCE = MPI_UNDEFINED;
  status->MPI_TAG = MPI_UNDEFINED;
  status->MPI_ERROR = *static_cast<int*>(code);
  return *static_cast<int*>(code);
}
int grequest_free(void* code) {
  delete static_cast<int*>(code);
  return MPI_SUCCESS;
}
int grequest_cancel(void*, int) { return MPI_SUCCESS; }  // a collective is never cancelled

/// Ends `call` (done, or failed with `failure`'s message): its packed output unpacked, its
/// outcome recorded, its generalized request completed. Returns whether it failed (printed; the
/// caller hands it to the communicator's error handler, as the blocking calls do).
bool complete(MPI_Request request, pending_call& call, const std::exception* failure) {
  std::string why;
  if (failure != nullptr) {
    why = failure->what();
  } else {
    try {
      call.finish();
    } catch (const std::exception& e) {
      why = e.what();
    }
  }
  *call.code = why.empty() ? MPI_SUCCESS : MPI_ERR_OTHER;
  PMPI_Grequest_complete(request);
  if (!why.empty())
    std::fprintf(stderr, "squall_mpi: %s: %s\n", call_names[call.kind], why.c_str());
  return !why.empty();
}

/// Completes those of `requests` (`n` handles) that are squall's and done; with `wait`,
/// waits for every one squall runs on `of` instead (every one, if null: MPI_Finalize, or a
/// communicator freed). Returns how many of `requests` are squall's and still running.
std::size_t settle(int n, const MPI_Request* requests, bool wait = false,
                   const comm_state* of = nullptr) {
  library& l = lib();
  if (l.in_flight.load(std::memory_order_acquire) == 0) return 0;
  std::size_t running = 0;
  std::vector<MPI_Comm> failed;
  {
    const std::lock_guard guard(l.pending_lock);
    // Whether the call `it` names is over (then completed and dropped).
    const auto over = [&](std::map<MPI_Request, std::unique_ptr<pending_call>>::iterator it) {
      pending_call& call = *it->second;
      bool failure = false;
      try {
        if (!wait && !call.work.test()) return false;
        call.work.wait();  // done: returns at once, or throws what the call failed with
        failure = complete(it->first, call, nullptr);
      } catch (const std::exception& e) {
        failure = complete(it->first, call, &e);
      }
      if (failure) failed.push_back(call.user);
      l.pending.erase(it);
      l.in_flight.fetch_sub(1, std::memory_order_release);
      return true;
    };
    if (wait) {
      for (auto it = l.pending.begin(); it != l.pending.end();) {
        const auto next = std::next(it);
        if (of == nullptr || it->second->state == of) over(it);
        it = next;
      }
    } else {
      for (int i = 0; i < n; ++i) {
        const auto it = l.pending.find(requests[i]);
        if (it != l.pending.end() && !over(it)) ++running;
      }
    }
  }
  for (MPI_Comm user : failed) PMPI_Comm_call_errhandler(user, MPI_ERR_OTHER);
  return running;
}

void finish_pending_of(const comm_state* state) { settle(0, nullptr, true, state); }

/// A blocking completion call on `requests`: straight to MPI (`test(nullptr)`: the PMPI_Wait*
/// form) when none is squall's, else polls squall's and `test(&flag)` (the PMPI_Test* form of
/// the same call, which moves MPI's requests on) until `flag`. squall's requests end by their
/// own deadlines, so this ends too.
template <class Test>
int wait_polling(int n, const MPI_Request* requests, Test&& test) {
  if (settle(n, requests) == 0) return test(nullptr);  // none of them is squall's
  for (int round = 0;; ++round) {
    settle(n, requests);
    int flag = 0;
    const int code = test(&flag);
    if (code != MPI_SUCCESS || flag != 0) return code;
    if (round < 64) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  }
}

/// Whether `request` is a non-blocking call squall still runs (MPI_Request_free, MPI_Cancel).
bool squall_runs(MPI_Request request, MPI_Comm* user) {
  library& l = lib();
  if (l.in_flight.load(std::memory_order_acquire) == 0) return false;
  const std::lock_guard guard(l.pending_lock);
  const auto it = l.pending.find(request);
  if (it == l.pending.end()) return false;
  *user = it->second->user;
  return true;
}

/// MPI_Request_free or MPI_Cancel of a pending non-blocking call squall runs: erroneous in MPI.
int refuse(const char* what, MPI_Comm user) {
  std::fprintf(stderr,
               "squall_mpi: %s of a pending non-blocking collective: erroneous (MPI 3.1, "
               "section 5.12); wait for it instead\n",
               what);
  PMPI_Comm_call_errhandler(user, MPI_ERR_REQUEST);
  return MPI_ERR_REQUEST;
}

/// Starts the non-blocking call `kind` on `comm` in squall where it may: squall holds the
/// communicator (a handled blocking call, or MPI_Init for MPI_COMM_WORLD, made its state) and
/// it lies on one host (shared memory). `start(holder, call)` sets `call.work` and
/// `call.finish`; the program gets a generalized request in `request`. Returns whether squall
/// took it; `code` is the error a failed start handed to the communicator's error handler.
template <class Start, class StartTiered>
bool start_pending(call_kind kind, MPI_Comm comm, MPI_Request* request, int& code, Start&& start,
                   StartTiered&& start_tiered) {
  code = MPI_SUCCESS;
  // Only once squall holds the communicator (a handled blocking call made its state, on every
  // rank alike): making it is a blocking collective, which a non-blocking call must not be.
  if (existing_state(comm) == nullptr) return false;
  bool started = false;
  code = run_state(comm, [&](comm_state& state) {
    // Across hosts squall's thread calls MPI: only where every rank's MPI allows it.
    if (!state.one_host && !lib().thread_multiple) return;
    auto call = std::make_unique<pending_call>();
    call->kind = kind;
    call->state = &state;
    call->user = comm;
    if (state.hierarchy && start_tiered(*state.hierarchy, *call)) {
      note_tiered();
    } else {
      std::visit([&](auto& holder) { start(holder, *call); }, state.impl);
    }
    call->code = new int(MPI_SUCCESS);
    const int made =
        PMPI_Grequest_start(grequest_query, grequest_free, grequest_cancel, call->code, request);
    if (made != MPI_SUCCESS) {
      delete call->code;
      call->work.wait();  // nothing may still write into the buffers
      squall::detail::mpi_check(made, {.operation = call_names[kind]}, "MPI_Grequest_start");
    }
    library& l = lib();
    const std::lock_guard guard(l.pending_lock);
    l.pending.emplace(*request, std::move(call));
    l.in_flight.fetch_add(1, std::memory_order_release);
    started = true;
  });
  return started;
}

/// Whether a non-blocking call `kind` of `bytes` on `comm` may go to squall at all.
bool usable_nonblocking(call_kind kind, MPI_Comm comm, std::uint64_t bytes) {
  return usable(kind, comm, bytes) && bytes >= lib().settings.iallreduce_min_bytes;
}

template <class Fallback>
int iallreduce_call(const void* sendbuf, void* recvbuf, count_type count, MPI_Datatype datatype,
                    MPI_Op op, MPI_Comm comm, MPI_Request* request, Fallback fallback) {
  const std::uint64_t bytes = bytes_of(count, datatype);
  const base b = usable_nonblocking(iallreduce, comm, bytes) && reducible(op)
                     ? signature_base(datatype)
                     : base::none;
  bool started = false;
  if (b != base::none) {
    int code = MPI_SUCCESS;
    started = start_pending(
        iallreduce, comm, request, code,
        [&](auto& holder, pending_call& call) {
          using holder_type = std::remove_reference_t<decltype(holder)>;
          auto buffers =
              std::make_shared<allreduce_buffers>(sendbuf, recvbuf, count, datatype, comm);
          call.finish = [buffers] { buffers->out.unpack(); };
          with_type(b, [&]<class T>(T) {
            with_op(op, [&](auto squall_op) {
              T* result = reinterpret_cast<T*>(buffers->out.bytes());
              const std::size_t n = elements<T>(bytes);
              constexpr bool float_sum =
                  std::is_same_v<T, float> && std::is_same_v<decltype(squall_op), squall::sum_op>;
              auto& squall_comm = *holder.comm;
              if constexpr (holder_type::compresses && float_sum) {
                // in place, as the blocking call; the state of this count, which the progress
                // thread uses for one call at a time, in their order
                buffers->input_to_output();
                call.work = squall_comm.iallreduce(host_view<T>(result, n),
                                                   state_of_count(holder, n), squall_op);
                const std::lock_guard guard(lib().lock);
                ++lib().compressed;
              } else if (buffers->in_place()) {
                call.work = squall_comm.iallreduce(host_view<T>(result, n), squall_op);
              } else {
                call.work = squall_comm.iallreduce(
                    host_view<const T>(reinterpret_cast<const T*>(buffers->in->bytes()), n),
                    host_view<T>(result, n), squall_op);
              }
            });
          });
        },
        [&](tiers& t, pending_call& call) {
          auto buffers =
              std::make_shared<allreduce_buffers>(sendbuf, recvbuf, count, datatype, comm);
          call.finish = [buffers] { buffers->out.unpack(); };
          with_type(b, [&]<class T>(T) {
            with_op(op, [&](auto squall_op) {
              const std::size_t n = elements<T>(bytes);
              call.work = t.calls.started(t.rank, [&t, buffers, n, squall_op] {
                buffers->input_to_output();
                tiered_allreduce(t, reinterpret_cast<T*>(buffers->out.bytes()), n, squall_op);
              });
              if (std::is_same_v<T, float> && std::is_same_v<decltype(squall_op), squall::sum_op> &&
                  t.compressing) {
                const std::lock_guard guard(lib().lock);
                ++lib().compressed;
              }
            });
          });
          return true;
        });
    if (code != MPI_SUCCESS) return code;
  }
  note(iallreduce, started, bytes);
  return started ? MPI_SUCCESS : fallback();
}

// ---- the blocks of reduce-scatters and allgathers -------------------------------------------

/// Every rank's block of a reduce-scatter or an allgather, in items of the call's datatype:
/// alike (the block forms, or -v counts all equal) or of different sizes, which squall moves
/// padded to the largest. The same on every rank (`blocks_of`).
struct blocks {
  std::vector<count_type> counts;  ///< rank q's items; empty where every rank has `most`
  count_type most = 0;             ///< the largest block's items
  count_type total = 0;            ///< all blocks' items
  int size = 1;                    ///< how many blocks (the communicator's ranks)

  bool alike() const { return counts.empty(); }
  count_type count(int q) const { return alike() ? most : counts[static_cast<std::size_t>(q)]; }
};

/// The blocks of a block form: `count` items for each rank of `comm`.
blocks same_blocks(count_type count, MPI_Comm comm) {
  int size = 1;
  if (comm != MPI_COMM_NULL) PMPI_Comm_size(comm, &size);
  return {.counts = {}, .most = count, .total = count * size, .size = size};
}

/// Blocks squall cannot move where they lie (a reduce-scatter's of different sizes, except in
/// squall's own split; an allgatherv's of bytes no multiple of 4) go through a packed copy,
/// every block padded to the largest, only where that copy is small: below
/// `packed_copy_bytes` squall's collectives copy through the shared-memory windows anyway (a
/// copy in and a copy out), above they read peers' memory straight into the result and the
/// packed copy would add a copy of every byte (squall-mpi-bench measured the padded allgatherv
/// at 0.36-0.52x of Open MPI's speed from 64 KiB at P = 2, and the padded reduce-scatter at
/// 0.92-1.03x from 1 MiB: docs/performance.md); and where padding adds at most a quarter of the
/// bytes (`padding_allowed` of `padding_of`: one rank holding most of the data would multiply
/// them by up to P). Otherwise MPI takes the call.
constexpr std::uint64_t packed_copy_bytes = squall::collective_tuning{}.peer_memory_bytes;
constexpr std::uint64_t padding_allowed = 5, padding_of = 4;

/// Whether blocks of `bytes` in all, `padded` bytes padded, may go through a packed copy.
bool packable(std::uint64_t bytes, std::uint64_t padded) {
  return padded < packed_copy_bytes && padded * padding_of <= bytes * padding_allowed;
}

/// The blocks of a -v call `kind` on `comm` (`recvcounts`, one a rank); none (the call noted
/// as MPI's) where `comm` is no intracommunicator or a count is negative (MPI says what is
/// wrong). The same on every rank: a reduce_scatter's ranks pass the same counts, and an
/// allgatherv's give block q the signature rank q sends (in counts of their own receive type,
/// alike on a rank).
template <class Count>
std::optional<blocks> blocks_of(call_kind kind, const Count* recvcounts, MPI_Comm comm) {
  if (!intracommunicator(comm)) {
    note(kind, false, 0);
    return std::nullopt;
  }
  blocks b;
  PMPI_Comm_size(comm, &b.size);
  b.counts.resize(static_cast<std::size_t>(b.size));
  bool alike = true, negative = false;
  for (int q = 0; q < b.size; ++q) {
    const auto count = static_cast<count_type>(recvcounts[q]);
    b.counts[static_cast<std::size_t>(q)] = count;
    alike = alike && count == b.counts[0];
    negative = negative || count < 0;
    b.most = std::max(b.most, count);
    b.total += count;
  }
  if (negative) {
    note(kind, false, 0);
    return std::nullopt;
  }
  if (alike) b.counts.clear();
  return b;
}

/// A reduce-scatter's route: the bytes of the largest block, of all blocks as they are and
/// padded to the largest, the element type squall reduces them as (none: MPI takes the call),
/// and whether blocks of different sizes are squall's own split (`detail::split_range` of the
/// elements: the first ranks one element more), which squall reduces where they lie, or go
/// through a padded copy (`packable`). `nonblocking`: the floor of the non-blocking forms
/// applies too.
struct scatter_route {
  std::uint64_t block = 0;
  std::uint64_t bytes = 0;
  std::uint64_t padded = 0;
  base b = base::none;
  bool split = true;
};
scatter_route reduce_scatter_route(call_kind kind, bool nonblocking, const blocks& shape,
                                   MPI_Datatype datatype, MPI_Op op, MPI_Comm comm) {
  scatter_route r;
  r.block = bytes_of(shape.most, datatype);
  r.bytes = bytes_of(shape.total, datatype);
  r.padded = r.block * static_cast<std::uint64_t>(shape.size);
  const bool may =
      nonblocking ? usable_nonblocking(kind, comm, r.bytes) : usable(kind, comm, r.bytes);
  if (may && reducible(op)) r.b = signature_base(datatype);
  if (r.b == base::none || shape.alike()) return r;
  const std::uint64_t element = r.b == base::f32 || r.b == base::i32 ? 4 : 8;
  const std::uint64_t item = bytes_of(1, datatype);
  const auto size = static_cast<std::size_t>(shape.size);
  for (int q = 0; q < shape.size; ++q) {
    const std::size_t share =
        squall::detail::split_range(r.bytes / element, size, static_cast<std::size_t>(q)).count;
    r.split = r.split && static_cast<std::uint64_t>(shape.count(q)) * item == share * element;
  }
  if (!r.split && !packable(r.bytes, r.padded)) r.b = base::none;
  return r;
}

/// A reduce-scatter's buffers as squall sees them, packed: `in` (every rank's input; the
/// receive buffer, in place) and `out` (this rank's block); with `pad` (blocks of different
/// sizes not in squall's split, or in tiers, whose reduce-scatter takes alike blocks), also
/// `in` padded (each block at q times the largest, zeros after it: sums of zeros, never read
/// back) and this rank's padded result.
struct scatter_buffers {
  bool in_place;        ///< squall reduces `whole()` in place (MPI_IN_PLACE, not padded)
  std::uint64_t block;  ///< the largest block's bytes
  std::uint64_t own;    ///< this rank's block's bytes
  staged in;
  staged out;
  std::unique_ptr<std::byte[]> padded;
  std::unique_ptr<std::byte[]> result;  ///< where padded and `own` < `block`
  scatter_buffers(const void* sendbuf, void* recvbuf, const blocks& b, int rank, bool pad,
                  MPI_Datatype type, MPI_Comm comm)
      : in_place(sendbuf == MPI_IN_PLACE && !(pad && !b.alike())),
        block(bytes_of(b.most, type)),
        own(bytes_of(b.count(rank), type)),
        in(sendbuf == MPI_IN_PLACE ? recvbuf : const_cast<void*>(sendbuf), b.total, type, comm),
        out(recvbuf, b.count(rank), type, comm) {
    in.pack();
    if (!pad || b.alike()) return;
    padded = std::make_unique_for_overwrite<std::byte[]>(block * static_cast<std::size_t>(b.size));
    std::uint64_t from = 0;
    for (int q = 0; q < b.size; ++q) {
      const std::uint64_t bytes = bytes_of(b.count(q), type);
      std::byte* to = padded.get() + static_cast<std::size_t>(q) * block;
      squall::kernels::copy_bytes(to, in.bytes() + from, bytes);
      std::memset(to + bytes, 0, block - bytes);
      from += bytes;
    }
    if (own < block) result = std::make_unique_for_overwrite<std::byte[]>(block);
  }
  std::byte* whole() { return padded ? padded.get() : in.bytes(); }
  std::byte* mine() { return result ? result.get() : out.bytes(); }
  /// The bytes of `whole()` and of `mine()` (padded, or as they are).
  std::uint64_t whole_bytes(int size) const {
    return padded ? block * static_cast<std::uint64_t>(size) : in.size();
  }
  std::uint64_t mine_bytes() const { return padded ? block : own; }
  /// The result into the receive buffer. In place squall leaves this rank's block at `offset`
  /// bytes of `in`; MPI wants it at the front.
  void finish(std::size_t offset) {
    if (in_place && offset != 0) std::memmove(out.bytes(), in.bytes() + offset, own);
    if (result) squall::kernels::copy_bytes(out.bytes(), result.get(), own);
    out.unpack();
  }
};

/// MPI_Ireduce_scatter_block, or an MPI_Ireduce_scatter (`kind`) of blocks `shape`.
template <class Fallback>
int ireduce_scatter_block_call(call_kind kind, const void* sendbuf, void* recvbuf,
                               const blocks& shape, MPI_Datatype datatype, MPI_Op op, MPI_Comm comm,
                               MPI_Request* request, Fallback fallback) {
  const scatter_route route = reduce_scatter_route(kind, true, shape, datatype, op, comm);
  bool started = false;
  if (route.b != base::none) {
    int code = MPI_SUCCESS;
    int rank = 0;
    PMPI_Comm_rank(comm, &rank);
    started = start_pending(
        kind, comm, request, code,
        [&](auto& holder, pending_call& call) {
          auto& squall_comm = *holder.comm;
          auto buffers = std::make_shared<scatter_buffers>(sendbuf, recvbuf, shape, rank,
                                                           !route.split, datatype, comm);
          with_type(route.b, [&]<class T>(T) {
            with_op(op, [&](auto squall_op) {
              const std::size_t n = elements<T>(buffers->whole_bytes(shape.size));
              T* whole = reinterpret_cast<T*>(buffers->whole());
              std::size_t offset = 0;
              if (buffers->in_place) {
                call.work = squall_comm.ireduce_scatter(host_view<T>(whole, n), squall_op);
                offset = squall_comm.block_offset(n) * sizeof(T);
              } else {
                call.work =
                    squall_comm.ireduce_scatter(host_view<const T>(whole, n),
                                                host_view<T>(reinterpret_cast<T*>(buffers->mine()),
                                                             elements<T>(buffers->mine_bytes())),
                                                squall_op);
              }
              call.finish = [buffers, offset] { buffers->finish(offset); };
            });
          });
        },
        [&](tiers& t, pending_call& call) {
          if (!t.shares) return false;  // on the whole communicator's MPI transport
          auto buffers = std::make_shared<scatter_buffers>(sendbuf, recvbuf, shape, rank, true,
                                                           datatype, comm);
          call.finish = [buffers] { buffers->finish(0); };
          with_type(route.b, [&]<class T>(T) {
            with_op(op, [&](auto squall_op) {
              const std::size_t block = elements<T>(route.block);
              call.work = t.calls.started(t.rank, [&t, buffers, block, squall_op] {
                tiered_reduce_scatter(t, reinterpret_cast<const T*>(buffers->whole()),
                                      reinterpret_cast<T*>(buffers->mine()), block, squall_op);
              });
            });
          });
          return true;
        });
    if (code != MPI_SUCCESS) return code;
  }
  note(kind, started, route.bytes);
  return started ? MPI_SUCCESS : fallback();
}

/// MPI_Iallgather, or an MPI_Iallgatherv whose blocks are one allgather in place (`kind`).
template <class Fallback>
int iallgather_call(call_kind kind, const void* sendbuf, count_type sendcount,
                    MPI_Datatype sendtype, void* recvbuf, count_type recvcount,
                    MPI_Datatype recvtype, MPI_Comm comm, MPI_Request* request, Fallback fallback) {
  int size = 1, rank = 0;
  if (comm != MPI_COMM_NULL) {
    PMPI_Comm_size(comm, &size);
    PMPI_Comm_rank(comm, &rank);
  }
  const std::uint64_t block = bytes_of(recvcount, recvtype);
  const std::uint64_t bytes = block * static_cast<std::uint64_t>(size);
  bool started = false;
  if (usable_nonblocking(kind, comm, bytes) && block % 4 == 0) {
    int code = MPI_SUCCESS;
    started = start_pending(
        kind, comm, request, code,
        [&](auto& holder, pending_call& call) {
          auto out = std::make_shared<staged>(recvbuf, recvcount * size, recvtype, comm);
          const std::size_t words = static_cast<std::size_t>(block / 4);
          auto* whole = reinterpret_cast<std::int32_t*>(out->bytes());
          const std::int32_t* mine =
              own_block(*out, sendbuf, sendcount, sendtype, block, rank, comm);
          call.work = holder.comm->iallgather(
              host_view<const std::int32_t>(mine, words),
              host_view<std::int32_t>(whole, words * static_cast<std::size_t>(size)));
          call.finish = [out] { out->unpack(); };
        },
        [&](tiers& t, pending_call& call) {
          if (!t.shares) return false;  // on the whole communicator's MPI transport
          auto out = std::make_shared<staged>(recvbuf, recvcount * size, recvtype, comm);
          const std::size_t words = static_cast<std::size_t>(block / 4);
          auto* whole = reinterpret_cast<std::int32_t*>(out->bytes());
          const std::int32_t* mine =
              own_block(*out, sendbuf, sendcount, sendtype, block, rank, comm);
          call.work = t.calls.started(
              t.rank, [&t, out, mine, whole, words] { tiered_allgather(t, mine, whole, words); });
          call.finish = [out] { out->unpack(); };
          return true;
        });
    if (code != MPI_SUCCESS) return code;
  }
  note(kind, started, bytes);
  return started ? MPI_SUCCESS : fallback();
}

template <class Fallback>
int ibcast_call(void* buffer, count_type count, MPI_Datatype datatype, int root, MPI_Comm comm,
                MPI_Request* request, Fallback fallback) {
  const std::uint64_t bytes = bytes_of(count, datatype);
  bool started = false;
  if (usable_nonblocking(ibcast, comm, bytes) && bytes % 4 == 0) {
    int code = MPI_SUCCESS;
    started = start_pending(
        ibcast, comm, request, code,
        [&](auto& holder, pending_call& call) {
          auto data = std::make_shared<staged>(buffer, count, datatype, comm);
          if (holder.comm->rank() == root) data->pack();
          call.work = holder.comm->ibroadcast(
              host_view<std::int32_t>(reinterpret_cast<std::int32_t*>(data->bytes()),
                                      static_cast<std::size_t>(bytes / 4)),
              root);
          call.finish = [data] { data->unpack(); };
        },
        [&](tiers& t, pending_call& call) {
          check_root(t, root);  // refused here, on every rank, before anything is queued
          auto data = std::make_shared<staged>(buffer, count, datatype, comm);
          if (t.rank == root) data->pack();
          const auto n = static_cast<std::size_t>(bytes / 4);
          call.work = t.calls.started(t.rank, [&t, data, n, root] {
            tiered_broadcast(t, reinterpret_cast<std::int32_t*>(data->bytes()), n, root);
          });
          call.finish = [data] { data->unpack(); };
          return true;
        });
    if (code != MPI_SUCCESS) return code;
  }
  note(ibcast, started, bytes);
  return started ? MPI_SUCCESS : fallback();
}

/// MPI_Reduce_scatter_block, or an MPI_Reduce_scatter (`kind`) of blocks `shape`.
template <class Fallback>
int reduce_scatter_block_call(call_kind kind, const void* sendbuf, void* recvbuf,
                              const blocks& shape, MPI_Datatype datatype, MPI_Op op, MPI_Comm comm,
                              Fallback fallback) {
  const scatter_route route = reduce_scatter_route(kind, false, shape, datatype, op, comm);
  note(kind, route.b != base::none, route.bytes);
  if (route.b == base::none) return fallback();
  return run_state(comm, [&](comm_state& state) {
    tiers* const tiered = shares_tiers(state);
    int rank = 0;
    PMPI_Comm_rank(comm, &rank);
    scatter_buffers buffers(sendbuf, recvbuf, shape, rank, tiered != nullptr || !route.split,
                            datatype, comm);
    with_type(route.b, [&]<class T>(T) {
      with_op(op, [&](auto squall_op) {
        const std::size_t n = elements<T>(buffers.whole_bytes(shape.size));
        T* whole = reinterpret_cast<T*>(buffers.whole());
        T* mine = reinterpret_cast<T*>(buffers.mine());
        if (tiered != nullptr) {
          tiered->calls.ordered(tiered->rank, [&] {
            tiered_reduce_scatter(*tiered, whole, mine, elements<T>(route.block), squall_op);
          });
          buffers.finish(0);  // `whole` was copied into tier order first: in place is safe
          note_tiered();
          return;
        }
        std::visit(
            [&](auto& holder) {
              auto& squall_comm = *holder.comm;
              std::size_t offset = 0;
              if (buffers.in_place) {
                squall_comm.reduce_scatter(host_view<T>(whole, n), squall_op);
                offset = squall_comm.block_offset(n) * sizeof(T);
              } else {
                squall_comm.reduce_scatter(host_view<const T>(whole, n),
                                           host_view<T>(mine, elements<T>(buffers.mine_bytes())),
                                           squall_op);
              }
              buffers.finish(offset);
            },
            state.impl);
      });
    });
  });
}

/// squall's allgather of `words` 32-bit words a rank on `state`'s communicator: `mine` (which
/// may be block r of `whole`) into `whole`, in tiers where the communicator spans nodes.
void gather_words(comm_state& state, const std::int32_t* mine, std::int32_t* whole,
                  std::size_t words, int size) {
  if (tiers* const tiered = shares_tiers(state)) {
    tiered->calls.ordered(tiered->rank, [&] { tiered_allgather(*tiered, mine, whole, words); });
    note_tiered();
  } else {
    std::visit(
        [&](auto& holder) {
          holder.comm->allgather(
              host_view<const std::int32_t>(mine, words),
              host_view<std::int32_t>(whole, words * static_cast<std::size_t>(size)));
        },
        state.impl);
  }
}

/// squall's allgather of `recvcount` items a rank on `state`'s communicator, in place in the
/// receive buffer (packed around it where its datatype does not lie as its bytes).
void gather_in_place(comm_state& state, const void* sendbuf, count_type sendcount,
                     MPI_Datatype sendtype, void* recvbuf, count_type recvcount,
                     MPI_Datatype recvtype, int rank, int size, MPI_Comm comm) {
  const std::uint64_t block = bytes_of(recvcount, recvtype);
  staged out(recvbuf, recvcount * size, recvtype, comm);
  const std::size_t words = static_cast<std::size_t>(block / 4);
  auto* whole = reinterpret_cast<std::int32_t*>(out.bytes());
  const std::int32_t* mine = own_block(out, sendbuf, sendcount, sendtype, block, rank, comm);
  gather_words(state, mine, whole, words, size);
  out.unpack();
}

/// MPI_Allgather (`kind`), or its large-count form.
template <class Fallback>
int allgather_call(call_kind kind, const void* sendbuf, count_type sendcount, MPI_Datatype sendtype,
                   void* recvbuf, count_type recvcount, MPI_Datatype recvtype, MPI_Comm comm,
                   Fallback fallback) {
  int size = 1, rank = 0;
  if (comm != MPI_COMM_NULL) {
    PMPI_Comm_size(comm, &size);
    PMPI_Comm_rank(comm, &rank);
  }
  const std::uint64_t block = bytes_of(recvcount, recvtype);
  const std::uint64_t bytes = block * static_cast<std::uint64_t>(size);
  if (!usable(kind, comm, bytes) || block % 4 != 0) {
    note(kind, false, bytes);
    return fallback();
  }
  note(kind, true, bytes);
  return run_state(comm, [&](comm_state& state) {
    gather_in_place(state, sendbuf, sendcount, sendtype, recvbuf, recvcount, recvtype, rank, size,
                    comm);
  });
}

/// Where an allgatherv's blocks go in this rank's receive buffer: block q at its displacement
/// times the receive type's extent, `count(q)` items. `unpack(from)` writes block q from the
/// packed bytes at `from(q)` (this rank's own skipped where it is already there: MPI_IN_PLACE).
struct receive_places {
  std::vector<std::pair<std::byte*, count_type>> at;  ///< block q's address and items
  MPI_Datatype type;
  MPI_Comm comm;
  int rank;
  bool in_place;

  template <class Displacement>
  receive_places(void* recvbuf, const blocks& shape, const Displacement* displs,
                 MPI_Datatype recvtype, int rank_, bool in_place_, MPI_Comm comm_)
      : type(recvtype), comm(comm_), rank(rank_), in_place(in_place_) {
    MPI_Count lb = 0, extent = 0;
    PMPI_Type_get_extent_x(recvtype, &lb, &extent);
    for (int q = 0; q < shape.size; ++q) {
      at.emplace_back(static_cast<std::byte*>(recvbuf) + static_cast<MPI_Count>(displs[q]) * extent,
                      shape.count(q));
    }
  }
  /// This rank's block as squall sends it, packed: the send buffer, or in place its block of
  /// the receive buffer; its bytes must be `bytes`.
  staged own(const void* sendbuf, count_type sendcount, MPI_Datatype sendtype,
             std::uint64_t bytes) const {
    const auto& [own_at, own_count] = at[static_cast<std::size_t>(rank)];
    staged in(in_place ? own_at : const_cast<void*>(sendbuf), in_place ? own_count : sendcount,
              in_place ? type : sendtype, comm);
    if (in.size() != bytes) {
      throw squall::mismatch_error({.operation = "squall_mpi allgatherv"},
                                   "the send and receive signatures differ in size");
    }
    in.pack();
    return in;
  }
  template <class From>
  void unpack(From&& from) {
    for (std::size_t q = 0; q < at.size(); ++q) {
      if (in_place && q == static_cast<std::size_t>(rank)) continue;  // where it was
      staged out(at[q].first, at[q].second, type, comm);
      squall::kernels::copy_bytes(out.bytes(), from(q), out.size());
      out.unpack();
    }
  }
};

/// An allgatherv's blocks as squall gathers them in tiers, or where their bytes are not whole
/// 32-bit words: every rank's block packed into `words` 32-bit words of `whole` (the largest
/// block's bytes, rounded up; zeros after a shorter one), this rank's copied in first, each
/// unpacked at its displacement at the end (the gaps between blocks left as they were).
struct gathered_blocks {
  std::size_t words = 0;
  int rank = 0;
  receive_places places;
  std::unique_ptr<std::int32_t[]> whole;

  template <class Displacement>
  gathered_blocks(const void* sendbuf, count_type sendcount, MPI_Datatype sendtype, void* recvbuf,
                  const blocks& shape, const Displacement* displs, MPI_Datatype recvtype, int rank_,
                  MPI_Comm comm)
      : words(static_cast<std::size_t>((bytes_of(shape.most, recvtype) + 3) / 4)),
        rank(rank_),
        places(recvbuf, shape, displs, recvtype, rank_, sendbuf == MPI_IN_PLACE, comm),
        whole(std::make_unique_for_overwrite<std::int32_t[]>(
            words * static_cast<std::size_t>(shape.size))) {
    staged in = places.own(sendbuf, sendcount, sendtype, bytes_of(shape.count(rank), recvtype));
    auto* into = reinterpret_cast<std::byte*>(mine());
    squall::kernels::copy_bytes(into, in.bytes(), in.size());
    std::memset(into + in.size(), 0, words * 4 - in.size());
  }
  std::int32_t* mine() { return whole.get() + static_cast<std::size_t>(rank) * words; }
  void unpack() {
    places.unpack([this](std::size_t q) { return whole.get() + q * words; });
  }
};

/// An allgatherv's blocks where squall's allgatherv (`communicator::allgatherv`: on one host
/// each rank reads every peer's block straight into its place) puts them, as 32-bit words:
/// into the receive buffer at this rank's displacements where its datatype lies as its bytes
/// and every place is 4-byte aligned, else into a packed copy (blocks end to end) unpacked
/// afterwards. `mine` is this rank's block.
struct placed_blocks {
  receive_places places;
  std::vector<std::size_t> words;
  std::vector<std::int32_t*> into;
  std::unique_ptr<std::int32_t[]> packed;
  std::optional<staged> own;
  const std::int32_t* mine = nullptr;

  template <class Displacement>
  placed_blocks(const void* sendbuf, count_type sendcount, MPI_Datatype sendtype, void* recvbuf,
                const blocks& shape, const Displacement* displs, MPI_Datatype recvtype, int rank,
                MPI_Comm comm)
      : places(recvbuf, shape, displs, recvtype, rank, sendbuf == MPI_IN_PLACE, comm) {
    const auto me = static_cast<std::size_t>(rank);
    bool direct = layout_of(1, recvtype).contiguous;
    std::size_t total = 0;
    for (const auto& [at, count] : places.at) {
      words.push_back(static_cast<std::size_t>(bytes_of(count, recvtype) / 4));
      total += words.back();
      direct = direct && reinterpret_cast<std::uintptr_t>(at) % alignof(std::int32_t) == 0;
    }
    if (direct) {
      for (const auto& [at, count] : places.at) into.push_back(reinterpret_cast<std::int32_t*>(at));
    } else {
      packed = std::make_unique_for_overwrite<std::int32_t[]>(total);
      for (std::size_t q = 0, at = 0; q < words.size(); at += words[q], ++q) {
        into.push_back(packed.get() + at);
      }
    }
    if (places.in_place && direct) {  // this rank's block is in its place already
      mine = into[me];
      return;
    }
    own.emplace(places.own(sendbuf, sendcount, sendtype, words[me] * 4));
    mine = reinterpret_cast<const std::int32_t*>(own->bytes());
    if (places.in_place || reinterpret_cast<std::uintptr_t>(mine) % alignof(std::int32_t) != 0) {
      squall::kernels::copy_bytes(into[me], own->bytes(), own->size());
      mine = into[me];
    }
  }
  void unpack() {
    if (packed) places.unpack([this](std::size_t q) { return into[q]; });
  }
};

/// An allgatherv's route, the same on every rank: squall takes blocks of whole 32-bit words at
/// any size (as one allgather in place where they are alike and this rank's displacements lay
/// them end to end, else through squall's allgatherv, `placed_blocks`: the displacements are
/// each rank's own, so another rank may gather in place), other blocks only where the packed
/// copy is small (`packable`). Across hosts, where blocks of different sizes travel padded to
/// the largest, only where padding adds at most a quarter of the bytes (decided where the
/// communicator's state is known, alike on every rank).
struct gatherv_route {
  std::uint64_t bytes = 0;   ///< all blocks'
  bool whole_words = false;  ///< every block of whole 32-bit words
  bool packable = false;
  bool padding_cheap = false;  ///< blocks padded to the largest add at most a quarter
  template <class Displacement>
  bool in_place(const blocks& shape, const Displacement* displs) const {
    if (!whole_words || !shape.alike()) return false;
    for (int q = 0; q < shape.size; ++q) {
      if (static_cast<count_type>(displs[q]) != shape.most * q) return false;
    }
    return true;
  }
};
gatherv_route gatherv_route_of(const blocks& shape, MPI_Datatype recvtype) {
  const std::uint64_t block = bytes_of(shape.most, recvtype);
  const std::uint64_t item = bytes_of(1, recvtype);
  gatherv_route r;
  r.bytes = bytes_of(shape.total, recvtype);
  r.whole_words = true;
  for (int q = 0; q < shape.size; ++q) {
    r.whole_words = r.whole_words && static_cast<std::uint64_t>(shape.count(q)) * item % 4 == 0;
  }
  const std::uint64_t padded = (block + 3) / 4 * 4 * static_cast<std::uint64_t>(shape.size);
  r.packable = packable(r.bytes, padded);
  r.padding_cheap = padded * padding_of <= r.bytes * padding_allowed;
  return r;
}

/// MPI_Allgatherv (`Count`: int or MPI_Count; `Displacement`: int or MPI_Aint). Its blocks
/// (`blocks_of`) are the same on every rank (MPI requires every rank to give each block the
/// signature its sender sends), and so is its route (`gatherv_route`).
template <class Count, class Displacement, class Fallback>
int allgatherv_call(const void* sendbuf, count_type sendcount, MPI_Datatype sendtype, void* recvbuf,
                    const Count* recvcounts, const Displacement* displs, MPI_Datatype recvtype,
                    MPI_Comm comm, Fallback fallback) {
  const std::optional<blocks> shape = blocks_of(allgatherv, recvcounts, comm);
  if (!shape) return fallback();
  const gatherv_route route = gatherv_route_of(*shape, recvtype);
  if (!usable(allgatherv, comm, route.bytes) || !(route.whole_words || route.packable)) {
    note(allgatherv, false, route.bytes);
    return fallback();
  }
  int rank = 0;
  PMPI_Comm_rank(comm, &rank);
  bool handled = false;
  const int code = run_state(comm, [&](comm_state& state) {
    tiers* const tiered = shares_tiers(state);
    const bool padded = tiered != nullptr || !state.one_host || !route.whole_words;
    if (padded && !shape->alike() && !route.padding_cheap) return;  // MPI's
    handled = true;
    if (tiered != nullptr && route.in_place(*shape, displs)) {  // the tiers' allgather, in place
      gather_in_place(state, sendbuf, sendcount, sendtype, recvbuf, shape->most, recvtype, rank,
                      shape->size, comm);
      return;
    }
    if (tiered != nullptr || !route.whole_words) {
      gathered_blocks gathered(sendbuf, sendcount, sendtype, recvbuf, *shape, displs, recvtype,
                               rank, comm);
      gather_words(state, gathered.mine(), gathered.whole.get(), gathered.words, shape->size);
      gathered.unpack();
      return;
    }
    placed_blocks placed(sendbuf, sendcount, sendtype, recvbuf, *shape, displs, recvtype, rank,
                         comm);
    std::visit(
        [&](auto& holder) {
          holder.comm->allgatherv(host_view<const std::int32_t>(
                                      placed.mine, placed.words[static_cast<std::size_t>(rank)]),
                                  std::span<const std::size_t>(placed.words),
                                  std::span<std::int32_t* const>(placed.into));
        },
        state.impl);
    placed.unpack();
  });
  note(allgatherv, handled, route.bytes);
  return handled || code != MPI_SUCCESS ? code : fallback();
}

/// MPI_Iallgatherv: started as MPI_Iallgather where in place, else through `gathered_blocks`,
/// which the request holds (the counts and displacements are read here, at the start): alike
/// blocks of whole words at any size (another rank may gather in place), others where the
/// packed copy is small.
template <class Count, class Displacement, class Fallback>
int iallgatherv_call(const void* sendbuf, count_type sendcount, MPI_Datatype sendtype,
                     void* recvbuf, const Count* recvcounts, const Displacement* displs,
                     MPI_Datatype recvtype, MPI_Comm comm, MPI_Request* request,
                     Fallback fallback) {
  const std::optional<blocks> shape = blocks_of(iallgatherv, recvcounts, comm);
  if (!shape) return fallback();
  const gatherv_route route = gatherv_route_of(*shape, recvtype);
  if (route.in_place(*shape, displs)) {
    return iallgather_call(iallgatherv, sendbuf, sendcount, sendtype, recvbuf, shape->most,
                           recvtype, comm, request, fallback);
  }
  bool started = false;
  if (usable_nonblocking(iallgatherv, comm, route.bytes) &&
      ((shape->alike() && route.whole_words) || route.packable)) {
    int code = MPI_SUCCESS;
    int rank = 0;
    PMPI_Comm_rank(comm, &rank);
    const auto gathered = [&] {
      return std::make_shared<gathered_blocks>(sendbuf, sendcount, sendtype, recvbuf, *shape,
                                               displs, recvtype, rank, comm);
    };
    started = start_pending(
        iallgatherv, comm, request, code,
        [&](auto& holder, pending_call& call) {
          auto g = gathered();
          call.work = holder.comm->iallgather(
              host_view<const std::int32_t>(g->mine(), g->words),
              host_view<std::int32_t>(g->whole.get(),
                                      g->words * static_cast<std::size_t>(shape->size)));
          call.finish = [g] { g->unpack(); };
        },
        [&](tiers& t, pending_call& call) {
          if (!t.shares) return false;  // on the whole communicator's MPI transport
          auto g = gathered();
          call.work = t.calls.started(
              t.rank, [&t, g] { tiered_allgather(t, g->mine(), g->whole.get(), g->words); });
          call.finish = [g] { g->unpack(); };
          return true;
        });
    if (code != MPI_SUCCESS) return code;
  }
  note(iallgatherv, started, route.bytes);
  return started ? MPI_SUCCESS : fallback();
}

/// MPI_Reduce_scatter: as MPI_Reduce_scatter_block, its blocks (`blocks_of`) padded where they
/// differ in size, or to MPI.
template <class Count, class Fallback>
int reduce_scatter_call(const void* sendbuf, void* recvbuf, const Count* recvcounts,
                        MPI_Datatype datatype, MPI_Op op, MPI_Comm comm, Fallback fallback) {
  const std::optional<blocks> shape = blocks_of(reduce_scatter, recvcounts, comm);
  if (!shape) return fallback();
  return reduce_scatter_block_call(reduce_scatter, sendbuf, recvbuf, *shape, datatype, op, comm,
                                   fallback);
}

/// MPI_Ireduce_scatter: as MPI_Ireduce_scatter_block, its blocks padded where they differ (the
/// counts are read here, at the start: the request holds what it needs), or to MPI.
template <class Count, class Fallback>
int ireduce_scatter_call(const void* sendbuf, void* recvbuf, const Count* recvcounts,
                         MPI_Datatype datatype, MPI_Op op, MPI_Comm comm, MPI_Request* request,
                         Fallback fallback) {
  const std::optional<blocks> shape = blocks_of(ireduce_scatter, recvcounts, comm);
  if (!shape) return fallback();
  return ireduce_scatter_block_call(ireduce_scatter, sendbuf, recvbuf, *shape, datatype, op, comm,
                                    request, fallback);
}

/// MPI_Ibarrier: squall's barrier, once squall holds `comm` (as the other non-blocking calls).
/// On one host this rank arrives here and the completion calls poll for the others
/// (`communicator::ibarrier`); behind other calls in flight, on squall's progress thread.
template <class Fallback>
int ibarrier_call(MPI_Comm comm, MPI_Request* request, Fallback fallback) {
  bool started = false;
  if (usable(ibarrier, comm, lib().settings.min_bytes)) {
    int code = MPI_SUCCESS;
    started = start_pending(
        ibarrier, comm, request, code,
        [](auto& holder, pending_call& call) {
          call.work = holder.comm->ibarrier();
          call.finish = [] {};
        },
        [](tiers&, pending_call&) { return false; });  // on the whole communicator
    if (code != MPI_SUCCESS) return code;
  }
  note(ibarrier, started, 0);
  return started ? MPI_SUCCESS : fallback();
}

template <class Fallback>
int bcast_call(void* buffer, count_type count, MPI_Datatype datatype, int root, MPI_Comm comm,
               Fallback fallback) {
  const std::uint64_t bytes = bytes_of(count, datatype);
  const bool by_default = lib().settings.bcast_by_default;
  if (!usable(bcast, comm, bytes) || bytes % 4 != 0 ||
      (by_default && bytes > default_bcast_bytes)) {
    note(bcast, false, bytes);
    return fallback();
  }
  // Whether the communicator lies within one host is known once squall holds it (made here
  // if need be: the same call on every rank, so every rank decides alike).
  bool handled = false;
  const int code = run_state(comm, [&](comm_state& state) {
    if (by_default && !state.one_host) return;
    handled = true;
    staged data(buffer, count, datatype, comm);
    int rank = 0;
    PMPI_Comm_rank(comm, &rank);
    if (rank == root) data.pack();
    auto* words = reinterpret_cast<std::int32_t*>(data.bytes());
    const auto n = static_cast<std::size_t>(bytes / 4);
    if (state.hierarchy) {
      state.hierarchy->calls.ordered(state.hierarchy->rank,
                                     [&] { tiered_broadcast(*state.hierarchy, words, n, root); });
      note_tiered();
    } else {
      std::visit(
          [&](auto& holder) { holder.comm->broadcast(host_view<std::int32_t>(words, n), root); },
          state.impl);
    }
    data.unpack();
  });
  note(bcast, handled, bytes);
  return handled || code != MPI_SUCCESS ? code : fallback();
}

}  // namespace

// ---- the intercepted calls ------------------------------------------------------------------

// The library's only exported symbols (it builds with hidden visibility).
#define SQUALL_MPI_EXPORT __attribute__((visibility("default")))

extern "C" {

SQUALL_MPI_EXPORT int MPI_Init(int* argc, char*** argv) {
  const int code = PMPI_Init(argc, argv);
  if (code == MPI_SUCCESS) start();
  return code;
}

SQUALL_MPI_EXPORT int MPI_Init_thread(int* argc, char*** argv, int required, int* provided) {
  const int code = PMPI_Init_thread(argc, argv, required, provided);
  if (code == MPI_SUCCESS) start();
  return code;
}

SQUALL_MPI_EXPORT int MPI_Finalize() {
  stop();
  return PMPI_Finalize();
}

SQUALL_MPI_EXPORT int MPI_Allreduce(const void* sendbuf, void* recvbuf, int count,
                                    MPI_Datatype datatype, MPI_Op op, MPI_Comm comm) {
  return allreduce_call(sendbuf, recvbuf, count, datatype, op, comm, [&] {
    return PMPI_Allreduce(sendbuf, recvbuf, count, datatype, op, comm);
  });
}

SQUALL_MPI_EXPORT int MPI_Iallreduce(const void* sendbuf, void* recvbuf, int count,
                                     MPI_Datatype datatype, MPI_Op op, MPI_Comm comm,
                                     MPI_Request* request) {
  return iallreduce_call(sendbuf, recvbuf, count, datatype, op, comm, request, [&] {
    return PMPI_Iallreduce(sendbuf, recvbuf, count, datatype, op, comm, request);
  });
}

SQUALL_MPI_EXPORT int MPI_Ireduce_scatter_block(const void* sendbuf, void* recvbuf, int recvcount,
                                                MPI_Datatype datatype, MPI_Op op, MPI_Comm comm,
                                                MPI_Request* request) {
  return ireduce_scatter_block_call(ireduce_scatter_block, sendbuf, recvbuf,
                                    same_blocks(recvcount, comm), datatype, op, comm, request, [&] {
                                      return PMPI_Ireduce_scatter_block(
                                          sendbuf, recvbuf, recvcount, datatype, op, comm, request);
                                    });
}

SQUALL_MPI_EXPORT int MPI_Ireduce_scatter(const void* sendbuf, void* recvbuf,
                                          const int recvcounts[], MPI_Datatype datatype, MPI_Op op,
                                          MPI_Comm comm, MPI_Request* request) {
  return ireduce_scatter_call(sendbuf, recvbuf, recvcounts, datatype, op, comm, request, [&] {
    return PMPI_Ireduce_scatter(sendbuf, recvbuf, recvcounts, datatype, op, comm, request);
  });
}

SQUALL_MPI_EXPORT int MPI_Iallgather(const void* sendbuf, int sendcount, MPI_Datatype sendtype,
                                     void* recvbuf, int recvcount, MPI_Datatype recvtype,
                                     MPI_Comm comm, MPI_Request* request) {
  return iallgather_call(iallgather, sendbuf, sendcount, sendtype, recvbuf, recvcount, recvtype,
                         comm, request, [&] {
                           return PMPI_Iallgather(sendbuf, sendcount, sendtype, recvbuf, recvcount,
                                                  recvtype, comm, request);
                         });
}

SQUALL_MPI_EXPORT int MPI_Iallgatherv(const void* sendbuf, int sendcount, MPI_Datatype sendtype,
                                      void* recvbuf, const int recvcounts[], const int displs[],
                                      MPI_Datatype recvtype, MPI_Comm comm, MPI_Request* request) {
  return iallgatherv_call(sendbuf, sendcount, sendtype, recvbuf, recvcounts, displs, recvtype, comm,
                          request, [&] {
                            return PMPI_Iallgatherv(sendbuf, sendcount, sendtype, recvbuf,
                                                    recvcounts, displs, recvtype, comm, request);
                          });
}

SQUALL_MPI_EXPORT int MPI_Ibarrier(MPI_Comm comm, MPI_Request* request) {
  return ibarrier_call(comm, request, [&] { return PMPI_Ibarrier(comm, request); });
}

SQUALL_MPI_EXPORT int MPI_Ibcast(void* buffer, int count, MPI_Datatype datatype, int root,
                                 MPI_Comm comm, MPI_Request* request) {
  return ibcast_call(buffer, count, datatype, root, comm, request,
                     [&] { return PMPI_Ibcast(buffer, count, datatype, root, comm, request); });
}

// The completion calls, for the non-blocking requests squall runs (`wait_polling`).
SQUALL_MPI_EXPORT int MPI_Wait(MPI_Request* request, MPI_Status* status) {
  return wait_polling(1, request, [&](int* flag) {
    return flag == nullptr ? PMPI_Wait(request, status) : PMPI_Test(request, flag, status);
  });
}

SQUALL_MPI_EXPORT int MPI_Waitall(int count, MPI_Request requests[], MPI_Status statuses[]) {
  return wait_polling(count, requests, [&](int* flag) {
    return flag == nullptr ? PMPI_Waitall(count, requests, statuses)
                           : PMPI_Testall(count, requests, flag, statuses);
  });
}

SQUALL_MPI_EXPORT int MPI_Waitany(int count, MPI_Request requests[], int* index,
                                  MPI_Status* status) {
  return wait_polling(count, requests, [&](int* flag) {
    return flag == nullptr ? PMPI_Waitany(count, requests, index, status)
                           : PMPI_Testany(count, requests, index, flag, status);
  });
}

SQUALL_MPI_EXPORT int MPI_Waitsome(int incount, MPI_Request requests[], int* outcount,
                                   int indices[], MPI_Status statuses[]) {
  return wait_polling(incount, requests, [&](int* flag) {
    if (flag == nullptr) return PMPI_Waitsome(incount, requests, outcount, indices, statuses);
    const int code = PMPI_Testsome(incount, requests, outcount, indices, statuses);
    *flag = *outcount != 0 ? 1 : 0;  // some completed, or none was active (MPI_UNDEFINED)
    return code;
  });
}

SQUALL_MPI_EXPORT int MPI_Test(MPI_Request* request, int* flag, MPI_Status* status) {
  settle(1, request);
  return PMPI_Test(request, flag, status);
}

SQUALL_MPI_EXPORT int MPI_Testall(int count, MPI_Request requests[], int* flag,
                                  MPI_Status statuses[]) {
  settle(count, requests);
  return PMPI_Testall(count, requests, flag, statuses);
}

SQUALL_MPI_EXPORT int MPI_Testany(int count, MPI_Request requests[], int* index, int* flag,
                                  MPI_Status* status) {
  settle(count, requests);
  return PMPI_Testany(count, requests, index, flag, status);
}

SQUALL_MPI_EXPORT int MPI_Testsome(int incount, MPI_Request requests[], int* outcount,
                                   int indices[], MPI_Status statuses[]) {
  settle(incount, requests);
  return PMPI_Testsome(incount, requests, outcount, indices, statuses);
}

SQUALL_MPI_EXPORT int MPI_Request_get_status(MPI_Request request, int* flag, MPI_Status* status) {
  settle(1, &request);
  return PMPI_Request_get_status(request, flag, status);
}

SQUALL_MPI_EXPORT int MPI_Request_free(MPI_Request* request) {
  MPI_Comm user = MPI_COMM_NULL;
  if (squall_runs(*request, &user)) return refuse("MPI_Request_free", user);
  return PMPI_Request_free(request);
}

SQUALL_MPI_EXPORT int MPI_Cancel(MPI_Request* request) {
  MPI_Comm user = MPI_COMM_NULL;
  if (squall_runs(*request, &user)) return refuse("MPI_Cancel", user);
  return PMPI_Cancel(request);
}

SQUALL_MPI_EXPORT int MPI_Reduce_scatter_block(const void* sendbuf, void* recvbuf, int recvcount,
                                               MPI_Datatype datatype, MPI_Op op, MPI_Comm comm) {
  return reduce_scatter_block_call(
      reduce_scatter_block, sendbuf, recvbuf, same_blocks(recvcount, comm), datatype, op, comm,
      [&] { return PMPI_Reduce_scatter_block(sendbuf, recvbuf, recvcount, datatype, op, comm); });
}

SQUALL_MPI_EXPORT int MPI_Reduce_scatter(const void* sendbuf, void* recvbuf, const int recvcounts[],
                                         MPI_Datatype datatype, MPI_Op op, MPI_Comm comm) {
  return reduce_scatter_call(sendbuf, recvbuf, recvcounts, datatype, op, comm, [&] {
    return PMPI_Reduce_scatter(sendbuf, recvbuf, recvcounts, datatype, op, comm);
  });
}

SQUALL_MPI_EXPORT int MPI_Allgatherv(const void* sendbuf, int sendcount, MPI_Datatype sendtype,
                                     void* recvbuf, const int recvcounts[], const int displs[],
                                     MPI_Datatype recvtype, MPI_Comm comm) {
  return allgatherv_call(sendbuf, sendcount, sendtype, recvbuf, recvcounts, displs, recvtype, comm,
                         [&] {
                           return PMPI_Allgatherv(sendbuf, sendcount, sendtype, recvbuf, recvcounts,
                                                  displs, recvtype, comm);
                         });
}

SQUALL_MPI_EXPORT int MPI_Allgather(const void* sendbuf, int sendcount, MPI_Datatype sendtype,
                                    void* recvbuf, int recvcount, MPI_Datatype recvtype,
                                    MPI_Comm comm) {
  return allgather_call(
      allgather, sendbuf, sendcount, sendtype, recvbuf, recvcount, recvtype, comm, [&] {
        return PMPI_Allgather(sendbuf, sendcount, sendtype, recvbuf, recvcount, recvtype, comm);
      });
}

SQUALL_MPI_EXPORT int MPI_Bcast(void* buffer, int count, MPI_Datatype datatype, int root,
                                MPI_Comm comm) {
  return bcast_call(buffer, count, datatype, root, comm,
                    [&] { return PMPI_Bcast(buffer, count, datatype, root, comm); });
}

#if MPI_VERSION >= 4
// The large-count forms of MPI 4 (MPICH 4; Open MPI 4.1 has none).
SQUALL_MPI_EXPORT int MPI_Allreduce_c(const void* sendbuf, void* recvbuf, MPI_Count count,
                                      MPI_Datatype datatype, MPI_Op op, MPI_Comm comm) {
  return allreduce_call(sendbuf, recvbuf, count, datatype, op, comm, [&] {
    return PMPI_Allreduce_c(sendbuf, recvbuf, count, datatype, op, comm);
  });
}

SQUALL_MPI_EXPORT int MPI_Iallreduce_c(const void* sendbuf, void* recvbuf, MPI_Count count,
                                       MPI_Datatype datatype, MPI_Op op, MPI_Comm comm,
                                       MPI_Request* request) {
  return iallreduce_call(sendbuf, recvbuf, count, datatype, op, comm, request, [&] {
    return PMPI_Iallreduce_c(sendbuf, recvbuf, count, datatype, op, comm, request);
  });
}

SQUALL_MPI_EXPORT int MPI_Reduce_scatter_block_c(const void* sendbuf, void* recvbuf,
                                                 MPI_Count recvcount, MPI_Datatype datatype,
                                                 MPI_Op op, MPI_Comm comm) {
  return reduce_scatter_block_call(
      reduce_scatter_block, sendbuf, recvbuf, same_blocks(recvcount, comm), datatype, op, comm,
      [&] { return PMPI_Reduce_scatter_block_c(sendbuf, recvbuf, recvcount, datatype, op, comm); });
}

SQUALL_MPI_EXPORT int MPI_Reduce_scatter_c(const void* sendbuf, void* recvbuf,
                                           const MPI_Count recvcounts[], MPI_Datatype datatype,
                                           MPI_Op op, MPI_Comm comm) {
  return reduce_scatter_call(sendbuf, recvbuf, recvcounts, datatype, op, comm, [&] {
    return PMPI_Reduce_scatter_c(sendbuf, recvbuf, recvcounts, datatype, op, comm);
  });
}

SQUALL_MPI_EXPORT int MPI_Allgatherv_c(const void* sendbuf, MPI_Count sendcount,
                                       MPI_Datatype sendtype, void* recvbuf,
                                       const MPI_Count recvcounts[], const MPI_Aint displs[],
                                       MPI_Datatype recvtype, MPI_Comm comm) {
  return allgatherv_call(sendbuf, sendcount, sendtype, recvbuf, recvcounts, displs, recvtype, comm,
                         [&] {
                           return PMPI_Allgatherv_c(sendbuf, sendcount, sendtype, recvbuf,
                                                    recvcounts, displs, recvtype, comm);
                         });
}

SQUALL_MPI_EXPORT int MPI_Allgather_c(const void* sendbuf, MPI_Count sendcount,
                                      MPI_Datatype sendtype, void* recvbuf, MPI_Count recvcount,
                                      MPI_Datatype recvtype, MPI_Comm comm) {
  return allgather_call(
      allgather, sendbuf, sendcount, sendtype, recvbuf, recvcount, recvtype, comm, [&] {
        return PMPI_Allgather_c(sendbuf, sendcount, sendtype, recvbuf, recvcount, recvtype, comm);
      });
}

SQUALL_MPI_EXPORT int MPI_Bcast_c(void* buffer, MPI_Count count, MPI_Datatype datatype, int root,
                                  MPI_Comm comm) {
  return bcast_call(buffer, count, datatype, root, comm,
                    [&] { return PMPI_Bcast_c(buffer, count, datatype, root, comm); });
}

SQUALL_MPI_EXPORT int MPI_Ireduce_scatter_block_c(const void* sendbuf, void* recvbuf,
                                                  MPI_Count recvcount, MPI_Datatype datatype,
                                                  MPI_Op op, MPI_Comm comm, MPI_Request* request) {
  return ireduce_scatter_block_call(ireduce_scatter_block, sendbuf, recvbuf,
                                    same_blocks(recvcount, comm), datatype, op, comm, request, [&] {
                                      return PMPI_Ireduce_scatter_block_c(
                                          sendbuf, recvbuf, recvcount, datatype, op, comm, request);
                                    });
}

SQUALL_MPI_EXPORT int MPI_Ireduce_scatter_c(const void* sendbuf, void* recvbuf,
                                            const MPI_Count recvcounts[], MPI_Datatype datatype,
                                            MPI_Op op, MPI_Comm comm, MPI_Request* request) {
  return ireduce_scatter_call(sendbuf, recvbuf, recvcounts, datatype, op, comm, request, [&] {
    return PMPI_Ireduce_scatter_c(sendbuf, recvbuf, recvcounts, datatype, op, comm, request);
  });
}

SQUALL_MPI_EXPORT int MPI_Iallgather_c(const void* sendbuf, MPI_Count sendcount,
                                       MPI_Datatype sendtype, void* recvbuf, MPI_Count recvcount,
                                       MPI_Datatype recvtype, MPI_Comm comm, MPI_Request* request) {
  return iallgather_call(iallgather, sendbuf, sendcount, sendtype, recvbuf, recvcount, recvtype,
                         comm, request, [&] {
                           return PMPI_Iallgather_c(sendbuf, sendcount, sendtype, recvbuf,
                                                    recvcount, recvtype, comm, request);
                         });
}

SQUALL_MPI_EXPORT int MPI_Iallgatherv_c(const void* sendbuf, MPI_Count sendcount,
                                        MPI_Datatype sendtype, void* recvbuf,
                                        const MPI_Count recvcounts[], const MPI_Aint displs[],
                                        MPI_Datatype recvtype, MPI_Comm comm,
                                        MPI_Request* request) {
  return iallgatherv_call(sendbuf, sendcount, sendtype, recvbuf, recvcounts, displs, recvtype, comm,
                          request, [&] {
                            return PMPI_Iallgatherv_c(sendbuf, sendcount, sendtype, recvbuf,
                                                      recvcounts, displs, recvtype, comm, request);
                          });
}

SQUALL_MPI_EXPORT int MPI_Ibcast_c(void* buffer, MPI_Count count, MPI_Datatype datatype, int root,
                                   MPI_Comm comm, MPI_Request* request) {
  return ibcast_call(buffer, count, datatype, root, comm, request,
                     [&] { return PMPI_Ibcast_c(buffer, count, datatype, root, comm, request); });
}
#endif

SQUALL_MPI_EXPORT int MPI_Barrier(MPI_Comm comm) {
  if (!usable(barrier, comm, lib().settings.min_bytes) || existing_state(comm) == nullptr) {
    note(barrier, false, 0);
    return PMPI_Barrier(comm);
  }
  note(barrier, true, 0);
  return run(comm, [](auto& holder) { holder.comm->barrier(); });
}

/// For tests and tools: this process's calls so far (allreduce, reduce_scatter_block, allgather,
/// bcast) that squall ran in tiers (shared memory inside nodes, MPI across them).
SQUALL_MPI_EXPORT unsigned long long squall_mpi_tiered_calls() {
  const std::lock_guard guard(lib().lock);
  return lib().tiered;
}

/// For tests and tools: this process's calls so far handled by squall (`handled`, of which
/// `compressed` were float sums it compressed) and passed to MPI (`passed`), over all the
/// collectives; returns whether squall is on (1) or off (0). Any pointer may be null.
SQUALL_MPI_EXPORT int squall_mpi_counts(unsigned long long* handled, unsigned long long* passed,
                                        unsigned long long* compressed) {
  library& l = lib();
  const std::lock_guard guard(l.lock);
  unsigned long long h = 0, p = 0;
  for (const auto& calls : snapshot(l.count.calls)) {
    h += calls[0];
    p += calls[1];
  }
  if (handled != nullptr) *handled = h;
  if (passed != nullptr) *passed = p;
  if (compressed != nullptr) *compressed = l.compressed;
  return l.on ? 1 : 0;
}

}  // extern "C"

// ---- Fortran: mpif.h, `use mpi` and `use mpi_f08`
// ------------------------------------------------
//
// Open MPI's Fortran bindings call PMPI_* directly (`mpi_allreduce_` in libmpi_mpifh, what
// gfortran calls for mpif.h and `use mpi`, is a weak alias of `ompi_allreduce_f`, which
// `use mpi_f08`'s `mpi_allreduce_f08_` calls too), so a Fortran program never reaches the C
// functions above. These take both names of the calls squall takes, convert the handles and
// Fortran's MPI_IN_PLACE and call the C forms; MPI_Init, MPI_Init_thread and MPI_Finalize call
// the MPI's own binding (the next definition after this library: dlsym RTLD_NEXT) and start
// or stop squall as the C forms do. Where this library does not know the MPI's Fortran
// MPI_IN_PLACE and MPI_BOTTOM (Open MPI's `mpi_fortran_in_place_` and `mpi_fortran_bottom_`),
// and for any buffer that is MPI_BOTTOM, a call goes to the MPI's own binding unchanged.
// MPICH's mpif.h and `use mpi` bindings go that way and are still taken: they call the C
// MPI_* functions above (its `use mpi_f08` bindings call PMPI_* from internal functions, and
// are not). Other compilers' name manglings are not taken: they reach MPI as before.
//
// The non-blocking forms are taken from mpif.h and `use mpi` (gfortran's names) only, with
// the completion calls (MPI_Wait, MPI_Test, their -all, -any and -some forms,
// MPI_Request_get_status, MPI_Request_free, MPI_Cancel), which under Open MPI call PMPI_*
// directly and would never complete squall's generalized requests: these look the requests
// up (their C handles), complete squall's finished ones, then call the MPI's own binding, a
// blocking one polling the binding of its test form meanwhile, as the C forms do. Not from
// `use mpi_f08`: Open MPI's MPI_Test there calls `pmpi_test_`, the Fortran profiling name,
// which a tool library must not define, so a program polling squall's request with it would
// never see it complete; its non-blocking calls go to MPI.

namespace {

/// The MPI's own Fortran binding `name` (the next definition after this library's).
template <class F>
F fortran_binding(const char* name) {
  void* f = dlsym(RTLD_NEXT, name);
  if (f == nullptr) {
    std::fprintf(stderr, "squall_mpi: the MPI library has no Fortran binding %s\n", name);
    std::abort();
  }
  return reinterpret_cast<F>(f);
}

/// Fortran's MPI_IN_PLACE and MPI_BOTTOM (their addresses), where this MPI is known.
struct fortran_sentinels {
  const void* in_place = nullptr;
  const void* bottom = nullptr;
  bool known() const { return in_place != nullptr && bottom != nullptr; }
};

const fortran_sentinels& sentinels() {
  static const fortran_sentinels s{dlsym(RTLD_DEFAULT, "mpi_fortran_in_place_"),
                                   dlsym(RTLD_DEFAULT, "mpi_fortran_bottom_")};
  return s;
}

/// Whether a Fortran call with these buffers can go to the C function: the sentinels known
/// and no buffer MPI_BOTTOM.
bool fortran_takes(const void* a, const void* b = nullptr) {
  const fortran_sentinels& s = sentinels();
  return s.known() && a != s.bottom && b != s.bottom;
}

const void* fortran_send(const void* buffer) {
  return buffer == sentinels().in_place ? MPI_IN_PLACE : buffer;
}

using init_f = void (*)(MPI_Fint*);
using init_thread_f = void (*)(MPI_Fint*, MPI_Fint*, MPI_Fint*);
using reduce_f = void (*)(void*, void*, MPI_Fint*, MPI_Fint*, MPI_Fint*, MPI_Fint*, MPI_Fint*);
using allgather_f = void (*)(void*, MPI_Fint*, MPI_Fint*, void*, MPI_Fint*, MPI_Fint*, MPI_Fint*,
                             MPI_Fint*);
using bcast_f = void (*)(void*, MPI_Fint*, MPI_Fint*, MPI_Fint*, MPI_Fint*, MPI_Fint*);
using allgatherv_f = void (*)(void*, MPI_Fint*, MPI_Fint*, void*, MPI_Fint*, MPI_Fint*, MPI_Fint*,
                              MPI_Fint*, MPI_Fint*);
using reduce_scatter_f = void (*)(void*, void*, MPI_Fint*, MPI_Fint*, MPI_Fint*, MPI_Fint*,
                                  MPI_Fint*);

// The calls, each given its name's own binding (`mpi()`, looked up on first use).
template <class Binding>
void fortran_init(Binding mpi, MPI_Fint* ierr) {
  mpi()(ierr);
  if (*ierr == MPI_SUCCESS) start();
}

template <class Binding>
void fortran_init_thread(Binding mpi, MPI_Fint* required, MPI_Fint* provided, MPI_Fint* ierr) {
  mpi()(required, provided, ierr);
  if (*ierr == MPI_SUCCESS) start();
}

template <class Binding>
void fortran_finalize(Binding mpi, MPI_Fint* ierr) {
  stop();
  mpi()(ierr);
}

template <class Binding>
void fortran_allreduce(Binding mpi, void* sendbuf, void* recvbuf, MPI_Fint* count,
                       MPI_Fint* datatype, MPI_Fint* op, MPI_Fint* comm, MPI_Fint* ierr) {
  if (!fortran_takes(sendbuf, recvbuf))
    return mpi()(sendbuf, recvbuf, count, datatype, op, comm, ierr);
  *ierr = MPI_Allreduce(fortran_send(sendbuf), recvbuf, *count, MPI_Type_f2c(*datatype),
                        MPI_Op_f2c(*op), MPI_Comm_f2c(*comm));
}

template <class Binding>
void fortran_reduce_scatter_block(Binding mpi, void* sendbuf, void* recvbuf, MPI_Fint* recvcount,
                                  MPI_Fint* datatype, MPI_Fint* op, MPI_Fint* comm,
                                  MPI_Fint* ierr) {
  if (!fortran_takes(sendbuf, recvbuf)) {
    return mpi()(sendbuf, recvbuf, recvcount, datatype, op, comm, ierr);
  }
  *ierr = MPI_Reduce_scatter_block(fortran_send(sendbuf), recvbuf, *recvcount,
                                   MPI_Type_f2c(*datatype), MPI_Op_f2c(*op), MPI_Comm_f2c(*comm));
}

template <class Binding>
void fortran_allgather(Binding mpi, void* sendbuf, MPI_Fint* sendcount, MPI_Fint* sendtype,
                       void* recvbuf, MPI_Fint* recvcount, MPI_Fint* recvtype, MPI_Fint* comm,
                       MPI_Fint* ierr) {
  if (!fortran_takes(sendbuf, recvbuf)) {
    return mpi()(sendbuf, sendcount, sendtype, recvbuf, recvcount, recvtype, comm, ierr);
  }
  *ierr = MPI_Allgather(fortran_send(sendbuf), *sendcount, MPI_Type_f2c(*sendtype), recvbuf,
                        *recvcount, MPI_Type_f2c(*recvtype), MPI_Comm_f2c(*comm));
}

template <class Binding>
void fortran_bcast(Binding mpi, void* buffer, MPI_Fint* count, MPI_Fint* datatype, MPI_Fint* root,
                   MPI_Fint* comm, MPI_Fint* ierr) {
  if (!fortran_takes(buffer)) return mpi()(buffer, count, datatype, root, comm, ierr);
  *ierr = MPI_Bcast(buffer, *count, MPI_Type_f2c(*datatype), *root, MPI_Comm_f2c(*comm));
}

void fortran_barrier(MPI_Fint* comm, MPI_Fint* ierr) { *ierr = MPI_Barrier(MPI_Comm_f2c(*comm)); }

// The -v forms' count arrays go to the C forms as they are where Fortran's integer is C's int
// (Open MPI and MPICH as Debian builds them); elsewhere such a call goes to the MPI's own binding.
constexpr bool fortran_integer_is_int = std::is_same_v<MPI_Fint, int>;

template <class Binding>
void fortran_allgatherv(Binding mpi, void* sendbuf, MPI_Fint* sendcount, MPI_Fint* sendtype,
                        void* recvbuf, MPI_Fint* recvcounts, MPI_Fint* displs, MPI_Fint* recvtype,
                        MPI_Fint* comm, MPI_Fint* ierr) {
  if constexpr (fortran_integer_is_int) {
    if (fortran_takes(sendbuf, recvbuf)) {
      *ierr = MPI_Allgatherv(fortran_send(sendbuf), *sendcount, MPI_Type_f2c(*sendtype), recvbuf,
                             recvcounts, displs, MPI_Type_f2c(*recvtype), MPI_Comm_f2c(*comm));
      return;
    }
  }
  mpi()(sendbuf, sendcount, sendtype, recvbuf, recvcounts, displs, recvtype, comm, ierr);
}

template <class Binding>
void fortran_reduce_scatter(Binding mpi, void* sendbuf, void* recvbuf, MPI_Fint* recvcounts,
                            MPI_Fint* datatype, MPI_Fint* op, MPI_Fint* comm, MPI_Fint* ierr) {
  if constexpr (fortran_integer_is_int) {
    if (fortran_takes(sendbuf, recvbuf)) {
      *ierr = MPI_Reduce_scatter(fortran_send(sendbuf), recvbuf, recvcounts,
                                 MPI_Type_f2c(*datatype), MPI_Op_f2c(*op), MPI_Comm_f2c(*comm));
      return;
    }
  }
  mpi()(sendbuf, recvbuf, recvcounts, datatype, op, comm, ierr);
}

// ---- the non-blocking forms (mpif.h and `use mpi`) and their completion calls

using ireduce_f = void (*)(void*, void*, MPI_Fint*, MPI_Fint*, MPI_Fint*, MPI_Fint*, MPI_Fint*,
                           MPI_Fint*);
using iallgather_f = void (*)(void*, MPI_Fint*, MPI_Fint*, void*, MPI_Fint*, MPI_Fint*, MPI_Fint*,
                              MPI_Fint*, MPI_Fint*);
using iallgatherv_f = void (*)(void*, MPI_Fint*, MPI_Fint*, void*, MPI_Fint*, MPI_Fint*, MPI_Fint*,
                               MPI_Fint*, MPI_Fint*, MPI_Fint*);
using ibcast_f = void (*)(void*, MPI_Fint*, MPI_Fint*, MPI_Fint*, MPI_Fint*, MPI_Fint*, MPI_Fint*);
using ibarrier_f = void (*)(MPI_Fint*, MPI_Fint*, MPI_Fint*);
using wait_f = void (*)(MPI_Fint*, MPI_Fint*, MPI_Fint*);
using test_f = void (*)(MPI_Fint*, MPI_Fint*, MPI_Fint*, MPI_Fint*);
using waitall_f = void (*)(MPI_Fint*, MPI_Fint*, MPI_Fint*, MPI_Fint*);
using testall_f = void (*)(MPI_Fint*, MPI_Fint*, MPI_Fint*, MPI_Fint*, MPI_Fint*);
using waitany_f = void (*)(MPI_Fint*, MPI_Fint*, MPI_Fint*, MPI_Fint*, MPI_Fint*);
using testany_f = void (*)(MPI_Fint*, MPI_Fint*, MPI_Fint*, MPI_Fint*, MPI_Fint*, MPI_Fint*);
using some_f = void (*)(MPI_Fint*, MPI_Fint*, MPI_Fint*, MPI_Fint*, MPI_Fint*, MPI_Fint*);
using free_f = void (*)(MPI_Fint*, MPI_Fint*);

/// A non-blocking start: `start(&c)` (the C form, into a C request) where the buffers allow
/// (`takes`), the Fortran handle of `c` into `request`; else the MPI's own binding with the
/// call's arguments (`args`, then `request` and `ierr`).
template <class Binding, class Start, class... Args>
void fortran_start(Binding mpi, bool takes, MPI_Fint* request, MPI_Fint* ierr, Start&& start,
                   Args... args) {
  if (!takes) return mpi()(args..., request, ierr);
  MPI_Request c = MPI_REQUEST_NULL;
  *ierr = start(&c);
  if (*ierr == MPI_SUCCESS) *request = MPI_Request_c2f(c);
}

/// The C handles of `n` Fortran requests (what `library::pending` is keyed on), in a buffer of
/// this thread's that a test polled in a loop reuses (no allocation per call; the MPI's own
/// bindings called meanwhile never come back here).
const std::vector<MPI_Request>& c_requests(MPI_Fint n, const MPI_Fint* requests) {
  thread_local std::vector<MPI_Request> c;
  c.resize(static_cast<std::size_t>(std::max<MPI_Fint>(n, 0)));
  for (std::size_t i = 0; i < c.size(); ++i) c[i] = MPI_Request_f2c(requests[i]);
  return c;
}

/// A Fortran test call: squall's finished requests among `requests` completed, then the
/// MPI's own binding (`test()`).
template <class Test>
void fortran_test(MPI_Fint n, const MPI_Fint* requests, Test&& test) {
  if (lib().in_flight.load(std::memory_order_acquire) != 0) {
    const std::vector<MPI_Request>& c = c_requests(n, requests);
    settle(static_cast<int>(c.size()), c.data());
  }
  test();
}

/// A blocking Fortran completion call: the MPI's own binding (`wait()`) when none of
/// `requests` is squall's, else `wait_polling` over squall's and the binding of the test form
/// (`test()`, which sets `*ierr` and returns whether the call is done).
template <class Wait, class Test>
void fortran_wait(MPI_Fint n, const MPI_Fint* requests, MPI_Fint* ierr, Wait&& wait, Test&& test) {
  if (lib().in_flight.load(std::memory_order_acquire) == 0) return wait();
  const std::vector<MPI_Request>& c = c_requests(n, requests);
  wait_polling(static_cast<int>(c.size()), c.data(), [&](int* flag) {
    if (flag == nullptr) {
      wait();
    } else {
      *flag = test() ? 1 : 0;
    }
    return *ierr;
  });
}

/// MPI_Request_free and MPI_Cancel: refused for a pending call squall runs, as in C.
template <class Binding>
void fortran_free(const char* what, Binding mpi, MPI_Fint* request, MPI_Fint* ierr) {
  MPI_Comm user = MPI_COMM_NULL;
  if (squall_runs(MPI_Request_f2c(*request), &user)) {
    *ierr = refuse(what, user);
    return;
  }
  mpi()(request, ierr);
}

}  // namespace

// The binding of `name`, looked up once, on first use.
#define SQUALL_MPI_FORTRAN_BINDING(type, name)         \
  [] {                                                 \
    static const type f = fortran_binding<type>(name); \
    return f;                                          \
  }

extern "C" {

// gfortran's names (mpif.h, `use mpi`), then Open MPI's (`use mpi_f08`)
SQUALL_MPI_EXPORT void mpi_init_(MPI_Fint* ierr) {
  fortran_init(SQUALL_MPI_FORTRAN_BINDING(init_f, "mpi_init_"), ierr);
}
SQUALL_MPI_EXPORT void ompi_init_f(MPI_Fint* ierr) {
  fortran_init(SQUALL_MPI_FORTRAN_BINDING(init_f, "ompi_init_f"), ierr);
}

SQUALL_MPI_EXPORT void mpi_init_thread_(MPI_Fint* required, MPI_Fint* provided, MPI_Fint* ierr) {
  fortran_init_thread(SQUALL_MPI_FORTRAN_BINDING(init_thread_f, "mpi_init_thread_"), required,
                      provided, ierr);
}
SQUALL_MPI_EXPORT void ompi_init_thread_f(MPI_Fint* required, MPI_Fint* provided, MPI_Fint* ierr) {
  fortran_init_thread(SQUALL_MPI_FORTRAN_BINDING(init_thread_f, "ompi_init_thread_f"), required,
                      provided, ierr);
}

SQUALL_MPI_EXPORT void mpi_finalize_(MPI_Fint* ierr) {
  fortran_finalize(SQUALL_MPI_FORTRAN_BINDING(init_f, "mpi_finalize_"), ierr);
}
SQUALL_MPI_EXPORT void ompi_finalize_f(MPI_Fint* ierr) {
  fortran_finalize(SQUALL_MPI_FORTRAN_BINDING(init_f, "ompi_finalize_f"), ierr);
}

SQUALL_MPI_EXPORT void mpi_allreduce_(void* sendbuf, void* recvbuf, MPI_Fint* count,
                                      MPI_Fint* datatype, MPI_Fint* op, MPI_Fint* comm,
                                      MPI_Fint* ierr) {
  fortran_allreduce(SQUALL_MPI_FORTRAN_BINDING(reduce_f, "mpi_allreduce_"), sendbuf, recvbuf, count,
                    datatype, op, comm, ierr);
}
SQUALL_MPI_EXPORT void ompi_allreduce_f(void* sendbuf, void* recvbuf, MPI_Fint* count,
                                        MPI_Fint* datatype, MPI_Fint* op, MPI_Fint* comm,
                                        MPI_Fint* ierr) {
  fortran_allreduce(SQUALL_MPI_FORTRAN_BINDING(reduce_f, "ompi_allreduce_f"), sendbuf, recvbuf,
                    count, datatype, op, comm, ierr);
}

SQUALL_MPI_EXPORT void mpi_reduce_scatter_block_(void* sendbuf, void* recvbuf, MPI_Fint* recvcount,
                                                 MPI_Fint* datatype, MPI_Fint* op, MPI_Fint* comm,
                                                 MPI_Fint* ierr) {
  fortran_reduce_scatter_block(SQUALL_MPI_FORTRAN_BINDING(reduce_f, "mpi_reduce_scatter_block_"),
                               sendbuf, recvbuf, recvcount, datatype, op, comm, ierr);
}
SQUALL_MPI_EXPORT void ompi_reduce_scatter_block_f(void* sendbuf, void* recvbuf,
                                                   MPI_Fint* recvcount, MPI_Fint* datatype,
                                                   MPI_Fint* op, MPI_Fint* comm, MPI_Fint* ierr) {
  fortran_reduce_scatter_block(SQUALL_MPI_FORTRAN_BINDING(reduce_f, "ompi_reduce_scatter_block_f"),
                               sendbuf, recvbuf, recvcount, datatype, op, comm, ierr);
}

SQUALL_MPI_EXPORT void mpi_allgather_(void* sendbuf, MPI_Fint* sendcount, MPI_Fint* sendtype,
                                      void* recvbuf, MPI_Fint* recvcount, MPI_Fint* recvtype,
                                      MPI_Fint* comm, MPI_Fint* ierr) {
  fortran_allgather(SQUALL_MPI_FORTRAN_BINDING(allgather_f, "mpi_allgather_"), sendbuf, sendcount,
                    sendtype, recvbuf, recvcount, recvtype, comm, ierr);
}
SQUALL_MPI_EXPORT void ompi_allgather_f(void* sendbuf, MPI_Fint* sendcount, MPI_Fint* sendtype,
                                        void* recvbuf, MPI_Fint* recvcount, MPI_Fint* recvtype,
                                        MPI_Fint* comm, MPI_Fint* ierr) {
  fortran_allgather(SQUALL_MPI_FORTRAN_BINDING(allgather_f, "ompi_allgather_f"), sendbuf, sendcount,
                    sendtype, recvbuf, recvcount, recvtype, comm, ierr);
}

SQUALL_MPI_EXPORT void mpi_bcast_(void* buffer, MPI_Fint* count, MPI_Fint* datatype, MPI_Fint* root,
                                  MPI_Fint* comm, MPI_Fint* ierr) {
  fortran_bcast(SQUALL_MPI_FORTRAN_BINDING(bcast_f, "mpi_bcast_"), buffer, count, datatype, root,
                comm, ierr);
}
SQUALL_MPI_EXPORT void ompi_bcast_f(void* buffer, MPI_Fint* count, MPI_Fint* datatype,
                                    MPI_Fint* root, MPI_Fint* comm, MPI_Fint* ierr) {
  fortran_bcast(SQUALL_MPI_FORTRAN_BINDING(bcast_f, "ompi_bcast_f"), buffer, count, datatype, root,
                comm, ierr);
}

SQUALL_MPI_EXPORT void mpi_allgatherv_(void* sendbuf, MPI_Fint* sendcount, MPI_Fint* sendtype,
                                       void* recvbuf, MPI_Fint* recvcounts, MPI_Fint* displs,
                                       MPI_Fint* recvtype, MPI_Fint* comm, MPI_Fint* ierr) {
  fortran_allgatherv(SQUALL_MPI_FORTRAN_BINDING(allgatherv_f, "mpi_allgatherv_"), sendbuf,
                     sendcount, sendtype, recvbuf, recvcounts, displs, recvtype, comm, ierr);
}
SQUALL_MPI_EXPORT void ompi_allgatherv_f(void* sendbuf, MPI_Fint* sendcount, MPI_Fint* sendtype,
                                         void* recvbuf, MPI_Fint* recvcounts, MPI_Fint* displs,
                                         MPI_Fint* recvtype, MPI_Fint* comm, MPI_Fint* ierr) {
  fortran_allgatherv(SQUALL_MPI_FORTRAN_BINDING(allgatherv_f, "ompi_allgatherv_f"), sendbuf,
                     sendcount, sendtype, recvbuf, recvcounts, displs, recvtype, comm, ierr);
}

SQUALL_MPI_EXPORT void mpi_reduce_scatter_(void* sendbuf, void* recvbuf, MPI_Fint* recvcounts,
                                           MPI_Fint* datatype, MPI_Fint* op, MPI_Fint* comm,
                                           MPI_Fint* ierr) {
  fortran_reduce_scatter(SQUALL_MPI_FORTRAN_BINDING(reduce_scatter_f, "mpi_reduce_scatter_"),
                         sendbuf, recvbuf, recvcounts, datatype, op, comm, ierr);
}
SQUALL_MPI_EXPORT void ompi_reduce_scatter_f(void* sendbuf, void* recvbuf, MPI_Fint* recvcounts,
                                             MPI_Fint* datatype, MPI_Fint* op, MPI_Fint* comm,
                                             MPI_Fint* ierr) {
  fortran_reduce_scatter(SQUALL_MPI_FORTRAN_BINDING(reduce_scatter_f, "ompi_reduce_scatter_f"),
                         sendbuf, recvbuf, recvcounts, datatype, op, comm, ierr);
}

SQUALL_MPI_EXPORT void mpi_barrier_(MPI_Fint* comm, MPI_Fint* ierr) { fortran_barrier(comm, ierr); }
SQUALL_MPI_EXPORT void ompi_barrier_f(MPI_Fint* comm, MPI_Fint* ierr) {
  fortran_barrier(comm, ierr);
}

// The non-blocking forms and the completion calls: gfortran's names only (see above).
SQUALL_MPI_EXPORT void mpi_iallreduce_(void* sendbuf, void* recvbuf, MPI_Fint* count,
                                       MPI_Fint* datatype, MPI_Fint* op, MPI_Fint* comm,
                                       MPI_Fint* request, MPI_Fint* ierr) {
  fortran_start(
      SQUALL_MPI_FORTRAN_BINDING(ireduce_f, "mpi_iallreduce_"), fortran_takes(sendbuf, recvbuf),
      request, ierr,
      [&](MPI_Request* c) {
        return MPI_Iallreduce(fortran_send(sendbuf), recvbuf, *count, MPI_Type_f2c(*datatype),
                              MPI_Op_f2c(*op), MPI_Comm_f2c(*comm), c);
      },
      sendbuf, recvbuf, count, datatype, op, comm);
}

SQUALL_MPI_EXPORT void mpi_ireduce_scatter_block_(void* sendbuf, void* recvbuf, MPI_Fint* recvcount,
                                                  MPI_Fint* datatype, MPI_Fint* op, MPI_Fint* comm,
                                                  MPI_Fint* request, MPI_Fint* ierr) {
  fortran_start(
      SQUALL_MPI_FORTRAN_BINDING(ireduce_f, "mpi_ireduce_scatter_block_"),
      fortran_takes(sendbuf, recvbuf), request, ierr,
      [&](MPI_Request* c) {
        return MPI_Ireduce_scatter_block(fortran_send(sendbuf), recvbuf, *recvcount,
                                         MPI_Type_f2c(*datatype), MPI_Op_f2c(*op),
                                         MPI_Comm_f2c(*comm), c);
      },
      sendbuf, recvbuf, recvcount, datatype, op, comm);
}

SQUALL_MPI_EXPORT void mpi_ireduce_scatter_(void* sendbuf, void* recvbuf, MPI_Fint* recvcounts,
                                            MPI_Fint* datatype, MPI_Fint* op, MPI_Fint* comm,
                                            MPI_Fint* request, MPI_Fint* ierr) {
  fortran_start(
      SQUALL_MPI_FORTRAN_BINDING(ireduce_f, "mpi_ireduce_scatter_"),
      fortran_integer_is_int && fortran_takes(sendbuf, recvbuf), request, ierr,
      [&](MPI_Request* c) {
        return MPI_Ireduce_scatter(
            fortran_send(sendbuf), recvbuf, reinterpret_cast<const int*>(recvcounts),
            MPI_Type_f2c(*datatype), MPI_Op_f2c(*op), MPI_Comm_f2c(*comm), c);
      },
      sendbuf, recvbuf, recvcounts, datatype, op, comm);
}

SQUALL_MPI_EXPORT void mpi_iallgather_(void* sendbuf, MPI_Fint* sendcount, MPI_Fint* sendtype,
                                       void* recvbuf, MPI_Fint* recvcount, MPI_Fint* recvtype,
                                       MPI_Fint* comm, MPI_Fint* request, MPI_Fint* ierr) {
  fortran_start(
      SQUALL_MPI_FORTRAN_BINDING(iallgather_f, "mpi_iallgather_"), fortran_takes(sendbuf, recvbuf),
      request, ierr,
      [&](MPI_Request* c) {
        return MPI_Iallgather(fortran_send(sendbuf), *sendcount, MPI_Type_f2c(*sendtype), recvbuf,
                              *recvcount, MPI_Type_f2c(*recvtype), MPI_Comm_f2c(*comm), c);
      },
      sendbuf, sendcount, sendtype, recvbuf, recvcount, recvtype, comm);
}

SQUALL_MPI_EXPORT void mpi_iallgatherv_(void* sendbuf, MPI_Fint* sendcount, MPI_Fint* sendtype,
                                        void* recvbuf, MPI_Fint* recvcounts, MPI_Fint* displs,
                                        MPI_Fint* recvtype, MPI_Fint* comm, MPI_Fint* request,
                                        MPI_Fint* ierr) {
  fortran_start(
      SQUALL_MPI_FORTRAN_BINDING(iallgatherv_f, "mpi_iallgatherv_"),
      fortran_integer_is_int && fortran_takes(sendbuf, recvbuf), request, ierr,
      [&](MPI_Request* c) {
        return MPI_Iallgatherv(fortran_send(sendbuf), *sendcount, MPI_Type_f2c(*sendtype), recvbuf,
                               reinterpret_cast<const int*>(recvcounts),
                               reinterpret_cast<const int*>(displs), MPI_Type_f2c(*recvtype),
                               MPI_Comm_f2c(*comm), c);
      },
      sendbuf, sendcount, sendtype, recvbuf, recvcounts, displs, recvtype, comm);
}

SQUALL_MPI_EXPORT void mpi_ibcast_(void* buffer, MPI_Fint* count, MPI_Fint* datatype,
                                   MPI_Fint* root, MPI_Fint* comm, MPI_Fint* request,
                                   MPI_Fint* ierr) {
  fortran_start(
      SQUALL_MPI_FORTRAN_BINDING(ibcast_f, "mpi_ibcast_"), fortran_takes(buffer), request, ierr,
      [&](MPI_Request* c) {
        return MPI_Ibcast(buffer, *count, MPI_Type_f2c(*datatype), *root, MPI_Comm_f2c(*comm), c);
      },
      buffer, count, datatype, root, comm);
}

SQUALL_MPI_EXPORT void mpi_ibarrier_(MPI_Fint* comm, MPI_Fint* request, MPI_Fint* ierr) {
  fortran_start(
      SQUALL_MPI_FORTRAN_BINDING(ibarrier_f, "mpi_ibarrier_"), true, request, ierr,
      [&](MPI_Request* c) { return MPI_Ibarrier(MPI_Comm_f2c(*comm), c); }, comm);
}

SQUALL_MPI_EXPORT void mpi_wait_(MPI_Fint* request, MPI_Fint* status, MPI_Fint* ierr) {
  const auto wait = SQUALL_MPI_FORTRAN_BINDING(wait_f, "mpi_wait_");
  const auto test = SQUALL_MPI_FORTRAN_BINDING(test_f, "mpi_test_");
  fortran_wait(
      1, request, ierr, [&] { wait()(request, status, ierr); },
      [&] {
        MPI_Fint flag = 0;
        test()(request, &flag, status, ierr);
        return flag != 0;
      });
}

SQUALL_MPI_EXPORT void mpi_waitall_(MPI_Fint* count, MPI_Fint* requests, MPI_Fint* statuses,
                                    MPI_Fint* ierr) {
  const auto wait = SQUALL_MPI_FORTRAN_BINDING(waitall_f, "mpi_waitall_");
  const auto test = SQUALL_MPI_FORTRAN_BINDING(testall_f, "mpi_testall_");
  fortran_wait(
      *count, requests, ierr, [&] { wait()(count, requests, statuses, ierr); },
      [&] {
        MPI_Fint flag = 0;
        test()(count, requests, &flag, statuses, ierr);
        return flag != 0;
      });
}

SQUALL_MPI_EXPORT void mpi_waitany_(MPI_Fint* count, MPI_Fint* requests, MPI_Fint* index,
                                    MPI_Fint* status, MPI_Fint* ierr) {
  const auto wait = SQUALL_MPI_FORTRAN_BINDING(waitany_f, "mpi_waitany_");
  const auto test = SQUALL_MPI_FORTRAN_BINDING(testany_f, "mpi_testany_");
  fortran_wait(
      *count, requests, ierr, [&] { wait()(count, requests, index, status, ierr); },
      [&] {
        MPI_Fint flag = 0;
        test()(count, requests, index, &flag, status, ierr);
        return flag != 0;
      });
}

SQUALL_MPI_EXPORT void mpi_waitsome_(MPI_Fint* incount, MPI_Fint* requests, MPI_Fint* outcount,
                                     MPI_Fint* indices, MPI_Fint* statuses, MPI_Fint* ierr) {
  const auto wait = SQUALL_MPI_FORTRAN_BINDING(some_f, "mpi_waitsome_");
  const auto test = SQUALL_MPI_FORTRAN_BINDING(some_f, "mpi_testsome_");
  fortran_wait(
      *incount, requests, ierr,
      [&] { wait()(incount, requests, outcount, indices, statuses, ierr); },
      [&] {
        test()(incount, requests, outcount, indices, statuses, ierr);
        return *outcount != 0;  // some completed, or none was active (MPI_UNDEFINED)
      });
}

SQUALL_MPI_EXPORT void mpi_test_(MPI_Fint* request, MPI_Fint* flag, MPI_Fint* status,
                                 MPI_Fint* ierr) {
  const auto test = SQUALL_MPI_FORTRAN_BINDING(test_f, "mpi_test_");
  fortran_test(1, request, [&] { test()(request, flag, status, ierr); });
}

SQUALL_MPI_EXPORT void mpi_testall_(MPI_Fint* count, MPI_Fint* requests, MPI_Fint* flag,
                                    MPI_Fint* statuses, MPI_Fint* ierr) {
  const auto test = SQUALL_MPI_FORTRAN_BINDING(testall_f, "mpi_testall_");
  fortran_test(*count, requests, [&] { test()(count, requests, flag, statuses, ierr); });
}

SQUALL_MPI_EXPORT void mpi_testany_(MPI_Fint* count, MPI_Fint* requests, MPI_Fint* index,
                                    MPI_Fint* flag, MPI_Fint* status, MPI_Fint* ierr) {
  const auto test = SQUALL_MPI_FORTRAN_BINDING(testany_f, "mpi_testany_");
  fortran_test(*count, requests, [&] { test()(count, requests, index, flag, status, ierr); });
}

SQUALL_MPI_EXPORT void mpi_testsome_(MPI_Fint* incount, MPI_Fint* requests, MPI_Fint* outcount,
                                     MPI_Fint* indices, MPI_Fint* statuses, MPI_Fint* ierr) {
  const auto test = SQUALL_MPI_FORTRAN_BINDING(some_f, "mpi_testsome_");
  fortran_test(*incount, requests,
               [&] { test()(incount, requests, outcount, indices, statuses, ierr); });
}

SQUALL_MPI_EXPORT void mpi_request_get_status_(MPI_Fint* request, MPI_Fint* flag, MPI_Fint* status,
                                               MPI_Fint* ierr) {
  const auto get = SQUALL_MPI_FORTRAN_BINDING(test_f, "mpi_request_get_status_");
  fortran_test(1, request, [&] { get()(request, flag, status, ierr); });
}

SQUALL_MPI_EXPORT void mpi_request_free_(MPI_Fint* request, MPI_Fint* ierr) {
  fortran_free("MPI_Request_free", SQUALL_MPI_FORTRAN_BINDING(free_f, "mpi_request_free_"), request,
               ierr);
}

SQUALL_MPI_EXPORT void mpi_cancel_(MPI_Fint* request, MPI_Fint* ierr) {
  fortran_free("MPI_Cancel", SQUALL_MPI_FORTRAN_BINDING(free_f, "mpi_cancel_"), request, ierr);
}

}  // extern "C"

#undef SQUALL_MPI_FORTRAN_BINDING
