// SPDX-License-Identifier: Apache-2.0
#pragma once
/// `inproc_transport`: the ranks are threads of one process. It exists so that everything above
/// the transport (executor, collectives, compressors) can be tested fast, without mpirun.
///
/// Create one `inproc_world` of `size` ranks, then one `inproc_transport` per thread with
/// `world.transport(rank)`. Messages are rendezvous: a send is matched with the recv that the
/// peer posts for it, and the bytes move by one `memmove` from the sender's buffer straight into
/// the receiver's, so no message is buffered and nothing is allocated per message beyond one
/// small queue node.
///
///     squall::inproc_world world(2);
///     std::jthread peer([&] {
///       auto t = world.transport(1);
///       t.send(0, bytes).wait();
///     });
///     auto t = world.transport(0);
///     t.recv(1, out).wait();

#include <squall/concepts.hpp>
#include <squall/core/buffer.hpp>
#include <squall/core/completion.hpp>  // detail::deadline, yield_before_sleep
#include <squall/core/error.hpp>
#include <squall/core/link_costs.hpp>
#include <squall/core/options.hpp>
#include <squall/kernels/host/copy.hpp>

#include <algorithm>  // min
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstring>  // memmove
#include <memory>   // shared_ptr, unique_ptr
#include <mutex>
#include <string>
#include <string_view>
#include <thread>   // this_thread::yield
#include <utility>  // move
#include <vector>

namespace squall {

namespace detail {
struct inproc_op;
class inproc_state;
}  // namespace detail

class inproc_transport;

/// A handle to one `send`, `recv` or `barrier` of an `inproc_transport`. Move-only.
///
/// `wait()` blocks (yielding the CPU for up to 200 us, then sleeping on a condition variable)
/// until the operation is done, for at most the transport's `deadline()`; `test()` never
/// waits. Either call may perform the copy of a matched message itself, so that no order of waits
/// across ranks can deadlock as long as every operation has been posted. The destructor of a
/// pending completion waits for it like `wait()` but swallows any error: the buffers of an
/// operation are never touched after its completion is destroyed.
class inproc_completion {
 public:
  /// A completion that is already done: `wait()` returns and `test()` is true at once.
  inproc_completion() noexcept = default;
  inproc_completion(inproc_completion&& other) noexcept;
  /// Waits for the operation this completion held (as the destructor does), then takes `other`'s.
  inproc_completion& operator=(inproc_completion&& other) noexcept;
  inproc_completion(const inproc_completion&) = delete;
  inproc_completion& operator=(const inproc_completion&) = delete;
  ~inproc_completion();

  /// Blocks until the operation is done. Throws, naming the operation, this rank and the peer:
  /// `timeout_error` past the deadline (the transport is then failed), `mismatch_error` when
  /// the matched send and recv differ in size, `peer_failure` when the peer's transport was
  /// destroyed before it posted the matching operation. A failed completion throws the same
  /// error again on every later `wait()` or `test()`.
  void wait();
  /// True once the operation is done; never waits (it may copy a matched message). Throws what
  /// `wait()` would throw once the operation has failed.
  bool test();

 private:
  friend class inproc_transport;
  inproc_completion(std::shared_ptr<detail::inproc_state> state,
                    std::unique_ptr<detail::inproc_op> op) noexcept;
  void finish() noexcept;

