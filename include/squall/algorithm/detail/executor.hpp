// SPDX-License-Identifier: Apache-2.0
#pragma once
/// The executor: walks a schedule over a transport, in pieces, pipelined. It moves bytes and
/// calls a type-erased `reducer` (the backend's kernels and its ordering point), so one
/// instantiation per transport serves every element type, op and backend (STYLE P3). Its
/// steps go through `walk_steps` and its bytes through `wire` (detail/verbs.hpp), the verbs
/// per-hop requantization (detail/requantize.hpp) and gTop-k (detail/gtopk.hpp) use too:
/// here a block of a step is a piece of elements, there a payload or a sparse set.

#include <squall/algorithm/detail/verbs.hpp>
#include <squall/backend/dispatch.hpp>
#include <squall/concepts.hpp>
#include <squall/core/error.hpp>
#include <squall/detail/math.hpp>
#include <squall/kernels/host/copy.hpp>  // published_lines
#include <squall/topology/schedule.hpp>
#include <squall/tuning/tuning.hpp>

#include <algorithm>  // max_element, min
#include <array>
#include <cstddef>  // byte, size_t
#include <cstdint>  // uint64_t
#include <deque>
#include <span>
#include <string>
#include <utility>  // move
#include <vector>

namespace squall::detail {

/// Elementwise work on raw bytes as elements of one type with one op, on one backend: the
/// executor is not a template on the element type, the op or the backend, so it reaches the
/// backend's kernels (backend/dispatch.hpp) through these pointers. A backend may run them
/// later (a stream); `settle()` is the ordering point, after which their results may be read
/// by the host or the transport and their sources reused.
struct reducer {
  std::size_t element_bytes = 1;
  const void* backend = nullptr;
  void (*combine_into)(const void* backend, std::byte* dst, const std::byte* src,
                       std::size_t count) = nullptr;
  void (*combine)(const void* backend, std::byte* dst, const std::byte* a, const std::byte* b,
                  std::size_t count) = nullptr;
  void (*copy_bytes)(const void* backend, std::byte* dst, const std::byte* src,
                     std::size_t bytes) = nullptr;
  void (*synchronize)(const void* backend) = nullptr;
  /// A copy into a window the peers read next, `last` what the last one into it left
  /// there: on the host the pieces of an unchanged buffer are not stored again
  /// (`kernels::publish_copy`); null elsewhere (`publish` then copies).
  void (*publish_bytes)(void* dst, const void* src, std::size_t bytes,
                        kernels::published_lines& last) = nullptr;
  /// A copy whose destination nothing reads soon: non-temporal stores on the host
  /// (`kernels::stream_copy`), the backend's copy elsewhere.
  void (*stream_bytes)(const void* backend, std::byte* dst, const std::byte* src,
                       std::size_t bytes) = nullptr;
  /// The most inputs one `combine_many` call takes.
  static constexpr std::size_t fused_inputs = 8;
  /// `reduce_many`'s fused pass over at most `fused_inputs` inputs (host memory:
  /// `kernels::reduce_many`); null: the chain of `reduce` and `reduce_into`.
  void (*combine_many)(const void* backend, std::byte* dst, const std::byte* const* srcs,
                       std::size_t inputs, std::size_t count) = nullptr;

