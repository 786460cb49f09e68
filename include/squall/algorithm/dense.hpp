// SPDX-License-Identifier: Apache-2.0
#pragma once
/// The dense collectives, what `communicator` forwards to, in two layers:
/// `detail::dense_core<Transport, Backend>` does the work and sees the topology only through
/// `schedule_source` (the schedules it builds, behind a virtual call each), so the collectives
/// and every compressed algorithm run over it (algorithm/compressed/, the section "for the
/// compressed algorithms" below) are instantiated once per (transport, backend), whatever the
/// topology and however many compressors a program uses; `detail::dense_collectives<Transport,
/// Topology, Backend>` adds what is the topology's own (node discovery, the cost model and its
/// calibration). Contracts: see communicator.hpp.

#include <squall/algorithm/call_check.hpp>
#include <squall/algorithm/detail/calibrate.hpp>
#include <squall/algorithm/detail/executor.hpp>
#include <squall/algorithm/detail/find_nodes.hpp>
#include <squall/algorithm/detail/scratch.hpp>
#include <squall/backend/dispatch.hpp>
#include <squall/backend/host.hpp>
#include <squall/concepts.hpp>
#include <squall/core/buffer.hpp>
#include <squall/core/error.hpp>
#include <squall/core/link_costs.hpp>
#include <squall/core/ops.hpp>
#include <squall/core/options.hpp>
#include <squall/core/types.hpp>
#include <squall/detail/math.hpp>
#include <squall/kernels/host/reduce.hpp>
#include <squall/topology/automatic.hpp>
#include <squall/topology/direct.hpp>
#include <squall/topology/ring.hpp>
#include <squall/topology/schedule.hpp>
#include <squall/topology/tree.hpp>
#include <squall/tuning/tuning.hpp>

#include <algorithm>  // all_of, max, min
#include <cstddef>    // byte, size_t
#include <cstdint>
#include <memory>  // unique_ptr
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>  // move
#include <vector>

namespace squall {

/// The bytes one collective moved on one rank (`communicator::last_transfer`): what it
/// sent (messages, writes into peers' memory, and what peers read out of its window or
/// memory, once per reading peer) and what it received (messages, reads out of peers'
/// window or memory, and peers' writes into its memory). The mismatch check's signature
/// exchange counts too where it travels as messages.
struct transfer_stats {
  std::uint64_t bytes_sent = 0;
  std::uint64_t bytes_received = 0;
};

namespace detail {

template <class T>
concept has_node_map = requires(T& t) {
  { t.node_of } -> std::same_as<std::vector<int>&>;
};
template <class T>
concept has_cost_model = requires(T& t) {
  { t.model } -> std::same_as<cost_model&>;
};
template <class T>
concept has_reduce_scatter = requires(const T& t, int r) {
  { t.reduce_scatter_schedule(r, r) } -> std::same_as<schedule>;
};
template <class T>
concept has_allgather = requires(const T& t, int r) {
  { t.allgather_schedule(r, r) } -> std::same_as<schedule>;
};
template <class T>
concept has_broadcast = requires(const T& t, int r) {
  { t.broadcast_schedule(r, r, r) } -> std::same_as<schedule>;
};

/// Throws `invalid_argument` naming `operation` unless `what` has `want` elements (`got`).
inline void require_count(std::string_view operation, std::string_view what, std::size_t got,
                          std::size_t want) {
  if (got != want) {
    throw invalid_argument({.operation = operation}, std::string(what) + " has " +
                                                         std::to_string(got) + " elements where " +
                                                         std::to_string(want) + " are needed");
  }
}

/// Throws `invalid_argument` unless an allgatherv's `counts` and `into` hold one entry for
/// each of the `size` ranks.
inline void require_per_rank(std::size_t counts, std::size_t into, int rank, int size) {
  if (counts != static_cast<std::size_t>(size) || into != static_cast<std::size_t>(size)) {
    throw invalid_argument({.operation = "allgatherv", .rank = rank},
                           "counts (" + std::to_string(counts) + ") and into (" +
                               std::to_string(into) + ") must hold one entry per rank (" +
                               std::to_string(size) + ")");
  }
}

/// The topology as the algorithms see it: the schedules it builds, one virtual call each (the
/// allreduce schedule is cached per size by `dense_core`). `std::nullopt` where the topology
/// has no schedule of its own for that collective.
class schedule_source {
 public:
  virtual ~schedule_source() = default;
  virtual std::string_view name() const = 0;
  virtual schedule allreduce_schedule(int rank, int size, std::size_t bytes) const = 0;
  virtual std::optional<schedule> reduce_scatter_schedule(int rank, int size) const = 0;
  virtual std::optional<schedule> allgather_schedule(int rank, int size) const = 0;
  virtual std::optional<schedule> broadcast_schedule(int rank, int size, int root) const = 0;
};

/// `Topology`'s schedules as a `schedule_source`; holds the topology.
template <topology Topology>
class topology_schedules final : public schedule_source {
 public:
  explicit topology_schedules(Topology t) : topology(std::move(t)) {}

  std::string_view name() const override { return Topology::name; }
  schedule allreduce_schedule(int rank, int size, std::size_t bytes) const override {
    return topology.allreduce_schedule(rank, size, bytes);
  }
  std::optional<schedule> reduce_scatter_schedule(int rank, int size) const override {
    if constexpr (has_reduce_scatter<Topology>) return topology.reduce_scatter_schedule(rank, size);
    return std::nullopt;
  }
  std::optional<schedule> allgather_schedule(int rank, int size) const override {
    if constexpr (has_allgather<Topology>) return topology.allgather_schedule(rank, size);
    return std::nullopt;
  }
  std::optional<schedule> broadcast_schedule(int rank, int size, int root) const override {
    if constexpr (has_broadcast<Topology>) return topology.broadcast_schedule(rank, size, root);
    return std::nullopt;
  }

