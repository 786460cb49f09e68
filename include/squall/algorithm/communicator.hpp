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
///   buffer it was given may be reused. The `i` forms (`iallreduce`, ...) return a `request`
///   at once and run on the communicator's progress thread, in the order started. All ranks must
///   call the same collectives in the same order with the same count, element type, op and root.
///   With `options::check_mismatch` (the default) a cheap exchange of a 24-byte call signature
///   before each collective catches a difference and throws `mismatch_error` on every rank, naming
///   the ranks; without it a mismatch is caught by the transport (size mismatch) or the deadline.
/// - Every rank holds bitwise the same result: each element is reduced by one rank in one
///   fixed order and then copied, whatever the schedule.
/// - Any count, 0 and above 2^31 elements included; any rank count; in place (one view) or
///   out of place (two views, which must not partially overlap).
/// - Errors: `invalid_argument` for bad sizes or roots, and the transport's `timeout_error`,
///   `peer_failure`, `mismatch_error`; after one, the transport has failed and so has the
///   communicator.

#include <squall/algorithm/call_check.hpp>
#include <squall/algorithm/compressed/allreduce.hpp>
#include <squall/algorithm/compressed/gather.hpp>
#include <squall/algorithm/dense.hpp>
#include <squall/algorithm/request.hpp>
#include <squall/backend/dispatch.hpp>
#include <squall/backend/host.hpp>
#include <squall/compress/none.hpp>
#include <squall/compress/state.hpp>
#include <squall/concepts.hpp>
#include <squall/core/buffer.hpp>
#include <squall/core/error.hpp>
#include <squall/core/ops.hpp>
#include <squall/core/options.hpp>
#include <squall/core/types.hpp>
#include <squall/topology/automatic.hpp>
#include <squall/tuning/tuning.hpp>

#include <atomic>
#include <chrono>
#include <concepts>  // same_as
#include <cstddef>   // size_t
#include <cstdint>
#include <memory>  // unique_ptr
#include <span>
#include <string>
#include <string_view>
#include <typeinfo>  // typeid
#include <utility>   // move

namespace squall {

namespace detail {

// The dense collectives as callables of (core, arguments...): one type each, whatever the
// communicator's topology.
inline constexpr auto run_allreduce = [](auto& core, const auto&... a) { core.allreduce(a...); };
inline constexpr auto run_reduce_scatter = [](auto& core, const auto&... a) {
  core.reduce_scatter(a...);
};
inline constexpr auto run_allgather = [](auto& core, const auto&... a) { core.allgather(a...); };
inline constexpr auto run_allgatherv = [](auto& core, const auto&... a) { core.allgatherv(a...); };
inline constexpr auto run_broadcast = [](auto& core, const auto&... a) { core.broadcast(a...); };
inline constexpr auto run_barrier = [](auto& core) { core.barrier(); };

/// What each of a communicator's calls does that depends neither on its topology nor on its
/// compressor: the calls' order and the progress thread of the non-blocking ones, the
/// announcement of a rank's own errors, the count of bytes sent. Each operation takes the
/// communicator's core (`dense_core`, topology-free) and a callable of (core, arguments...):
/// `communicator` forwards every collective here, so that a program with communicators of
/// several topologies or compressors compiles these wrappers once per (transport, backend)
/// and callable (squall-bench's compressed runners, six topologies each, and libsquall_mpi's
/// communicators, six compressors each: docs/performance.md).
template <transport Transport, backend Backend>
class ordered_calls {
 public:
  using core_type = dense_core<Transport, Backend>;

  explicit ordered_calls(const options& opts) : calls_(opts.resolved_deadline()) {}

  /// A blocking collective, `f(core, args...)`: on the caller's thread when nothing is in
  /// flight, else queued behind what is and waited for (so it runs in the order it was
  /// called).
  template <class F, class... A>
  void ordered(core_type& core, F f, const A&... args) {
    calls_.ordered(core.rank(), [&] { announced(core, [&] { f(core, args...); }); });
  }
  /// A non-blocking collective: `f(core, args...)` queued on the progress thread.
  template <class F, class... A>
  request started(core_type& core, F f, const A&... args) {
    return calls_.started(
        core.rank(), [this, &core, f, args...] { announced(core, [&] { f(core, args...); }); });
  }
  /// `communicator::ibarrier`.
  request ibarrier(core_type& core) {
    if constexpr (direct_transport<Transport>) {
      return calls_.split(
          core.rank(), [&core] { return core.barrier_arrive(); },
          [this, &core] { announced(core, [&core] { run_barrier(core); }); });
    } else {
      return started(core, run_barrier);
    }
  }

