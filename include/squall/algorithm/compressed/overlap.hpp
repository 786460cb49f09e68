// SPDX-License-Identifier: Apache-2.0
#pragma once
/// Overlap of a compressed allreduce's phases (`collective_tuning::overlap_chunks`): the tensor
/// is cut into chunks, and while the calling thread moves chunk c's payloads a second host
/// thread (`overlap_worker`) encodes chunk c + 1 and decodes chunk c - 1. On a slow link the
/// call then takes about max(encode, transfer) + the last chunk's decode instead of their sum.
/// The transport is only ever called from the calling thread (an MPI library initialized with
/// MPI_THREAD_FUNNELED is enough); the worker runs host kernels only.
///
/// Chunks start at multiples of the compressor's `chunk_alignment()` (compress/traits.hpp):
/// there a chunk's payload holds what the whole tensor's would (bitwise for cast, threshold and
/// the deterministic quantizers; with fresh draws for the stochastic ones). A compressor
/// without one (top-k, random-k, count sketch) means something else per chunk (top-k keeps
/// the k x n_c / n largest of each chunk, not the k largest overall): automatic never chunks
/// it, an explicit `overlap_chunks` does, and docs/compressors.md says what changes.

#include <squall/algorithm/compressed/payload.hpp>
#include <squall/algorithm/compressed/phases.hpp>
#include <squall/core/error.hpp>
#include <squall/core/random.hpp>
#include <squall/tuning/tuning.hpp>

#include <algorithm>  // min, max
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>  // unique_ptr
#include <mutex>
#include <string>
#include <thread>
#include <utility>  // move
#include <vector>