  Topology topology;
};

/// The dense collectives over `Transport`, computing on `Backend`, with the schedules of
/// `schedule_source`. Owns the transport and the schedule source.
/// (A Backend whose memory the transport cannot carry takes the staged core below.)
template <transport Transport, backend Backend>
class dense_core {
  static_assert(check_backend_kernels<Backend>());

 public:
  using transport_type = Transport;
  using backend_type = Backend;
  using memory_space = typename Backend::memory_space;
  /// Whether the collectives stage through host memory (the specialization below).
  static constexpr bool staged = false;
  /// The views the collectives take: the backend's memory.
  template <class T>
  using view = buffer_view<T, typename Backend::memory_space>;

  /// See `communicator`'s constructor.
  dense_core(Transport transport, std::unique_ptr<schedule_source> schedules, const options& opts,
             const collective_tuning& tuning, Backend backend)
      : transport_(std::move(transport)),
        schedules_(std::move(schedules)),
        backend_(std::move(backend)),
        check_(opts.check_mismatch),
        tuning_(tuning) {
    if (tuning_.chunk_bytes == 0) {
      throw invalid_argument({.operation = "communicator", .rank = rank()},
                             "collective_tuning::chunk_bytes must be positive");
    }
    // A transport whose messages cost more to start than 256 KiB take to move (CUDA IPC: a
    // round trip through the host against a copy at device bandwidth) names its own default.
    if constexpr (requires { Transport::default_chunk_bytes; }) {
      if (tuning_.chunk_bytes == collective_tuning{}.chunk_bytes) {
        tuning_.chunk_bytes = Transport::default_chunk_bytes;
      }
    }
  }

  int rank() const { return transport_.rank(); }
  int size() const { return transport_.size(); }
  Transport& transport() { return transport_; }
  const Backend& backend() const { return backend_; }
  const schedule_source& schedules() const { return *schedules_; }
  const collective_tuning& tuning() const { return tuning_; }
  /// Whether the allreduce's path above `peer_memory_bytes` is a choice here (the windows or
  /// the peers' memory: a transport with both, 3 ranks or more, the peers reachable, no
  /// registered memory), which `calibrate_windows` measures.
  bool allreduce_window_choice() const {
    if constexpr (peer_memory_transport<Transport> && direct_transport<Transport>) {
      if constexpr (registered_memory_transport<Transport>) {
        if (transport_.registrations() != 0) return false;
      }
      return size() >= 3 && transport_.can_access_peers() &&
             fits_half_window(tuning_.peer_memory_bytes);
    } else {
      return false;
    }
  }
  /// Sets `collective_tuning::allreduce_window_copy_bytes`; every rank must set the same.
  void set_allreduce_window_copy_bytes(std::size_t bytes) {
    tuning_.allreduce_window_copy_bytes = bytes;
  }
  /// The allreduce's bound in effect (`allreduce_window_copy_bytes`, else `window_copy_bytes`).
  std::size_t allreduce_window_bound() const {
    return tuning_.allreduce_window_copy_bytes == collective_tuning::as_window_copy
               ? tuning_.window_copy_bytes
               : tuning_.allreduce_window_copy_bytes;
  }
  transfer_stats last_transfer() const { return {buffers_.moved.sent, buffers_.moved.received}; }
  /// The core whose memory is the transport's (calibration runs there): this one.
  dense_core& transport_core() { return *this; }

  std::string schedule_for(std::size_t bytes) const {
    const schedule s = schedules_->allreduce_schedule(rank(), size(), bytes);
    const std::string name(schedules_->name());
    if (s.name == name) return name;
    return name + ":" + std::string(s.name);
  }

  // ---- the collectives (documented in communicator.hpp) ---------------------------------------

  template <element T, reduction_op<T> Op>
  void allreduce(view<T> data, Op op) {
    begin_call(collective::allreduce, dtype_of<T>, Op::name, data.count());
    allreduce_into(data.data(), data, op);
    backend_.synchronize();
  }
  template <element T, reduction_op<T> Op>
  void allreduce(view<const T> in, view<T> out, Op op) {
    require_count("allreduce", "out", out.count(), in.count());
    begin_call(collective::allreduce, dtype_of<T>, Op::name, in.count());
    place_check(in, out);
    allreduce_into(in.data(), out, op);
    backend_.synchronize();
  }

  std::size_t block_count(std::size_t count) const {
    return split_range(count, static_cast<std::size_t>(size()), static_cast<std::size_t>(rank()))
        .count;
  }
  std::size_t block_offset(std::size_t count) const {
    return split_range(count, static_cast<std::size_t>(size()), static_cast<std::size_t>(rank()))
        .begin;
  }

  template <element T, reduction_op<T> Op>
  void reduce_scatter(view<T> data, Op op) {
    begin_call(collective::reduce_scatter, dtype_of<T>, Op::name, data.count());
    reduce_scatter_into(data.data(), data.data(), data.data() + block_offset(data.count()),
                        data.count(), op);
    backend_.synchronize();
  }
  template <element T, reduction_op<T> Op>
  void reduce_scatter(view<const T> in, view<T> out, Op op) {
    require_count("reduce_scatter", "out", out.count(), block_count(in.count()));
    begin_call(collective::reduce_scatter, dtype_of<T>, Op::name, in.count());
    reduce_scatter_into(in.data(), static_cast<T*>(nullptr), out.data(), in.count(), op);
    backend_.synchronize();
  }