  /// dst[i] = dst[i] op src[i] for `count` elements
  void reduce_into(std::byte* dst, const std::byte* src, std::size_t count) const {
    combine_into(backend, dst, src, count);
  }
  /// dst[i] = a[i] op b[i] for `count` elements
  void reduce(std::byte* dst, const std::byte* a, const std::byte* b, std::size_t count) const {
    combine(backend, dst, a, b, count);
  }
  /// dst[i] = srcs[0][i] op srcs[1][i] op ... op srcs[k-1][i], the inputs in their order (the
  /// bits of `reduce` of the first two, then `reduce_into` of each further one), `count`
  /// elements each; `srcs[0]` may be `dst`, no later input. One pass where the backend fuses.
  void reduce_many(std::byte* dst, std::span<const std::byte* const> srcs,
                   std::size_t count) const {
    if (combine_many != nullptr) {  // in groups of `fused_inputs`, the later ones into dst
      std::array<const std::byte*, fused_inputs> group{};
      for (std::size_t j = 0; j < srcs.size();) {
        std::size_t g = 0;
        if (j > 0) group[g++] = dst;
        while (g < fused_inputs && j < srcs.size()) group[g++] = srcs[j++];
        combine_many(backend, dst, group.data(), g, count);
      }
      return;
    }
    if (srcs.size() == 1) {
      if (dst != srcs[0]) copy(dst, srcs[0], count * element_bytes);
      return;
    }
    reduce(dst, srcs[0], srcs[1], count);
    for (std::size_t j = 2; j < srcs.size(); ++j) reduce_into(dst, srcs[j], count);
  }
  /// dst = src, `bytes` bytes
  void copy(std::byte* dst, const std::byte* src, std::size_t bytes) const {
    copy_bytes(backend, dst, src, bytes);
  }
  /// dst = src into a window the peers read next (`publish_bytes`, or `copy`)
  void publish(std::byte* dst, const std::byte* src, std::size_t bytes,
               kernels::published_lines& last) const {
    if (publish_bytes != nullptr)
      publish_bytes(dst, src, bytes, last);
    else
      copy(dst, src, bytes);
  }
  /// dst = src, `bytes` bytes not overlapping, bypassing the caches where the backend can
  void stream(std::byte* dst, const std::byte* src, std::size_t bytes) const {
    stream_bytes(backend, dst, src, bytes);
  }
  /// The ordering point: returns once the work started through this reducer has finished.
  void settle() const { synchronize(backend); }
};

/// `reducer::combine_many` for `Backend`: `kernels::reduce_many` on the host, else none.
template <element T, reduction_op<T> Op, class Backend>
constexpr auto combine_many_of() {
  using fused =
      void (*)(const void*, std::byte*, const std::byte* const*, std::size_t, std::size_t);
  if constexpr (std::is_same_v<Backend, host_backend>) {
    return fused{[](const void* b, std::byte* dst, const std::byte* const* srcs, std::size_t inputs,
                    std::size_t count) {
      std::array<const T*, reducer::fused_inputs> typed{};  // inputs <= fused_inputs
      for (std::size_t j = 0; j < inputs; ++j) typed[j] = reinterpret_cast<const T*>(srcs[j]);
      kernels::reduce_many(*static_cast<const host_backend*>(b), Op{},
                           host_view<T>(reinterpret_cast<T*>(dst), count),
                           std::span<const T* const>(typed.data(), inputs));
    }};
  } else {
    return fused{nullptr};
  }
}

/// The reducer of elements `T` under `Op`, through `backend`'s kernels; `backend` must
/// outlive it.
template <element T, reduction_op<T> Op, class Backend>
reducer make_reducer(const Backend& backend) {
  using M = typename Backend::memory_space;
  return {.element_bytes = sizeof(T),
          .backend = &backend,
          .combine_into =
              [](const void* b, std::byte* dst, const std::byte* src, std::size_t count) {
                dispatch::reduce_into_on(
                    *static_cast<const Backend*>(b), Op{},
                    buffer_view<T, M>(reinterpret_cast<T*>(dst), count),
                    buffer_view<const T, M>(reinterpret_cast<const T*>(src), count));
              },
          .combine =
              [](const void* b, std::byte* dst, const std::byte* x, const std::byte* y,
                 std::size_t count) {
                dispatch::reduce_on(*static_cast<const Backend*>(b), Op{},
                                    buffer_view<T, M>(reinterpret_cast<T*>(dst), count),
                                    buffer_view<const T, M>(reinterpret_cast<const T*>(x), count),
                                    buffer_view<const T, M>(reinterpret_cast<const T*>(y), count));
              },
          .copy_bytes =
              [](const void* b, std::byte* dst, const std::byte* src, std::size_t bytes) {
                dispatch::copy_on(*static_cast<const Backend*>(b),
                                  buffer_view<std::byte, M>(dst, bytes),
                                  buffer_view<const std::byte, M>(src, bytes));
              },
          .synchronize = [](const void* b) { static_cast<const Backend*>(b)->synchronize(); },
          .publish_bytes = std::is_same_v<Backend, host_backend> ? &kernels::publish_copy : nullptr,
          .stream_bytes =
              [](const void* b, std::byte* dst, const std::byte* src, std::size_t bytes) {
                if constexpr (std::is_same_v<Backend, host_backend>) {
                  (void)b;
                  kernels::stream_copy(dst, src, bytes);
                } else {
                  dispatch::copy_on(*static_cast<const Backend*>(b),
                                    buffer_view<std::byte, M>(dst, bytes),
                                    buffer_view<const std::byte, M>(src, bytes));
                }
              },
          .combine_many = combine_many_of<T, Op, Backend>()};
}

/// The tail of every rank's window the communicator keeps for call signatures (two slots,
/// alternating by call); the one-shot schedule uses the bytes before it.
inline constexpr std::size_t signature_area = 256;

template <class Transport>
std::size_t window_data_bytes(Transport& t) {
  const std::size_t window = t.local_view().count();
  return window > signature_area ? window - signature_area : 0;
}

/// Scratch bytes in the backend's memory, reached without naming the backend (the executor
/// is not a template on it): `get(bytes)` gives at least `bytes`, 16-byte aligned; growing
/// drops the contents. The owner is the communicator's `scratch_bytes<Backend>`.
struct scratch_ref {
  void* owner = nullptr;
  std::byte* (*reserve)(void* owner, std::size_t bytes) = nullptr;
  std::byte* get(std::size_t bytes) const { return reserve(owner, bytes); }
};

/// What the executor keeps between calls, owned by the communicator: peer addresses and the
/// vectors of completions in flight (host bookkeeping; its scratch for received pieces is a
/// `scratch_ref` into the backend's memory). Grown on demand and reused, so a warm
/// collective allocates nothing.
template <class Transport>
struct executor_buffers {
  std::vector<std::uint64_t> addresses;
  std::vector<std::byte*> mapped;        ///< where each peer's shared buffers lie here (issue 22)
  std::vector<const std::byte*> inputs;  ///< a fused reduction's inputs (`reducer::reduce_many`)
  std::vector<completion_of<Transport>> pending;  ///< a step's receives, or an exchange
  std::deque<completion_of<Transport>> sends;     ///< sends in flight
  traffic moved;  ///< bytes moved since the communicator's last reset (every collective)
  /// What the last publish into each half of this rank's window left there
  /// (`kernels::publish_copy`)
  std::array<kernels::published_lines, 2> published;
};

/// Runs schedules for one communicator, over its transport and `executor_buffers`. Built per
/// call (it is two references and the tuning); whatever is still in flight when it is
/// destroyed, by an exception, is waited for then, as the completions' destructors do.
template <transport Transport>
class executor {
 public:
  using completion_type = completion_of<Transport>;

