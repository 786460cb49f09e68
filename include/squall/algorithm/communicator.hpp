// SPDX-License-Identifier: Apache-2.0
#pragma once
/// `communicator<Transport, Topology, Compressor, Backend>`: the dense collectives, and the
/// compressed allreduce with `Compressor`.
///
///   squall::communicator<squall::shm_transport, squall::automatic_topology> comm{
///       squall::shm_transport{}};
///   comm.allreduce(squall::host_view<float>(grad), squall::avg_op{});
///
///   squall::communicator<squall::shm_transport, squall::ring_topology,
///                        squall::error_feedback<squall::topk_compressor>> sparse{
///       squall::shm_transport{}, {}, squall::error_feedback<squall::topk_compressor>{}};
///   auto state = sparse.make_state<float>(grad.size());   // one per tensor, kept by the caller
///   sparse.allreduce(squall::host_view<float>(grad), state, squall::avg_op{});
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
#include <squall/algorithm/detail/gtopk.hpp>
#include <squall/algorithm/detail/requantize.hpp>
#include <squall/backend/host.hpp>
#include <squall/compress/linear_body.hpp>
#include <squall/compress/none.hpp>
#include <squall/compress/state.hpp>
#include <squall/compress/traits.hpp>
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
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <unistd.h>  // gethostname
#include <utility>   // move
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
  std::int32_t root = -1;  ///< broadcast's root; a compressed call's step (low 31 bits)
  std::uint8_t kind = 0;
  std::uint8_t type = 0;
  std::uint8_t op = 0;
  std::uint8_t compressed = 0;  ///< a compressed collective's `compressed_path`, 0 if dense
};

/// A linear compressor pairs with a topology through `linear_body<Compressor>`: the topology
/// adds payload bodies as numbers. Without one the pairing is impossible, and the
/// instantiation of `linear_pairing<Compressor, Topology>` (named in the diagnostic above the
/// error) fails with what to do.
template <class Compressor, class Topology>
struct linear_pairing {
  static_assert(has_linear_body<Compressor>,
                "squall: this Compressor declares aggregation_class::linear but has no "
                "squall::linear_body<Compressor>, so the Topology cannot add its payloads: "
                "specialize linear_body (where the summable body lies), or declare the "
                "requantize class (payloads gathered, decoded and summed)");
  static constexpr bool possible = true;
};

/// The algorithm a compressed collective runs, in its call signature: ranks that would run
/// different ones (one tuned for gTop-k, one for the allgather-union) get `mismatch_error`
/// instead of waiting on each other until the deadline.
enum class compressed_path : std::uint8_t { linear = 1, powersgd, per_hop, gather, gtopk };

inline std::string_view to_string(compressed_path p) {
  switch (p) {
    case compressed_path::linear: return "linear";
    case compressed_path::powersgd: return "PowerSGD";
    case compressed_path::per_hop: return "per hop";
    case compressed_path::gather: return "gather";
    case compressed_path::gtopk: return "gTop-k";
  }
  return "?";
}
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
  if (s.compressed != 0) {
    text += ", compressed (" + std::string(to_string(static_cast<compressed_path>(s.compressed))) +
            "), at step " + std::to_string(s.root) + " (mod 2^31)";
  } else if (s.root >= 0) {
    text += " from root " + std::to_string(s.root);
  }
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

/// The collectives over `Transport`, scheduled by `Topology`. Owns the transport. The dense
/// collectives ignore `Compressor`; the compressed allreduce (the overload taking a
/// `compression_state`) uses it. The CUDA backend comes with its own issue; this class
/// states so at compile time.
template <transport Transport, topology Topology = automatic_topology,
          compressor Compressor = identity_compressor, backend Backend = host_backend>
class communicator {
  static_assert(check_transport<Transport>());
  static_assert(check_topology<Topology>());
  static_assert(check_compressor<Compressor>());
  static_assert(check_backend<Backend>());
  static_assert(std::same_as<Backend, host_backend>,
                "squall: communicator runs on host_backend so far");

 public:
  using transport_type = Transport;
  using topology_type = Topology;
  using compressor_type = Compressor;

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

  /// The same, with the compressor the compressed collectives use (its tuned parameters:
  /// ratio, bits, rank, seed). Every rank must pass the same parameters.
  template <std::same_as<Compressor> C>
  communicator(Transport transport, Topology topology, C compressor, const options& opts = {},
               const collective_tuning& tuning = {})
      : communicator(std::move(transport), std::move(topology), opts, tuning) {
    compressor_ = std::move(compressor);
  }

