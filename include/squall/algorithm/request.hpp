// SPDX-License-Identifier: Apache-2.0
#pragma once
/// `request`, what the non-blocking collectives return, and the progress engine that runs them:
/// one worker thread per communicator, started at its first non-blocking call, that runs the
/// calls one after another in the order this rank started them (every rank starts them in the
/// same order, so every rank runs the same sequence). The thread sleeps on a condition
/// variable when there is nothing to run: no spinning while idle. A call that can start on the
/// caller's thread and finish by polling (a barrier on shared memory) runs in two halves
/// instead (`split_call`): no thread between the caller and the transport.

#include <squall/core/error.hpp>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>  // move

namespace squall {

namespace detail {

/// One operation's outcome, shared by its `request` and the engine.
struct request_state {
  bool done = false;
  std::exception_ptr failure;
};

/// Whether this thread is a progress engine's: squall's own calls into MPI run there, and the
/// PMPI interposer tells them from the program's by it (its MPI_Ibarrier, which
/// `mpi_transport::barrier` calls).
inline thread_local bool on_progress_thread = false;

/// A call whose first half ran on the caller's thread (`call_order::split`); its rest runs
/// on whichever thread asks first: the request's `test` or `wait`, or the communicator's next
/// call, which must not start before it (the progress engine's, for a call queued there). One
/// thread at a time: `test` skips a poll while another thread completes it.
class split_call {
 public:
  split_call() = default;
  split_call(const split_call&) = delete;
  split_call& operator=(const split_call&) = delete;
  virtual ~split_call() = default;

  /// Completes the call (its own waits have deadlines); rethrows its failure.
  void wait() {
    const std::lock_guard guard(lock_);
    if (!done_) run(true);
    if (failure_) std::rethrow_exception(failure_);
  }
  /// One poll; whether the call is done (then `wait()` returns or throws at once). Never
  /// blocks, never throws.
  bool test() {
    const std::unique_lock guard(lock_, std::try_to_lock);
    if (!guard.owns_lock()) return false;
    if (!done_) run(false);
    return done_;
  }

 private:
  /// The rest of the call: one poll, or (`block`) to the end; true once done.
  virtual bool rest(bool block) = 0;
  void run(bool block) {
    try {
      done_ = rest(block);
    } catch (...) {
      failure_ = std::current_exception();
      done_ = true;
    }
  }

  std::mutex lock_;
  bool done_ = false;
  std::exception_ptr failure_;
};

/// A `split_call` whose rest is `Rest`, a callable `bool(bool block)` (move-only allowed).
template <class Rest>
class split_call_of final : public split_call {
 public:
  explicit split_call_of(Rest rest) : rest_(std::move(rest)) {}

 private:
  bool rest(bool block) override { return rest_(block); }
  Rest rest_;
};

/// Runs submitted operations in order on a thread of its own; see the file comment. After an
/// operation fails, the communicator has failed: every operation still queued, and every one
/// submitted later, fails with the same error without running.
class progress_engine {
 public:
  explicit progress_engine(std::chrono::nanoseconds deadline) : deadline_(deadline) {}
  progress_engine(const progress_engine&) = delete;
  progress_engine& operator=(const progress_engine&) = delete;

  /// Runs what is queued, then stops the thread (the buffers of operations in flight must
  /// outlive the communicator's destruction, as they must outlive a wait).
  ~progress_engine() {
    {
      const std::lock_guard guard(lock_);
      stopping_ = true;
    }
    wake_.notify_all();
    if (worker_.joinable()) worker_.join();
  }

  /// Queues `body`; returns its state. Starts the thread at the first call.
  std::shared_ptr<request_state> submit(std::function<void()> body) {
    auto state = std::make_shared<request_state>();
    {
      const std::lock_guard guard(lock_);
      if (!worker_.joinable()) worker_ = std::thread([this] { serve(); });
      queue_.push_back({std::move(body), state});
      if (queue_.size() == 1 && !running_) progress_ = clock::now();
    }
    wake_.notify_all();
    return state;
  }

  /// Whether nothing is queued or running, so a blocking call may run on the caller's thread
  /// without passing anything started before it. Throws the failure of an earlier operation.
  bool idle() {
    const std::lock_guard guard(lock_);
    if (failure_) std::rethrow_exception(failure_);
    return queue_.empty() && !running_;
  }

  /// Blocks until `state` is done; rethrows its failure. Throws `timeout_error` when the
  /// engine has neither started nor finished an operation for the deadline (each operation's
  /// own waits have that deadline, so this fires only if the engine itself is stuck).
  void wait(const std::shared_ptr<request_state>& state, int rank) {
    std::unique_lock guard(lock_);
    while (!state->done) {
      const clock::time_point until = progress_ + deadline_;
      if (wake_.wait_until(guard, until) == std::cv_status::timeout && !state->done &&
          clock::now() >= progress_ + deadline_) {
        throw timeout_error({.operation = "request::wait", .rank = rank},
                            "no operation of this communicator started or finished for " +
                                std::to_string(std::chrono::duration<double>(deadline_).count()) +
                                " s");
      }
    }
    if (state->failure) std::rethrow_exception(state->failure);
  }

  /// Whether `state` is done (never blocks).
  bool test(const std::shared_ptr<request_state>& state) {
    const std::lock_guard guard(lock_);
    return state->done;
  }

 private:
  using clock = std::chrono::steady_clock;
  struct item {
    std::function<void()> body;
    std::shared_ptr<request_state> state;
  };