  std::shared_ptr<detail::inproc_state> state_;
  std::unique_ptr<detail::inproc_op> op_;
};

/// One rank's end of an `inproc_world`; models `transport` and `direct_transport`.
///
/// - Messages of one ordered pair (source, destination) match in FIFO order: the k-th recv
///   that `dst` posts from `src` receives the k-th send that `src` posted to `dst`.
/// - A send completes once its bytes are in the receiver's buffer (rendezvous): the sender's
///   buffer must stay valid and unchanged until the send's completion is done, the receiver's
///   until the recv's is. Sending to oneself is allowed.
/// - A recv whose size differs from the matched send's fails with `mismatch_error` ("recv",
///   this rank, the peer); the send fails with `mismatch_error` ("send") too, rather than hang.
/// - A peer outside `[0, size())` throws `invalid_argument` before anything is posted.
/// - Every wait lasts at most `deadline()`, then throws `timeout_error` naming the operation,
///   the rank and the peer. After a timeout the transport is *failed*: every later `send`,
///   `recv` and `barrier` throws `timeout_error` at once, and so does waiting for any of its
///   operations that no peer has matched yet.
/// - Destroying the transport tells the peers that this rank has left: their operations that
///   can no longer complete (a recv from this rank with no send of it queued, a barrier it
///   never reached) fail at once with `peer_failure` instead of running into the deadline.
///
/// Windows (`direct_transport`): each rank owns `window_bytes` bytes, given to the world's
/// constructor, that every rank can read and write through `peer_view`. Ordering accesses to
/// windows is the caller's job, with `barrier()` or messages.
///
/// One thread uses a transport at a time; its completions may be waited from any thread. A
/// moved-from transport may only be destroyed or assigned to.
class inproc_transport {
 public:
  /// Buffers are host memory.
  using memory_space = host_memory;
  /// One process's memory, as `shm_transport`'s (the same figures).
  static constexpr link_costs costs{
      .alpha = 1e-6, .beta = 1.0 / 11e9, .gamma = 1.0 / 8e9, .all_peers_at_once = true};

  inproc_transport(inproc_transport&& other) noexcept;
  /// Leaves the world as the destructor does, then takes `other`'s rank.
  inproc_transport& operator=(inproc_transport&& other) noexcept;
  inproc_transport(const inproc_transport&) = delete;
  inproc_transport& operator=(const inproc_transport&) = delete;
  /// Leaves the world (see above). Operations already posted stay matchable until their
  /// completions are done.
  ~inproc_transport();

  /// This rank, in `[0, size())`.
  int rank() const noexcept { return rank_; }
  /// The number of ranks of the world.
  int size() const noexcept;
  /// How long any single wait may last, as `options::resolved_deadline()` gave it to the world.
  std::chrono::nanoseconds deadline() const noexcept;

  /// Starts sending `bytes` to `peer`; `bytes` must stay valid until the completion is done.
  [[nodiscard]] inproc_completion send(int peer, buffer_view<const std::byte> bytes);
  /// Starts receiving exactly `bytes.count()` bytes from `peer` into `bytes`.
  [[nodiscard]] inproc_completion recv(int peer, buffer_view<std::byte> bytes);
  /// Starts a barrier; it completes once every rank has called `barrier()` as many times as
  /// this rank has. Barriers may be posted before earlier ones are waited.
  [[nodiscard]] inproc_completion barrier();

  /// The window of `peer` (`window_bytes` bytes, shared by all ranks); `invalid_argument` if
  /// `peer` is outside `[0, size())`.
  buffer_view<std::byte> peer_view(int peer);
  /// This rank's own window: `peer_view(rank())`.
  buffer_view<std::byte> local_view();
  /// Ranks are threads of one process: every peer's memory is readable.
  bool can_access_peers() const noexcept { return true; }
  /// Copies `into.count()` bytes at address `from` (in `peer`'s buffers, which here share
  /// this process) into `into`; the caller synchronises, as with `shm_transport::read_peer`.
  void read_peer(int peer, std::uint64_t from, buffer_view<std::byte> into);
  /// Copies `from` to address `to` (in `peer`'s buffers); the caller synchronises.
  void write_peer(int peer, std::uint64_t to, buffer_view<const std::byte> from);

 private:
  friend class inproc_world;
  inproc_transport(std::shared_ptr<detail::inproc_state> state, int rank) noexcept;
  void check_peer(std::string_view operation, int peer) const;
  inproc_completion post(std::unique_ptr<detail::inproc_op> op);