  std::uint64_t bytes_sent_total() const {
    return std::atomic_ref(const_cast<std::uint64_t&>(sent_total_)).load(std::memory_order_relaxed);
  }

 protected:
  /// Runs what is queued and stops the progress thread (before what the calls use goes).
  void finish() noexcept { calls_.finish(); }

 private:
  // Runs a collective's body. An error of this rank's own (a bad argument, a compressor's
  // error, an allocation) is announced to the peers through the transport's `abandon` where
  // it has one (shm_transport), so that they fail at once, naming this rank and the cause,
  // instead of waiting to their deadlines; then it propagates. Not announced: errors every
  // rank raises alike (a mismatch, `options::check_finite`) and the transport's own (already
  // recorded for the peers).
  template <class F>
  void announced(core_type& core, F&& body) {
    try {
      std::forward<F>(body)();
      std::atomic_ref(sent_total_)
          .fetch_add(core.last_transfer().bytes_sent, std::memory_order_relaxed);
    } catch (const mismatch_error&) {
      throw;
    } catch (const peer_failure&) {
      throw;
    } catch (const timeout_error&) {
      throw;
    } catch (const raised_everywhere&) {
      throw;
    } catch (const error& e) {
      abandon(core, e.what());
      // a backend's own error (a CUDA call's, say) knows the call and the device, not the
      // rank: the same error again, naming this rank
      if (typeid(e) == typeid(error) && e.rank() == no_rank) {
        throw error(e.code(), {.operation = e.operation(), .rank = core.rank()}, e.detail());
      }
      throw;
    } catch (const std::exception& e) {
      abandon(core, e.what());
      throw;
    } catch (...) {
      abandon(core, "an exception that is not a std::exception");
      throw;
    }
  }
  static void abandon(core_type& core, std::string_view why) noexcept {
    if constexpr (requires(Transport & t) { t.abandon(why); }) core.transport().abandon(why);
  }

  std::uint64_t sent_total_ = 0;  ///< bytes_sent_total (through atomic_ref: stays movable)
  /// The calls' order and the progress thread of the non-blocking ones, made at the first.
  call_order calls_;
};

/// The compressed allreduce's and allgather's bodies and their workspace, over
/// `ordered_calls`: once per (transport, compressor, backend), whatever the topology.
template <transport Transport, compressor Compressor, backend Backend>
class communicator_calls : public ordered_calls<Transport, Backend> {
 public:
  using core_type = dense_core<Transport, Backend>;
  template <class T>
  using view = buffer_view<T, typename Backend::memory_space>;
  template <class T>
  using state_type = compression_state<Compressor, T, Backend>;

  communicator_calls(Compressor compressor, const options& opts)
      : ordered_calls<Transport, Backend>(opts),
        compressor_(std::move(compressor)),
        check_finite_(opts.check_finite) {}
  communicator_calls(communicator_calls&&) noexcept = default;
  communicator_calls& operator=(communicator_calls&&) = delete;
  /// Finishes what is queued first: queued compressed calls use the workspace below.
  ~communicator_calls() { this->finish(); }

  const Compressor& compressor() const { return compressor_; }
  void set_compressor(Compressor c) { compressor_ = std::move(c); }
  phase_split last_split() const { return workspace_.clock.split(); }

  /// The communicator's choice of aggregation (`aggregation_of<Compressor, Topology>`), made
  /// in the call's body, so that its error is announced (and, non-blocking, raised at `wait`).
  using aggregation_choice = aggregation (*)(const collective_tuning&, int, int, bool);