  void serve() {
    on_progress_thread = true;
    std::unique_lock guard(lock_);
    for (;;) {
      wake_.wait(guard, [this] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, and everything ran
      item next = std::move(queue_.front());
      queue_.pop_front();
      std::exception_ptr failure = failure_;
      if (!failure) {
        running_ = true;
        progress_ = clock::now();
        guard.unlock();
        try {
          next.body();
        } catch (...) {
          failure = std::current_exception();
        }
        guard.lock();
        running_ = false;
        if (failure && !failure_) failure_ = failure;
      }
      next.state->failure = failure;
      next.state->done = true;
      progress_ = clock::now();
      wake_.notify_all();
    }
  }

  std::chrono::nanoseconds deadline_;
  std::mutex lock_;
  std::condition_variable wake_;  ///< new work, a finished operation, or stopping
  std::deque<item> queue_;
  bool running_ = false;
  bool stopping_ = false;
  std::exception_ptr failure_;  ///< the first operation that failed
  clock::time_point progress_ = clock::now();
  std::thread worker_;  ///< last: started after everything it reads
};

}  // namespace detail

/// A collective in flight, from a non-blocking call (`iallreduce`, ...). `wait()` blocks until
/// it is done and throws what it threw (each rank's request raises where that rank's part of
/// the collective failed: a dead peer, a deadline, a bad argument); `test()` says whether it is
/// done, never blocking. Its buffers (and compression state) must stay valid and untouched
/// until then. Movable, not copyable. A request destroyed without `wait()` still runs to the
/// end; its error, if any, is raised by the communicator's next call.
class request {
 public:
  request() = default;
  request(detail::progress_engine* engine, std::shared_ptr<detail::request_state> state, int rank)
      : engine_(engine), state_(std::move(state)), rank_(rank) {}
  explicit request(std::shared_ptr<detail::split_call> split) : split_(std::move(split)) {}
  request(request&&) noexcept = default;
  request& operator=(request&&) noexcept = default;
  request(const request&) = delete;
  request& operator=(const request&) = delete;

  /// Blocks until the collective is done; rethrows its error. A request that holds nothing
  /// (default-constructed, moved from, or already waited on) returns at once.
  void wait() {
    if (split_) {
      std::exchange(split_, nullptr)->wait();
      return;
    }
    if (!state_) return;
    const auto state = std::exchange(state_, nullptr);
    engine_->wait(state, rank_);
  }
  /// True once the collective is done (then `wait()` returns or throws at once).
  bool test() {
    if (split_) return split_->test();
    return !state_ || engine_->test(state_);
  }

 private:
  detail::progress_engine* engine_ = nullptr;
  std::shared_ptr<detail::request_state> state_;
  int rank_ = no_rank;
  std::shared_ptr<detail::split_call> split_;  ///< or, for a call in two halves, its rest
};

namespace detail {

/// The order of one communicator's calls (squall's communicators; the interposer's tiers):
/// a non-blocking call queued on a progress engine made at the first; a blocking one on the
/// caller's thread when nothing is in flight, else queued behind what is and waited for (so
/// it runs in the order it was called); a call in two halves (`split`) starts on the caller's
/// thread when nothing is in flight, and every later call first completes it.
class call_order {
 public:
  explicit call_order(std::chrono::nanoseconds deadline) : deadline_(deadline) {}
  call_order(call_order&&) noexcept = default;
  call_order& operator=(call_order&&) = delete;
  ~call_order() { finish(); }

  /// A blocking call of rank `rank`: `body`, in order.
  template <class F>
  void ordered(int rank, F&& body) {
    if (!engine_ || engine_->idle()) {
      complete_split();
      std::forward<F>(body)();
      return;
    }
    engine_->wait(engine_->submit([&] { body(); }), rank);
  }
  /// A non-blocking call of rank `rank`: `body` queued on the engine (behind the rest of a
  /// call in two halves, if one is pending).
  request started(int rank, std::function<void()> body) {
    if (!engine_) engine_ = std::make_unique<progress_engine>(deadline_);
    if (auto before = std::exchange(split_, nullptr)) {
      body = [before = std::move(before), body = std::move(body)] {
        before->wait();
        body();
      };
    }
    return request(engine_.get(), engine_->submit(std::move(body)), rank);
  }
  /// A call in two halves of rank `rank`: when nothing is in flight, `arrive()` on this thread
  /// (it returns the rest: a callable `bool(bool block)`, true once done) and a request that
  /// runs the rest; else `whole` queued as a non-blocking call (behind a pending call in two
  /// halves too: completing it here would block until every rank has arrived at it, which a
  /// non-blocking call must not).
  template <class Arrive>
  request split(int rank, Arrive&& arrive, std::function<void()> whole) {
    if (split_ && split_->test()) complete_split();  // done: dropped (its failure raised here)
    if (split_ || (engine_ && !engine_->idle())) return started(rank, std::move(whole));
    using rest = decltype(arrive());
    split_ = std::make_shared<split_call_of<rest>>(std::forward<Arrive>(arrive)());
    return request(split_);
  }
  /// Runs what is queued and the rest of a pending call in two halves (its error, if any,
  /// dropped: the request's wait raised it, or nobody asks), then stops the engine's thread
  /// (before what its calls use goes).
  void finish() noexcept {
    engine_.reset();
    if (auto pending = std::exchange(split_, nullptr)) {
      try {
        pending->wait();
      } catch (...) {  // NOLINT(bugprone-empty-catch): see above
      }
    }
  }

 private:
  /// Completes the pending call in two halves, if any; rethrows its failure (the next call
  /// of a communicator whose call failed fails too).
  void complete_split() {
    if (auto pending = std::exchange(split_, nullptr)) pending->wait();
  }

  std::chrono::nanoseconds deadline_;  ///< options::resolved_deadline, for the requests' waits
  std::unique_ptr<progress_engine> engine_;
  std::shared_ptr<split_call> split_;  ///< a call in two halves whose rest may still be pending
};

}  // namespace detail

}  // namespace squall