  std::shared_ptr<detail::inproc_state> state_;
  int rank_ = no_rank;
};

/// The shared state of `size` thread-ranks: message queues, barrier counters and windows.
/// Create one, then one transport per thread with `transport(rank)`. The state lives as long
/// as the world, a transport or a completion refers to it.
class inproc_world {
 public:
  /// A world of `size` ranks whose waits last at most `opts.resolved_deadline()` (resolved
  /// here, once) and whose ranks own windows of `window_bytes` zeroed bytes each, aligned for
  /// any scalar type. Throws `invalid_argument` if `size < 1` or the deadline is invalid.
  explicit inproc_world(int size, const options& opts = {}, std::size_t window_bytes = 0);
  inproc_world(inproc_world&&) noexcept = default;
  inproc_world& operator=(inproc_world&&) noexcept = default;
  inproc_world(const inproc_world&) = delete;
  inproc_world& operator=(const inproc_world&) = delete;
  ~inproc_world() = default;

  /// The number of ranks.
  int size() const noexcept;
  /// The transport of `rank`, to be used by one thread. Thread-safe. Throws `invalid_argument`
  /// if `rank` is outside `[0, size())` or already has a transport.
  inproc_transport transport(int rank);

 private:
  std::shared_ptr<detail::inproc_state> state_;
};

// ---- implementation ----------------------------------------------------------------------------

namespace detail {

enum class inproc_kind : unsigned char { send, recv, barrier };

/// posted -> matched -> copying -> done; or posted/matched -> failed.
enum class inproc_status : unsigned char { posted, matched, copying, done, failed };

enum class inproc_failure : unsigned char { none, mismatch, timeout, transport_failed, peer_left };

/// One posted operation: a queue node while unmatched, then one half of a matched pair.
/// It is owned by its completion, which outlives every reference to it from elsewhere: the
/// queue drops it when it is matched or cancelled, and the partner stops touching it once both
/// are done or failed, which happens under the state's mutex, before either completion returns.
struct inproc_op {
  inproc_kind kind = inproc_kind::send;
  int rank = no_rank;
  int peer = no_peer;
  const std::byte* source = nullptr;  ///< send: the sender's bytes
  std::byte* target = nullptr;        ///< recv: the receiver's buffer
  std::size_t bytes = 0;
  std::uint64_t barrier_index = 0;  ///< barrier: how many barriers this rank called before
  inproc_status status = inproc_status::posted;
  inproc_failure failure = inproc_failure::none;
  std::string failure_detail;  ///< set, under the mutex, when `status` becomes failed
  inproc_op* partner = nullptr;
  inproc_op* next = nullptr;  ///< the queue link while posted and unmatched
};

inline std::string_view inproc_name(inproc_kind kind) noexcept {
  switch (kind) {
    case inproc_kind::send:
      return "send";
    case inproc_kind::recv:
      return "recv";
    case inproc_kind::barrier:
      return "barrier";
  }
  return "inproc";
}

/// The world's shared state. One mutex guards the queues and counters; each rank has a
/// condition variable that its waiting threads sleep on and that peers notify. Copies run
/// outside the mutex, so two pairs of ranks move bytes at the same time.
class inproc_state {
 public:
  inproc_state(int size, std::chrono::nanoseconds deadline, std::size_t window_bytes)
      : size_(size),
        deadline_(deadline),
        ranks_(std::make_unique<rank_slot[]>(static_cast<std::size_t>(size))),
        channels_(static_cast<std::size_t>(size) * static_cast<std::size_t>(size)) {
    for (int r = 0; r < size; ++r) ranks_[static_cast<std::size_t>(r)].window.resize(window_bytes);
  }

  int size() const noexcept { return size_; }
  std::chrono::nanoseconds deadline() const noexcept { return deadline_; }

  buffer_view<std::byte> window(int rank) {
    auto& window = slot(rank).window;
    return {window.data(), window.size()};
  }

  /// Marks `rank` as having a transport; throws if it already has one.
  void claim(int rank) {
    const std::lock_guard lock(mutex_);
    if (slot(rank).claimed) {
      throw invalid_argument({.operation = "inproc_world transport", .rank = rank},
                             "rank " + std::to_string(rank) + " already has a transport");
    }
    slot(rank).claimed = true;
  }

  /// `rank`'s transport is gone: wake every waiter, so that those who depend on it fail.
  void leave(int rank) noexcept {
    const std::lock_guard lock(mutex_);
    slot(rank).left = true;
    notify_all_ranks();
  }