  int rank() const { return transport_.rank(); }
  int size() const { return transport_.size(); }
  Transport& transport() { return transport_; }
  const Topology& topology() const { return topology_; }
  const Compressor& compressor() const { return compressor_; }

  /// A fresh compression state for a tensor of `count` elements of `T`, for this
  /// communicator's compressor (PowerSGD's Q drawn from its seed and shape).
  template <real_gradient T>
  compression_state<Compressor, T> make_state(std::size_t count) const {
    return compression_state<Compressor, T>(compressor_, count);
  }

  /// The bytes this rank moved in its last collective (counted from its start).
  transfer_stats last_transfer() const { return {buffers_.bytes_sent, buffers_.bytes_received}; }

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

  /// The compressed allreduce, in place: `data` = the sum (`sum_op`) or mean (`avg_op`) over
  /// ranks of what `Compressor` sends of each rank's `data`; every rank gets bitwise the same
  /// result. `state` is this tensor's (`make_state`); its step keys the compressor's draws
  /// and advances by one; its residual (error feedback) and Q (PowerSGD) are updated. The
  /// algorithm follows the compressor's aggregation class:
  ///
  /// - linear with a `linear_body` (cast, randomk, count_sketch): encode, reduce the
  ///   payloads' bodies through the topology's own allreduce schedule, decode;
  /// - PowerSGD: P = M Q, summed; orthogonalize P; Q = M^T P, summed and kept; data = P Q^T;
  ///   with error feedback M = residual + data and residual = M - P Q_mine^T, the rank's own
  ///   share (so the residuals and the results add up to the inputs);
  /// - requantize (int8, qsgd, terngrad, sign) on ring or tree with `collective_tuning::
  ///   requantize` automatic or per_hop: decode, add and re-encode at each hop (CGX): the
  ///   ring's reduce-scatter of encoded partials, each block's owner encoding the sum once,
  ///   an allgather of those payloads; the tree's reduce up, the root's payload broadcast
  ///   down; every rank decodes every final payload (algorithm/detail/requantize.hpp has the
  ///   streams and the error-feedback rule). per_hop on another topology: `invalid_argument`;
  /// - sparse (topk, threshold) with `collective_tuning::sparse` gtopk: gTop-k (Shi et al.
  ///   2019): the local sets merged pairwise up a tree keeping the k largest sums, the global
  ///   set G broadcast down; data = G (algorithm/detail/gtopk.hpp: tree, ties, error feedback);
  /// - requantize otherwise, sparse, vote (and linear compressors without a body): every rank encodes
  ///   once, the payloads are gathered (sizes first unless fixed size, padded to the
  ///   largest) through the topology's allgather schedule, and every rank decodes all P and
  ///   sums them in rank order. A vote is element i = sign(sum_q sign(d_q[i])) x
  ///   sum_q |d_q[i]|, d_q rank q's decoded payload: the majority sign times the sum of the
  ///   ranks' scales (their mean with `avg_op`); a tie gives 0.
  ///
  /// `avg_op` divides the sum by `size()`. Throws `invalid_argument` if `state.count()` is
  /// not `data.count()` (naming both), what the compressor throws (a bad parameter or
  /// payload), and the transport's errors. Every rank must call it with the same count,
  /// op and step.
  template <real_gradient T, class Op = sum_op>
  void allreduce(host_view<T> data, compression_state<Compressor, T>& state, Op op = {}) {
    static_assert(std::same_as<Op, sum_op> || std::same_as<Op, avg_op>,
                  "squall: a compressed allreduce sums or averages: sum_op or avg_op");
    if (state.count() != data.count()) {
      throw invalid_argument({.operation = "compressed allreduce", .rank = rank()},
                             "a compression state of " + std::to_string(state.count()) +
                                 " elements used for data of " + std::to_string(data.count()) +
                                 " elements");
    }
    // the step goes in the signature: ranks at different steps would draw differently
    const detail::compressed_path path = compressed_path_of();
    signature(collective::allreduce, dtype_of<T>, Op::name, data.count(),
              static_cast<int>(state.step() & 0x7fffffff), path);
    switch (path) {
      case detail::compressed_path::powersgd:
        if constexpr (uses_powersgd<Compressor>) powersgd_allreduce(data, state);
        break;
      case detail::compressed_path::linear:
        if constexpr (has_linear_body<inner_compressor_t<Compressor>>) linear_allreduce(data, state);
        break;
      case detail::compressed_path::per_hop:
        if constexpr (Compressor::aggregation == aggregation_class::requantize) {
          requantize_allreduce(data, state);
        }
        break;
      case detail::compressed_path::gtopk:
        if constexpr (detail::gtopk_mergeable<inner_compressor_t<Compressor>>) {
          gtopk_allreduce(data, state);
        }
        break;
      case detail::compressed_path::gather:
        gather_allreduce(data, state);
        break;
    }
    kernels::finalize(host_backend{}, op, data, static_cast<std::size_t>(size()));
    state.advance();
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

  /// The compressed allgather: block q of `out` (`out.count()` = `size() * in.count()`) is
  /// rank q's `in` encoded by `Compressor` with this step's stream (through the residual with
  /// error feedback, which then keeps what the payload left out) and decoded; every rank gets
  /// bitwise the same `out`. Payloads are gathered as the gather-then-reduce allreduce gathers
  /// them (sizes first unless fixed size). `state` is this tensor's, for `in.count()` elements;
  /// its step advances by one. PowerSGD sends its one-rank payload (one power iteration from
  /// a Q drawn from its seed and the step; the state's Q is not used). `in` is read before
  /// `out` is written, so it may lie in `out`. Throws `invalid_argument` if `out.count()` is not
  /// `size() * in.count()` or `state.count()` not `in.count()`, what the compressor throws,
  /// and the transport's errors.
  template <real_gradient T>
  void allgather(host_view<const T> in, host_view<T> out, compression_state<Compressor, T>& state) {
    const std::size_t count = in.count();
    const auto p = static_cast<std::size_t>(size());
    require_count("compressed allgather", "out", out.count(), count * p);
    if (state.count() != count) {
      throw invalid_argument({.operation = "compressed allgather", .rank = rank()},
                             "a compression state of " + std::to_string(state.count()) +
                                 " elements used for blocks of " + std::to_string(count) +
                                 " elements");
    }
    signature(collective::allgather, dtype_of<T>, "", count,
              static_cast<int>(state.step() & 0x7fffffff), detail::compressed_path::gather);
    // step 0: encode; step 1: gather the payloads; step 2: decode rank q's into block q
    const std::size_t stride = gather_payloads(encode_payload(in, state));
    for (std::size_t q = 0; q < p; ++q) {
      compressor_.decode(host_backend{},
                         host_view<const std::byte>(gathered_.data() + q * stride,
                                                    static_cast<std::size_t>(sizes_[q])),
                         host_view<T>(out.data() + q * count, count));
    }
    state.advance();
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
                 int root = -1, std::optional<detail::compressed_path> compressed = std::nullopt) {
    ++sequence_;
    pending_ = false;
    buffers_.bytes_sent = 0;
    buffers_.bytes_received = 0;
    if (!check_ || size() == 1) return;
    const detail::call_signature mine{.sequence = sequence_,
                                      .count = count,
                                      .root = root,
                                      .kind = static_cast<std::uint8_t>(kind),
                                      .type = static_cast<std::uint8_t>(type),
                                      .op = detail::op_code(op),
                                      .compressed = static_cast<std::uint8_t>(
                                          compressed ? static_cast<std::uint8_t>(*compressed) : 0)};
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

  // ---- compressed allreduce ---------------------------------------------------------------

  // `count` elements of T in `bytes` (grown as needed; operator new aligns it to 16).
  template <class T>
  static T* scratch_of(std::vector<std::byte>& bytes, std::size_t count) {
    if (bytes.size() < count * sizeof(T)) bytes.resize(count * sizeof(T));
    return reinterpret_cast<T*>(bytes.data());
  }

  // The algorithm this communicator's compressed allreduce runs: chosen at compile time from
  // the compressor's aggregation class, then from the tuning (and, for per hop, the topology).
  detail::compressed_path compressed_path_of() const {
    using Inner = inner_compressor_t<Compressor>;
    if constexpr (uses_powersgd<Compressor>) {
      return detail::compressed_path::powersgd;
    } else if constexpr (Compressor::aggregation == aggregation_class::linear) {
      static_assert(detail::linear_pairing<Inner, Topology>::possible);
      return detail::compressed_path::linear;
    } else if constexpr (Compressor::aggregation == aggregation_class::requantize) {
      return detail::uses_per_hop<Topology, Inner>(tuning_.requantize, rank(), size())
                 ? detail::compressed_path::per_hop
                 : detail::compressed_path::gather;
    } else if constexpr (detail::gtopk_mergeable<Inner>) {
      return tuning_.sparse == sparse_algorithm::gtopk ? detail::compressed_path::gtopk
                                                       : detail::compressed_path::gather;
    } else {
      return detail::compressed_path::gather;
    }
  }

  // Encodes `data` into payload_ with this step's stream (through the residual with error
  // feedback); returns the payload's size.
  template <class T>
  std::size_t encode_payload(host_view<T> data, compression_state<Compressor, T>& state) {
    const std::size_t capacity = compressor_.max_payload_bytes(dtype_of<T>, data.count());
    if (payload_.size() < capacity) payload_.resize(capacity);
    const host_view<const T> in(data.data(), data.count());
    const host_view<std::byte> out(payload_.data(), capacity);
    const random_stream stream = state.stream(rank());
    if constexpr (is_error_feedback<Compressor>) {
      const host_view<T> scratch(scratch_of<T>(decoded_, data.count()), data.count());
      return compressor_.encode(host_backend{}, state.residual(), in, out, scratch, stream);
    } else if constexpr (requires { compressor_.encode(host_backend{}, in, out, stream); }) {
      return compressor_.encode(host_backend{}, in, out, stream);
    } else {
      return compressor_.encode(host_backend{}, in, out);
    }
  }

  // step 0: encode; step 1: allreduce the payload's body (elements E) with the topology's
  // schedule, the header fields being equal on every rank; step 2: decode the sum.
  template <class T>
  void linear_allreduce(host_view<T> data, compression_state<Compressor, T>& state) {
    using Inner = inner_compressor_t<Compressor>;
    using E = typename linear_body<Inner>::template element<T>;
    const linear_body_range body =
        linear_body<Inner>::template of<T>(inner_of(compressor_), data.count());
    const std::size_t bytes = encode_payload(data, state);
    if (body.offset > bytes || body.count > (bytes - body.offset) / sizeof(E)) {
      throw error(make_error_code(errc::internal), {.operation = "compressed allreduce"},
                  "a payload of " + std::to_string(bytes) + " bytes has no body of " +
                      std::to_string(body.count) + " elements at " + std::to_string(body.offset));
    }
    E* values = reinterpret_cast<E*>(payload_.data() + body.offset);
    if (body.count == 0) {
      settle();
    } else {
      run_allreduce(allreduce_schedule_for(body.count * sizeof(E)), values, values, body.count,
                    detail::make_reducer<E, sum_op>());
    }
    compressor_.decode(host_backend{}, host_view<const std::byte>(payload_.data(), bytes), data);
  }

  // The sum over ranks of `count` elements at `x`, in place, with the topology's schedule.
  template <class T>
  void sum_in_place(T* x, std::size_t count) {
    if (count == 0) {
      settle();
      return;
    }
    run_allreduce(allreduce_schedule_for(count * sizeof(T)), x, x, count,
                  detail::make_reducer<T, sum_op>());
  }

  // PowerSGD (Vogels et al., NeurIPS 2019, Algorithm 1 with error feedback):
  // step 0: M = data (or residual + data); P = M Q with Q the state's warm start; sum P.
  // step 1: orthogonalize P; Q = M^T P (kept as this rank's share); sum Q into the state.
  // step 2: residual -= P Q_mine^T (error feedback); data = P Q^T.
  template <class T>
  void powersgd_allreduce(host_view<T> data, compression_state<Compressor, T>& state) {
    const powersgd_compressor& c = inner_of(compressor_);
    powersgd_state<T>& ps = state.powersgd();
    const std::size_t count = data.count();
    const powersgd_shape shape = c.shape(count);
    if (ps.rows() != shape.rows || ps.columns() != shape.columns || ps.rank() != c.rank) {
      throw invalid_argument({.operation = "compressed allreduce", .rank = rank()},
                             "a PowerSGD state of " + std::to_string(ps.rows()) + " x " +
                                 std::to_string(ps.columns()) + " rank " +
                                 std::to_string(ps.rank()) + " used for " +
                                 std::to_string(shape.rows) + " x " +
                                 std::to_string(shape.columns) + " rank " + std::to_string(c.rank));
    }
    if (count == 0) {
      settle();
      return;
    }
    const host_backend b{};
    const std::size_t p_count = shape.rows * c.rank;
    const std::size_t q_count = shape.columns * c.rank;
    const std::size_t q_at = detail::align_up(p_count * sizeof(T), 16) / sizeof(T);
    T* p = scratch_of<T>(factors_, q_at + q_count);
    T* mine = p + q_at;
    host_view<const T> matrix(data.data(), count);
    if constexpr (is_error_feedback<Compressor>) {
      kernels::reduce_into(b, sum_op{}, state.residual().residual(), matrix);
      matrix = host_view<const T>(state.residual().residual().data(), count);
    }
    c.multiply(b, matrix, host_view<const T>(ps.q().data(), q_count), host_view<T>(p, p_count));
    sum_in_place(p, p_count);
    c.orthogonalize(b, host_view<T>(p, p_count));
    c.multiply_transposed(b, matrix, host_view<const T>(p, p_count), host_view<T>(mine, q_count));
    std::memcpy(ps.q().data(), mine, q_count * sizeof(T));
    sum_in_place(ps.q().data(), q_count);
    if constexpr (is_error_feedback<Compressor>) {
      T* share = scratch_of<T>(decoded_, count);
      c.decompress(b, host_view<const T>(p, p_count), host_view<const T>(mine, q_count),
                   host_view<T>(share, count));
      kernels::subtract_into(b, state.residual().residual(), host_view<const T>(share, count));
    }
    c.decompress(b, host_view<const T>(p, p_count), host_view<const T>(ps.q().data(), q_count),
                 data);
  }

  // A reducer for schedules that only copy (allgather): bytes, never combined.
  static detail::reducer copy_only_reducer() {
    return {.element_bytes = 1,
            .reduce_into =
                [](std::byte*, const std::byte*, std::size_t) {
                  throw error(make_error_code(errc::internal), {.operation = "allgather"},
                              "a copy-only schedule asked for a reduction");
                },
            .reduce =
                [](std::byte*, const std::byte*, const std::byte*, std::size_t) {
                  throw error(make_error_code(errc::internal), {.operation = "allgather"},
                              "a copy-only schedule asked for a reduction");
                }};
  }

  // Gathers every rank's `bytes` at `mine` into `all`, rank q's at q x `stride` (`stride` >=
  // every rank's bytes; the rest of each slot zero), with the topology's allgather schedule.
  void gather_blobs(const std::byte* mine, std::size_t bytes, std::size_t stride, std::byte* all) {
    const std::size_t total = stride * static_cast<std::size_t>(size());
    std::byte* slot = all + static_cast<std::size_t>(rank()) * stride;
    if (bytes != 0) std::memcpy(slot, mine, bytes);
    if (stride != bytes) std::memset(slot + bytes, 0, stride - bytes);
    settle();
    if (size() == 1 || total == 0) return;
    const schedule s = gather_schedule(total);
    if constexpr (peer_memory_transport<Transport>) {
      if (s.one_shot && uses_peer_memory(total)) {
        executor().allgather_peer_memory(slot, all, stride);
        return;
      }
    }
    executor().run(s, all, total, copy_only_reducer());
  }

  // Per-hop requantization on the ring or tree (algorithm/detail/requantize.hpp): decode,
  // add, re-encode at every hop; error feedback through the state's residual.
  template <class T>
  void requantize_allreduce(host_view<T> data, compression_state<Compressor, T>& state) {
    settle();
    detail::requantize_hops<Transport, inner_compressor_t<Compressor>, T> hops{
        .transport = transport_,
        .c = inner_of(compressor_),
        .buffers = requantize_,
        .sent = buffers_.bytes_sent,
        .received = buffers_.bytes_received,
        .step = state.step()};
    if constexpr (is_error_feedback<Compressor>) hops.residual = state.residual().residual().data();
    if constexpr (std::same_as<Topology, ring_topology>) {
      hops.ring(data.data(), data.count());
    } else {
      hops.tree(data.data(), data.count());
    }
  }

  // Gathers every rank's payload (this rank's: the first `mine` bytes of payload_) into
  // gathered_: the sizes first (into sizes_) unless fixed size, each payload at q x the stride
  // returned (the largest size rounded up to 8 bytes).
  std::size_t gather_payloads(std::uint64_t mine) {
    const auto p = static_cast<std::size_t>(size());
    settle();
    sizes_.assign(p, mine);
    if constexpr (!compression_traits<inner_compressor_t<Compressor>>::fixed_size) {
      if (p > 1) exchange(&mine, sizeof mine, sizes_.data());
    }
    std::uint64_t largest = 0;
    for (const std::uint64_t n : sizes_) largest = std::max(largest, n);
    const std::size_t stride = detail::align_up(static_cast<std::size_t>(largest), 8);
    if (gathered_.size() < stride * p) gathered_.resize(stride * p);
    gather_blobs(payload_.data(), static_cast<std::size_t>(mine), stride, gathered_.data());
    return stride;
  }

  // The encode of a read-only input: `encode_payload` only reads its data.
  template <class T>
  std::size_t encode_payload(host_view<const T> in, compression_state<Compressor, T>& state) {
    return encode_payload(host_view<T>(const_cast<T*>(in.data()), in.count()), state);
  }

  // step 0: encode once; step 1: exchange sizes (unless fixed size) and gather every payload;
  // step 2: decode each and sum in rank order (a vote: count signs, add magnitudes).
  template <class T>
  void gather_allreduce(host_view<T> data, compression_state<Compressor, T>& state) {
    const std::size_t count = data.count();
    const auto p = static_cast<std::size_t>(size());
    const std::size_t stride = gather_payloads(encode_payload(data, state));
    const auto payload_of = [&](std::size_t q) {
      return host_view<const std::byte>(gathered_.data() + q * stride,
                                        static_cast<std::size_t>(sizes_[q]));
    };
    const host_backend b{};
    T* out = data.data();
    T* decoded = scratch_of<T>(decoded_, count);
    const host_view<T> d(decoded, count);
    if constexpr (Compressor::aggregation == aggregation_class::vote) {
      std::int32_t* votes = scratch_of<std::int32_t>(votes_, count);
      for (std::size_t q = 0; q < p; ++q) {
        compressor_.decode(b, payload_of(q), d);
        for (std::size_t i = 0; i < count; ++i) {
          const T x = decoded[i];
          const std::int32_t v =
              static_cast<std::int32_t>(x > T(0)) - static_cast<std::int32_t>(x < T(0));
          const T magnitude = x < T(0) ? -x : x;
          votes[i] = q == 0 ? v : votes[i] + v;
          out[i] = q == 0 ? magnitude : out[i] + magnitude;
        }
      }
      for (std::size_t i = 0; i < count; ++i) {
        out[i] = votes[i] > 0 ? out[i] : votes[i] < 0 ? -out[i] : T(0) * out[i];
      }
    } else {
      compressor_.decode(b, payload_of(0), data);
      for (std::size_t q = 1; q < p; ++q) {
        compressor_.decode(b, payload_of(q), d);
        kernels::reduce_into(b, sum_op{}, data, host_view<const T>(decoded, count));
      }
    }
  }

  // gTop-k (algorithm/detail/gtopk.hpp): encode (through error feedback), merge the sparse
  // sets up a tree to rank 0 keeping the k largest, broadcast G back down; data = G.
  template <class T>
  void gtopk_allreduce(host_view<T> data, compression_state<Compressor, T>& state) {
    const std::size_t bytes = encode_payload(data, state);
    settle();
    T* residual = nullptr;
    if constexpr (is_error_feedback<Compressor>) residual = state.residual().residual().data();
    std::size_t cap = 0;  // threshold: each rank's own entry count
    if constexpr (requires { inner_of(compressor_).entries(data.count()); }) {
      cap = inner_of(compressor_).entries(data.count());
    }
    detail::gtopk_allreduce(transport_, buffers_,
                            host_view<const std::byte>(payload_.data(), bytes), cap, data,
                            residual, gtopk_.template of<T>());
  }

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
  Compressor compressor_{};
  std::vector<std::byte> payload_;    // this rank's payload
  std::vector<std::byte> gathered_;   // every rank's payload, each at a multiple of 8 bytes
  std::vector<std::byte> decoded_;    // a decoded payload, or error feedback's scratch
  std::vector<std::byte> factors_;    // PowerSGD's P and this rank's Q
  std::vector<std::byte> votes_;      // a vote's sums of signs
  detail::requantize_buffers requantize_;  // per-hop requantization's payloads
  std::vector<std::uint64_t> sizes_;  // every rank's payload size
  detail::gtopk_workspace gtopk_;     // gTop-k's sets
  std::vector<detail::call_signature> signatures_;
  bool cached_ = false;
  std::size_t cached_bytes_ = 0;
  schedule cached_schedule_;
};

}  // namespace squall
