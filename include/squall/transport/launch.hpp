// SPDX-License-Identifier: Apache-2.0
#pragma once
/// `squall::launch`: forks P ranks of a function on this host, the launcher behind
/// `squall-run`, the tests, the examples and the benchmark. No MPI needed. The ranks die with
/// the launcher (a parent-death signal), and SIGINT, SIGTERM and SIGHUP sent to the launcher
/// while it waits are forwarded to them.

#include <squall/core/error.hpp>
#include <squall/transport/shm.hpp>

#include <sys/prctl.h>
#include <sys/types.h>
#include <sys/wait.h>

#include <array>
#include <cerrno>
#include <chrono>
#include <cinttypes>  // PRIx64
#include <csignal>    // sig_atomic_t
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <random>
#include <signal.h>
#include <string>
#include <thread>
#include <type_traits>
#include <unistd.h>
#include <vector>

namespace squall {

/// How `launch` runs its ranks.
struct launch_options {
  /// The job name the ranks join (`shm_job::name`); empty: a name unique to this launch.
  std::string job = {};
  /// When a rank fails (non-zero exit or a signal), end the others: SIGTERM, then SIGKILL
  /// after `grace`. Fault tests turn this off to watch how the survivors react.
  bool kill_on_failure = true;
  std::chrono::milliseconds grace{1000};
};

/// What became of the ranks.
struct launch_result {
  /// Per rank: its exit code, or 128 + the signal that ended it.
  std::vector<int> status;
  /// The rank that failed first, or -1 if all exited with 0: of the ranks found ended when
  /// the first failure is seen, one that a signal ended (it died; the others may only have
  /// seen it die), else the first. -1 too when the launcher was signalled (`signal`).
  int failed_rank = -1;
  /// The signal (SIGINT, SIGTERM, SIGHUP) the launcher received and forwarded to the ranks,
  /// or 0.
  int signal = 0;

  /// Every rank exited with 0 and the launcher was not signalled.
  bool ok() const { return failed_rank < 0 && signal == 0; }
  /// What `squall-run` exits with: 128 + the forwarded signal, else the failing rank's
  /// status (0 if none failed).
  int exit_code() const {
    if (signal != 0) return 128 + signal;
    return ok() ? 0 : status[static_cast<std::size_t>(failed_rank)];
  }
};

namespace detail {

inline int exit_status(int wait_status) {
  if (WIFEXITED(wait_status)) return WEXITSTATUS(wait_status);
  if (WIFSIGNALED(wait_status)) return 128 + WTERMSIG(wait_status);
  return 255;
}

/// The signal the launcher received while waiting for its ranks (0: none). The one static of
/// the launcher: a signal handler reaches nothing else.
inline volatile std::sig_atomic_t& launch_signal() {
  static volatile std::sig_atomic_t received = 0;
  return received;
}

/// While alive: SIGINT, SIGTERM and SIGHUP recorded in `launch_signal` (and interrupting the
/// launcher's waitpid) instead of ending the launcher; the old handlers restored after.
class forward_signals {
 public:
  forward_signals() {
    launch_signal() = 0;
    struct sigaction record {};
    record.sa_handler = [](int sig) { launch_signal() = sig; };
    sigemptyset(&record.sa_mask);
    record.sa_flags = 0;  // no SA_RESTART: waitpid returns EINTR
    for (std::size_t i = 0; i < signals.size(); ++i) sigaction(signals[i], &record, &old_[i]);
  }
  ~forward_signals() {
    for (std::size_t i = 0; i < signals.size(); ++i) sigaction(signals[i], &old_[i], nullptr);
  }
  forward_signals(const forward_signals&) = delete;
  forward_signals& operator=(const forward_signals&) = delete;

  static constexpr std::array<int, 3> signals = {SIGINT, SIGTERM, SIGHUP};