  /// Queues `op`, or matches it with the oldest queued counterpart. Throws `timeout_error` if
  /// the rank's transport has failed.
  void post(inproc_op& op) {
    const std::lock_guard lock(mutex_);
    auto& self = slot(op.rank);
    if (self.failed) {
      throw timeout_error({.operation = inproc_name(op.kind), .rank = op.rank, .peer = op.peer},
                          "the transport failed earlier: " + self.failure);
    }
    switch (op.kind) {
      case inproc_kind::send: {
        auto& ch = channel(op.rank, op.peer);
        if (inproc_op* recv = ch.recvs.pop()) {
          pair(op, *recv);
        } else {
          ch.sends.push(op);
        }
        break;
      }
      case inproc_kind::recv: {
        auto& ch = channel(op.peer, op.rank);
        if (inproc_op* send = ch.sends.pop()) {
          pair(*send, op);
        } else {
          ch.recvs.push(op);
        }
        break;
      }
      case inproc_kind::barrier: {
        op.barrier_index = self.barriers++;
        std::uint64_t least = self.barriers;
        for (int r = 0; r < size_; ++r) least = std::min(least, slot(r).barriers);
        if (least > barriers_done_) {
          barriers_done_ = least;
          notify_all_ranks();
        }
        break;
      }
    }
  }

  /// Blocks until `op` is done; throws if it fails or the deadline passes first. Yields the
  /// CPU for up to `squall::detail::yield_before_sleep` first (a peer that is a few instructions
  /// from matching or copying gets the core, and neither side pays a sleep and a wake-up), then
  /// sleeps on the rank's condition variable.
  void wait(inproc_op& op) {
    const squall::detail::deadline limit(deadline_);
    std::unique_lock lock(mutex_);
    // (never past the deadline: a wait lasts at most `deadline_`, however short)
    const auto yielding_until = std::min(
        std::chrono::steady_clock::now() + squall::detail::yield_before_sleep, limit.end());
    while (!progress(op, lock)) {
      if (std::chrono::steady_clock::now() < yielding_until) {
        lock.unlock();
        std::this_thread::yield();
        lock.lock();
        continue;
      }
      if (op.status == inproc_status::copying) {
        // The peer is copying; a copy is bounded work that needs nobody else, so it is
        // waited for without a deadline (the buffers must not be released mid-copy).
        slot(op.rank).cv.wait(lock);
        continue;
      }
      give_up_if_hopeless(op);
      if (limit.expired()) {
        cancel(op, inproc_failure::timeout, timeout_detail(op, limit));
        auto& self = slot(op.rank);
        self.failed = true;
        self.failure = std::string(inproc_name(op.kind));
        if (op.kind != inproc_kind::barrier)
          self.failure += " (peer " + std::to_string(op.peer) + ")";
        self.failure += " timed out after " + limit.describe();
        notify(op.rank);  // other threads waiting on this rank's operations fail too
        throw_failure(op);
      }
      slot(op.rank).cv.wait_until(lock, limit.end());
    }
  }

  /// True if `op` is done; throws if it has failed. Never waits for a peer.
  bool test(inproc_op& op) {
    std::unique_lock lock(mutex_);
    if (progress(op, lock)) return true;
    if (op.status == inproc_status::posted) give_up_if_hopeless(op);
    return false;
  }

 private:
  /// An intrusive FIFO of posted, unmatched operations.
  class fifo {
   public:
    void push(inproc_op& op) noexcept {
      op.next = nullptr;
      if (tail_ != nullptr) {
        tail_->next = &op;
      } else {
        head_ = &op;
      }
      tail_ = &op;
    }
    inproc_op* pop() noexcept {
      inproc_op* op = head_;
      if (op != nullptr) {
        head_ = op->next;
        if (head_ == nullptr) tail_ = nullptr;
        op->next = nullptr;
      }
      return op;
    }
    /// Unlinks `op` if it is queued here.
    void remove(inproc_op& op) noexcept {
      inproc_op* prev = nullptr;
      for (inproc_op* it = head_; it != nullptr; prev = it, it = it->next) {
        if (it != &op) continue;
        (prev != nullptr ? prev->next : head_) = it->next;
        if (tail_ == it) tail_ = prev;
        it->next = nullptr;
        return;
      }
    }