  template <element T>
  void allgather(view<const T> in, view<T> out) {
    const std::size_t count = in.count();
    const auto p = static_cast<std::size_t>(size());
    require_count("allgather", "out", out.count(), count * p);
    begin_call(collective::allgather, dtype_of<T>, "", count);
    T* mine = out.data() + static_cast<std::size_t>(rank()) * count;
    if (in.data() != mine) place_check(in, view<T>(mine, count));
    const schedule s = gather_schedule(out.size_bytes());
    if constexpr (direct_transport<Transport>) {
      if (s.one_shot && copies_through_windows(in.size_bytes(), out.size_bytes(), true,
                                               tuning_.window_copy_bytes)) {
        executor().allgather_windows(reinterpret_cast<const std::byte*>(in.data()),
                                     reinterpret_cast<std::byte*>(out.data()), in.size_bytes(),
                                     copy_only_reducer(), window_round_, check_after_barrier());
        return;
      }
    }
    if constexpr (peer_memory_transport<Transport>) {
      if (s.one_shot && uses_peer_memory(out.size_bytes())) {
        settle();
        executor().allgather_peer_memory(reinterpret_cast<const std::byte*>(in.data()),
                                         reinterpret_cast<std::byte*>(out.data()), in.size_bytes(),
                                         copy_only_reducer());
        return;
      }
    }
    if (in.data() != mine) place(in, view<T>(mine, count));
    run(s, out.data(), out.count(), make_reducer<T, sum_op>(backend_));
  }

  template <element T>
  void allgatherv(view<const T> in, std::span<const std::size_t> counts, std::span<T* const> into) {
    const auto p = static_cast<std::size_t>(size());
    const auto me = static_cast<std::size_t>(rank());
    require_per_rank(counts.size(), into.size(), rank(), size());
    require_count("allgatherv", "in", in.count(), counts[me]);
    std::size_t total = 0, most = 0;
    for (const std::size_t c : counts) {
      total += c;
      most = std::max(most, c);
    }
    // Alike blocks where their allgather copies through the windows: that allgather, each
    // peer's block copied out of its window into its place. Where no peer memory serves
    // (below `peer_memory_bytes` padded to the largest, or no such transport): an allgather
    // of the largest block (the same call on every rank, whatever its places). Else every
    // rank reads each peer's block into its place.
    const bool alike =
        std::all_of(counts.begin(), counts.end(), [most](std::size_t c) { return c == most; });
    const schedule s = gather_schedule(total * sizeof(T));
    if constexpr (direct_transport<Transport>) {
      if (alike && s.one_shot &&
          copies_through_windows(most * sizeof(T), most * p * sizeof(T), true,
                                 tuning_.window_copy_bytes)) {
        begin_call(collective::allgatherv, dtype_of<T>, "", total);
        if (in.data() != into[me]) place_check(in, view<T>(into[me], most));
        executor().allgather_windows(
            reinterpret_cast<const std::byte*>(in.data()),
            [into](int q) {
              return reinterpret_cast<std::byte*>(into[static_cast<std::size_t>(q)]);
            },
            most * sizeof(T), copy_only_reducer(), window_round_, check_after_barrier());
        return;
      }
    }
    if constexpr (peer_memory_transport<Transport>) {
      if (s.one_shot && uses_peer_memory(most * p * sizeof(T))) {
        begin_call(collective::allgatherv, dtype_of<T>, "", total);
        settle();
        std::vector<std::size_t> bytes(p);
        std::vector<std::byte*> places(p);
        for (std::size_t q = 0; q < p; ++q) {
          bytes[q] = counts[q] * sizeof(T);
          places[q] = reinterpret_cast<std::byte*>(into[q]);
        }
        executor().allgatherv_peer_memory(reinterpret_cast<const std::byte*>(in.data()), bytes,
                                          places, total * sizeof(T));
        return;
      }
    }
    bool end_to_end = true;  // blocks alike, in rank order from into[0]: one allgather there
    for (std::size_t q = 0; q < p; ++q)
      end_to_end = end_to_end && counts[q] == most && into[q] == into[0] + q * most;
    if (end_to_end) {
      allgather(in, view<T>(into[0], most * p));
      return;
    }
    // every block padded to the largest in scratch, gathered, and copied to its place
    T* const padded = reinterpret_cast<T*>(work_.reserve(backend_, most * p * sizeof(T)));
    place(in, view<T>(padded + me * most, counts[me]));
    allgather(view<const T>(padded + me * most, most), view<T>(padded, most * p));
    for (std::size_t q = 0; q < p; ++q) {
      if (q == me && into[q] == in.data()) continue;  // this rank's block lies there already
      place(view<const T>(padded + q * most, counts[q]), view<T>(into[q], counts[q]));
    }
  }

