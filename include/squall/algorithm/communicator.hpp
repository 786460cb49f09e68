// SPDX-License-Identifier: Apache-2.0
#pragma once
/// `communicator<Transport, Topology, Compressor, Backend>`: the dense collectives.
///
///   squall::communicator<squall::shm_transport, squall::automatic_topology> comm{
///       squall::shm_transport{}};
///   comm.allreduce(squall::host_view<float>(grad), squall::avg_op{});
///
/// Contracts:
/// - Every collective is blocking: it returns once this rank's result is complete and every
///   buffer it was given may be reused. All ranks must call the same collectives in the same
///   order with the same count, element type, op and root. With `options::check_mismatch`
///   (the default) a cheap exchange of a 24-byte call signature before each collective
///   catches a difference and throws `mismatch_error` on every rank, naming the ranks; without
///   it a mismatch is caught by the transport (size mismatch) or the deadline.
/// - Every rank holds bitwise the same result: each element is reduced by one rank in one
///   fixed order and then copied, whatever the schedule.
/// - Any count, 0 and above 2^31 elements included; any rank count; in place (one view) or
///   out of place (two views, which must not partially overlap).
/// - Errors: `invalid_argument` for bad sizes or roots, and the transport's `timeout_error`,
///   `peer_failure`, `mismatch_error`; after one, the transport has failed and so has the
///   communicator.

#include <squall/algorithm/detail/executor.hpp>
#include <squall/backend/host.hpp>
#include <squall/compress/none.hpp>
#include <squall/concepts.hpp>
#include <squall/core/buffer.hpp>
#include <squall/core/error.hpp>
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

#include <algorithm>  // min, max
#include <array>
#include <chrono>
#include <cstddef>  // byte, size_t
#include <cstdint>
#include <cstdlib>  // getenv, strtol
#include <cstring>  // memcpy, memcmp
#include <string>
#include <string_view>
#include <type_traits>
#include <unistd.h>  // gethostname
#include <utility>   // move
#include <vector>

namespace squall {

/// The collectives, as the mismatch check and squall-bench name them.
enum class collective : std::uint8_t { allreduce = 1, allgather, reduce_scatter, broadcast, barrier };

constexpr std::string_view to_string(collective c) noexcept {
  switch (c) {
    case collective::allreduce: return "allreduce";
    case collective::allgather: return "allgather";
    case collective::reduce_scatter: return "reduce_scatter";
    case collective::broadcast: return "broadcast";
    case collective::barrier: return "barrier";
  }
  return "?";
}

namespace detail {

/// What each rank says about a call before running it (`options::check_mismatch`).
struct call_signature {
  std::uint64_t sequence = 0;
  std::uint64_t count = 0;
  std::int32_t root = -1;
  std::uint8_t kind = 0;
  std::uint8_t type = 0;
  std::uint8_t op = 0;
  std::uint8_t unused = 0;
};
static_assert(sizeof(call_signature) == 24);

constexpr std::uint8_t op_code(std::string_view name) {
  if (name == "sum") return 1;
  if (name == "avg") return 2;
  if (name == "min") return 3;
  if (name == "max") return 4;
  return 0;
}

inline std::string describe(const call_signature& s) {
  static constexpr std::array<std::string_view, 5> ops = {"?", "sum", "avg", "min", "max"};
  std::string text = "call #" + std::to_string(s.sequence) + " " +
                     std::string(to_string(static_cast<collective>(s.kind)));
  if (static_cast<collective>(s.kind) == collective::barrier) return text;
  text += " of " + std::to_string(s.count) + " " +
          std::string(to_string(static_cast<dtype>(s.type)));
  if (s.op != 0) text += " " + std::string(ops[std::min<std::size_t>(s.op, 4)]);
  if (s.root >= 0) text += " from root " + std::to_string(s.root);
  return text;
}

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

}  // namespace detail

/// The environment variable that sets how many consecutive ranks form one node for
/// `hierarchical_topology` (so that "nodes" can be tested on one host).
inline constexpr const char* ranks_per_node_env_var = "SQUALL_RANKS_PER_NODE";

/// The dense collectives over `Transport`, scheduled by `Topology`. Owns the transport.
/// Compressed collectives (`Compressor` other than `identity_compressor`) and the CUDA
/// backend come with their own issues; this class states so at compile time.
template <transport Transport, topology Topology = automatic_topology,
          compressor Compressor = identity_compressor, backend Backend = host_backend>
class communicator {
  static_assert(check_transport<Transport>());
  static_assert(check_topology<Topology>());
  static_assert(check_compressor<Compressor>());
  static_assert(check_backend<Backend>());
  static_assert(std::same_as<Compressor, identity_compressor>,
                "squall: communicator runs dense collectives (identity_compressor) so far");
  static_assert(std::same_as<Backend, host_backend>,
                "squall: communicator runs on host_backend so far");