  executor(Transport& transport, executor_buffers<Transport>& buffers, scratch_ref scratch,
           const collective_tuning& tuning)
      : transport_(transport),
        wire_(transport, buffers.moved),
        scratch_(scratch),
        addresses_(buffers.addresses),
        mapped_(buffers.mapped),
        inputs_(buffers.inputs),
        pending_(buffers.pending),
        sends_(buffers.sends),
        published_(buffers.published),
        tuning_(tuning) {}
  executor(const executor&) = delete;
  executor& operator=(const executor&) = delete;
  ~executor() {
    pending_.clear();
    sends_.clear();
  }

  /// Runs `s` in place on `count` elements at `data`: every step's blocks move in pieces, and
  /// `r` reduces received pieces into place.
  void run(const schedule& s, std::byte* data, std::size_t count, const reducer& r) {
    const std::size_t piece = piece_elements(r);
    std::size_t begin = 0;
    while (begin < s.steps.size()) {
      std::size_t end = begin + 1;
      while (end < s.steps.size() && !s.steps[end].new_phase &&
             parts_of(s.steps[end]) == parts_of(s.steps[begin])) {
        ++end;
      }
      run_phase(s, begin, end, data, count, r, piece);
      begin = end;
    }
    wait_sends(0);
  }

  /// The one-shot allreduce through the peers' windows (direct transports): per round of half
  /// a window, publish this rank's data, reduce this rank's slice straight out of every
  /// window, then copy every reduced slice back. Two barriers a round; the window's halves
  /// alternate across rounds and calls (`round` is the communicator's counter), so the next
  /// round's publish never overwrites a half a slower rank still reads.
  ///
  /// `after_first_barrier()` runs once, after the first barrier (the communicator's mismatch
  /// check, fused with the publish so that it costs no barrier of its own).
  template <class Check>
  void run_one_shot(std::byte* data, std::size_t count, const reducer& r, std::size_t& round,
                    Check&& after_first_barrier) requires direct_transport<Transport> {
    const int size = transport_.size();
    const int me = transport_.rank();
    const std::size_t half = window_data_bytes(transport_) / 2;
    const std::size_t per_round = half / r.element_bytes;
    const std::size_t sub = std::max<std::size_t>(1, (std::size_t{32} << 10) / r.element_bytes);
    for (std::size_t offset = 0; offset < count; offset += per_round, ++round) {
      const std::size_t m = std::min(per_round, count - offset);
      const std::size_t at = (round % 2) * half;
      const auto window = [&](int q) { return window_of(q, at); };
      std::byte* chunk = data + offset * r.element_bytes;
      // step 0: publish this rank's data.
      r.copy(window(me), chunk, m * r.element_bytes);
      r.settle();
      wire_.barrier();
      if (offset == 0) after_first_barrier();
      // step 1: reduce slice `me` out of every window into this rank's own window, in
      // cache-sized pieces (one fused pass over the P windows for up to 8 ranks; beyond, the
      // destination stays in cache between the passes).
      const index_range mine =
          split_range(m, static_cast<std::size_t>(size), static_cast<std::size_t>(me));
      // Accounting: this rank reads its slice out of P - 1 windows and the other slices back
      // from their owners; the peers read as much out of its window.
      const std::uint64_t moved =
          (static_cast<std::uint64_t>(size - 1) * mine.count + (m - mine.count)) * r.element_bytes;
      wire_.count(moved, moved);
      for (std::size_t i = 0; i < mine.count; i += sub) {
        const std::size_t n = std::min(sub, mine.count - i);
        const std::size_t from = (mine.begin + i) * r.element_bytes;
        std::byte* dst = window(me) + from;
        inputs_.assign(1, dst);
        for (int k = 1; k < size; ++k) inputs_.push_back(window(wrap(me + k, size)) + from);
        r.reduce_many(dst, inputs_, n);
      }
      r.settle();  // the reduced slice is complete before the peers read it
      wire_.barrier();
      // step 2: copy every reduced slice back.
      for (int q = 0; q < size; ++q) {
        const index_range slice =
            split_range(m, static_cast<std::size_t>(size), static_cast<std::size_t>(q));
        r.copy(chunk + slice.begin * r.element_bytes, window(q) + slice.begin * r.element_bytes,
               slice.count * r.element_bytes);
      }
      r.settle();  // the window half is free for the round after next
    }
  }