  template <element T>
  void broadcast(view<T> data, int root) {
    if (root < 0 || root >= size()) {
      throw invalid_argument(
          {.operation = "broadcast", .rank = rank()},
          "root " + std::to_string(root) + " outside [0, " + std::to_string(size()) + ")");
    }
    begin_call(collective::broadcast, dtype_of<T>, "", data.count(), root);
    std::optional<schedule> own = schedules_->broadcast_schedule(rank(), size(), root);
    schedule s;
    if (own) {
      s = std::move(*own);
    } else if (uses_peer_memory(data.size_bytes()) || fits_window(data.size_bytes())) {
      s = direct_topology{}.broadcast_schedule(rank(), size(), root);
    } else {
      s = tree_topology{}.broadcast_schedule(rank(), size(), root);
    }
    if constexpr (direct_transport<Transport>) {
      if (s.one_shot && copies_through_windows(data.size_bytes(), data.size_bytes(), false,
                                               tuning_.window_copy_bytes)) {
        executor().broadcast_windows(reinterpret_cast<std::byte*>(data.data()), data.size_bytes(),
                                     root, copy_only_reducer(), window_round_,
                                     check_after_barrier());
        return;
      }
    }
    if constexpr (peer_memory_transport<Transport>) {
      if (s.one_shot && uses_peer_memory(data.size_bytes())) {
        settle();
        executor().broadcast_peer_memory(reinterpret_cast<std::byte*>(data.data()),
                                         data.size_bytes(), root);
        return;
      }
    }
    run(s, data.data(), data.count(), make_reducer<T, sum_op>(backend_));
  }

  /// The call stated for the mismatch check, then the transport's barrier, whose signatures
  /// it compares (a pending window check's barrier is this one).
  void barrier() { barrier_arrive()(true); }

  /// `barrier()` in two halves (`communicator::ibarrier`): states the call for the mismatch
  /// check and arrives. Returns the rest, a callable `bool(bool block)`: one poll, or to the
  /// end; true once every rank has arrived (and the check passed). It must complete before
  /// this core's next call, on one thread at a time.
  auto barrier_arrive() {
    begin_call(collective::barrier, dtype::float32, "", 0);
    using arrival = decltype(transport_.barrier());
    return [this, pending = std::optional<arrival>(transport_.barrier()),
            check = check_.pending()](bool block) mutable {
      if (!pending) return true;
      try {
        if (block) {
          pending->wait();
        } else if (!pending->test()) {
          return false;
        }
      } catch (...) {
        pending.reset();  // now, while the transport lives (a failed wait has recorded it)
        throw;
      }
      pending.reset();
      if (check) check_.read_pending(transport_);
      return true;
    };
  }

  // ---- for the compressed algorithms ----------------------------------------------------------

  /// Starts a call: resets the byte counts and states the call for the mismatch check.
  void begin_call(collective kind, dtype type, std::string_view op, std::size_t count,
                  int root = -1, std::optional<aggregation> compressed = std::nullopt,
                  std::size_t chunks = 1) {
    buffers_.moved = {};
    check_.begin(
        transport_, executor(),
        {.count = count,
         .root = root,
         .kind = static_cast<std::uint8_t>(kind),
         .type = static_cast<std::uint8_t>(type),
         .op = op_code(op),
         .compressed = compressed ? compressed_code(*compressed, chunks) : std::uint8_t{0}});
  }

  /// Completes a pending mismatch check (a barrier): before anything touches a peer.
  void settle() { check_.settle(transport_); }

  /// The transport's verbs, counting into this call's byte counts.
  detail::wire<Transport> wire() { return {transport_, buffers_.moved}; }

  /// The sum over ranks of `count` elements at `x` (in the backend's memory, written by its
  /// kernels: the ordering point comes first), in place, with the topology's schedule.
  template <class T>
  void sum_in_place(T* x, std::size_t count) {
    backend_.synchronize();
    if (count == 0) {
      settle();
      return;
    }
    run_allreduce(allreduce_schedule_for(count * sizeof(T)), x, x, count,
                  make_reducer<T, sum_op>(backend_));
    backend_.synchronize();
  }

  /// Gathers every rank's `bytes` at `mine` into `all` (both in the backend's memory), rank
  /// q's at q x `stride` (`stride` >= every rank's bytes; the rest of each slot zero), with
  /// the topology's allgather schedule.
  void gather_blobs(const std::byte* mine, std::size_t bytes, std::size_t stride, std::byte* all) {
    using bytes_view = buffer_view<std::byte, memory_space>;
    const std::size_t total = stride * static_cast<std::size_t>(size());
    std::byte* slot = all + static_cast<std::size_t>(rank()) * stride;
    dispatch::copy_on(backend_, bytes_view(slot, bytes),
                      buffer_view<const std::byte, memory_space>(mine, bytes));
    dispatch::fill_zero_on(backend_, bytes_view(slot + bytes, stride - bytes));
    backend_.synchronize();
    settle();
    if (size() == 1 || total == 0) return;
    const schedule s = gather_schedule(total);
    if constexpr (peer_memory_transport<Transport>) {
      if (s.one_shot && uses_peer_memory(total)) {
        executor().allgather_peer_memory(slot, all, stride, copy_only_reducer());
        return;
      }
    }
    executor().run(s, all, total, copy_only_reducer());
    backend_.synchronize();
  }

  /// Every rank's `bytes` at `mine` into `all`, rank q's at q x `bytes`, by messages.
  void exchange(const void* mine, std::size_t bytes, void* all) {
    executor().exchange(mine, bytes, all);
  }