 public:
  using transport_type = Transport;
  using topology_type = Topology;

  /// Builds a communicator over `transport`, a collective call on every rank. With
  /// `automatic_topology` and an uncalibrated model, it measures every candidate schedule
  /// (allreduce of float sums, 4 KiB to `calibrate_up_to` bytes); with
  /// `hierarchical_topology` and an empty `node_of`, it finds the nodes.
  explicit communicator(Transport transport, Topology topology = {}, const options& opts = {},
                        const collective_tuning& tuning = {})
      : transport_(std::move(transport)),
        topology_(std::move(topology)),
        check_(opts.check_mismatch),
        tuning_(tuning) {
    if (tuning_.chunk_bytes == 0) {
      throw invalid_argument({.operation = "communicator", .rank = rank()},
                             "collective_tuning::chunk_bytes must be positive");
    }
    if constexpr (detail::has_node_map<Topology>) {
      if (topology_.node_of.empty()) topology_.node_of = find_nodes();
    }
    if constexpr (detail::has_cost_model<Topology>) {
      if (!topology_.model.calibrated()) calibrate();
    }
  }

  int rank() const { return transport_.rank(); }
  int size() const { return transport_.size(); }
  Transport& transport() { return transport_; }
  const Topology& topology() const { return topology_; }

  /// The schedule an allreduce of `bytes` runs: the topology's name, or
  /// "automatic:<chosen>" for `automatic_topology`.
  std::string schedule_for(std::size_t bytes) const {
    const schedule s = topology_.allreduce_schedule(rank(), size(), bytes);
    if (s.name == Topology::name) return std::string(Topology::name);
    return std::string(Topology::name) + ":" + std::string(s.name);
  }

  // ---- allreduce ------------------------------------------------------------------------------

  /// `data[i] = op over ranks of data[i]`, in place.
  template <element T, reduction_op<T> Op = sum_op>
  void allreduce(host_view<T> data, Op op = {}) {
    signature(collective::allreduce, dtype_of<T>, Op::name, data.count());
    allreduce_into(data.data(), data, op);
  }
  /// `out[i] = op over ranks of in[i]`; `in` and `out` have the same count and do not
  /// partially overlap (`invalid_argument` otherwise).
  template <element T, reduction_op<T> Op = sum_op>
  void allreduce(host_view<const T> in, host_view<T> out, Op op = {}) {
    require_count("allreduce", "out", out.count(), in.count());
    signature(collective::allreduce, dtype_of<T>, Op::name, in.count());
    place_check(in, out);
    allreduce_into(in.data(), out, op);
  }

  // ---- reduce_scatter ---------------------------------------------------------------------

  /// The part of `count` elements this rank gets from `reduce_scatter`: block `rank()` of
  /// `size()` near-equal blocks (the first `count % size()` one element longer).
  std::size_t block_count(std::size_t count) const {
    return detail::split_range(count, static_cast<std::size_t>(size()),
                               static_cast<std::size_t>(rank()))
        .count;
  }
  /// Where this rank's block starts in a buffer of `count` elements.
  std::size_t block_offset(std::size_t count) const {
    return detail::split_range(count, static_cast<std::size_t>(size()),
                               static_cast<std::size_t>(rank()))
        .begin;
  }

  /// Reduces `data` over ranks; this rank's block (`block_offset`, `block_count`) of `data`
  /// holds the result, the other blocks hold partial sums.
  template <element T, reduction_op<T> Op = sum_op>
  void reduce_scatter(host_view<T> data, Op op = {}) {
    signature(collective::reduce_scatter, dtype_of<T>, Op::name, data.count());
    reduce_scatter_into(data.data(), data.data(), data.data() + block_offset(data.count()),
                        data.count(), op);
  }
  /// `out` = this rank's block of `in` reduced over ranks; `out.count()` must be
  /// `block_count(in.count())`.
  template <element T, reduction_op<T> Op = sum_op>
  void reduce_scatter(host_view<const T> in, host_view<T> out, Op op = {}) {
    require_count("reduce_scatter", "out", out.count(), block_count(in.count()));
    signature(collective::reduce_scatter, dtype_of<T>, Op::name, in.count());
    reduce_scatter_into(in.data(), static_cast<T*>(nullptr), out.data(), in.count(), op);
  }