  /// `communicator::allreduce(data, state, op)`.
  template <real_gradient T, class Op>
  void compressed_allreduce(core_type& core, aggregation_choice how, view<T> data,
                            state_type<T>& state, Op op) {
    this->ordered(core, [&](core_type& c) { compressed_allreduce_now(c, how, data, state, op); });
  }
  /// `communicator::iallreduce(data, state, op)`.
  template <real_gradient T, class Op>
  request icompressed_allreduce(core_type& core, aggregation_choice how, view<T> data,
                                state_type<T>& state, Op op) {
    return this->started(core, [this, how, data, state = &state, op](core_type& c) {
      compressed_allreduce_now(c, how, data, *state, op);
    });
  }

  /// `communicator::allgather(in, out, state)`.
  template <real_gradient T>
  void compressed_allgather(core_type& core, view<const T> in, view<T> out, state_type<T>& state) {
    this->ordered(core, [&](core_type& c) {
      const std::size_t count = in.count();
      require_count("compressed allgather", "out", out.count(),
                    count * static_cast<std::size_t>(c.size()));
      require_state(c, "compressed allgather", state.count(), count, "blocks");
      c.begin_call(collective::allgather, dtype_of<T>, "", count,
                   static_cast<int>(state.step() & 0x7fffffff), aggregation::gather);
      if (check_finite_) require_finite_everywhere(c, in);
      workspace_.clock.start();
      detail::compressed_allgather(c, compressor_, workspace_.payload, workspace_.gather, in, out,
                                   state, workspace_.clock);
      c.backend().synchronize();
      workspace_.clock.mark(phase::decode);
      state.advance();
    });
  }

 private:
  // The compressed allreduce's body (see `communicator::allreduce(data, state, op)`).
  template <real_gradient T, class Op>
  void compressed_allreduce_now(core_type& core, aggregation_choice choose, view<T> data,
                                state_type<T>& state, Op op) {
    require_state(core, "compressed allreduce", state.count(), data.count(), "data");
    // the step goes in the signature: ranks at different steps would draw differently
    const aggregation how = choose(core.tuning(), core.rank(), core.size(), core_type::staged);
    const chunk_plan plan = overlap_plan<core_type, Compressor, T>(how, core.tuning(), compressor_,
                                                                   data.count(), core.rank());
    core.begin_call(collective::allreduce, dtype_of<T>, Op::name, data.count(),
                    static_cast<int>(state.step() & 0x7fffffff), how, plan.chunks);
    if (check_finite_) require_finite_everywhere(core, view<const T>(data));
    workspace_.clock.start();
    detail::compressed_allreduce(how, plan, core, compressor_, workspace_, data, state);
    dispatch::finalize_on(core.backend(), op, data, static_cast<std::size_t>(core.size()));
    core.backend().synchronize();
    workspace_.clock.mark(phase::decode);
    state.advance();
  }

  // A compression state must be for `count` elements (of `what`).
  static void require_state(const core_type& core, std::string_view operation,
                            std::size_t state_count, std::size_t count, std::string_view what) {
    if (state_count != count) {
      throw invalid_argument({.operation = operation, .rank = core.rank()},
                             "a compression state of " + std::to_string(state_count) +
                                 " elements used for " + std::string(what) + " of " +
                                 std::to_string(count) + " elements");
    }
  }

  Compressor compressor_{};
  bool check_finite_ = false;  ///< options::check_finite
  compressed_workspace<Backend> workspace_;
};

}  // namespace detail

/// The collectives over `Transport`, scheduled by `Topology`: a facade. The dense collectives
/// are `detail::dense_collectives<Transport, Topology, Backend>` (algorithm/dense.hpp), which
/// does not depend on `Compressor`; the compressed allreduce and allgather (the overloads
/// taking a `compression_state`) run the algorithms of algorithm/compressed/ over its
/// topology-free core, `detail::dense_core<Transport, Backend>`, so that neither the dense
/// nor the compressed algorithms are instantiated once per topology; what each call does
/// around them (its order, the progress thread, the compressed bodies) is
/// `detail::communicator_calls`, which depends on neither the topology nor, for the dense
/// collectives, the compressor. Owns the transport. Every collective runs its kernels on `Backend`
/// (through backend/dispatch.hpp); where its memory is not the transport's (the CUDA backend over
/// shared memory or MPI), the dense collectives stage through host memory (dense.hpp). The
/// compressed ones keep their `compression_state` in host memory and send payloads straight
/// from the backend's, so they take a Backend of the transport's (host) memory so far.
template <transport Transport, topology Topology = automatic_topology,
          compressor Compressor = identity_compressor, backend Backend = host_backend>
class communicator {
  static_assert(check_transport<Transport>());
  static_assert(check_topology<Topology>());
  static_assert(check_compressor<Compressor>());
  static_assert(check_backend<Backend>());