  /// Runs allreduce schedule `s` from `in` into `out` (`in` may be `out`): the one-shot one
  /// straight out of the peers' buffers or through the windows where the transport has them,
  /// else the schedule's messages on `out` after copying `in` there.
  template <class T>
  void run_allreduce(const schedule& s, const T* in, T* out, std::size_t count, const reducer& r) {
    const std::size_t bytes = count * r.element_bytes;
    if constexpr (peer_memory_transport<Transport>) {
      if (s.one_shot && uses_peer_memory(bytes) &&
          !copies_through_windows(bytes, bytes, true, allreduce_window_bound())) {
        settle();
        executor().run_one_shot_peer_memory(reinterpret_cast<const std::byte*>(in),
                                            reinterpret_cast<std::byte*>(out), count, r);
        return;
      }
    }
    if constexpr (direct_transport<Transport>) {
      if (s.one_shot && size() == 2 && bytes <= tuning_.whole_reduce_bytes &&
          fits_half_window(bytes)) {
        settle();
        executor().allreduce_windows_whole(reinterpret_cast<const std::byte*>(in),
                                           reinterpret_cast<std::byte*>(out), count, r,
                                           window_round_, check_after_barrier());
        return;
      }
    }
    if (in != out && count != 0) {
      r.copy(reinterpret_cast<std::byte*>(out), reinterpret_cast<const std::byte*>(in),
             count * r.element_bytes);
      r.settle();
    }
    if constexpr (direct_transport<Transport>) {
      if (s.one_shot && windows_fit(r)) {
        executor().run_one_shot(reinterpret_cast<std::byte*>(out), count, r, window_round_,
                                check_after_barrier());
        return;
      }
    }
    settle();
    run(s, out, count, r);
  }

 protected:
  schedule_source& mutable_schedules() { return *schedules_; }

  // Throws if `in` and `out` overlap without being the same memory.
  template <element T, class M>
  void place_check(buffer_view<const T, M> in, buffer_view<T, M> out) const {
    if (in.data() == out.data() || in.empty()) return;
    const auto* a = reinterpret_cast<const std::byte*>(in.data());
    const auto* b = reinterpret_cast<const std::byte*>(out.data());
    if (a < b + out.size_bytes() && b < a + in.size_bytes()) {
      throw invalid_argument({.operation = "collective", .rank = rank()},
                             "input and output partially overlap");
    }
  }

 private:
  // Copies `in` to `out` (same count), unless they are the same memory.
  template <element T>
  void place(view<const T> in, view<T> out) {
    place_check(in, out);
    if (in.data() != out.data() && !in.empty()) {
      dispatch::copy_on(backend_, out, in);
      backend_.synchronize();
    }
  }

  // Whether a one-shot collective of `bytes` goes through the peers' own memory.
  bool uses_peer_memory(std::size_t bytes) const {
    if constexpr (peer_memory_transport<Transport>) {
      return size() > 1 && bytes >= tuning_.peer_memory_bytes && transport_.can_access_peers();
    } else {
      (void)bytes;
      return false;
    }
  }

  // out = op over ranks of in (`in` may be `out.data()`), then the op's finalize.
  template <element T, reduction_op<T> Op>
  void allreduce_into(const T* in, view<T> out, Op op) {
    if (out.empty()) {
      settle();
      return;
    }
    run_allreduce(allreduce_schedule_for(out.size_bytes()), in, out.data(), out.count(),
                  make_reducer<T, Op>(backend_));
    dispatch::finalize_on(backend_, op, out, static_cast<std::size_t>(size()));
  }

  // Reduce-scatter of `count` elements of `in` into `out` (this rank's block). `whole` is
  // `in` itself when the caller lets it be overwritten (in place), else null: the message
  // schedules then work on a copy in `work_`. Through peer memory no copy is needed.
  template <element T, reduction_op<T> Op>
  void reduce_scatter_into(const T* in, T* whole, T* out, std::size_t count, Op op) {
    const std::size_t bytes = count * sizeof(T);
    const schedule s = scatter_schedule(bytes);
    const view<T> result(out, block_count(count));
    const reducer r = make_reducer<T, Op>(backend_);
    const bool windows =
        s.one_shot && copies_through_windows(bytes, bytes, false, tuning_.window_copy_bytes);
    bool done = false;
    if constexpr (peer_memory_transport<Transport>) {
      if (s.one_shot && !windows && uses_peer_memory(bytes)) {
        settle();
        executor().reduce_scatter_peer_memory(reinterpret_cast<const std::byte*>(in),
                                              reinterpret_cast<std::byte*>(out), count, r);
        done = true;
      }
    }
    if constexpr (direct_transport<Transport>) {
      if (!done && windows) {
        executor().reduce_scatter_windows(reinterpret_cast<const std::byte*>(in),
                                          reinterpret_cast<std::byte*>(out), count, r,
                                          window_round_, check_after_barrier());
        done = true;
      }
    }
    if (!done) {
      if (whole == nullptr) {
        whole = reinterpret_cast<T*>(work_.reserve(backend_, bytes));
        if (count != 0) {
          r.copy(reinterpret_cast<std::byte*>(whole), reinterpret_cast<const std::byte*>(in),
                 bytes);
          r.settle();
        }
      }
      run(s, whole, count, r);
      T* mine = whole + block_offset(count);
      if (mine != out && !result.empty()) {
        r.copy(reinterpret_cast<std::byte*>(out), reinterpret_cast<const std::byte*>(mine),
               result.size_bytes());
      }
    }
    dispatch::finalize_on(backend_, op, result, static_cast<std::size_t>(size()));
  }

  // The schedules of reduce_scatter and allgather: the topology's own, else direct's one-shot
  // where the transport has peer memory or windows, else the ring's.
  schedule scatter_schedule(std::size_t bytes) const {
    if (auto own = schedules_->reduce_scatter_schedule(rank(), size())) return std::move(*own);
    if (uses_peer_memory(bytes) || fits_window(bytes))
      return direct_topology{}.reduce_scatter_schedule(rank(), size());
    return ring_topology{}.reduce_scatter_schedule(rank(), size());
  }
  schedule gather_schedule(std::size_t bytes) const {
    if (auto own = schedules_->allgather_schedule(rank(), size())) return std::move(*own);
    if (uses_peer_memory(bytes) || fits_window(bytes / static_cast<std::size_t>(size())))
      return direct_topology{}.allgather_schedule(rank(), size());
    return ring_topology{}.allgather_schedule(rank(), size());
  }