  // ---- allgather ----------------------------------------------------------------------------

  /// `out` = the `in` of rank 0, then of rank 1, ...; `out.count()` must be
  /// `size() * in.count()`. `in` may be this rank's block of `out` (in place).
  template <element T>
  void allgather(host_view<const T> in, host_view<T> out) {
    const std::size_t count = in.count();
    const auto p = static_cast<std::size_t>(size());
    require_count("allgather", "out", out.count(), count * p);
    signature(collective::allgather, dtype_of<T>, "", count);
    T* mine = out.data() + static_cast<std::size_t>(rank()) * count;
    if (in.data() != mine) place_check(in, host_view<T>(mine, count));
    const schedule s = gather_schedule(out.size_bytes());
    if constexpr (peer_memory_transport<Transport>) {
      if (s.one_shot && uses_peer_memory(out.size_bytes())) {
        settle();
        executor()
            .allgather_peer_memory(reinterpret_cast<const std::byte*>(in.data()),
                                   reinterpret_cast<std::byte*>(out.data()), in.size_bytes());
        return;
      }
    }
    if (in.data() != mine) place(in, host_view<T>(mine, count));
    run(s, out.data(), out.count(), detail::make_reducer<T, sum_op>());
  }

  // ---- broadcast ----------------------------------------------------------------------------

  /// `data` on every rank = `data` on `root`.
  template <element T>
  void broadcast(host_view<T> data, int root) {
    if (root < 0 || root >= size()) {
      throw invalid_argument({.operation = "broadcast", .rank = rank()},
                             "root " + std::to_string(root) + " outside [0, " +
                                 std::to_string(size()) + ")");
    }
    signature(collective::broadcast, dtype_of<T>, "", data.count(), root);
    schedule s;
    if constexpr (detail::has_broadcast<Topology>) {
      s = topology_.broadcast_schedule(rank(), size(), root);
    } else if (uses_peer_memory(data.size_bytes())) {
      s = direct_topology{}.broadcast_schedule(rank(), size(), root);
    } else {
      s = tree_topology{}.broadcast_schedule(rank(), size(), root);
    }
    if constexpr (peer_memory_transport<Transport>) {
      if (s.one_shot && uses_peer_memory(data.size_bytes())) {
        settle();
        executor()
            .broadcast_peer_memory(reinterpret_cast<std::byte*>(data.data()), data.size_bytes(),
                                   root);
        return;
      }
    }
    run(s, data.data(), data.count(), detail::make_reducer<T, sum_op>());
  }

  // ---- barrier ------------------------------------------------------------------------------

  /// Returns once every rank has entered the barrier.
  void barrier() {
    signature(collective::barrier, dtype::float32, "", 0);
    if (pending_) {
      settle();  // that barrier is the barrier
    } else {
      transport_.barrier().wait();
    }
  }

 private:
  static void require_count(std::string_view operation, std::string_view what, std::size_t got,
                            std::size_t want) {
    if (got != want) {
      throw invalid_argument({.operation = operation},
                             std::string(what) + " has " + std::to_string(got) +
                                 " elements where " + std::to_string(want) + " are needed");
    }
  }

  // Throws if `in` and `out` overlap without being the same memory.
  template <element T>
  void place_check(host_view<const T> in, host_view<T> out) {
    if (in.data() == out.data() || in.empty()) return;
    const auto* a = reinterpret_cast<const std::byte*>(in.data());
    const auto* b = reinterpret_cast<const std::byte*>(out.data());
    if (a < b + out.size_bytes() && b < a + in.size_bytes()) {
      throw invalid_argument({.operation = "collective", .rank = rank()},
                             "input and output partially overlap");
    }
  }