 public:
  using transport_type = Transport;
  using topology_type = Topology;
  using compressor_type = Compressor;

  /// Builds a communicator over `transport`, a collective call on every rank. It measures
  /// nothing: `automatic_topology` predicts with its transport's link costs until
  /// `calibrate` (or a loaded model) says better. With `hierarchical_topology` and an empty
  /// `node_of`, it finds the nodes (one exchange of host names). `invalid_argument` for a
  /// model measured on another rank count.
  explicit communicator(Transport transport, Topology topology = {}, const options& opts = {},
                        const collective_tuning& tuning = {}, Backend backend = {})
      : dense_(std::move(transport), std::move(topology), opts, tuning, std::move(backend)),
        calls_(Compressor{}, opts) {}

  /// The same, with the compressor the compressed collectives use (its tuned parameters:
  /// ratio, bits, rank, seed). Every rank must pass the same parameters.
  template <std::same_as<Compressor> C>
  communicator(Transport transport, Topology topology, C compressor, const options& opts = {},
               const collective_tuning& tuning = {}, Backend backend = {})
      : dense_(std::move(transport), std::move(topology), opts, tuning, std::move(backend)),
        calls_(std::move(compressor), opts) {}

  int rank() const { return dense_.rank(); }
  int size() const { return dense_.size(); }
  Transport& transport() { return dense_.transport(); }
  const Topology& topology() const { return dense_.topology(); }
  const Compressor& compressor() const { return calls_.compressor(); }
  /// Replaces the compressor's parameters for the compressed collectives that follow (a
  /// sparsity warm-up lowers top-k's ratio epoch by epoch, as DGC does). Every rank must set
  /// the same parameters between the same two collectives; the states stay valid (their
  /// count, step and residual do not depend on the parameters).
  void set_compressor(Compressor c) { calls_.set_compressor(std::move(c)); }
  /// Where the kernels run (the CUDA backend carries its device and stream).
  const Backend& backend() const { return dense_.backend(); }
  /// The views the dense collectives take: buffers in the backend's memory.
  template <class T>
  using view = buffer_view<T, typename Backend::memory_space>;

  /// The per-tensor state the compressed collectives take, in the backend's memory.
  template <real_gradient T>
  using state_type = compression_state<Compressor, T, Backend>;

  /// A fresh compression state for a tensor of `count` elements of `T`, for this
  /// communicator's compressor (PowerSGD's Q drawn from its seed and shape), in the
  /// backend's memory.
  template <real_gradient T>
  state_type<T> make_state(std::size_t count) const {
    return state_type<T>(compressor(), count, backend());
  }

  /// The same with a low-rank compressor (PowerSGD) viewing the tensor as `view`: a layer's
  /// own matrix, `powersgd_shape::of(count, columns)` (a weight of shape (out, in, k, k) as
  /// out x in k k, as torch's PowerSGD hook does), not the default near-square view of the
  /// flat tensor. Throws `invalid_argument` unless view.covers(count).
  template <real_gradient T>
  state_type<T> make_state(std::size_t count,
                           powersgd_shape view) const requires uses_low_rank<Compressor> {
    return state_type<T>(compressor(), count, view, backend());
  }

  /// Measures `automatic_topology`'s model on these ranks and keeps it (a collective call):
  /// float sums of 4 KiB to `up_to` bytes in steps of 4 with each candidate schedule, the
  /// best of 5 trials, the slowest rank's time, agreed so every rank holds the same model.
  /// About 0.5 s at 2 ranks and 1-3 s at 4 on a 2-core machine for the default 16 MiB; save
  /// the result (`cost_model::save`) and hand it to later runs' topology to skip it.
  const cost_model& calibrate(std::size_t up_to = std::size_t{16}
                                                  << 20) requires detail::has_cost_model<Topology> {
    return dense_.calibrate(up_to);
  }

