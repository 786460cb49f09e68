// SPDX-License-Identifier: Apache-2.0
// The fault matrix (issue 15): one rank of P (2 to 4) is killed (SIGKILL) or stopped (SIGSTOP)
// at a random moment of a run of allreduces (dense on the direct topology: through the windows
// at 4 KiB, through the peers' own memory from 64 KiB; and compressed with bf16 casts on the
// ring: slots and single copy), 4 KiB and 1 MiB (64 MiB with SQUALL_FAULT_LARGE=1), real
// processes on shm_transport with a 1 s deadline. Every survivor must raise a squall::error
// within the deadline + 1 s of the fault, no survivor may see a wrong result before that (each
// call's sum is checked exactly: small integers), no peer may write into a survivor's buffer
// after the survivor raised (it refills the buffer with a mark at once and checks it 100 ms
// later: "touched"), and nothing may be left in /dev/shm. SQUALL_FAULT_TRIALS sets the trials
// per cell (default 2 in CI). Prints one line per cell: trials, hangs, wrong results, touched
// buffers, leftovers, and the survivors' detection latency min / median / max.
#include <squall/algorithm/communicator.hpp>
#include <squall/compress/cast.hpp>
#include <squall/core/completion.hpp>  // detail::deadline
#include <squall/topology/direct.hpp>
#include <squall/topology/ring.hpp>
#include <squall/transport/launch.hpp>
#include <squall/transport/shm.hpp>

#include <doctest/doctest.h>
#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <random>
#include <signal.h>
#include <string>
#include <thread>
#include <unistd.h>
#include <vector>

#include "../support/shm_ranks.hpp"

namespace {

using namespace std::chrono_literals;
namespace test = squall::test;

/// CLOCK_MONOTONIC in seconds: one clock for every process of the machine.
double monotonic_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

/// What the ranks of one trial share (an anonymous shared mapping made before the fork).
struct shared_record {
  std::atomic<double> fault_at;    ///< when the victim raised its signal
  std::atomic<double> latency[4];  ///< each survivor's detection latency (-1: none)
};

constexpr int wrong_result = 70;
constexpr int no_error = 71;
constexpr int too_late = 72;
constexpr int touched_after = 73;

/// One trial: rank `victim` of `p` raises `sig` after `iterations_before` calls.
template <bool Compressed>
int run_rank(const squall::shm_job& me, std::size_t count, int victim, int sig,
             int iterations_before, shared_record* record) {
  using C = std::conditional_t<Compressed, squall::cast_compressor<squall::bfloat16>,
                               squall::identity_compressor>;
  using Topology = std::conditional_t<Compressed, squall::ring_topology, squall::direct_topology>;
  squall::communicator<squall::shm_transport, Topology, C> comm(
      squall::shm_transport(me, squall::options{.deadline = 1s}));
  auto state = comm.template make_state<float>(Compressed ? count : 0);
  std::vector<float> data(count);
  for (int call = 0; call < 100000; ++call) {
    if (me.rank == victim && call == iterations_before) {
      if (sig == SIGSTOP) {  // a helper ends the stopped victim once the survivors have given up
        const pid_t stopped = getpid();
        if (fork() == 0) {
          // Every survivor records its latency as it raises; one that never does is caught by
          // its own check (too late), after which the victim is ended all the same.
          const squall::detail::deadline give_up(1800ms);
          const auto all_raised = [&] {
            for (int r = 0; r < me.size; ++r) {
              if (r != victim && record->latency[r].load() < 0) return false;
            }
            return true;
          };
          while (!all_raised() && !give_up.expired()) {
            std::this_thread::sleep_for(5ms);
          }
          kill(stopped, SIGKILL);
          std::_Exit(0);
        }
      }
      record->fault_at.store(monotonic_seconds());
      raise(sig);
      return 0;
    }
    // rank r contributes (r + 1 + call % 5): the sum is exact in float and in bfloat16
    const float mine = static_cast<float>(me.rank + 1 + call % 5);
    std::fill(data.begin(), data.end(), mine);
    try {
      if constexpr (Compressed) {
        comm.allreduce(squall::host_view<float>(data), state);
      } else {
        comm.allreduce(squall::host_view<float>(data));
      }
    } catch (const squall::error&) {
      const double fault = record->fault_at.load();
      const double latency = fault > 0 ? monotonic_seconds() - fault : -1.0;
      record->latency[me.rank].store(latency);
      // No use after failure: what a peer still wrote into this buffer now would show.
      std::fill(data.begin(), data.end(), -1.0f);
      std::this_thread::sleep_for(100ms);
      if (std::any_of(data.begin(), data.end(), [](float x) { return x != -1.0f; })) {
        return touched_after;
      }
      return fault > 0 && latency <= 2.0 ? 0 : too_late;  // the deadline + 1 s
    }
    const float want = static_cast<float>(me.size * (me.size + 1) / 2 + me.size * (call % 5));
    for (const float x : data) {
      if (x != want) return wrong_result;
    }
  }
  return no_error;
}

}  // namespace