  /// The one-barrier allreduce through the windows, for small inputs (`count` elements that
  /// fit half a window; two ranks or more): this rank's input into its window, a barrier, then
  /// the whole result reduced out of every window into `out`, the windows taken in rank order
  /// 0, 1, ..., P - 1 on every rank (so every rank computes the same bits). One barrier and no
  /// copy back where `run_one_shot` has two barriers and copies every reduced slice back, for
  /// every rank reading all P inputs rather than its slice of them: the cheaper trade at two
  /// ranks (`collective_tuning::whole_reduce_bytes`). `in` may be `out`. `after_barrier()` as
  /// in `run_one_shot`.
  template <class Check>
  void allreduce_windows_whole(const std::byte* in, std::byte* out, std::size_t count,
                               const reducer& r, std::size_t& round,
                               Check&& after_barrier) requires direct_transport<Transport> {
    const int size = transport_.size();
    const std::size_t bytes = count * r.element_bytes;
    const std::size_t half = publish(in, bytes, r, round, true, after_barrier);
    inputs_.clear();
    for (int q = 0; q < size; ++q) inputs_.push_back(window_of(q, half));
    r.reduce_many(out, inputs_, count);  // two ranks or more
    r.settle();
    const auto others = static_cast<std::uint64_t>(size - 1) * bytes;
    wire_.count(others, others);  // the peers read this rank's input; it reads theirs
  }

  /// Allgather through the windows (direct transports; a block that fits half a window):
  /// this rank's block into its window, a barrier, then every peer's block out of its window
  /// into `out`. One barrier, where `run_one_shot`'s rounds have two: the window's halves
  /// alternate across window rounds (`round`, shared with `run_one_shot`), and every rank
  /// reads a round's half before it enters the next round's barrier, so a rank that publishes
  /// into a half again (two rounds on) has passed a barrier that every reader of its last use
  /// had to reach. `in` may be block r of `out`. `after_barrier()` as in `run_one_shot`.
  template <class Check>
  void allgather_windows(const std::byte* in, std::byte* out, std::size_t block_bytes,
                         const reducer& r, std::size_t& round,
                         Check&& after_barrier) requires direct_transport<Transport> {
    allgather_windows(
        in, [out, block_bytes](int q) { return out + static_cast<std::size_t>(q) * block_bytes; },
        block_bytes, r, round, after_barrier);
  }
  /// The same, rank q's block copied to `place_of(q)` (an allgatherv's places, any order).
  template <class Place, class Check>
  void allgather_windows(const std::byte* in, Place&& place_of, std::size_t block_bytes,
                         const reducer& r, std::size_t& round,
                         Check&& after_barrier) requires direct_transport<Transport> {
    const int size = transport_.size();
    const int me = transport_.rank();
    const std::size_t half = publish(in, block_bytes, r, round, true, after_barrier);
    for (int k = 1; k < size; ++k) {
      const int q = wrap(me + k, size);
      r.copy(place_of(q), window_of(q, half), block_bytes);
    }
    std::byte* const mine = place_of(me);
    if (in != mine) r.copy(mine, in, block_bytes);
    r.settle();
    const auto others = static_cast<std::uint64_t>(size - 1) * block_bytes;
    wire_.count(others, others);  // the peers read this rank's block; it reads theirs
  }

  /// Reduce-scatter through the windows (a whole input that fits half a window): this rank's
  /// input into its window, a barrier, then block r reduced out of every window into `out`
  /// (block r's elements; it may be block r of `in`). One barrier, as `allgather_windows`.
  template <class Check>
  void reduce_scatter_windows(const std::byte* in, std::byte* out, std::size_t count,
                              const reducer& r, std::size_t& round,
                              Check&& after_barrier) requires direct_transport<Transport> {
    const int size = transport_.size();
    const int me = transport_.rank();
    const std::size_t e = r.element_bytes;
    const std::size_t half = publish(in, count * e, r, round, true, after_barrier);
    const index_range block =
        split_range(count, static_cast<std::size_t>(size), static_cast<std::size_t>(me));
    const std::size_t at = block.begin * e;
    inputs_.assign(1, in + at);
    for (int k = 1; k < size; ++k) inputs_.push_back(window_of(wrap(me + k, size), half) + at);
    r.reduce_many(out, inputs_, block.count);
    r.settle();
    const std::uint64_t others = (count - block.count) * e;
    wire_.count(others, others);
  }

  /// Broadcast through the root's window (data that fits half a window): the root publishes,
  /// a barrier, every other rank copies out. One barrier, as `allgather_windows`.
  template <class Check>
  void broadcast_windows(std::byte* data, std::size_t bytes, int root, const reducer& r,
                         std::size_t& round,
                         Check&& after_barrier) requires direct_transport<Transport> {
    const bool mine = transport_.rank() == root;
    const std::size_t half = publish(data, bytes, r, round, mine, after_barrier);
    if (!mine) {
      r.copy(data, window_of(root, half), bytes);
      r.settle();
      wire_.count(0, bytes);
    } else {
      wire_.count(static_cast<std::uint64_t>(transport_.size() - 1) * bytes, 0);
    }
  }

