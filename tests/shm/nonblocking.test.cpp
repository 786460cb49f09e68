// SPDX-License-Identifier: Apache-2.0
// The non-blocking collectives (`iallreduce`, `ireduce_scatter`, `iallgather`, `ibroadcast`,
// `ibarrier`, the compressed `iallreduce`) and `gradient_buckets` over shm_transport, ranks as
// real processes. Inputs
// are small integers, so every rank can compute every expected result itself, exactly.
// Suite: shm_nonblocking.

#include <squall/algorithm/buckets.hpp>
#include <squall/algorithm/communicator.hpp>
#include <squall/compress/cast.hpp>
#include <squall/compress/sketch.hpp>
#include <squall/topology/automatic.hpp>
#include <squall/transport/launch.hpp>
#include <squall/transport/shm.hpp>

#include <doctest/doctest.h>

#include <algorithm>  // copy, shuffle
#include <chrono>
#include <cmath>    // sin
#include <csignal>  // raise, SIGKILL
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <ctime>  // clock_gettime
#include <numeric>
#include <random>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "../support/shm_ranks.hpp"

using squall::shm_job;
using squall::shm_transport;
namespace test = squall::test;
using namespace std::chrono_literals;

namespace {

using comm_type = squall::communicator<shm_transport, squall::automatic_topology,
                                       squall::cast_compressor<squall::bfloat16>>;

/// Rank r's value at i: a small integer, so sums are exact in float and in any order.
float value(int rank, std::size_t i, int salt) {
  return static_cast<float>(
      static_cast<int>(
          (i * 7 + static_cast<std::size_t>(rank) * 13 + static_cast<std::size_t>(salt) * 5) % 61) -
      30);
}

std::vector<float> input(int rank, std::size_t n, int salt) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = value(rank, i, salt);
  return v;
}

float sum_at(int size, std::size_t i, int salt) {
  float s = 0;
  for (int r = 0; r < size; ++r) s += value(r, i, salt);
  return s;
}

double cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) * 1e-9;
}

/// Says on stderr what is wrong and gives the rank's failure status.
int wrong(int rank, const char* what) {
  std::fprintf(stderr, "rank %d: %s\n", rank, what);
  return 1;
}