   private:
    inproc_op* head_ = nullptr;
    inproc_op* tail_ = nullptr;
  };

  /// The queues of one ordered pair (source, destination).
  struct pair_channel {
    fifo sends;
    fifo recvs;
  };

  struct rank_slot {
    std::condition_variable cv;
    std::vector<std::byte> window;
    std::uint64_t barriers = 0;  ///< barriers this rank has called
    bool claimed = false;
    bool left = false;
    bool failed = false;
    std::string failure;  ///< why `failed`, for the messages of later calls
  };

  rank_slot& slot(int rank) noexcept { return ranks_[static_cast<std::size_t>(rank)]; }
  pair_channel& channel(int source, int destination) noexcept {
    return channels_[static_cast<std::size_t>(source) * static_cast<std::size_t>(size_) +
                     static_cast<std::size_t>(destination)];
  }
  void notify(int rank) noexcept { slot(rank).cv.notify_all(); }
  void notify_all_ranks() noexcept {
    for (int r = 0; r < size_; ++r) notify(r);
  }

  /// Links a send with its recv. Sizes are compared here, so that both sides fail together.
  void pair(inproc_op& send, inproc_op& recv) {
    send.partner = &recv;
    recv.partner = &send;
    if (send.bytes == recv.bytes) {
      send.status = recv.status = inproc_status::matched;
    } else {
      const std::string sent = std::to_string(send.bytes);
      const std::string expected = std::to_string(recv.bytes);
      fail(recv, inproc_failure::mismatch,
           "expected " + expected + " bytes, but the matching send has " + sent);
      fail(send, inproc_failure::mismatch,
           "sent " + sent + " bytes, but the matching recv expects " + expected);
    }
    notify(send.rank);
    notify(recv.rank);
  }

  void fail(inproc_op& op, inproc_failure failure, std::string detail) noexcept {
    op.status = inproc_status::failed;
    op.failure = failure;
    op.failure_detail = std::move(detail);
  }

  /// Moves `op` on as far as it goes without waiting: true once done, throws once failed,
  /// copies a matched message (releasing `lock` meanwhile).
  bool progress(inproc_op& op, std::unique_lock<std::mutex>& lock) {
    switch (op.status) {
      case inproc_status::done:
        return true;
      case inproc_status::failed:
        throw_failure(op);
      case inproc_status::matched: {
        inproc_op& send = op.kind == inproc_kind::send ? op : *op.partner;
        inproc_op& recv = op.kind == inproc_kind::recv ? op : *op.partner;
        send.status = recv.status = inproc_status::copying;
        lock.unlock();
        // Either side may copy: the first to look at a matched pair does, so a rank blocked
        // in waiting for its own send never stalls the recv it is matched with.
        if (recv.bytes != 0) std::memmove(recv.target, send.source, recv.bytes);
        lock.lock();
        send.status = recv.status = inproc_status::done;
        notify(send.rank);
        if (recv.rank != send.rank) notify(recv.rank);
        return true;
      }
      case inproc_status::copying:
        return false;
      case inproc_status::posted:
        if (op.kind == inproc_kind::barrier && barriers_done_ > op.barrier_index) {
          op.status = inproc_status::done;
          return true;
        }
        return false;
    }
    return false;
  }

  /// Fails a posted `op` at once if it can never complete: its transport failed, or the peer
  /// (for a barrier: any rank that has not reached it) has left.
  void give_up_if_hopeless(inproc_op& op) {
    if (slot(op.rank).failed) {
      cancel(op, inproc_failure::transport_failed,
             "the transport failed earlier: " + slot(op.rank).failure);
      throw_failure(op);
    }
    if (op.kind == inproc_kind::barrier) {
      for (int r = 0; r < size_; ++r) {
        if (slot(r).left && slot(r).barriers <= op.barrier_index) {
          cancel(op, inproc_failure::peer_left,
                 "rank " + std::to_string(r) + " left before reaching barrier #" +
                     std::to_string(op.barrier_index));
          throw_failure(op);
        }
      }
    } else if (slot(op.peer).left) {
      cancel(op, inproc_failure::peer_left,
             op.kind == inproc_kind::recv ? "the peer left without sending a matching message"
                                          : "the peer left without posting a matching recv");
      throw_failure(op);
    }
  }