  template <class T>
  void run(const schedule& s, T* data, std::size_t count, const reducer& r) {
    settle();
    executor().run(s, reinterpret_cast<std::byte*>(data), count, r);
  }

  // Whether a rank's `bytes` fit one round of the windows (half a window; direct transports).
  bool fits_half_window(std::size_t bytes) const {
    if constexpr (direct_transport<Transport>) {
      return size() > 1 && bytes <= window_data_bytes(const_cast<Transport&>(transport_)) / 2;
    } else {
      (void)bytes;
      return false;
    }
  }

  // Whether a one-shot collective in which a rank publishes `bytes` goes through the windows
  // (issue 22: below `peer_memory_bytes`, one round, where the peer-memory path does not run).
  bool fits_window(std::size_t bytes) const {
    return !uses_peer_memory(bytes) && fits_half_window(bytes);
  }

  // Whether a one-shot collective copies through the windows (a rank publishes `published`
  // bytes; `total`, the bytes that decide the peer-memory path): below `peer_memory_bytes`
  // where they fit, and above it up to `bound` (collective_tuning's `window_copy_bytes`, or
  // the allreduce's own) while no rank has registered memory (registering is collective, so
  // every rank decides alike): a broadcast and a reduce-scatter at any size of job, an
  // allreduce and an allgather from 3 ranks on (`from_three_ranks`).
  bool copies_through_windows(std::size_t published, std::size_t total, bool from_three_ranks,
                              std::size_t bound) const {
    if (!fits_half_window(published)) return false;
    if (!uses_peer_memory(total)) return true;
    if (from_three_ranks && size() == 2) return false;
    if constexpr (registered_memory_transport<Transport>) {
      if (transport_.registrations() != 0) return false;
    }
    return published <= bound;
  }

  // What a window round runs after its first barrier: the pending mismatch check, whose
  // signatures that barrier made visible.
  auto check_after_barrier() {
    return [this] {
      if (check_.pending()) check_.read_pending(transport_);
    };
  }

  bool windows_fit(const reducer& r) {
    return window_data_bytes(transport_) / 2 >=
           64 * r.element_bytes * static_cast<std::size_t>(size());
  }

  // A reducer for schedules that only copy (allgather): bytes, never combined.
  reducer copy_only_reducer() const {
    reducer r = make_reducer<float, sum_op>(backend_);  // its copy and its ordering point
    r.element_bytes = 1;
    r.combine_into = [](const void*, std::byte*, const std::byte*, std::size_t) {
      throw error(make_error_code(errc::internal), {.operation = "allgather"},
                  "a copy-only schedule asked for a reduction");
    };
    r.combine = [](const void*, std::byte*, const std::byte*, const std::byte*, std::size_t) {
      throw error(make_error_code(errc::internal), {.operation = "allgather"},
                  "a copy-only schedule asked for a reduction");
    };
    return r;
  }

  // The allreduce schedule for `bytes`, kept for the next call of the same size, so that a
  // training loop's repeated allreduce builds no schedule (and allocates nothing).
  const schedule& allreduce_schedule_for(std::size_t bytes) {
    if (!cached_ || cached_bytes_ != bytes) {
      cached_schedule_ = schedules_->allreduce_schedule(rank(), size(), bytes);
      cached_bytes_ = bytes;
      cached_ = true;
    }
    return cached_schedule_;
  }

  detail::executor<Transport> executor() {
    const scratch_ref scratch{.owner = this, .reserve = [](void* self, std::size_t bytes) {
                                auto& core = *static_cast<dense_core*>(self);
                                return core.receive_.reserve(core.backend_, bytes);
                              }};
    return {transport_, buffers_, scratch, tuning_};
  }