  /// The one-shot allreduce through the peers' own memory (peer-memory transports), with no
  /// staging copy: the ranks swap the addresses of their input and output; rank r reduces
  /// block r of every input into its output, piece by piece (each peer's piece read into a
  /// cache-sized scratch), and writes each reduced piece, still in cache, into every peer's
  /// output; a barrier ends it, so that no rank reuses a buffer a peer may still touch. `in`
  /// may be `out` (in place): rank r alone reads and writes block r of every buffer, and it
  /// reads a piece before it writes it.
  void run_one_shot_peer_memory(const std::byte* in, std::byte* out, std::size_t count,
                                const reducer& r) requires peer_memory_transport<Transport> {
    const int size = transport_.size();
    const int me = transport_.rank();
    const std::size_t e = r.element_bytes;
    share_buffers(shared::allreduce, count * e, in, out);
    const index_range block =
        split_range(count, static_cast<std::size_t>(size), static_cast<std::size_t>(me));
    // Accounting: the peers read the other blocks of this rank's input and write their
    // reduced blocks into its output (its own reads and writes count where they happen).
    wire_.count((count - block.count) * e, (count - block.count) * e);
    // step 0, per piece of block `me`: reduce every rank's piece into this rank's output,
    // then write the result, still in cache, into every peer's output.
    const bool stream = streams(count * e);
    reduce_block_from_peers(in + block.begin * e, out + block.begin * e, block, r, stream,
                            [&](std::size_t at, std::size_t n, const std::byte* reduced) {
                              for (int k = 1; k < size; ++k) {
                                write_to(wrap(me + k, size), 1, at, reduced, n * e, r, stream);
                              }
                            });
    // step 1: every block is everywhere once every rank is here.
    wire_.barrier();
  }

  /// Reduce-scatter through the peers' own memory: rank r reads block r of every rank's
  /// input in cache-sized pieces and reduces them into `out` (block r's `count` elements);
  /// a barrier ends it, so no input changes while a peer reads it. `in` is this rank's whole
  /// input; `out` may be its block r (in place).
  void reduce_scatter_peer_memory(const std::byte* in, std::byte* out, std::size_t count,
                                  const reducer& r) requires peer_memory_transport<Transport> {
    const int size = transport_.size();
    const int me = transport_.rank();
    share_buffers(shared::reduce_scatter, count * r.element_bytes, in);
    const index_range block =
        split_range(count, static_cast<std::size_t>(size), static_cast<std::size_t>(me));
    wire_.count((count - block.count) * r.element_bytes, 0);  // the peers read the other blocks
    reduce_block_from_peers(in + block.begin * r.element_bytes, out, block, r,
                            streams(block.count * r.element_bytes),
                            [](std::size_t, std::size_t, const std::byte*) {});
    wire_.barrier();
  }

  /// Allgather through the peers' own memory: every rank writes its `block_bytes` into block
  /// r of every peer's `out` and of its own; a barrier ends it. `in` may be block r of `out`.
  void allgather_peer_memory(const std::byte* in, std::byte* out, std::size_t block_bytes,
                             const reducer& r) requires peer_memory_transport<Transport> {
    const int size = transport_.size();
    const int me = transport_.rank();
    share_buffers(shared::allgather, block_bytes, out, nullptr,
                  block_bytes * static_cast<std::size_t>(size));
    const std::size_t at = static_cast<std::size_t>(me) * block_bytes;
    const bool stream = streams(block_bytes * static_cast<std::size_t>(size));
    for (int k = 1; k < size; ++k) write_to(wrap(me + k, size), 0, at, in, block_bytes, r, stream);
    wire_.count(0, static_cast<std::uint64_t>(size - 1) * block_bytes);  // the peers' writes
    if (in != out + at) {
      r.copy(out + at, in, block_bytes);
      r.settle();
    }
    wire_.barrier();
  }

  /// Allgather of blocks of different sizes through the peers' own memory, by reads: every
  /// rank shows its block `in` (`bytes[rank]` long); each reads every peer q's `bytes[q]`
  /// into `into[q]`, a place of its own choosing, and copies its own there unless it lies
  /// there already; a barrier ends it, so no block changes while a peer reads it. `total`
  /// (the blocks' sum, alike on every rank) is what the ranks check they all run.
  void allgatherv_peer_memory(const std::byte* in, std::span<const std::size_t> bytes,
                              std::span<std::byte* const> into,
                              std::size_t total) requires peer_memory_transport<Transport> {
    const int size = transport_.size();
    const int me = transport_.rank();
    const auto mine = static_cast<std::size_t>(me);
    // a peer's block is mapped (registered memory) as the largest block's extent from its
    // start, else read by cross-memory copy
    share_buffers(shared::allgatherv, total, in, nullptr,
                  std::max<std::size_t>(1, *std::max_element(bytes.begin(), bytes.end())));
    wire_.count(static_cast<std::uint64_t>(size - 1) * bytes[mine], 0);  // the peers' reads
    const bool stream = streams(total);
    for (int k = 1; k < size; ++k) {
      const int q = wrap(me + k, size);
      const auto i = static_cast<std::size_t>(q);
      if (bytes[i] != 0) read_into(q, 0, into[i], bytes[i], stream);
    }
    if (into[mine] != in && bytes[mine] != 0) kernels::copy_bytes(into[mine], in, bytes[mine]);
    wire_.barrier();
  }

  /// Broadcast through the root's own memory: every other rank reads the root's `bytes`
  /// at once; a barrier ends it, so the root's buffer stays unchanged until all have read.
  void broadcast_peer_memory(std::byte* data, std::size_t bytes,
                             int root) requires peer_memory_transport<Transport> {
    share_buffers(shared::broadcast + (static_cast<std::uint64_t>(root) << 8), bytes, data);
    if (transport_.rank() != root) {
      read_into(root, 0, data, bytes, streams(bytes));
    } else {
      wire_.count(static_cast<std::uint64_t>(transport_.size() - 1) * bytes, 0);  // their reads
    }
    wire_.barrier();
  }

