// SPDX-License-Identifier: Apache-2.0
#pragma once
/// What every wait in squall is made of: a `deadline`, and a `backoff` that spins briefly,
/// then yields, then sleeps, so that 4 ranks on 2 cores do not starve each other.

#include <squall/core/error.hpp>

#include <chrono>
#include <cstdint>
#include <string>
#include <thread>  // this_thread::yield, sleep_for

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>  // _mm_pause
#endif

namespace squall::detail {

/// A point in time after which a wait gives up, from a duration measured now.
class deadline {
 public:
  using clock = std::chrono::steady_clock;

  explicit deadline(std::chrono::nanoseconds budget)
      : budget_(budget), end_(clock::now() + budget) {}

  bool expired() const { return clock::now() >= end_; }
  clock::time_point end() const { return end_; }
  std::chrono::nanoseconds budget() const { return budget_; }
  /// The time left, never negative.
  std::chrono::nanoseconds remaining() const {
    const auto left = end_ - clock::now();
    return left.count() > 0 ? std::chrono::duration_cast<std::chrono::nanoseconds>(left)
                            : std::chrono::nanoseconds{0};
  }
  /// "5.000 s": the budget as error messages print it.
  std::string describe() const {
    const double seconds = std::chrono::duration<double>(budget_).count();
    std::string text = std::to_string(seconds);
    return text.substr(0, text.find('.') + 4) + " s";
  }

 private:
  std::chrono::nanoseconds budget_;
  clock::time_point end_;
};

/// One CPU relax hint inside a spin loop.
inline void cpu_relax() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

/// How long the transports' waits that can sleep on a wake-up (the shared-memory transport's
/// futex, the thread ranks' condition variable) yield the core before they sleep: many times a
/// sleep's wake-up, so a peer a few microseconds from answering is met awake, and short enough
/// that an oversubscribed machine spends little on it.
inline constexpr std::chrono::microseconds yield_before_sleep{200};

/// Waiting politely: `pause()` spins for the first `spin_rounds` calls, then yields the core
/// for `yield_rounds` calls, then sleeps 50 us, doubling to at most 1 ms. Spinning keeps
/// latency low when the peer runs on another core; yielding and sleeping let an
/// oversubscribed peer (more ranks than cores) run instead of us.
class backoff {
 public:
  static constexpr int spin_rounds = 256;
  static constexpr int yield_rounds = 64;

  void pause() {
    if (round_ < spin_rounds) {
      cpu_relax();
    } else if (round_ < spin_rounds + yield_rounds) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(sleep_);
      if (sleep_ < std::chrono::microseconds(1000)) sleep_ *= 2;
    }
    ++round_;
  }
  /// True once spinning and yielding are over (callers may then block in the kernel instead).
  bool sleeping() const { return round_ >= spin_rounds + yield_rounds; }
  void reset() {
    round_ = 0;
    sleep_ = std::chrono::microseconds(50);
  }

 private:
  int round_ = 0;
  std::chrono::microseconds sleep_{50};
};

/// Polls `done()` with `backoff` until it returns true; throws `timeout_error` naming `where`
/// when `limit` passes first. `done` may throw (a peer failure it detected).
template <class Done>
void wait_until(Done&& done, const deadline& limit, const error_context& where,
                std::string_view what) {
  backoff wait;
  while (!done()) {
    if (limit.expired()) {
      throw timeout_error(where,
                          std::string(what) + " did not complete within " + limit.describe());
    }
    wait.pause();
  }
}

}  // namespace squall::detail