  Transport transport_;
  std::unique_ptr<schedule_source> schedules_;
  Backend backend_;
  call_check<Transport> check_;
  collective_tuning tuning_;
  std::size_t window_round_ = 0;
  executor_buffers<Transport> buffers_;
  scratch_bytes<Backend> work_;     // reduce_scatter's copy of its input
  scratch_bytes<Backend> receive_;  // the executor's received pieces
  bool cached_ = false;
  std::size_t cached_bytes_ = 0;
  schedule cached_schedule_;
};

/// The dense collectives for a Backend whose memory the transport cannot carry (a device
/// backend over shared memory or MPI): the staging step. Each collective copies its input
/// into host staging memory with the backend's cross-space copy, waits for it (the ordering
/// point before the transport reads it), runs on the host core (host_backend's kernels over
/// the transport), and copies the result back; it returns once that copy is done, as every
/// collective does. The staging memory is page-locked where the backend offers it
/// (`allocate_pinned_host`: CUDA), so its copies run at the bus's speed and asynchronously. An
/// allreduce above `collective_tuning::staging_chunk_bytes` runs in pieces where the backend
/// can wait for part of its work (`record_mark`/`wait_mark`: CUDA events): the copies of
/// later pieces and the copy back of earlier ones overlap each piece's allreduce. The other
/// collectives copy whole buffers. The compressed algorithms that sum
/// or gather payloads through the core (linear, low_rank, gather) stage those payloads the
/// same way, so only compressed bytes cross; per_hop and gtopk, which move payloads over
/// the transport themselves, do not run here (`choose_aggregation` says so).
template <transport Transport, backend Backend>
requires(!std::same_as<typename Backend::memory_space,
                       typename Transport::memory_space>) class dense_core<Transport, Backend>
    : public dense_core<Transport, host_backend> {
  using host_core = dense_core<Transport, host_backend>;
  static_assert(std::same_as<typename Transport::memory_space, host_memory>,
                "squall: staging goes through host memory; this Transport carries neither the "
                "Backend's memory nor the host's");
  static_assert(check_backend_kernels<Backend>());
  static_assert(dispatch::has_staging_copies<Backend>,
                "squall: the Backend's memory is not the Transport's, and it has no kernels "
                "copy(backend, host_view, its view) and copy(backend, its view, host_view) to "
                "stage through host memory");

 public:
  using backend_type = Backend;
  using memory_space = typename Backend::memory_space;
  static constexpr bool staged = true;
  template <class T>
  using view = buffer_view<T, memory_space>;

  /// See `communicator`'s constructor.
  dense_core(Transport transport, std::unique_ptr<schedule_source> schedules, const options& opts,
             const collective_tuning& tuning, Backend backend)
      : host_core(std::move(transport), std::move(schedules), opts, tuning, host_backend{}),
        backend_(std::move(backend)) {}

  const Backend& backend() const { return backend_; }
  /// The core whose memory is the transport's (calibration runs there).
  host_core& transport_core() { return *this; }

  template <element T, reduction_op<T> Op>
  void allreduce(view<T> data, Op op) {
    allreduce(view<const T>(data), data, op);  // staged, in place is out of place
  }
  template <element T, reduction_op<T> Op>
  void allreduce(view<const T> in, view<T> out, Op op) {
    require_count("allreduce", "out", out.count(), in.count());
    this->place_check(in, out);
    const std::size_t piece = this->tuning().staging_chunk_bytes / sizeof(T);
    if constexpr (dispatch::has_marks<Backend>) {
      if (piece != 0 && in.count() > piece) {
        allreduce_in_pieces(in, out, op, piece);
        return;
      }
    }
    const host_view<T> h = stage_in<T>(in);
    host_core::allreduce(h, op);
    stage(out, host_view<const T>(h));
  }

  template <element T, reduction_op<T> Op>
  void reduce_scatter(view<T> data, Op op) {
    const host_view<T> h = stage_in<T>(data);
    host_core::reduce_scatter(h, op);
    stage(data, host_view<const T>(h));
  }
  template <element T, reduction_op<T> Op>
  void reduce_scatter(view<const T> in, view<T> out, Op op) {
    require_count("reduce_scatter", "out", out.count(), this->block_count(in.count()));
    const host_view<T> h = stage_in<T>(in);
    host_core::reduce_scatter(h, op);
    stage(out, host_view<const T>(h.data() + this->block_offset(in.count()), out.count()));
  }

  template <element T>
  void allgather(view<const T> in, view<T> out) {
    const std::size_t count = in.count();
    require_count("allgather", "out", out.count(), count * static_cast<std::size_t>(this->size()));
    const std::size_t at = static_cast<std::size_t>(this->rank()) * count;
    if (in.data() != out.data() + at) this->place_check(in, view<T>(out.data() + at, count));
    const host_view<T> h = staging<T>(out.count());
    const host_view<T> mine(h.data() + at, count);
    stage(mine, in);
    host_core::allgather(host_view<const T>(mine), h);
    stage(out, host_view<const T>(h));
  }

  template <element T>
  void allgatherv(view<const T> in, std::span<const std::size_t> counts, std::span<T* const> into) {
    const auto p = static_cast<std::size_t>(this->size());
    const auto me = static_cast<std::size_t>(this->rank());
    require_per_rank(counts.size(), into.size(), this->rank(), this->size());
    require_count("allgatherv", "in", in.count(), counts[me]);
    std::vector<T*> places(p);
    std::size_t total = 0;
    for (const std::size_t c : counts) total += c;
    const host_view<T> h = staging<T>(total);
    for (std::size_t q = 0, at = 0; q < p; at += counts[q], ++q) places[q] = h.data() + at;
    const host_view<T> mine(places[me], counts[me]);
    stage(mine, in);
    host_core::allgatherv(host_view<const T>(mine), counts, std::span<T* const>(places));
    for (std::size_t q = 0; q < p; ++q) {
      if (q == me && into[q] == in.data()) continue;  // this rank's block lies there already
      stage(view<T>(into[q], counts[q]), host_view<const T>(places[q], counts[q]));
    }
  }

  template <element T>
  void broadcast(view<T> data, int root) {
    const host_view<T> h = staging<T>(data.count());
    const bool root_here = root == this->rank();
    if (root_here) stage(h, view<const T>(data));
    host_core::broadcast(h, root);
    if (!root_here) stage(data, host_view<const T>(h));  // the root's data is unchanged
  }

  // ---- for the compressed algorithms: the host core's, staged --------------------------------

  /// The sum over ranks of `count` elements at `x` (in the backend's memory), in place.
  template <class T>
  void sum_in_place(T* x, std::size_t count) {
    const host_view<T> h = stage_in<T>(view<const T>(x, count));
    host_core::sum_in_place(h.data(), count);
    stage(view<T>(x, count), host_view<const T>(h));
  }

  /// Gathers every rank's `bytes` at `mine` into `all` (both in the backend's memory), rank
  /// q's at q x `stride`, as the host core does.
  void gather_blobs(const std::byte* mine, std::size_t bytes, std::size_t stride, std::byte* all) {
    const std::size_t total = stride * static_cast<std::size_t>(this->size());
    const host_view<std::byte> h = staging<std::byte>(total);
    std::byte* slot = h.data() + static_cast<std::size_t>(this->rank()) * stride;
    stage(host_view<std::byte>(slot, bytes), view<const std::byte>(mine, bytes));
    host_core::gather_blobs(slot, bytes, stride, h.data());
    stage(view<std::byte>(all, total), host_view<const std::byte>(h));
  }

 private:
  // Every piece's copy to the host enqueued at once, each followed by a mark; piece k is
  // allreduced once its mark is reached, then copied back (enqueued), while the backend copies
  // on. Returns when the last copy back is done; on an error, once the copies already
  // enqueued are (they write the staging memory and `out`).
  template <class T, class Op>
  void allreduce_in_pieces(view<const T> in, view<T> out, Op op, std::size_t piece) {
    const host_view<T> h = staging<T>(in.count());
    const std::size_t pieces = div_up(in.count(), piece);
    const auto at = [&](auto v, std::size_t k) {
      const std::size_t begin = k * piece;
      return decltype(v)(v.data() + begin, std::min(piece, v.count() - begin));
    };
    std::vector<decltype(record_mark(backend_))> copied;
    copied.reserve(pieces);
    try {
      for (std::size_t k = 0; k < pieces; ++k) {
        dispatch::copy_across_on(backend_, at(h, k), at(in, k));
        copied.push_back(record_mark(backend_));
      }
      for (std::size_t k = 0; k < pieces; ++k) {
        wait_mark(backend_, copied[k]);
        host_core::allreduce(at(h, k), op);
        dispatch::copy_across_on(backend_, at(out, k), host_view<const T>(at(h, k)));
      }
      backend_.synchronize();
    } catch (...) {
      try {
        backend_.synchronize();
      } catch (...) {  // the first error is the one to report
      }
      throw;
    }
  }

  // Host staging memory for `count` elements: page-locked where the backend offers it (kept,
  // grown to the largest call), the host's otherwise.
  template <class T>
  host_view<T> staging(std::size_t count) {
    if constexpr (dispatch::has_pinned_host<Backend>) {
      const std::size_t bytes = count * sizeof(T);
      if (!pinned_ || pinned_->size() < bytes) {
        pinned_.reset();  // freed before the larger one is taken
        pinned_.emplace(allocate_pinned_host(backend_, bytes));
      }
      return {reinterpret_cast<T*>(pinned_->data()), count};
    } else {
      return staging_.template elements<T>(host_backend{}, count);
    }
  }
  // `dst` = `src` between the backend's memory and the host's, complete when it returns
  template <class T, class To, class From>
  void stage(buffer_view<T, To> dst, buffer_view<const T, From> src) {
    dispatch::copy_across_on(backend_, dst, src);
    backend_.synchronize();
  }
  template <class T>
  host_view<T> stage_in(view<const T> src) {
    const host_view<T> h = staging<T>(src.count());
    stage(h, src);
    return h;
  }

  template <class B>
  struct pinned_type {
    using type = int;  // unused: the backend has no page-locked memory
  };
  template <dispatch::has_pinned_host B>
  struct pinned_type<B> {
    using type = decltype(allocate_pinned_host(std::declval<const B&>(), std::size_t{}));
  };

  Backend backend_;
  scratch_bytes<host_backend> staging_;
  std::optional<typename pinned_type<Backend>::type> pinned_;
};

/// `dense_core` over `Topology`'s schedules, plus what is the topology's own: node discovery
/// (`hierarchical`'s node map, where not given), the cost model (`automatic`) and its
/// calibration. The compressed algorithms take the core (`core()`), never this type, so that
/// they are not instantiated per topology.
template <transport Transport, topology Topology, backend Backend>
class dense_collectives : public dense_core<Transport, Backend> {
  using core_type = dense_core<Transport, Backend>;