  /// Every rank sends `mine` (`bytes` long) to every other; `all` gets rank q's at q * bytes.
  void exchange(const void* mine, std::size_t bytes, void* all) {
    wire_.exchange(mine, bytes, all, pending_);
  }

 private:
  // What a peer-memory collective tells the peers it runs (`share_buffers`).
  enum shared : std::uint64_t {
    allreduce = 1,
    reduce_scatter = 2,
    allgather = 3,
    broadcast = 4,
    allgatherv = 5
  };
  // kind, bytes, two addresses, their registrations (issue 22; 0: not registered)
  static constexpr std::size_t shared_words = 6;

  // Every rank sends what it runs (`kind`, a broadcast's root in bits 8 and up), the bytes
  // of its buffers, their addresses (`first`, and `second` or null; `first_extent` bytes
  // from `first`, default `bytes`; `bytes` from `second`) and the registration of this rank's
  // memory each lies in (0: none); then every rank checks the table, which is the same on
  // every rank, so if any rank runs another kind or size, every rank throws `mismatch_error`
  // before anything touches a peer's memory: the peer-memory paths never read or write
  // outside the buffers a peer gave, even with the communicator's mismatch check off
  // (issue 15). `buffer_of(q, i)` is q's address i.
  void share_buffers(std::uint64_t kind, std::uint64_t bytes, const void* first,
                     const void* second = nullptr, std::size_t first_extent = 0) {
    extent_ = {first_extent != 0 ? first_extent : bytes, bytes};
    std::array<std::uint64_t, 2> registration = {0, 0};
    if constexpr (registered_memory_transport<Transport>) {
      registration = {transport_.registration_of(first, extent_[0]),
                      second == nullptr ? 0 : transport_.registration_of(second, extent_[1])};
    }
    const std::array<std::uint64_t, shared_words> mine = {kind,
                                                          bytes,
                                                          reinterpret_cast<std::uint64_t>(first),
                                                          reinterpret_cast<std::uint64_t>(second),
                                                          registration[0],
                                                          registration[1]};
    const int size = transport_.size();
    addresses_.resize(shared_words * static_cast<std::size_t>(size));
    exchange(mine.data(), sizeof mine, addresses_.data());
    for (int q = 0; q < size; ++q) {
      const std::uint64_t* theirs = &addresses_[shared_words * static_cast<std::size_t>(q)];
      if (theirs[0] != kind || theirs[1] != bytes) {
        throw mismatch_error(
            {.operation = "peer-memory collective", .rank = transport_.rank(), .peer = q},
            "rank " + std::to_string(q) + " runs " + describe_shared(theirs[0], theirs[1]) +
                ", this rank " + describe_shared(kind, bytes));
      }
    }
    if constexpr (registered_memory_transport<Transport>) {
      mapped_.assign(2 * static_cast<std::size_t>(size), nullptr);
      for (int q = 0; q < size; ++q) {
        const std::uint64_t* theirs = &addresses_[shared_words * static_cast<std::size_t>(q)];
        for (std::size_t i = 0; i < 2; ++i) {
          mapped_[2 * static_cast<std::size_t>(q) + i] =
              transport_.mapped_peer(q, theirs[4 + i], theirs[2 + i], extent_[i]);
        }
      }
    }
  }
  std::uint64_t buffer_of(int q, std::size_t i) const {
    return addresses_[shared_words * static_cast<std::size_t>(q) + 2 + i];
  }
  // When q's buffer i is registered memory this rank maps (issue 22: plain loads and
  // stores), runs `use(where it lies in this process)` under `with_peer`, counts `n` bytes
  // this rank reads from it or writes into it (`reads`) and returns true; else false (the
  // caller moves them by cross-memory copy).
  template <class Use>
  bool through_mapping(int q, std::size_t i, bool reads, std::size_t n, Use&& use) {
    if constexpr (registered_memory_transport<Transport>) {
      std::byte* const mapped = mapped_[2 * static_cast<std::size_t>(q) + i];
      if (mapped == nullptr) return false;
      transport_.with_peer(q, [&] { use(mapped); });
      wire_.count(reads ? 0 : n, reads ? n : 0);
      return true;
    } else {
      return false;
    }
  }
  // Reads `n` bytes at offset `at` of q's buffer 0 into `into`.
  void read_into(int q, std::size_t at, std::byte* into, std::size_t n, bool stream) {
    if (through_mapping(q, 0, true, n, [&](const std::byte* mapped) {
          if (stream) {
            kernels::stream_copy(into, mapped + at, n);  // host memory: a registered transport's
          } else {
            kernels::copy_bytes(into, mapped + at, n);
          }
        })) {
      return;
    }
    wire_.read_peer(q, buffer_of(q, 0) + at, {into, n});
  }
  // Writes `n` bytes at `from` to offset `at` of q's buffer i (non-temporal stores where
  // `stream` and mapped).
  void write_to(int q, std::size_t i, std::size_t at, const std::byte* from, std::size_t n,
                const reducer& r, bool stream) {
    if (through_mapping(q, i, false, n, [&](std::byte* mapped) {
          if (stream) {
            r.stream(mapped + at, from, n);
          } else {
            r.copy(mapped + at, from, n);
          }
          r.settle();
        })) {
      return;
    }
    wire_.write_peer(q, buffer_of(q, i) + at, {from, n});
  }
  static std::string describe_shared(std::uint64_t kind, std::uint64_t bytes) {
    static constexpr std::array<const char*, 6> names = {"?",         "allreduce", "reduce_scatter",
                                                         "allgather", "broadcast", "allgatherv"};
    std::string text = names[(kind & 0xff) < names.size() ? (kind & 0xff) : 0];
    if ((kind & 0xff) == shared::broadcast) text += " from root " + std::to_string(kind >> 8);
    return text + " of " + std::to_string(bytes) + " bytes";
  }