  /// Measures, on these ranks, whether an allreduce above `peer_memory_bytes` is faster
  /// through the shared-memory windows (a copy in, a barrier, the reduction out of every
  /// window, a copy back) or through the peers' own memory (cross-memory reads and writes, which
  /// pin every page), size by size up to half a window, and sets the bound between them
  /// (`collective_tuning::allreduce_window_copy_bytes`), the same on every rank: which is
  /// faster is the machine's (docs/performance.md). A collective call, made between the same
  /// two collectives on every rank; the calls in flight finish first. Where there is no
  /// choice (a transport without windows or peer memory, fewer than 3 ranks, registered
  /// memory, peers out of reach), it measures nothing (`measured` false). About 0.1 s at
  /// 4 ranks on a 2-core machine (its `seconds`).
  window_calibration calibrate_windows() {
    window_calibration m;
    calls_.ordered(dense_.core(),
                   [&m](core_type& core) { m = detail::calibrate_windows(core.transport_core()); });
    return m;
  }

  /// The aggregation the compressed allreduce runs (`collective_tuning::aggregation`, or with
  /// `automatic` the compressor's first allowed one that this topology runs on these ranks).
  /// Throws `invalid_argument` where the tuning asks for one the compressor does not allow
  /// or that cannot run here.
  squall::aggregation aggregation() const {
    return detail::aggregation_of<Compressor, Topology>(dense_.tuning(), rank(), size(),
                                                        core_type::staged);
  }

  /// The bytes this rank moved in its last collective (counted from its start).
  transfer_stats last_transfer() const { return dense_.last_transfer(); }
  /// The bytes this rank sent in all its collectives so far (safe to read while non-blocking
  /// ones run: updated as each finishes).
  std::uint64_t bytes_sent_total() const { return calls_.bytes_sent_total(); }
  /// Where this rank's last compressed allreduce or allgather spent its time: encode,
  /// transfer, decode (`phase_split`; zeros before the first).
  phase_split last_split() const { return calls_.last_split(); }

  /// The schedule an allreduce of `bytes` runs: the topology's name, or
  /// "automatic:<chosen>" for `automatic_topology`.
  std::string schedule_for(std::size_t bytes) const { return dense_.schedule_for(bytes); }

  // ---- allreduce ------------------------------------------------------------------------------

  /// `data[i] = op over ranks of data[i]`, in place.
  template <element T, reduction_op<T> Op = sum_op>
  void allreduce(view<T> data, Op op = {}) {
    calls_.ordered(dense_.core(), detail::run_allreduce, data, op);
  }
  /// `out[i] = op over ranks of in[i]`; `in` and `out` have the same count and do not
  /// partially overlap (`invalid_argument` otherwise).
  template <element T, reduction_op<T> Op = sum_op>
  void allreduce(view<const T> in, view<T> out, Op op = {}) {
    calls_.ordered(dense_.core(), detail::run_allreduce, in, out, op);
  }