  /// Takes a posted `op` out of its queue and fails it; its buffer is never touched again.
  void cancel(inproc_op& op, inproc_failure failure, std::string detail) {
    if (op.kind == inproc_kind::send) channel(op.rank, op.peer).sends.remove(op);
    if (op.kind == inproc_kind::recv) channel(op.peer, op.rank).recvs.remove(op);
    fail(op, failure, std::move(detail));
  }

  std::string timeout_detail(const inproc_op& op, const squall::detail::deadline& limit) {
    switch (op.kind) {
      case inproc_kind::send:
        return "no matching recv was posted within " + limit.describe();
      case inproc_kind::recv:
        return "no matching send was posted within " + limit.describe();
      case inproc_kind::barrier:
        break;
    }
    std::string missing;
    for (int r = 0; r < size_; ++r) {
      if (slot(r).barriers > op.barrier_index) continue;
      missing += missing.empty() ? "rank " : ", ";
      missing += std::to_string(r);
    }
    return missing + " did not reach barrier #" + std::to_string(op.barrier_index) + " within " +
           limit.describe();
  }

  /// The first rank that has not reached `op`'s barrier, named as its peer.
  int barrier_laggard(const inproc_op& op) noexcept {
    for (int r = 0; r < size_; ++r) {
      if (slot(r).barriers <= op.barrier_index) return r;
    }
    return no_peer;
  }

  [[noreturn]] void throw_failure(const inproc_op& op) {
    const error_context where{
        .operation = inproc_name(op.kind),
        .rank = op.rank,
        .peer = op.kind == inproc_kind::barrier ? barrier_laggard(op) : op.peer};
    switch (op.failure) {
      case inproc_failure::mismatch:
        throw mismatch_error(where, op.failure_detail);
      case inproc_failure::peer_left:
        throw peer_failure(where, op.failure_detail);
      case inproc_failure::timeout:
      case inproc_failure::transport_failed:
        throw timeout_error(where, op.failure_detail);
      case inproc_failure::none:
        break;
    }
    throw error(make_error_code(errc::internal), where, "failed without a reason");
  }