 private:
  std::array<struct sigaction, 3> old_{};
};

/// A job key no other launch shares (`shm_job::key`): 64 random bits, never 0.
inline std::uint64_t random_job_key() {
  std::random_device source;
  const std::uint64_t key = (static_cast<std::uint64_t>(source()) << 32) ^ source();
  return key == 0 ? 1 : key;
}

inline std::string unique_job_name() {
  return "run-" + std::to_string(getpid()) + "-" +
         std::to_string(std::chrono::steady_clock::now().time_since_epoch().count());
}

}  // namespace detail

/// Runs `body(job)` in `ranks` forked processes, rank r getting `shm_job{name, r, ranks, key}`
/// (`key` random, this launch's own) and the environment `SQUALL_JOB`, `SQUALL_RANK`,
/// `SQUALL_WORLD_SIZE`, `SQUALL_JOB_KEY`; when all have ended, it removes the job's segment
/// if one is left (a rank died before every rank attached). A rank's exit code
/// is what `body` returns (an int; 0 for void), 1 if it throws (the message goes to stderr).
/// Returns when every rank has ended; with `kill_on_failure`, the first failure ends the
/// others (SIGTERM, SIGKILL after `grace`). SIGINT, SIGTERM or SIGHUP sent to the launcher
/// while it waits goes to every rank (then SIGKILL after `grace`; `launch_result::signal`);
/// the ranks get SIGKILL when the launcher dies (PR_SET_PDEATHSIG). The children leave
/// through `_Exit`, never running the parent's atexit handlers.
template <class Body>
launch_result launch(int ranks, Body&& body, const launch_options& opts = {}) {
  if (ranks < 1) {
    throw invalid_argument({.operation = "launch"}, "ranks must be at least 1");
  }
  const std::string job = opts.job.empty() ? detail::unique_job_name() : opts.job;
  shm_job{job, 0, ranks}.validate();
  const std::uint64_t key = detail::random_job_key();
  char key_text[17];
  std::snprintf(key_text, sizeof key_text, "%016" PRIx64, key);
  std::fflush(nullptr);  // no buffered output duplicated into the children
  const detail::forward_signals forwarding;
  const pid_t launcher = getpid();
  std::vector<pid_t> pids(static_cast<std::size_t>(ranks), -1);
  // SIGTERM, SIGINT and SIGHUP are blocked across each fork: a child ended before it reset
  // their handlers would otherwise run the launcher's (which only records the signal) and
  // live on until SIGKILL; blocked, the signal waits until the child's own default applies.
  sigset_t ending;
  sigset_t previous;
  sigemptyset(&ending);
  for (const int sig : {SIGTERM, SIGINT, SIGHUP}) sigaddset(&ending, sig);
  for (int r = 0; r < ranks; ++r) {
    pthread_sigmask(SIG_BLOCK, &ending, &previous);
    const pid_t pid = fork();
    if (pid != 0) pthread_sigmask(SIG_SETMASK, &previous, nullptr);
    if (pid < 0) {
      const int err = errno;
      for (pid_t p : pids) {
        if (p > 0) kill(p, SIGKILL);
      }
      for (pid_t p : pids) {
        if (p > 0) waitpid(p, nullptr, 0);
      }
      throw error(std::error_code(err, std::system_category()), {.operation = "launch", .rank = r},
                  "fork failed");
    }
    if (pid == 0) {
      // The launcher ends ranks with SIGTERM: they must not inherit a handler that ignores
      // or intercepts it (a test framework's crash handler, say).
      signal(SIGTERM, SIG_DFL);
      signal(SIGINT, SIG_DFL);
      signal(SIGHUP, SIG_DFL);
      pthread_sigmask(SIG_SETMASK, &previous, nullptr);  // one sent meanwhile lands now
      // die with the launcher, also when it is killed outright (kept across exec)
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != launcher) std::_Exit(128 + SIGKILL);  // it died before the prctl
      int code = 0;
      try {
        setenv("SQUALL_JOB", job.c_str(), 1);
        setenv("SQUALL_RANK", std::to_string(r).c_str(), 1);
        setenv("SQUALL_WORLD_SIZE", std::to_string(ranks).c_str(), 1);
        setenv("SQUALL_JOB_KEY", key_text, 1);
        const shm_job me{job, r, ranks, key};
        if constexpr (std::is_void_v<std::invoke_result_t<Body&, const shm_job&>>) {
          body(me);
        } else {
          code = static_cast<int>(body(me));
        }
      } catch (const std::exception& e) {
        std::fprintf(stderr, "squall launch: rank %d: %s\n", r, e.what());
        code = 1;
      } catch (...) {
        std::fprintf(stderr, "squall launch: rank %d: unknown exception\n", r);
        code = 1;
      }
      std::fflush(nullptr);
      std::_Exit(code);
    }
    pids[static_cast<std::size_t>(r)] = pid;
  }

  launch_result result;
  result.status.assign(static_cast<std::size_t>(ranks), 0);
  int running = ranks;
  std::chrono::steady_clock::time_point kill_at{};
  bool terminating = false;
  const auto signal_all = [&](int sig) {
    for (pid_t p : pids) {
      if (p > 0) kill(p, sig);
    }
  };
  const auto terminate_all = [&](int sig) {
    terminating = true;
    kill_at = std::chrono::steady_clock::now() + opts.grace;
    signal_all(sig);
  };
  // Records the end of `done`; returns its rank, or -1 if it is not one.
  const auto record = [&](pid_t done, int status) {
    for (std::size_t r = 0; r < pids.size(); ++r) {
      if (pids[r] != done) continue;
      pids[r] = -1;
      --running;
      result.status[r] = detail::exit_status(status);
      return static_cast<int>(r);
    }
    return -1;
  };
  while (running > 0) {
    if (const int sig = detail::launch_signal(); sig != 0 && result.signal == 0) {
      result.signal = sig;  // forward it; the ranks get their grace, then SIGKILL
      terminate_all(sig);
    }
    int status = 0;
    const pid_t done = waitpid(-1, &status, terminating ? WNOHANG : 0);
    if (done < 0 && errno == EINTR) continue;
    if (done < 0) break;  // no children left
    if (done == 0) {      // terminating: give the others their grace, then kill them
      if (std::chrono::steady_clock::now() >= kill_at) signal_all(SIGKILL);
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
      continue;
    }
    const int r = record(done, status);
    if (r < 0 || terminating || result.failed_rank >= 0) continue;
    if (result.status[static_cast<std::size_t>(r)] == 0) continue;
    // The first failure seen. Every rank already ended counts too: one that a signal ended
    // failed first, the others (exit code 1 from peer_failure) only saw it die, and
    // waitpid's order is not the order of the deaths.
    std::vector<int> ended = {r};
    for (pid_t other; (other = waitpid(-1, &status, WNOHANG)) > 0;) {
      const int q = record(other, status);
      if (q >= 0 && result.status[static_cast<std::size_t>(q)] != 0) ended.push_back(q);
    }
    result.failed_rank = r;
    for (const int q : ended) {
      if (result.status[static_cast<std::size_t>(q)] > 128) {
        result.failed_rank = q;
        break;
      }
    }
    if (opts.kill_on_failure) terminate_all(SIGTERM);
  }
  // A rank that died before every rank attached leaves the segment's name: every rank has
  // ended, so remove it (only this launch's: the key says so).
  detail::shm::remove_leftover(job, key);
  return result;
}

}  // namespace squall