  /// The compressed allreduce, in place: `data` = the sum (`sum_op`) or mean (`avg_op`) over
  /// ranks of what `Compressor` sends of each rank's `data`; every rank gets bitwise the same
  /// result. `state` is this tensor's (`make_state`); its step keys the compressor's draws
  /// and advances by one; its residual (error feedback) and Q (PowerSGD) are updated. The
  /// aggregation is `aggregation()`: what the compressor allows (`C::aggregations`), asked
  /// for by `collective_tuning::aggregation` or the first that runs here:
  ///
  /// - linear (cast, randomk, count_sketch; needs a `linear_body`): encode, reduce the
  ///   payloads' bodies through the topology's own allreduce schedule, decode;
  /// - low_rank (PowerSGD): P = M Q, summed; orthogonalize P; Q = M^T P, summed and kept;
  ///   data = P Q^T; with error feedback M = residual + data and residual = M - P Q_mine^T,
  ///   the rank's own share (so the residuals and the results add up to the inputs);
  /// - per_hop (int8, qsgd, terngrad, sign; the default where it runs: ring or tree):
  ///   decode, add and re-encode at each hop (CGX): the ring's reduce-scatter of encoded
  ///   partials, each block's owner encoding the sum once, an allgather of those payloads;
  ///   the tree's reduce up, the root's payload broadcast down; every rank decodes every
  ///   final payload (algorithm/detail/requantize.hpp has the streams and the error-feedback
  ///   rule);
  /// - gtopk (topk, threshold): gTop-k (Shi et al. 2019): the local sets merged pairwise up a
  ///   tree keeping the k largest sums, the global set G broadcast down; data = G
  ///   (algorithm/detail/gtopk.hpp: tree, ties, error feedback);
  /// - gather (every compressor but identity and PowerSGD; the default of topk, threshold and
  ///   sign_vote): every rank encodes once, the payloads are gathered (sizes first unless
  ///   fixed size, padded to the largest) through the topology's allgather schedule, and
  ///   every rank decodes all P and sums them in rank order. A majority vote (sign_vote) is
  ///   element i = sign(sum_q sign(d_q[i])) x sum_q |d_q[i]|, d_q rank q's decoded payload:
  ///   the majority sign times the sum of the ranks' scales (their mean with `avg_op`); a
  ///   tie gives 0;
  /// - two_round (count_sketch, when asked): the sketches summed, every rank picks the same k
  ///   largest median estimates I, the ranks' exact values at I summed; data = those sums at
  ///   I, 0 elsewhere; with error feedback the residual is zeroed at I
  ///   (algorithm/compressed/two_round.hpp).
  ///
  /// `avg_op` divides the sum by `size()`. Throws `invalid_argument` if `state.count()` is
  /// not `data.count()` (naming both), what the compressor throws (a bad parameter or
  /// payload), and the transport's errors. Every rank must call it with the same count,
  /// op and step.
  template <real_gradient T, class Op = sum_op>
  void allreduce(view<T> data, state_type<T>& state, Op op = {}) {
    static_assert(std::same_as<Op, sum_op> || std::same_as<Op, avg_op>,
                  "squall: a compressed allreduce sums or averages: sum_op or avg_op");
    calls_.compressed_allreduce(dense_.core(), &detail::aggregation_of<Compressor, Topology>, data,
                                state, op);
  }

  // ---- reduce_scatter ---------------------------------------------------------------------

  /// The part of `count` elements this rank gets from `reduce_scatter`: block `rank()` of
  /// `size()` near-equal blocks (the first `count % size()` one element longer).
  std::size_t block_count(std::size_t count) const { return dense_.block_count(count); }
  /// Where this rank's block starts in a buffer of `count` elements.
  std::size_t block_offset(std::size_t count) const { return dense_.block_offset(count); }

  /// Reduces `data` over ranks; this rank's block (`block_offset`, `block_count`) of `data`
  /// holds the result, the other blocks hold partial sums.
  template <element T, reduction_op<T> Op = sum_op>
  void reduce_scatter(view<T> data, Op op = {}) {
    calls_.ordered(dense_.core(), detail::run_reduce_scatter, data, op);
  }
  /// `out` = this rank's block of `in` reduced over ranks; `out.count()` must be
  /// `block_count(in.count())`.
  template <element T, reduction_op<T> Op = sum_op>
  void reduce_scatter(view<const T> in, view<T> out, Op op = {}) {
    calls_.ordered(dense_.core(), detail::run_reduce_scatter, in, out, op);
  }

  // ---- allgather ----------------------------------------------------------------------------

  /// `out` = the `in` of rank 0, then of rank 1, ...; `out.count()` must be
  /// `size() * in.count()`. `in` may be this rank's block of `out` (in place).
  template <element T>
  void allgather(view<const T> in, view<T> out) {
    calls_.ordered(dense_.core(), detail::run_allgather, in, out);
  }