namespace squall::detail {

/// One host thread running tasks in the order they were queued, started on the first
/// `submit`. A task that throws makes the later ones skip, and a `wait` for it or a later one
/// rethrows its exception (a wait for an earlier one returns: it ran).
/// Waits block on a condition variable (no spinning): what the worker runs is computation
/// that always ends, so they need no deadline of their own.
class overlap_worker {
 public:
  overlap_worker() = default;
  overlap_worker(const overlap_worker&) = delete;
  overlap_worker& operator=(const overlap_worker&) = delete;
  ~overlap_worker() {
    {
      const std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    wake_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

  /// Queues `task`; returns its ticket, which `wait` takes.
  std::uint64_t submit(std::function<void()> task) {
    std::uint64_t ticket = 0;
    {
      const std::lock_guard lock(mutex_);
      if (!thread_.joinable()) thread_ = std::thread([this] { run(); });
      queue_.push_back(std::move(task));
      ticket = ++submitted_;
    }
    wake_.notify_all();
    return ticket;
  }

  /// Blocks until task `ticket` and every one before it have run; rethrows the exception of
  /// the first task that threw since the last `reset` if it is `ticket` or one before it.
  void wait(std::uint64_t ticket) {
    std::unique_lock lock(mutex_);
    done_changed_.wait(lock, [&] { return done_ >= ticket; });
    if (failed_ && failed_ticket_ <= ticket) std::rethrow_exception(failed_);
  }

  /// Blocks until every queued task has run, ignoring their exceptions (for unwinding).
  void drain() noexcept {
    std::unique_lock lock(mutex_);
    done_changed_.wait(lock, [&] { return done_ >= submitted_; });
  }

  /// Forgets a failure (at the start of a call, after a drained one).
  void reset() {
    const std::lock_guard lock(mutex_);
    failed_ = nullptr;
  }

 private:
  void run() {
    std::unique_lock lock(mutex_);
    for (;;) {
      wake_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, nothing left
      std::function<void()> task = std::move(queue_.front());
      queue_.pop_front();
      const bool skip = failed_ != nullptr;
      const std::uint64_t ticket = done_ + 1;
      lock.unlock();
      std::exception_ptr thrown;
      if (!skip) {
        try {
          task();
        } catch (...) {
          thrown = std::current_exception();
        }
      }
      lock.lock();
      if (thrown && !failed_) {
        failed_ = thrown;
        failed_ticket_ = ticket;
      }
      ++done_;
      done_changed_.notify_all();
    }
  }

  std::mutex mutex_;
  std::condition_variable wake_;          ///< a task queued, or stopping
  std::condition_variable done_changed_;  ///< a task ran
  std::deque<std::function<void()>> queue_;
  std::uint64_t submitted_ = 0;
  std::uint64_t done_ = 0;
  std::exception_ptr failed_;
  std::uint64_t failed_ticket_ = 0;
  bool stopping_ = false;
  std::thread thread_;
};

/// Drains `worker` when it goes out of scope: a transfer that throws must not unwind the
/// buffers a queued encode or decode still touches.
class drain_on_exit {
 public:
  explicit drain_on_exit(overlap_worker& w) : worker_(w) {}
  drain_on_exit(const drain_on_exit&) = delete;
  drain_on_exit& operator=(const drain_on_exit&) = delete;
  ~drain_on_exit() { worker_.drain(); }

 private:
  overlap_worker& worker_;
};

/// What overlapped calls keep: the worker (started on the first one) and the second payload
/// slot (slot 0 is the unchunked call's own; gather keeps its second slot beside its first).
template <class Backend>
struct overlap_workspace {
  std::unique_ptr<overlap_worker> started;
  payload_workspace<Backend> payload;

  overlap_worker& worker() {
    if (!started) started = std::make_unique<overlap_worker>();
    return *started;
  }
};

/// The most chunks `collective_tuning::overlap_chunks` may ask for (the call signature of the
/// mismatch check carries the number in five bits).
inline constexpr std::size_t max_overlap_chunks = 32;

/// Automatic overlap cuts a tensor into chunks of at least this many bytes, at most 8 chunks.
inline constexpr std::size_t automatic_chunk_bytes = std::size_t{4} << 20;

/// How a tensor of `count` elements is cut: `chunks` chunks of `length` elements, the last
/// one shorter.
struct chunk_plan {
  std::size_t count = 0;
  std::size_t length = 0;
  std::size_t chunks = 1;

  std::size_t offset(std::size_t c) const { return c * length; }
  std::size_t count_of(std::size_t c) const { return std::min(length, count - offset(c)); }
};

/// The chunks of `count` elements of `element_bytes` each: `asked` chunks (1: no overlap;
/// 0, automatic: one per `automatic_chunk_bytes`, at most 8, and none where `alignment` is 0),
/// each starting at a multiple of `alignment` (1 where it is 0), fewer where the tensor is
/// too short for them. Throws `invalid_argument` for more than `max_overlap_chunks`.
inline chunk_plan plan_chunks(std::size_t count, std::size_t element_bytes, std::size_t asked,
                              std::size_t alignment, int rank) {
  if (asked > max_overlap_chunks) {
    throw invalid_argument({.operation = "compressed allreduce", .rank = rank},
                           "collective_tuning::overlap_chunks is " + std::to_string(asked) +
                               ", more than " + std::to_string(max_overlap_chunks));
  }
  std::size_t want = asked;
  if (want == 0) {
    want = alignment == 0 ? 1
                          : std::min<std::size_t>(8, count * element_bytes / automatic_chunk_bytes);
  }
  const std::size_t unit = std::max<std::size_t>(alignment, 1);
  const std::size_t units = (count + unit - 1) / unit;
  want = std::max<std::size_t>(1, std::min(want, units));
  const std::size_t length = ((units + want - 1) / want) * unit;
  if (want == 1 || length >= count) return {.count = count, .length = count, .chunks = 1};
  return {.count = count, .length = length, .chunks = (count + length - 1) / length};
}

/// The draws of chunk `c` of rank `rank` of `size` at `step`: chunk 0 draws as the whole
/// tensor would, chunk c from `rank + size x c` (as per-hop requantization's hops do), so
/// no two chunks of any ranks share a stream.
constexpr random_stream chunk_stream(std::uint64_t step, int rank, int size, std::size_t c) {
  return {step, static_cast<std::uint32_t>(rank) +
                    static_cast<std::uint32_t>(size) * static_cast<std::uint32_t>(c)};
}

/// Runs a compressed collective's phases over the chunks of `plan`. With one chunk: on the
/// calling thread, `encode(0)` (returns the payload's bytes), `transfer(0, bytes)`,
/// `decode(0, bytes)`, each marked on `clock`. With more: `encode` and `decode` on `worker`, in the
/// order e0 e1 | t0 | d0 e2 | t1 | d1 e3 ..., `transfer` on the calling thread once chunk c
/// is encoded, so chunk c uses the slot c % 2 of whatever the phases keep: when encode(c + 2)
/// runs, decode(c) has, and when transfer(c + 2) runs, encode(c + 2) and so decode(c) have.
/// The clock gets each phase's own seconds (they overlap: the sum exceeds the call's time).
/// Errors come where the unchunked call would give them, so that every rank moves the same
/// chunks: an encode's before its chunk's transfer (the others wait for that payload, as
/// they would for an unchunked one), a decode's only after the last transfer.
template <class Backend, class Encode, class Transfer, class Decode>
void run_phases(const chunk_plan& plan, overlap_workspace<Backend>& workspace, phase_clock& clock,
                Encode&& encode, Transfer&& transfer, Decode&& decode) {
  if (plan.chunks == 1) {
    const std::size_t bytes = encode(std::size_t{0});
    clock.mark(phase::encode);
    transfer(std::size_t{0}, bytes);
    clock.mark(phase::transfer);
    decode(std::size_t{0}, bytes);
    clock.mark(phase::decode);
    return;
  }
  using seconds = std::chrono::duration<double>;
  const auto timed = [](double& total, auto&& f) {
    const auto start = phase_clock::clock::now();
    f();
    total += seconds(phase_clock::clock::now() - start).count();
  };
  overlap_worker& worker = workspace.worker();  // made here: only overlapped calls need one
  std::vector<std::size_t> bytes(plan.chunks);
  std::vector<std::uint64_t> encoded(plan.chunks);
  double encode_s = 0;
  double transfer_s = 0;
  double decode_s = 0;
  std::exception_ptr decode_failed;  // written by the worker, read after the last wait
  worker.reset();
  const drain_on_exit guard(worker);  // after what the tasks touch: destroyed before it
  const auto queue_encode = [&](std::size_t c) {
    encoded[c] = worker.submit([&, c] { timed(encode_s, [&] { bytes[c] = encode(c); }); });
  };
  queue_encode(0);
  queue_encode(1);
  std::uint64_t last = 0;
  for (std::size_t c = 0; c < plan.chunks; ++c) {
    worker.wait(encoded[c]);
    timed(transfer_s, [&] { transfer(c, bytes[c]); });
    last = worker.submit([&, c] {
      if (decode_failed) return;
      try {
        timed(decode_s, [&] { decode(c, bytes[c]); });
      } catch (...) {
        decode_failed = std::current_exception();
      }
    });
    if (c + 2 < plan.chunks) queue_encode(c + 2);
  }
  worker.wait(last);
  if (decode_failed) std::rethrow_exception(decode_failed);
  clock.overlapped(
      {.encode = encode_s, .transfer = transfer_s, .decode = decode_s, .chunks = plan.chunks});
}

}  // namespace squall::detail