TEST_SUITE("shm_nonblocking") {
  TEST_CASE("many requests in flight, mixed collectives, waited in a random order per rank") {
    for (int ranks = 1; ranks <= 4; ++ranks) {
      CAPTURE(ranks);
      test::expect_ranks_succeed(ranks, [](const shm_job& me) {
        comm_type comm(shm_transport(me), {}, squall::cast_compressor<squall::bfloat16>{});
        const int p = me.size;
        // Sizes across the schedules' regimes: windows, messages, single copy.
        const std::vector<std::size_t> counts = {1, 1000, 70001, 1 << 20};
        std::vector<std::vector<float>> sums, outs;
        std::vector<std::vector<float>> gathered(counts.size()), shards(counts.size());
        std::vector<std::vector<std::int64_t>> maxima(counts.size());
        std::vector<squall::request> pending;
        for (std::size_t c = 0; c < counts.size(); ++c) {
          const std::size_t n = counts[c];
          const int salt = static_cast<int>(c);
          sums.push_back(input(me.rank, n, salt));
          pending.push_back(comm.iallreduce(squall::host_view<float>(sums.back())));
          maxima[c].resize(n);
          for (std::size_t i = 0; i < n; ++i) maxima[c][i] = me.rank * 1000 + (i % 7);
          pending.push_back(
              comm.iallreduce(squall::host_view<std::int64_t>(maxima[c]), squall::max_op{}));
          gathered[c].resize(n * static_cast<std::size_t>(p));
          outs.push_back(input(me.rank, n, salt + 10));
          pending.push_back(comm.iallgather(squall::host_view<const float>(outs.back()),
                                            squall::host_view<float>(gathered[c])));
          shards[c] = input(me.rank, n * static_cast<std::size_t>(p), salt + 20);
          pending.push_back(comm.ireduce_scatter(squall::host_view<float>(shards[c])));
        }
        // A blocking call among them runs after everything started before it.
        std::vector<float> blocking = input(me.rank, 5000, 99);
        comm.allreduce(squall::host_view<float>(blocking));
        std::vector<std::vector<float>> roots(static_cast<std::size_t>(p));
        for (int root = 0; root < p; ++root) {
          roots[static_cast<std::size_t>(root)] = input(me.rank, 3001, 40 + root);
          pending.push_back(comm.ibroadcast(
              squall::host_view<float>(roots[static_cast<std::size_t>(root)]), root));
        }
        pending.push_back(comm.ibarrier());
        std::mt19937 order(static_cast<unsigned>(me.rank) * 7919u + 3u);
        std::vector<std::size_t> index(pending.size());
        std::iota(index.begin(), index.end(), 0);
        std::shuffle(index.begin(), index.end(), order);
        for (std::size_t k : index) pending[k].wait();

        for (std::size_t c = 0; c < counts.size(); ++c) {
          const std::size_t n = counts[c];
          const int salt = static_cast<int>(c);
          for (std::size_t i = 0; i < n; ++i) {
            if (sums[c][i] != sum_at(p, i, salt)) return wrong(me.rank, "iallreduce sum");
            if (maxima[c][i] != static_cast<std::int64_t>((p - 1) * 1000 + (i % 7))) {
              return wrong(me.rank, "iallreduce max");
            }
          }
          for (int q = 0; q < p; ++q) {
            for (std::size_t i = 0; i < n; ++i) {
              if (gathered[c][static_cast<std::size_t>(q) * n + i] != value(q, i, salt + 10)) {
                return wrong(me.rank, "iallgather");
              }
            }
          }
          const std::size_t whole = n * static_cast<std::size_t>(p);
          const std::size_t first = comm.block_offset(whole);
          for (std::size_t i = first; i < first + comm.block_count(whole); ++i) {
            if (shards[c][i] != sum_at(p, i, salt + 20)) return wrong(me.rank, "ireduce_scatter");
          }
        }
        for (std::size_t i = 0; i < blocking.size(); ++i) {
          if (blocking[i] != sum_at(p, i, 99)) return wrong(me.rank, "the blocking allreduce");
        }
        for (int root = 0; root < p; ++root) {
          for (std::size_t i = 0; i < 3001; ++i) {
            if (roots[static_cast<std::size_t>(root)][i] != value(root, i, 40 + root)) {
              return wrong(me.rank, "ibroadcast");
            }
          }
        }
        return 0;
      });
    }
  }

  TEST_CASE("the compressed iallreduce gives the blocking one's bits; test() polls") {
    for (int ranks : {2, 3}) {
      CAPTURE(ranks);
      test::expect_ranks_succeed(ranks, [](const shm_job& me) {
        comm_type comm(shm_transport(me), {}, squall::cast_compressor<squall::bfloat16>{});
        const std::size_t n = 100003;
        std::vector<float> a(n), b;
        for (std::size_t i = 0; i < n; ++i) {
          a[i] = static_cast<float>(std::sin(0.01 * static_cast<double>(i) + me.rank)) * 3.0f;
        }
        b = a;
        auto state_a = comm.make_state<float>(n);
        auto state_b = comm.make_state<float>(n);
        squall::request r = comm.iallreduce(squall::host_view<float>(a), state_a, squall::avg_op{});
        while (!r.test()) std::this_thread::yield();
        r.wait();  // done: returns at once
        r.wait();  // a request waited on holds nothing
        comm.allreduce(squall::host_view<float>(b), state_b, squall::avg_op{});
        if (a != b) return wrong(me.rank, "compressed iallreduce differs from the blocking one");
        if (state_a.step() != 1) return wrong(me.rank, "the state's step did not advance");
        return 0;
      });
    }
  }

  TEST_CASE("a request destroyed without wait still completes before later calls") {
    test::expect_ranks_succeed(3, [](const shm_job& me) {
      comm_type comm(shm_transport(me), {}, squall::cast_compressor<squall::bfloat16>{});
      std::vector<float> dropped = input(me.rank, 200000, 1);
      { auto r = comm.iallreduce(squall::host_view<float>(dropped)); }
      std::vector<float> after = input(me.rank, 1000, 2);
      comm.allreduce(squall::host_view<float>(after));
      for (std::size_t i = 0; i < dropped.size(); ++i) {
        if (dropped[i] != sum_at(me.size, i, 1)) return wrong(me.rank, "the dropped request");
      }
      for (std::size_t i = 0; i < after.size(); ++i) {
        if (after[i] != sum_at(me.size, i, 2)) return wrong(me.rank, "the call after it");
      }
      return 0;
    });
  }

  TEST_CASE("ibarrier in two halves: arrives at the call, completes once all arrived") {
    // Ranks arrive 150 ms apart (rank 0 must poll at least once before the last one comes, even
    // on a loaded machine). steady_clock is CLOCK_MONOTONIC, one clock for every process.
    for (int ranks = 1; ranks <= 4; ++ranks) {
      CAPTURE(ranks);
      test::expect_ranks_succeed(ranks, [](const shm_job& me) {
        comm_type comm(shm_transport(me), {}, squall::cast_compressor<squall::bfloat16>{});
        const auto now = [] {
          return static_cast<std::int64_t>(
              std::chrono::steady_clock::now().time_since_epoch().count());
        };
        const int p = me.size;
        comm.barrier();
        std::this_thread::sleep_for(150ms * me.rank);
        // times[0]: arrival, [1]: the call returned, [2]: test() said done
        std::vector<std::int64_t> times(3), all(3 * static_cast<std::size_t>(p));
        times[0] = now();
        squall::request r = comm.ibarrier();
        times[1] = now();
        int polls = 0;
        while (!r.test()) {
          ++polls;
          std::this_thread::sleep_for(1ms);
        }
        times[2] = now();
        r.wait();  // done: returns at once
        comm.allgather(squall::host_view<const std::int64_t>(times),
                       squall::host_view<std::int64_t>(all));
        std::int64_t last = 0;
        for (int q = 0; q < p; ++q) last = std::max(last, all[3 * static_cast<std::size_t>(q)]);
        if (times[2] < last) return wrong(me.rank, "test() said done before every rank arrived");
        // The first rank's call returned before the last rank arrived: it did not wait.
        if (me.rank == 0 && p > 1 && (times[1] >= last || polls == 0)) {
          return wrong(me.rank, "ibarrier() waited for the other ranks");
        }

        // The next call completes a pending one first: a blocking allreduce, a non-blocking
        // one (on the progress thread), another ibarrier (there too), a request dropped
        // unwaited.
        std::vector<float> a = input(me.rank, 70001, 5), b = input(me.rank, 1000, 6);
        squall::request first = comm.ibarrier();
        comm.allreduce(squall::host_view<float>(a));
        first.wait();
        squall::request second = comm.ibarrier();
        squall::request sum = comm.iallreduce(squall::host_view<float>(b));
        squall::request third = comm.ibarrier();  // behind the iallreduce: the whole barrier
        sum.wait();
        third.wait();
        second.wait();
        { auto dropped = comm.ibarrier(); }
        squall::request fourth = comm.ibarrier();
        fourth.wait();
        // Two in a row while the last rank is 1 s late: neither call waits for it (the
        // second goes behind the first, on the progress thread).
        comm.barrier();
        if (me.rank == p - 1) std::this_thread::sleep_for(1s);
        const auto before = std::chrono::steady_clock::now();
        squall::request fifth = comm.ibarrier();
        squall::request sixth = comm.ibarrier();
        if (p > 1 && std::chrono::steady_clock::now() - before > 500ms) {
          return wrong(me.rank, "a second ibarrier waited for the first");
        }
        sixth.wait();
        fifth.wait();
        for (std::size_t i = 0; i < a.size(); ++i) {
          if (a[i] != sum_at(p, i, 5)) return wrong(me.rank, "the allreduce after an ibarrier");
        }
        for (std::size_t i = 0; i < b.size(); ++i) {
          if (b[i] != sum_at(p, i, 6)) return wrong(me.rank, "the iallreduce after an ibarrier");
        }
        return 0;
      });
    }
  }

  TEST_CASE("an ibarrier against another call is a mismatch_error on every rank") {
    const auto result =
        squall::launch(2,
                       [](const shm_job& me) {
                         comm_type comm(shm_transport(me, squall::options{.deadline = 10s}), {},
                                        squall::cast_compressor<squall::bfloat16>{});
                         std::vector<float> data(1000, 1.0f);
                         try {
                           if (me.rank == 0) {
                             comm.ibarrier().wait();
                           } else {
                             comm.allreduce(squall::host_view<float>(data));
                           }
                         } catch (const squall::mismatch_error& e) {
                           const std::string what = e.what();
                           return what.find("barrier") != std::string::npos &&
                                          what.find("allreduce") != std::string::npos
                                      ? 0
                                      : wrong(me.rank, e.what());
                         }
                         return wrong(me.rank, "a barrier met an allreduce without an error");
                       },
                       {.kill_on_failure = false});
    INFO(test::statuses(result));
    CHECK(result.ok());
  }

  TEST_CASE("the progress thread does not spin while idle") {
    test::expect_ranks_succeed(2, [](const shm_job& me) {
      comm_type comm(shm_transport(me), {}, squall::cast_compressor<squall::bfloat16>{});
      std::vector<float> data = input(me.rank, 1000, 3);
      comm.iallreduce(squall::host_view<float>(data)).wait();
      const double before = cpu_seconds();
      std::this_thread::sleep_for(500ms);
      const double used = cpu_seconds() - before;
      if (used > 0.05) {
        std::fprintf(stderr, "rank %d: %.3f s of CPU in 0.5 s idle\n", me.rank, used);
        return 1;
      }
      comm.barrier();
      return 0;
    });
  }

  TEST_CASE("a rank dies with requests pending: every survivor's wait raises, none hangs") {
    for (int ranks : {2, 3}) {
      CAPTURE(ranks);
      const auto result = squall::launch(
          ranks,
          [](const shm_job& me) {
            comm_type comm(shm_transport(me, squall::options{.deadline = 60s}), {},
                           squall::cast_compressor<squall::bfloat16>{});
            comm.barrier();
            if (me.rank == 1) raise(SIGKILL);
            std::vector<std::vector<float>> data(4, std::vector<float>(1 << 20, 1.0f));
            std::vector<squall::request> pending;
            for (auto& d : data) pending.push_back(comm.iallreduce(squall::host_view<float>(d)));
            const auto start = std::chrono::steady_clock::now();
            int raised = 0;
            for (auto& r : pending) {
              try {
                r.wait();
              } catch (const squall::error& e) {
                if (raised == 0) std::fprintf(stderr, "rank %d: %s\n", me.rank, e.what());
                ++raised;
              }
            }
            const double waited =
                std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
            if (raised != 4) return wrong(me.rank, "a wait returned although a rank had died");
            if (waited > 10.0) return wrong(me.rank, "the waits took more than 10 s");
            // Later calls fail too, at once.
            try {
              comm.barrier();
            } catch (const squall::error&) {
              return 0;
            }
            return wrong(me.rank, "a blocking call after the failure returned");
          },
          {.kill_on_failure = false});
      CHECK(result.status[1] == 128 + SIGKILL);
      INFO(test::statuses(result));
      for (int r = 0; r < ranks; ++r) {
        if (r != 1) CHECK(result.status[static_cast<std::size_t>(r)] == 0);
      }
    }
  }

  TEST_CASE("a bad argument surfaces at wait() on every rank") {
    test::expect_ranks_succeed(3, [](const shm_job& me) {
      comm_type comm(shm_transport(me, squall::options{.deadline = 20s}), {},
                     squall::cast_compressor<squall::bfloat16>{});
      std::vector<float> data(1000);
      squall::request r = comm.ibroadcast(squall::host_view<float>(data), me.size);  // no such root
      try {
        r.wait();
      } catch (const squall::invalid_argument&) {
        return 0;
      } catch (const squall::error& e) {
        std::fprintf(stderr, "rank %d: %s\n", me.rank, e.what());
        return 0;  // a peer that learned of it from the rank that raised it first
      }
      return wrong(me.rank, "wait() returned for a root outside the communicator");
    });
  }
  TEST_CASE("gradient buckets: tensors marked in any order, buckets started in order, sums") {
    for (int ranks = 1; ranks <= 3; ++ranks) {
      CAPTURE(ranks);
      test::expect_ranks_succeed(ranks, [](const shm_job& me) {
        // Both kinds: the dense allreduce, and the compressed one with a state per bucket
        // (bf16 carries these small integer sums exactly).
        squall::communicator<shm_transport, squall::automatic_topology> dense{shm_transport(me)};
        const std::vector<std::size_t> sizes = {1000, 70000, 5, 300000, 12345, 1, 40000};
        squall::gradient_buckets<decltype(dense)> plain(dense, sizes, 400 << 10, false);
        // 400 KiB: {1000, 70000, 5}, {300000}, {12345, 1, 40000}
        if (plain.bucket_count() != 3 || plain.bucket_of(2) != 0 || plain.bucket_of(3) != 1 ||
            plain.bucket_of(6) != 2) {
          return wrong(me.rank, "bucket assignment");
        }
        std::mt19937 order(static_cast<unsigned>(me.rank) + 11u);
        for (int step = 0; step < 3; ++step) {
          std::vector<std::size_t> marks(sizes.size());
          std::iota(marks.begin(), marks.end(), 0);
          std::shuffle(marks.begin(), marks.end(), order);  // a different order on every rank
          for (std::size_t i : marks) {
            const std::vector<float> g = input(me.rank, sizes[i], step * 10 + static_cast<int>(i));
            plain.ready(i, squall::host_view<const float>(g));
          }
          plain.wait();
          for (std::size_t i = 0; i < sizes.size(); ++i) {
            const std::span<float> got = plain.gradient(i);
            for (std::size_t k = 0; k < got.size(); ++k) {
              if (got[k] != sum_at(me.size, k, step * 10 + static_cast<int>(i))) {
                return wrong(me.rank, "a dense bucket's sum");
              }
            }
          }
        }
        comm_type compressing(
            shm_transport(squall::shm_job{
                .name = me.name + "-c", .rank = me.rank, .size = me.size, .key = me.key}),
            {}, squall::cast_compressor<squall::bfloat16>{});
        squall::gradient_buckets<comm_type> packed(compressing, sizes, 1 << 20, false);
        for (int step = 0; step < 2; ++step) {
          for (std::size_t i = sizes.size(); i-- > 0;) {
            const std::vector<float> g = input(me.rank, sizes[i], 50 + step + static_cast<int>(i));
            std::copy(g.begin(), g.end(), packed.gradient(i).begin());
            packed.ready(i);
          }
          packed.wait();
          for (std::size_t i = 0; i < sizes.size(); ++i) {
            const std::span<float> got = packed.gradient(i);
            for (std::size_t k = 0; k < got.size(); ++k) {
              if (got[k] != sum_at(me.size, k, 50 + step + static_cast<int>(i))) {
                return wrong(me.rank, "a compressed bucket's sum");
              }
            }
          }
        }
        // Misuse is named.
        try {
          packed.ready(0);
          packed.ready(0);
          return wrong(me.rank, "a tensor marked twice was accepted");
        } catch (const squall::invalid_argument&) {
        }
        try {
          packed.wait();
          return wrong(me.rank, "wait() with tensors not ready was accepted");
        } catch (const squall::invalid_argument& e) {
          if (std::string(e.what()).find("tensor 1") == std::string::npos) {
            return wrong(me.rank, "wait() did not name the first tensor not ready");
          }
        }
        return 0;
      });
    }
  }

  TEST_CASE("gradient buckets per tensor with PowerSGD: each weight in its own view, exact") {
    // Two weights, each rank's of rank 1 in its own view (so the sum over <= 3 ranks is exact
    // at rank 4), a bias and a 4 x 512 weight that rank-4 factors would not shrink twofold
    // (both dense: small integers, exact sums), in 8 KiB buckets: {16 x 25, 16, 32 x 48},
    // {4 x 512}. The same tensors in whole buckets are not exact: the view is what matters.
    for (int ranks = 1; ranks <= 3; ++ranks) {
      CAPTURE(ranks);
      test::expect_ranks_succeed(ranks, [](const shm_job& me) {
        using low_rank_comm = squall::communicator<shm_transport, squall::automatic_topology,
                                                   squall::powersgd_compressor>;
        low_rank_comm comm(shm_transport(me), {}, squall::powersgd_compressor{.rank = 4});
        const std::vector<std::size_t> sizes = {16 * 25, 16, 32 * 48, 4 * 512};
        const std::vector<std::size_t> columns = {25, 0, 48, 512};
        squall::gradient_buckets<low_rank_comm> per_tensor(comm, sizes, columns, 8 << 10, false);
        squall::gradient_buckets<low_rank_comm> whole(comm, sizes, 8 << 10, false);
        if (per_tensor.bucket_count() != 2 || per_tensor.bucket_of(2) != 0 ||
            per_tensor.compressed_tensors() != 2 || whole.compressed_tensors() != 4) {
          return wrong(me.rank, "bucket assignment or compressed tensors");
        }
        // rank r's weight w (rows x cols): sin(0.3 i (r + 1) + r + w) cos(0.45 j (r + 2))
        const auto weight = [](int r, std::size_t rows, std::size_t cols, int w) {
          std::vector<float> m(rows * cols);
          for (std::size_t i = 0; i < rows; ++i) {
            for (std::size_t j = 0; j < cols; ++j) {
              m[i * cols + j] =
                  static_cast<float>(std::sin(0.3 * static_cast<double>(i) * (r + 1) + r + w) *
                                     std::cos(0.45 * static_cast<double>(j) * (r + 2)));
            }
          }
          return m;
        };
        const auto fill = [&](squall::gradient_buckets<low_rank_comm>& b, int rank) {
          b.ready(0, squall::host_view<const float>(weight(rank, 16, 25, 0)));
          b.ready(3, squall::host_view<const float>(input(rank, sizes[3], 3)));
          b.ready(1, squall::host_view<const float>(input(rank, sizes[1], 1)));
          b.ready(2, squall::host_view<const float>(weight(rank, 32, 48, 2)));
        };
        double worst_whole = 0;
        for (int step = 0; step < 2; ++step) {
          fill(per_tensor, me.rank);
          per_tensor.wait();
          fill(whole, me.rank);
          whole.wait();
          for (const std::size_t t : {std::size_t{0}, std::size_t{2}}) {
            const std::size_t rows = t == 0 ? 16 : 32;
            const std::size_t cols = t == 0 ? 25 : 48;
            std::vector<double> want(sizes[t], 0.0);
            double largest = 0;
            for (int r = 0; r < me.size; ++r) {
              const auto m = weight(r, rows, cols, static_cast<int>(t));
              for (std::size_t k = 0; k < want.size(); ++k) want[k] += m[k];
            }
            for (const double x : want) largest = std::max(largest, std::fabs(x));
            for (std::size_t k = 0; k < want.size(); ++k) {
              if (std::fabs(per_tensor.gradient(t)[k] - want[k]) > 1e-4 * largest) {
                return wrong(me.rank, "a weight's low-rank sum in its own view");
              }
              worst_whole =
                  std::max(worst_whole, std::fabs(whole.gradient(t)[k] - want[k]) / largest);
            }
          }
          for (const std::size_t t : {std::size_t{1}, std::size_t{3}}) {
            for (std::size_t k = 0; k < sizes[t]; ++k) {
              if (per_tensor.gradient(t)[k] != sum_at(me.size, k, static_cast<int>(t))) {
                return wrong(me.rank, "a dense part's sum");
              }
            }
          }
        }
        if (!(worst_whole > 0.01)) return wrong(me.rank, "the whole bucket was exact too");
        try {
          squall::gradient_buckets<low_rank_comm> bad(comm, sizes, {25, 0, 48}, 8 << 10);
          return wrong(me.rank, "3 column counts for 4 tensors were accepted");
        } catch (const squall::invalid_argument&) {
        }
        try {
          squall::gradient_buckets<low_rank_comm> bad(comm, sizes, {25, 17, 48, 512}, 8 << 10);
          return wrong(me.rank, "rows of 17 for a tensor of 16 were accepted");
        } catch (const squall::invalid_argument&) {
        }
        return 0;
      });
    }
  }
}

}  // namespace