TEST_SUITE("shm_fault_matrix") {
  TEST_CASE(
      "SIGKILL and SIGSTOP of one rank at random moments: survivors raise in time, never a wrong "
      "result, nothing left") {
    const char* trials_text = std::getenv("SQUALL_FAULT_TRIALS");
    const int trials = trials_text != nullptr ? std::max(1, std::atoi(trials_text)) : 2;
    std::vector<std::size_t> sizes = {std::size_t{4} << 10, std::size_t{1} << 20};
    if (std::getenv("SQUALL_FAULT_LARGE") != nullptr) sizes.push_back(std::size_t{64} << 20);
    std::mt19937 random(20261125);
    auto* record = static_cast<shared_record*>(mmap(
        nullptr, sizeof(shared_record), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
    REQUIRE(record != MAP_FAILED);
    std::printf("%-12s %-7s %2s %-9s %6s %5s %5s %7s %9s %20s\n", "path", "signal", "P", "size",
                "trials", "hangs", "wrong", "touched", "leftover", "latency min/med/max s");
    for (const bool compressed : {false, true}) {
      for (const int sig : {SIGKILL, SIGSTOP}) {
        for (int p = 2; p <= 4; ++p) {
          for (const std::size_t bytes : sizes) {
            int hangs = 0, wrong = 0, touched = 0, leftover = 0;
            std::vector<double> latencies;
            for (int t = 0; t < trials; ++t) {
              const int victim = std::uniform_int_distribution<int>(0, p - 1)(random);
              const int before = std::uniform_int_distribution<int>(0, 6)(random);
              record->fault_at.store(0);
              for (auto& l : record->latency) l.store(-1);
              const std::string job = squall::detail::unique_job_name();
              const std::size_t count = bytes / sizeof(float);
              const auto start = std::chrono::steady_clock::now();
              const auto result = squall::launch(
                  p,
                  [&](const squall::shm_job& me) {
                    return compressed ? run_rank<true>(me, count, victim, sig, before, record)
                                      : run_rank<false>(me, count, victim, sig, before, record);
                  },
                  {.job = job, .kill_on_failure = false});
              const double took =
                  std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
              if (took > 20.0) ++hangs;
              for (int r = 0; r < p; ++r) {
                if (r == victim) continue;
                const int status = result.status[static_cast<std::size_t>(r)];
                if (status == wrong_result) ++wrong;
                if (status == touched_after) ++touched;
                if (status != 0) {
                  INFO("trial " << t << ", rank " << r << " of " << p << ", victim " << victim
                                << ", status " << status);
                  CHECK(status == 0);
                }
                if (record->latency[r].load() >= 0) latencies.push_back(record->latency[r].load());
              }
              if (test::segment_left(job)) ++leftover;
            }
            std::sort(latencies.begin(), latencies.end());
            const auto at = [&](double q) {
              return latencies.empty() ? -1.0
                                       : latencies[static_cast<std::size_t>(
                                             q * static_cast<double>(latencies.size() - 1))];
            };
            std::printf("%-12s %-7s %2d %-9zu %6d %5d %5d %7d %9d %6.3f %6.3f %6.3f\n",
                        compressed ? "bf16 ring" : "dense direct",
                        sig == SIGKILL ? "SIGKILL" : "SIGSTOP", p, bytes, trials, hangs, wrong,
                        touched, leftover, at(0), at(0.5), at(1));
            CHECK(hangs == 0);
            CHECK(wrong == 0);
            CHECK(touched == 0);
            CHECK(leftover == 0);
          }
        }
      }
    }
    munmap(record, sizeof(shared_record));
  }
}