  int size_;
  std::chrono::nanoseconds deadline_;
  std::mutex mutex_;
  std::unique_ptr<rank_slot[]> ranks_;
  std::vector<pair_channel> channels_;
  std::uint64_t barriers_done_ = 0;  ///< barriers every rank has reached
};

}  // namespace detail

// ---- inproc_completion
// ---------------------------------------------------------------------------

inline inproc_completion::inproc_completion(std::shared_ptr<detail::inproc_state> state,
                                            std::unique_ptr<detail::inproc_op> op) noexcept
    : state_(std::move(state)), op_(std::move(op)) {}

inline inproc_completion::inproc_completion(inproc_completion&& other) noexcept
    : state_(std::move(other.state_)), op_(std::move(other.op_)) {}

inline inproc_completion& inproc_completion::operator=(inproc_completion&& other) noexcept {
  if (this != &other) {
    finish();
    state_ = std::move(other.state_);
    op_ = std::move(other.op_);
  }
  return *this;
}

inline inproc_completion::~inproc_completion() { finish(); }

inline void inproc_completion::wait() {
  if (!op_) return;
  state_->wait(*op_);
  op_.reset();
  state_.reset();
}

inline bool inproc_completion::test() {
  if (!op_) return true;
  if (!state_->test(*op_)) return false;
  op_.reset();
  state_.reset();
  return true;
}

inline void inproc_completion::finish() noexcept {
  if (!op_) return;
  try {
    state_->wait(*op_);
  } catch (...) {
    // Dropped on purpose: a destructor cannot report, and callers who care call wait().
  }
  op_.reset();
  state_.reset();
}

// ---- inproc_transport
// ----------------------------------------------------------------------------

inline inproc_transport::inproc_transport(std::shared_ptr<detail::inproc_state> state,
                                          int rank) noexcept
    : state_(std::move(state)), rank_(rank) {}

inline inproc_transport::inproc_transport(inproc_transport&& other) noexcept
    : state_(std::move(other.state_)), rank_(other.rank_) {}

inline inproc_transport& inproc_transport::operator=(inproc_transport&& other) noexcept {
  if (this != &other) {
    if (state_) state_->leave(rank_);
    state_ = std::move(other.state_);
    rank_ = other.rank_;
  }
  return *this;
}

inline inproc_transport::~inproc_transport() {
  if (state_) state_->leave(rank_);
}

inline int inproc_transport::size() const noexcept { return state_->size(); }

inline std::chrono::nanoseconds inproc_transport::deadline() const noexcept {
  return state_->deadline();
}

inline void inproc_transport::check_peer(std::string_view operation, int peer) const {
  if (peer < 0 || peer >= size()) {
    throw invalid_argument(
        {.operation = operation, .rank = rank_, .peer = peer},
        "peer " + std::to_string(peer) + " is outside [0, " + std::to_string(size()) + ")");
  }
}

inline inproc_completion inproc_transport::post(std::unique_ptr<detail::inproc_op> op) {
  op->rank = rank_;
  state_->post(*op);
  return inproc_completion(state_, std::move(op));
}

inline inproc_completion inproc_transport::send(int peer, buffer_view<const std::byte> bytes) {
  check_peer("send", peer);
  auto op = std::make_unique<detail::inproc_op>();
  op->kind = detail::inproc_kind::send;
  op->peer = peer;
  op->source = bytes.data();
  op->bytes = bytes.size_bytes();
  return post(std::move(op));
}

inline inproc_completion inproc_transport::recv(int peer, buffer_view<std::byte> bytes) {
  check_peer("recv", peer);
  auto op = std::make_unique<detail::inproc_op>();
  op->kind = detail::inproc_kind::recv;
  op->peer = peer;
  op->target = bytes.data();
  op->bytes = bytes.size_bytes();
  return post(std::move(op));
}

inline inproc_completion inproc_transport::barrier() {
  auto op = std::make_unique<detail::inproc_op>();
  op->kind = detail::inproc_kind::barrier;
  return post(std::move(op));
}

inline buffer_view<std::byte> inproc_transport::peer_view(int peer) {
  check_peer("peer_view", peer);
  return state_->window(peer);
}

inline buffer_view<std::byte> inproc_transport::local_view() { return state_->window(rank_); }

inline void inproc_transport::read_peer(int peer, std::uint64_t from, buffer_view<std::byte> into) {
  check_peer("read_peer", peer);
  kernels::copy_bytes(into.data(), reinterpret_cast<const std::byte*>(from), into.count());
}

inline void inproc_transport::write_peer(int peer, std::uint64_t to,
                                         buffer_view<const std::byte> from) {
  check_peer("write_peer", peer);
  kernels::copy_bytes(reinterpret_cast<std::byte*>(to), from.data(), from.count());
}

// ---- inproc_world
// --------------------------------------------------------------------------------

inline inproc_world::inproc_world(int size, const options& opts, std::size_t window_bytes) {
  if (size < 1) {
    throw invalid_argument({.operation = "inproc_world"},
                           "size " + std::to_string(size) + " is not at least 1");
  }
  state_ = std::make_shared<detail::inproc_state>(size, opts.resolved_deadline(), window_bytes);
}

inline int inproc_world::size() const noexcept { return state_->size(); }

inline inproc_transport inproc_world::transport(int rank) {
  if (rank < 0 || rank >= size()) {
    throw invalid_argument(
        {.operation = "inproc_world transport", .rank = rank},
        "rank " + std::to_string(rank) + " is outside [0, " + std::to_string(size()) + ")");
  }
  state_->claim(rank);
  return inproc_transport(state_, rank);
}

static_assert(completion<inproc_completion>);
static_assert(transport<inproc_transport>);
static_assert(direct_transport<inproc_transport>);
static_assert(peer_memory_transport<inproc_transport>);

}  // namespace squall