 public:
  /// See `communicator`'s constructor.
  dense_collectives(Transport transport, Topology topology, const options& opts,
                    const collective_tuning& tuning, Backend backend = {})
      : core_type(std::move(transport),
                  std::make_unique<topology_schedules<Topology>>(std::move(topology)), opts, tuning,
                  std::move(backend)) {
    Topology& t = own_topology();
    if constexpr (has_node_map<Topology>) {
      if (t.node_of.empty()) {
        t.node_of = find_nodes(this->rank(), this->size(),
                               [this](const void* mine, std::size_t bytes, void* all) {
                                 this->exchange(mine, bytes, all);
                               });
      }
    }
    if constexpr (has_cost_model<Topology>) {
      cost_model& model = t.model;
      if (!model.link) model.link = link_costs_of<Transport>();
      if (model.calibrated() && model.ranks != this->size()) {
        throw invalid_argument({.operation = "communicator", .rank = this->rank()},
                               "automatic_topology's cost model was measured on " +
                                   std::to_string(model.ranks) + " ranks, this communicator has " +
                                   std::to_string(this->size()));
      }
    }
  }

  /// Measures `automatic_topology`'s model on these ranks (a collective call; see
  /// `communicator::calibrate`).
  const cost_model& calibrate(std::size_t up_to) requires has_cost_model<Topology> {
    detail::calibrate(core().transport_core(), own_topology().model, up_to);
    return own_topology().model;
  }

  const Topology& topology() const {
    return static_cast<const topology_schedules<Topology>&>(this->schedules()).topology;
  }
  /// What the compressed algorithms run over.
  core_type& core() { return *this; }

 private:
  Topology& own_topology() {
    return static_cast<topology_schedules<Topology>&>(this->mutable_schedules()).topology;
  }
};

}  // namespace detail
}  // namespace squall