  // The first half of a one-barrier window round (`allgather_windows`): this rank's `bytes`
  // from `from` published into this round's half of its window when `mine`, a barrier, then
  // `after_barrier()`. Returns the half's offset in every window (`window_of`). The round
  // counts only once `after_barrier()` (the mismatch check) has passed, as in `run_one_shot`:
  // when the ranks' calls differ, one rank publishes here while another is in a barrier of its
  // own, every rank throws in its check, and neither has counted the round, so later calls
  // still find each peer's data in the half it wrote.
  template <class Check>
  std::size_t publish(const std::byte* from, std::size_t bytes, const reducer& r,
                      std::size_t& round, bool mine,
                      Check&& after_barrier) requires direct_transport<Transport> {
    const std::size_t at = (round % 2) * (window_data_bytes(transport_) / 2);
    if (mine) {
      r.publish(window_of(transport_.rank(), at), from, bytes, published_[round % 2]);
      r.settle();
    }
    wire_.barrier();
    after_barrier();
    ++round;
    return at;
  }
  // Rank q's window, from offset `at`.
  std::byte* window_of(int q, std::size_t at) requires direct_transport<Transport> {
    return transport_.peer_view(q).data() + at;
  }

  // Whether a peer-memory collective of `bytes` of output writes it with non-temporal stores.
  bool streams(std::size_t bytes) const {
    return tuning_.non_temporal_bytes != 0 && bytes >= tuning_.non_temporal_bytes;
  }

  // Reduces `block` (of the whole buffer) over every rank into `out`, which holds the block's
  // elements: this rank's own elements are at `own`, peer q's input at `buffer_of(q, 0)`.
  // Works in 256 KiB pieces, each peer's read into the scratch (or, where every peer's input
  // is registered memory, all reduced straight out of their mappings in one fused pass);
  // after each piece calls `after(byte offset of the piece in the whole buffer, elements, the
  // reduced piece)`. With `stream`, each piece is reduced into a second scratch, still in
  // cache when `after` reads it, and streamed into `out` (non-temporal stores: `out`'s lines
  // are not read first).
  template <class AfterPiece>
  void reduce_block_from_peers(const std::byte* own, std::byte* out, index_range block,
                               const reducer& r, bool stream, AfterPiece&& after) {
    const int size = transport_.size();
    const int me = transport_.rank();
    const std::size_t e = r.element_bytes;
    const std::size_t piece = std::max<std::size_t>(1, (std::size_t{256} << 10) / e);
    std::byte* const scratch = scratch_.get(2 * piece * e);
    std::byte* const staged = scratch + piece * e;
    stream = stream && size > 1;  // one rank: nothing to reduce into the scratch
    for (std::size_t i = 0; i < block.count; i += piece) {
      const std::size_t n = std::min(piece, block.count - i);
      const std::size_t at = (block.begin + i) * e;
      std::byte* const got = stream ? staged : out + i * e;
      // every peer's piece in one pass where all are mapped, else peer by peer
      const bool fused = reduce_mapped(own + i * e, got, at, n, r);
      for (int k = 1; !fused && k < size; ++k) {
        const int q = wrap(me + k, size);
        const bool first = k == 1 && (stream || own != out);
        const auto reduce = [&](const std::byte* theirs) {
          if (first) {
            r.reduce(got, own + i * e, theirs, n);
          } else {
            r.reduce_into(got, theirs, n);
          }
          r.settle();  // the scratch is read again for the next peer; a mapping is let go
        };
        if (through_mapping(q, 0, true, n * e,
                            [&](const std::byte* mapped) { reduce(mapped + at); })) {
          continue;
        }
        wire_.read_peer(q, buffer_of(q, 0) + at, {scratch, n * e});
        reduce(scratch);
      }
      if (stream) {
        r.stream(out + i * e, staged, n * e);
        r.settle();
      }
      after(at, n, got);
    }
  }

