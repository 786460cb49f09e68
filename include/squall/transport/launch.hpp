// SPDX-License-Identifier: Apache-2.0
#pragma once
/// `squall::launch`: forks P ranks of a function on this host, the launcher behind
/// `squall-run`, the tests, the examples and the benchmark. No MPI needed.

#include <squall/core/error.hpp>
#include <squall/transport/shm.hpp>

#include <sys/types.h>
#include <sys/wait.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
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
  /// The first rank seen to fail, or -1 if all exited with 0.
  int failed_rank = -1;

  bool ok() const { return failed_rank < 0; }
  /// The failing rank's status (0 if none failed): what `squall-run` exits with.
  int exit_code() const { return ok() ? 0 : status[static_cast<std::size_t>(failed_rank)]; }
};

namespace detail {

inline int exit_status(int wait_status) {
  if (WIFEXITED(wait_status)) return WEXITSTATUS(wait_status);
  if (WIFSIGNALED(wait_status)) return 128 + WTERMSIG(wait_status);
  return 255;
}

inline std::string unique_job_name() {
  return "run-" + std::to_string(getpid()) + "-" +
         std::to_string(std::chrono::steady_clock::now().time_since_epoch().count());
}

}  // namespace detail

/// Runs `body(job)` in `ranks` forked processes, rank r getting `shm_job{name, r, ranks}`
/// and the environment `SQUALL_JOB`, `SQUALL_RANK`, `SQUALL_WORLD_SIZE`. A rank's exit code
/// is what `body` returns (an int; 0 for void), 1 if it throws (the message goes to stderr).
/// Returns when every rank has ended; with `kill_on_failure`, the first failure ends the
/// others. The children leave through `_Exit`, never running the parent's atexit handlers.
template <class Body>
launch_result launch(int ranks, Body&& body, const launch_options& opts = {}) {
  if (ranks < 1) {
    throw invalid_argument({.operation = "launch"}, "ranks must be at least 1");
  }
  const std::string job = opts.job.empty() ? detail::unique_job_name() : opts.job;
  shm_job{job, 0, ranks}.validate();
  std::fflush(nullptr);  // no buffered output duplicated into the children
  std::vector<pid_t> pids(static_cast<std::size_t>(ranks), -1);
  for (int r = 0; r < ranks; ++r) {
    const pid_t pid = fork();
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
      int code = 0;
      try {
        setenv("SQUALL_JOB", job.c_str(), 1);
        setenv("SQUALL_RANK", std::to_string(r).c_str(), 1);
        setenv("SQUALL_WORLD_SIZE", std::to_string(ranks).c_str(), 1);
        const shm_job me{job, r, ranks};
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
  while (running > 0) {
    int status = 0;
    const pid_t done = waitpid(-1, &status, terminating ? WNOHANG : 0);
    if (done < 0 && errno == EINTR) continue;
    if (done < 0) break;  // no children left
    if (done == 0) {      // terminating: give the others their grace, then kill them
      if (std::chrono::steady_clock::now() >= kill_at) {
        for (std::size_t r = 0; r < pids.size(); ++r) {
          if (pids[r] > 0) kill(pids[r], SIGKILL);
        }
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
      continue;
    }
    for (std::size_t r = 0; r < pids.size(); ++r) {
      if (pids[r] != done) continue;
      pids[r] = -1;
      --running;
      result.status[r] = detail::exit_status(status);
      if (result.status[r] != 0 && result.failed_rank < 0 && !terminating) {
        result.failed_rank = static_cast<int>(r);
        if (opts.kill_on_failure) {
          terminating = true;
          kill_at = std::chrono::steady_clock::now() + opts.grace;
          for (pid_t p : pids) {
            if (p > 0) kill(p, SIGTERM);
          }
        }
      }
    }
  }
  return result;
}

}  // namespace squall