  // Copies `in` to `out` (same count), unless they are the same memory.
  template <element T>
  void place(host_view<const T> in, host_view<T> out) {
    place_check(in, out);
    if (in.data() != out.data() && !in.empty()) std::memcpy(out.data(), in.data(), in.size_bytes());
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
  void allreduce_into(const T* in, host_view<T> out, Op op) {
    if (out.empty()) {
      settle();
      return;
    }
    run_allreduce(allreduce_schedule_for(out.size_bytes()), in, out.data(), out.count(),
                  detail::make_reducer<T, Op>());
    kernels::finalize(host_backend{}, op, out, static_cast<std::size_t>(size()));
  }

  // Reduce-scatter of `count` elements of `in` into `out` (this rank's block). `whole` is
  // `in` itself when the caller lets it be overwritten (in place), else null: the message
  // schedules then work on a copy in `work_`. Through peer memory no copy is needed.
  template <element T, reduction_op<T> Op>
  void reduce_scatter_into(const T* in, T* whole, T* out, std::size_t count, Op op) {
    const std::size_t bytes = count * sizeof(T);
    const schedule s = scatter_schedule(bytes);
    const host_view<T> result(out, block_count(count));
    const detail::reducer r = detail::make_reducer<T, Op>();
    bool done = false;
    if constexpr (peer_memory_transport<Transport>) {
      if (s.one_shot && uses_peer_memory(bytes)) {
        settle();
        executor().reduce_scatter_peer_memory(reinterpret_cast<const std::byte*>(in),
                                              reinterpret_cast<std::byte*>(out), count, r);
        done = true;
      }
    }
    if (!done) {
      if (whole == nullptr) {
        if (work_.size() < bytes) work_.resize(bytes);
        whole = reinterpret_cast<T*>(work_.data());
        if (count != 0) std::memcpy(whole, in, bytes);
      }
      run(s, whole, count, r);
      T* mine = whole + block_offset(count);
      if (mine != out && !result.empty()) std::memcpy(out, mine, result.size_bytes());
    }
    kernels::finalize(host_backend{}, op, result, static_cast<std::size_t>(size()));
  }

  // The schedules of reduce_scatter and allgather: the topology's own, else direct's one-shot
  // where the transport has peer memory, else the ring's.
  schedule scatter_schedule(std::size_t bytes) const {
    if constexpr (detail::has_reduce_scatter<Topology>) {
      (void)bytes;
      return topology_.reduce_scatter_schedule(rank(), size());
    } else {
      if (uses_peer_memory(bytes)) return direct_topology{}.reduce_scatter_schedule(rank(), size());
      return ring_topology{}.reduce_scatter_schedule(rank(), size());
    }
  }
  schedule gather_schedule(std::size_t bytes) const {
    if constexpr (detail::has_allgather<Topology>) {
      (void)bytes;
      return topology_.allgather_schedule(rank(), size());
    } else {
      if (uses_peer_memory(bytes)) return direct_topology{}.allgather_schedule(rank(), size());
      return ring_topology{}.allgather_schedule(rank(), size());
    }
  }

  template <class T>
  void run(const schedule& s, T* data, std::size_t count, const detail::reducer& r) {
    settle();
    executor().run(s, reinterpret_cast<std::byte*>(data), count, r);
  }

  // Room for the one-shot schedule: each half of the window holds a round of at least 64
  // elements per rank.
  bool windows_fit(const detail::reducer& r) {
    return detail::window_data_bytes(transport_) / 2 >=
           64 * r.element_bytes * static_cast<std::size_t>(size());
  }

  void exchange(const void* mine, std::size_t bytes, void* all) {
    executor().exchange(mine, bytes, all);
  }

  // The mismatch check: every rank learns every rank's signature and compares them all, so
  // every rank throws the same `mismatch_error`. On a direct transport the signatures go
  // through a slot at the end of each window (alternating by call, so a rank one call ahead
  // never overwrites one still read) and one barrier; `settle()` is that barrier and the
  // comparison, and the one-shot allreduce fuses it with its own first barrier. Elsewhere
  // they are swapped by messages.
  void signature(collective kind, dtype type, std::string_view op, std::size_t count,
                 int root = -1) {
    ++sequence_;
    pending_ = false;
    if (!check_ || size() == 1) return;
    const detail::call_signature mine{.sequence = sequence_,
                                      .count = count,
                                      .root = root,
                                      .kind = static_cast<std::uint8_t>(kind),
                                      .type = static_cast<std::uint8_t>(type),
                                      .op = detail::op_code(op)};
    signatures_.resize(static_cast<std::size_t>(size()));
    if constexpr (direct_transport<Transport>) {
      if (transport_.local_view().count() >= detail::signature_area) {
        std::memcpy(signature_slot(rank()), &mine, sizeof mine);
        pending_ = true;
        return;
      }
    }
    exchange(&mine, sizeof mine, signatures_.data());
    compare_signatures();
  }

  // Completes a pending window signature check: barrier, then compare.
  void settle() {
    if (!pending_) return;
    transport_.barrier().wait();
    read_signatures();
  }

  void read_signatures() {
    pending_ = false;
    if constexpr (direct_transport<Transport>) {
      for (int q = 0; q < size(); ++q) {
        std::memcpy(&signatures_[static_cast<std::size_t>(q)], signature_slot(q),
                    sizeof(detail::call_signature));
      }
    }
    compare_signatures();
  }

  std::byte* signature_slot(int q) {
    const std::size_t at = detail::window_data_bytes(transport_) + (sequence_ % 2) * 128;
    return transport_.peer_view(q).data() + at;
  }

  void compare_signatures() {
    for (int q = 0; q < size(); ++q) {
      const detail::call_signature& theirs = signatures_[static_cast<std::size_t>(q)];
      if (std::memcmp(&theirs, &signatures_[0], sizeof theirs) != 0) {
        const auto kind = static_cast<collective>(signatures_[static_cast<std::size_t>(rank())].kind);
        throw mismatch_error({.operation = to_string(kind), .rank = rank(), .peer = q},
                             "rank " + std::to_string(q) + " made " + detail::describe(theirs) +
                                 ", rank 0 made " + detail::describe(signatures_[0]));
      }
    }
  }

  // The node of every rank: SQUALL_RANKS_PER_NODE consecutive ranks per node if set, else
  // ranks with the same host name share a node.
  std::vector<int> find_nodes() {
    std::vector<int> node_of(static_cast<std::size_t>(size()));
    if (const char* text = std::getenv(ranks_per_node_env_var); text != nullptr && *text) {
      char* end = nullptr;
      const long per = std::strtol(text, &end, 10);
      if (*end != '\0' || per <= 0) {
        throw invalid_argument({.operation = "hierarchical_topology", .rank = rank()},
                               std::string(ranks_per_node_env_var) + "='" + text +
                                   "' is not a positive whole number");
      }
      for (int q = 0; q < size(); ++q) node_of[static_cast<std::size_t>(q)] = q / static_cast<int>(per);
      return node_of;
    }
    std::array<char, 256> host{};
    gethostname(host.data(), host.size() - 1);
    std::vector<std::array<char, 256>> hosts(static_cast<std::size_t>(size()));
    exchange(host.data(), host.size(), hosts.data());
    for (int q = 0; q < size(); ++q) {
      int first = q;
      for (int e = 0; e < q; ++e) {
        if (hosts[static_cast<std::size_t>(e)] == hosts[static_cast<std::size_t>(q)]) {
          first = e;
          break;
        }
      }
      node_of[static_cast<std::size_t>(q)] = first;
    }
    return node_of;
  }

  // Measures every candidate of the cost model on these ranks: float sums of 4 KiB to
  // `calibrate_up_to` bytes in steps of 4, best of several runs, the slowest rank's time.
  void calibrate() {
    const std::size_t top = std::max<std::size_t>(topology_.calibrate_up_to, std::size_t{16} << 10);
    std::vector<std::size_t> sizes;
    for (std::size_t b = std::size_t{4} << 10; b <= top; b *= 4) sizes.push_back(b);
    // Out of place, as squall-bench and most training loops call it: schedules other than
    // the one-shot read pay the copy of the input into the output, and the model should see it.
    std::vector<float> input(top / sizeof(float));
    std::vector<float> buffer(top / sizeof(float));
    const auto candidates = cost_model::candidates;
    std::vector<double> mine(candidates * sizes.size(), 1e30);
    // Sizes outer, candidates inner: whatever else the machine does at a moment hits every
    // candidate alike. Each trial times calls back to back, as a training loop makes them
    // (a single call right after a barrier flatters schedules that like starting in step):
    // 4 MiB worth of calls (2 to 128) per trial, the best of 5 trials counts.
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      const std::size_t count = sizes[i] / sizeof(float);
      const int calls = static_cast<int>(
          std::clamp<std::size_t>((std::size_t{4} << 20) / sizes[i], 2, 128));
      for (int trial = 0; trial < 5; ++trial) {
        for (std::size_t c = 0; c < candidates; ++c) {
          run_candidate(c, input.data(), buffer.data(), count);  // warm
          transport_.barrier().wait();
          const auto start = std::chrono::steady_clock::now();
          for (int call = 0; call < calls; ++call) {
            run_candidate(c, input.data(), buffer.data(), count);
          }
          const double took =
              std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() /
              calls;
          double& best = mine[c * sizes.size() + i];
          best = std::min(best, took);
        }
      }
    }
    std::vector<double> all(mine.size() * static_cast<std::size_t>(size()));
    exchange(mine.data(), mine.size() * sizeof(double), all.data());
    for (std::size_t c = 0; c < candidates; ++c) {
      auto& points = topology_.model.measured[c];
      points.clear();
      for (std::size_t i = 0; i < sizes.size(); ++i) {
        double slowest = 0;
        for (int q = 0; q < size(); ++q) {
          slowest = std::max(slowest, all[static_cast<std::size_t>(q) * mine.size() +
                                          c * sizes.size() + i]);
        }
        points.push_back({sizes[i], slowest});
      }
    }
  }

