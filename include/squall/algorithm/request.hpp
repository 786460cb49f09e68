// SPDX-License-Identifier: Apache-2.0
#pragma once
/// `request`, what the non-blocking collectives return, and the progress engine that runs them:
/// one worker thread per communicator, started at its first non-blocking call, that runs the
/// calls one after another in the order this rank started them (every rank starts them in the
/// same order, so every rank runs the same sequence). The thread sleeps on a condition
/// variable when there is nothing to run: no spinning while idle.

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
  request(request&&) noexcept = default;
  request& operator=(request&&) noexcept = default;
  request(const request&) = delete;
  request& operator=(const request&) = delete;

  /// Blocks until the collective is done; rethrows its error. A request that holds nothing
  /// (default-constructed, moved from, or already waited on) returns at once.
  void wait() {
    if (!state_) return;
    const auto state = std::exchange(state_, nullptr);
    engine_->wait(state, rank_);
  }
  /// True once the collective is done (then `wait()` returns or throws at once).
  bool test() { return !state_ || engine_->test(state_); }

 private:
  detail::progress_engine* engine_ = nullptr;
  std::shared_ptr<detail::request_state> state_;
  int rank_ = no_rank;
};

namespace detail {

/// The order of one communicator's calls (squall's communicators; the interposer's tiers):
/// a non-blocking call queued on a progress engine made at the first; a blocking one on the
/// caller's thread when nothing is in flight, else queued behind what is and waited for (so
/// it runs in the order it was called).
class call_order {
 public:
  explicit call_order(std::chrono::nanoseconds deadline) : deadline_(deadline) {}

  /// A blocking call of rank `rank`: `body`, in order.
  template <class F>
  void ordered(int rank, F&& body) {
    if (!engine_ || engine_->idle()) {
      std::forward<F>(body)();
      return;
    }
    engine_->wait(engine_->submit([&] { body(); }), rank);
  }
  /// A non-blocking call of rank `rank`: `body` queued on the engine.
  request started(int rank, std::function<void()> body) {
    if (!engine_) engine_ = std::make_unique<progress_engine>(deadline_);
    return request(engine_.get(), engine_->submit(std::move(body)), rank);
  }
  /// Runs what is queued, then stops the engine's thread (before what its calls use goes).
  void finish() { engine_.reset(); }

 private:
  std::chrono::nanoseconds deadline_;  ///< options::resolved_deadline, for the requests' waits
  std::unique_ptr<progress_engine> engine_;
};

}  // namespace detail

}  // namespace squall