  /// Blocks of different sizes, each where this rank chooses: rank q's `in` (`counts[q]`
  /// elements) lands at `into[q]` on every rank, this rank's own too unless `into[rank()]` is
  /// `in.data()`. `counts` must be the same on every rank (the mismatch check compares their
  /// sum, or the largest where the call runs as an allgather); `into` is each rank's own,
  /// blocks not overlapping each other or `in`. Through the peers' own memory where the
  /// transport has it and the blocks padded to the largest reach `peer_memory_bytes` (each
  /// rank reads every peer's block into its place: nothing padded, nothing copied twice),
  /// except alike blocks whose allgather copies through the windows; otherwise an allgather of
  /// the largest block (in place where this rank's places lie end to end in rank order, else
  /// padded through scratch and copied to the places). Throws `invalid_argument` if `counts`
  /// or `into` does not hold one entry per rank or `in.count()` is not `counts[rank()]`.
  template <element T>
  void allgatherv(view<const T> in, std::span<const std::size_t> counts, std::span<T* const> into) {
    calls_.ordered(dense_.core(), detail::run_allgatherv, in, counts, into);
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
  void allgather(view<const T> in, view<T> out, state_type<T>& state) {
    calls_.compressed_allgather(dense_.core(), in, out, state);
  }

  // ---- broadcast and barrier ----------------------------------------------------------------

  /// `data` on every rank = `data` on `root`.
  template <element T>
  void broadcast(view<T> data, int root) {
    calls_.ordered(dense_.core(), detail::run_broadcast, data, root);
  }

  /// Returns once every rank has entered the barrier.
  void barrier() { calls_.ordered(dense_.core(), detail::run_barrier); }

  // ---- non-blocking ---------------------------------------------------------------------------

  /// The non-blocking forms: each starts the collective its blocking namesake runs and returns
  /// a `request` at once. The communicator's progress thread (started at the first of them)
  /// runs them one at a time in the order this rank started them, and every rank must start
  /// the same sequence (as with the blocking calls); several may be in flight, and a blocking
  /// call made meanwhile runs after them (it is one of them, plus `wait`). Buffers, and the
  /// compression state, must stay valid and untouched until the request's `wait()` (or a
  /// `test()` that returned true). Errors surface at `wait()`; after one, every later call on
  /// this communicator fails with it. Do not move the communicator while requests are in
  /// flight.
  template <element T, reduction_op<T> Op = sum_op>
  request iallreduce(view<T> data, Op op = {}) {
    return calls_.started(dense_.core(), detail::run_allreduce, data, op);
  }
  template <element T, reduction_op<T> Op = sum_op>
  request iallreduce(view<const T> in, view<T> out, Op op = {}) {
    return calls_.started(dense_.core(), detail::run_allreduce, in, out, op);
  }
  /// The compressed allreduce (`allreduce(data, state, op)`), non-blocking.
  template <real_gradient T, class Op = sum_op>
  request iallreduce(view<T> data, state_type<T>& state, Op op = {}) {
    static_assert(std::same_as<Op, sum_op> || std::same_as<Op, avg_op>,
                  "squall: a compressed allreduce sums or averages: sum_op or avg_op");
    return calls_.icompressed_allreduce(
        dense_.core(), &detail::aggregation_of<Compressor, Topology>, data, state, op);
  }
  template <element T, reduction_op<T> Op = sum_op>
  request ireduce_scatter(view<T> data, Op op = {}) {
    return calls_.started(dense_.core(), detail::run_reduce_scatter, data, op);
  }
  template <element T, reduction_op<T> Op = sum_op>
  request ireduce_scatter(view<const T> in, view<T> out, Op op = {}) {
    return calls_.started(dense_.core(), detail::run_reduce_scatter, in, out, op);
  }
  template <element T>
  request iallgather(view<const T> in, view<T> out) {
    return calls_.started(dense_.core(), detail::run_allgather, in, out);
  }
  template <element T>
  request ibroadcast(view<T> data, int root) {
    return calls_.started(dense_.core(), detail::run_broadcast, data, root);
  }
  /// On a transport whose peers' windows this rank maps (shared memory), this rank arrives
  /// now, on the caller's thread, and the request's `test` polls for the others (no hand-off
  /// to the progress thread), unless other non-blocking calls are still in flight; the
  /// communicator's next call completes it first.
  request ibarrier() { return calls_.ibarrier(dense_.core()); }

 private:
  using core_type = detail::dense_core<Transport, Backend>;

  detail::dense_collectives<Transport, Topology, Backend> dense_;
  /// What each call does beyond the topology's schedules (the calls' order, the progress
  /// thread, the compressed bodies); declared last, so destroyed first: it finishes what is
  /// queued while the rest of the communicator exists.
  detail::communicator_calls<Transport, Compressor, Backend> calls_;
};

}  // namespace squall