  // One out-of-place float sum with candidate `c` of the cost model, as `allreduce` runs it.
  void run_candidate(std::size_t c, const float* in, float* out, std::size_t count) {
    const int r = rank();
    const int p = size();
    const std::size_t bytes = count * sizeof(float);
    schedule s;
    switch (c) {
      case 0: s = ring_topology{}.allreduce_schedule(r, p, bytes); break;
      case 1: s = tree_topology{}.allreduce_schedule(r, p, bytes); break;
      case 2: s = direct_topology{}.allreduce_schedule(r, p, bytes); break;
      default: s = halving_doubling_topology{}.allreduce_schedule(r, p, bytes);
    }
    run_allreduce(s, in, out, count, detail::make_reducer<float, sum_op>());
  }

  // Runs allreduce schedule `s` from `in` into `out` (`in` may be `out`): the one-shot one
  // straight out of the peers' buffers or through the windows where the transport has them,
  // else the schedule's messages on `out` after copying `in` there.
  template <class T>
  void run_allreduce(const schedule& s, const T* in, T* out, std::size_t count,
                     const detail::reducer& r) {
    if constexpr (peer_memory_transport<Transport>) {
      if (s.one_shot && uses_peer_memory(count * r.element_bytes)) {
        settle();
        executor()
            .run_one_shot_peer_memory(reinterpret_cast<const std::byte*>(in),
                               reinterpret_cast<std::byte*>(out), count, r);
        return;
      }
    }
    if (in != out) std::memcpy(out, in, count * r.element_bytes);
    if constexpr (direct_transport<Transport>) {
      if (s.one_shot && windows_fit(r)) {
        executor()
            .run_one_shot(reinterpret_cast<std::byte*>(out), count, r, window_round_, [this] {
              if (pending_) read_signatures();
            });
        return;
      }
    }
    settle();
    run(s, out, count, r);
  }

  detail::executor<Transport> executor() { return {transport_, buffers_, tuning_}; }

  // The allreduce schedule for `bytes`, kept for the next call of the same size, so that a
  // training loop's repeated allreduce builds no schedule (and allocates nothing).
  const schedule& allreduce_schedule_for(std::size_t bytes) {
    if (!cached_ || cached_bytes_ != bytes) {
      cached_schedule_ = topology_.allreduce_schedule(rank(), size(), bytes);
      cached_bytes_ = bytes;
      cached_ = true;
    }
    return cached_schedule_;
  }

  Transport transport_;
  Topology topology_;
  bool check_ = true;
  collective_tuning tuning_;
  std::uint64_t sequence_ = 0;
  bool pending_ = false;  // a window signature check waits for its barrier (`settle`)
  std::size_t window_round_ = 0;
  detail::executor_buffers<Transport> buffers_;
  std::vector<std::byte> work_;
  std::vector<detail::call_signature> signatures_;
  bool cached_ = false;
  std::size_t cached_bytes_ = 0;
  schedule cached_schedule_;
};

}  // namespace squall