  // Where every peer's buffer 0 is registered memory this rank maps: `got` = the fold of
  // `own` and each peer's `n` elements at byte `at`, the peers in `wrap(me + k)` order, in
  // one pass under every peer's `with_peer`; returns true. Else false, nothing done.
  bool reduce_mapped(const std::byte* own, std::byte* got, std::size_t at, std::size_t n,
                     const reducer& r) {
    if constexpr (registered_memory_transport<Transport>) {
      const int size = transport_.size();
      const int me = transport_.rank();
      inputs_.assign(1, own);
      for (int k = 1; k < size; ++k) {
        const std::byte* mapped = mapped_[2 * static_cast<std::size_t>(wrap(me + k, size))];
        if (mapped == nullptr) return false;
        inputs_.push_back(mapped + at);
      }
      const auto reduce = [&] {
        r.reduce_many(got, inputs_, n);
        r.settle();
      };
      with_every_peer(1, reduce);
      wire_.count(0, static_cast<std::uint64_t>(size - 1) * n * r.element_bytes);
      return true;
    } else {
      (void)own, (void)got, (void)at, (void)n, (void)r;
      return false;
    }
  }
  // Runs `use()` under `with_peer` of the peers `wrap(me + k)`, k from `k` on (registered memory).
  template <class Use>
  void with_every_peer(int k, Use& use) requires registered_memory_transport<Transport> {
    if (k == transport_.size()) {
      use();
      return;
    }
    transport_.with_peer(wrap(transport_.rank() + k, transport_.size()),
                         [&] { with_every_peer(k + 1, use); });
  }

  static std::size_t parts_of(const step& s) {
    return s.recv_from != nobody ? s.recv.parts : s.send.parts;
  }

  std::size_t piece_elements(const reducer& r) const {
    return std::max<std::size_t>(1, tuning_.chunk_bytes / r.element_bytes);
  }

  // One phase, chunk-major: for piece j, every step of the phase on piece j of its blocks.
  void run_phase(const schedule& s, std::size_t begin, std::size_t end, std::byte* data,
                 std::size_t count, const reducer& r, std::size_t piece) {
    const std::size_t parts = parts_of(s.steps[begin]);
    const std::size_t largest = split_range(count, parts, 0).count;
    const std::size_t pieces = div_up(largest, piece);
    std::size_t widest = 1;
    for (std::size_t i = begin; i < end; ++i) {
      if (s.steps[i].action == step_action::reduce)
        widest = std::max(widest, s.steps[i].recv.count);
    }
    const std::size_t slot_bytes = piece * r.element_bytes;
    std::byte* const scratch = scratch_.get(widest * slot_bytes);
    const std::size_t e = r.element_bytes;
    std::vector<completion_type>& recvs = pending_;
    std::size_t j = 0;  // the piece of every block the steps move
    // Piece j of each of a step's blocks, `visit(b, piece)` for the non-empty ones.
    const auto for_pieces = [&](const block_range& blocks, auto&& visit) {
      for (std::size_t b = 0; b < blocks.count; ++b) {
        const index_range p = piece_of(count, blocks, b, j, piece);
        if (p.count != 0) visit(b, p);
      }
    };
    const step_hooks hooks{
        /*post_recv*/
        [&](const step& st) {
          recvs.clear();
          for_pieces(st.recv, [&](std::size_t b, index_range p) {
            std::byte* into =
                st.action == step_action::reduce ? scratch + b * slot_bytes : data + p.begin * e;
            recvs.push_back(wire_.recv(st.recv_from, {into, p.count * e}));
          });
        },
        /*post_send*/
        [&](const step& st) {
          for_pieces(st.send, [&](std::size_t, index_range p) {
            sends_.push_back(wire_.send(st.send_to, {data + p.begin * e, p.count * e}));
          });
        },
        /*finish_recv*/
        [&](const step& st) {
          std::size_t k = 0;
          for_pieces(st.recv, [&](std::size_t b, index_range p) {
            recvs[k++].wait();
            if (st.action == step_action::reduce) {
              r.reduce_into(data + p.begin * e, scratch + b * slot_bytes, p.count);
            }
          });
          // the ordering point: the reduced pieces are complete before a later step sends
          // them, and the scratch they were reduced from is free for the next receive
          if (st.action == step_action::reduce && k != 0) r.settle();
        },
        /*end_step*/ [&](const step&) { wait_sends(tuning_.pipeline_depth); }};
    const std::span<const step> phase(s.steps.data() + begin, end - begin);
    for (; j < pieces; ++j) walk_steps(phase, hooks);
  }

  // Piece j of block `first + b` of `blocks`, as elements of the whole buffer.
  static index_range piece_of(std::size_t count, const block_range& blocks, std::size_t b,
                              std::size_t j, std::size_t piece) {
    const index_range block = split_range(count, blocks.parts, blocks.first + b);
    const std::size_t from = std::min(block.count, j * piece);
    return {block.begin + from, std::min(piece, block.count - from)};
  }

  // Waits for the oldest sends until at most `keep` are in flight.
  void wait_sends(std::size_t keep) {
    while (sends_.size() > keep) {
      sends_.front().wait();
      sends_.pop_front();
    }
  }

  Transport& transport_;
  wire<Transport> wire_;
  scratch_ref scratch_;
  std::vector<std::uint64_t>& addresses_;
  std::vector<std::byte*>& mapped_;             // where each peer's buffers lie here, if mapped
  std::vector<const std::byte*>& inputs_;       // a fused reduction's inputs
  std::array<std::size_t, 2> extent_ = {0, 0};  // the bytes at each shared address
  std::vector<completion_type>& pending_;
  std::deque<completion_type>& sends_;
  std::array<kernels::published_lines, 2>& published_;
  collective_tuning tuning_;
};

}  // namespace squall::detail
