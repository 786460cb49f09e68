// SPDX-License-Identifier: Apache-2.0
// squall::communicator over shm_transport, ranks as real processes (squall::launch forks
// them). Every rank runs the shared dense checks (tests/support/collective_checks.hpp: every
// collective against the serial reference, bitwise, which exact inputs make every rank's
// result too), with float sums of 1 Mi + 1 and 16 Mi elements added; a rank returns 0, or 1
// after saying on stderr what was wrong.
// Suites: shm_collectives (1 to 4 ranks, every topology), shm_collectives_large (an
// allreduce of more than 2^31 elements on 2 ranks).

#include <squall/algorithm/communicator.hpp>
#include <squall/topology/automatic.hpp>
#include <squall/topology/direct.hpp>
#include <squall/topology/halving_doubling.hpp>
#include <squall/topology/hierarchical.hpp>
#include <squall/topology/ring.hpp>
#include <squall/topology/tree.hpp>
#include <squall/transport/launch.hpp>
#include <squall/transport/shm.hpp>

#include <doctest/doctest.h>
#include <sys/mman.h>

#include <algorithm>  // copy_n, count, fill, find, min
#include <chrono>
#include <cmath>  // fabs, ldexp
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "../support/collective_checks.hpp"
#include "../support/deferred_backend.hpp"
#include "../support/result_hash.hpp"
#include "../support/shm_ranks.hpp"
#include "../support/topologies.hpp"

using squall::shm_job;
using squall::shm_transport;
namespace test = squall::test;
using namespace std::chrono_literals;

namespace {

constexpr std::size_t npos = static_cast<std::size_t>(-1);
constexpr int max_ranks = 4;

using squall::test::make_topology;

/// Float sums this runner adds to the shared checks: 1 Mi + 1 and 16 Mi elements.
constexpr std::size_t large_counts[] = {(std::size_t{1} << 20) + 1, std::size_t{16} << 20};

/// The shared dense checks (collective_checks.hpp) on 1 to 4 processes; a rank that finds
/// something wrong says what on stderr and returns 1.
template <class Topology, class Backend = squall::host_backend>
void collectives_on_processes() {
  for (int ranks = 1; ranks <= max_ranks; ++ranks) {
    CAPTURE(ranks);
    const auto start = std::chrono::steady_clock::now();
    test::expect_ranks_succeed(ranks, [&](const shm_job& me) {
      squall::communicator<shm_transport, Topology, squall::identity_compressor, Backend> comm(
          shm_transport(me, squall::options{.deadline = 60s}), make_topology<Topology>(me.size));
      test::findings found;
      test::check_dense_collectives(comm, found, large_counts);
      if (found.ok()) return 0;
      std::fprintf(stderr, "rank %d of %d (%s):\n%s\n", me.rank, me.size,
                   std::string(Topology::name).c_str(), found.text().c_str());
      return 1;
    });
    MESSAGE(std::string(Topology::name)
            << " on " << ranks << " processes: "
            << std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count()
            << " s");
  }
}

// ---- above 2^31 elements ------------------------------------------------------------------------

/// Rank r's element i in the large test: -1, 0 or 1, so any sum of 2 is exact in float16.
int small_value(int rank, std::size_t i) {
  const std::uint64_t x =
      (static_cast<std::uint64_t>(i) ^ (static_cast<std::uint64_t>(rank + 1) << 40)) *
      0x9E3779B97F4A7C15ull;
  return static_cast<int>((x >> 32) % 3) - 1;
}

/// The large test's values repeat with this period: a prime, so an element displaced by any
/// power of two (an offset cut to 32 bits, a block placed 2^31 elements off) lands on another
/// place of the pattern, whose expected sum differs from its own about three times in four.
/// Hashing every one of the 2^31 indexes instead took most of the test's minute (the pages'
/// first touch, about a third, is the rest).
constexpr std::size_t pattern_period = 1'000'003;

}  // namespace

#define SQUALL_TOPOLOGIES                                                 \
  squall::ring_topology, squall::tree_topology, squall::direct_topology,  \
      squall::halving_doubling_topology, squall::hierarchical_topology<>, \
      squall::automatic_topology

TEST_SUITE("shm_collectives") {
  TEST_CASE_TEMPLATE("every collective on 1 to 4 processes equals the serial reference", Topology,
                     SQUALL_TOPOLOGIES) {
    collectives_on_processes<Topology>();
  }
  TEST_CASE_TEMPLATE("the same on the deferred backend (kernels run at the ordering points)",
                     Topology, squall::ring_topology, squall::direct_topology,
                     squall::hierarchical_topology<>) {
    collectives_on_processes<Topology, squall::test::deferred_backend>();
  }
  TEST_CASE("the same staged through host memory (a backend whose memory is not the transport's)") {
    collectives_on_processes<squall::ring_topology, squall::test::deferred_device_backend>();
  }
}

TEST_SUITE("shm_collectives") {
  TEST_CASE("every collective above peer_memory_bytes, through the windows and not") {
    // From 64 KiB up a broadcast and a reduce-scatter, and an allreduce and an allgather of 3
    // or 4 ranks, copy through the windows while what a rank publishes fits half a window
    // (2 MiB less 128 bytes of the default 4 MiB) and no rank has registered memory; with
    // window_copy_bytes = 0 (and an allreduce or allgather of 2 ranks) they reach the peers'
    // memory (cross-memory copies) instead. Both equal the reference; counts at the half
    // window and one past it (doubles and int32 for the allgather's block, bfloat16 for the
    // broadcast, every root; float and int32 sums, in place and not, for the whole input of
    // the allreduce and the reduce-scatter).
    constexpr std::size_t counts[] = {8193, std::size_t{1} << 18, (std::size_t{1} << 18) + 1,
                                      std::size_t{1} << 20, (std::size_t{1} << 20) + 1};
    const std::size_t half_window_words =
        (squall::shm_config{}.window_bytes - squall::detail::signature_area) / 2 / 4;
    const std::size_t word_counts[] = {16385, half_window_words, half_window_words + 1};
    for (const std::size_t window_copy : {std::size_t{2} << 20, std::size_t{0}}) {
      CAPTURE(window_copy);
      for (int ranks = 1; ranks <= max_ranks; ++ranks) {
        CAPTURE(ranks);
        test::expect_ranks_succeed(ranks, [&](const shm_job& me) {
          squall::communicator<shm_transport, squall::direct_topology> comm(
              shm_transport(me, squall::options{.deadline = 60s}), {}, {},
              squall::collective_tuning{.window_copy_bytes = window_copy});
          test::findings found;
          for (const std::size_t count : counts) {
            test::check_allgather(comm, count, found);
            test::check_broadcast(comm, count, found);
          }
          for (const std::size_t count : word_counts) {
            test::check_allreduce<float, squall::sum_op>(comm, count, false, found);
            test::check_allreduce<std::int32_t, squall::sum_op>(comm, count, true, found);
            test::check_reduce_scatter(comm, count, found);
          }
          if (found.ok()) return 0;
          std::fprintf(stderr, "rank %d of %d: %s\n", me.rank, me.size, found.text().c_str());
          return 1;
        });
      }
    }
  }
}

TEST_SUITE("shm_collectives") {
  TEST_CASE("the windows' collectives on the same input again, then changed between its ends") {
    // A rank publishing into a window half stores only the 64-byte pieces that differ when its
    // input has the size and the first and last 64 bytes of the last one published there
    // (kernels::publish_copy). Steps of every collective through the windows (allreduce,
    // allgather, reduce-scatter, broadcast from a root that moves) on 12,004-byte inputs:
    // three steps of the same input, then one element between the ends changed on rank 0
    // only, then on every rank, then the first element too, then the first input again; each
    // call against the serial reference of that step's inputs.
    constexpr std::size_t count = 3001;
    const auto bump = [](int step, int rank, std::size_t i) {
      if (step >= 3 && step <= 4 && rank == 0 && i == 1500) return 1.0f;
      if (step >= 5 && step <= 7 && i == 1500) return 2.0f;
      if (step == 7 && i == 0) return 3.0f;
      return 0.0f;
    };
    const auto value = [&](int step, int rank, std::size_t i) {
      return test::exact_value<float>(rank, i) + bump(step, rank, i);
    };
    for (int ranks = 1; ranks <= max_ranks; ++ranks) {
      CAPTURE(ranks);
      test::expect_ranks_succeed(ranks, [&](const shm_job& me) {
        squall::communicator<shm_transport, squall::direct_topology> comm(
            shm_transport(me, squall::options{.deadline = 60s}));
        const int p = comm.size();
        const auto up = static_cast<std::size_t>(p);
        test::findings found;
        std::vector<float> in(count), out(count), all(count * up), block(comm.block_count(count));
        for (int step = 0; step <= 8; ++step) {
          const std::string at = " (step " + std::to_string(step) + ")";
          for (std::size_t i = 0; i < count; ++i) in[i] = value(step, me.rank, i);
          const auto sum = [&](std::size_t i) {
            float s = 0;
            for (int r = 0; r < p; ++r) s += value(step, r, i);
            return s;
          };
          comm.allreduce(squall::host_view<const float>(in), squall::host_view<float>(out));
          test::compare(found, "allreduce" + at, out.data(), count, 0, sum);
          comm.allgather(squall::host_view<const float>(in), squall::host_view<float>(all));
          test::compare(found, "allgather" + at, all.data(), all.size(), 0, [&](std::size_t j) {
            return value(step, static_cast<int>(j / count), j % count);
          });
          comm.reduce_scatter(squall::host_view<const float>(in), squall::host_view<float>(block));
          test::compare(found, "reduce_scatter" + at, block.data(), block.size(),
                        comm.block_offset(count), sum);
          const int root = step % p;
          out = in;
          comm.broadcast(squall::host_view<float>(out), root);
          test::compare(found, "broadcast" + at, out.data(), count, 0,
                        [&](std::size_t i) { return value(step, root, i); });
        }
        if (found.ok()) return 0;
        std::fprintf(stderr, "rank %d of %d: %s\n", me.rank, me.size, found.text().c_str());
        return 1;
      });
    }
  }

  TEST_CASE(
      "calibrate_windows measures the allreduce's two paths from 3 processes on; every "
      "rank agrees; either path gives the same bits") {
    // Measured on 3 and 4 ranks (nothing to choose on 1 and 2): sizes from peer_memory_bytes
    // to a whole half window, the chosen bound the one `window_bound_of` fits to the times,
    // bitwise the same bound and times on every rank; the allreduce still equals the serial
    // reference after it (exact inputs either side of the bound).
    const std::size_t half =
        (squall::shm_config{}.window_bytes - squall::detail::signature_area) / 2;
    for (int ranks = 1; ranks <= max_ranks; ++ranks) {
      CAPTURE(ranks);
      test::expect_ranks_succeed(ranks, [&](const shm_job& me) {
        squall::communicator<shm_transport, squall::direct_topology> comm(
            shm_transport(me, squall::options{.deadline = 60s}));
        const squall::window_calibration m = comm.calibrate_windows();
        test::findings found;
        if (ranks < 3) {
          if (m.measured || !m.sizes.empty() ||
              m.bound != squall::collective_tuning{}.window_copy_bytes) {
            found.add("calibrate_windows measured on " + std::to_string(ranks) + " ranks");
          }
        } else {
          bool sane = m.measured && m.sizes.size() == m.windows_seconds.size() &&
                      m.sizes.size() == m.peers_seconds.size() && m.sizes.size() >= 2 &&
                      m.sizes.front() == squall::collective_tuning{}.peer_memory_bytes &&
                      m.sizes.back() == half / 64 * 64 && m.seconds > 0;
          for (std::size_t i = 0; sane && i < m.sizes.size(); ++i) {
            sane = m.windows_seconds[i] > 0 && m.windows_seconds[i] < 10 &&
                   m.peers_seconds[i] > 0 && m.peers_seconds[i] < 10;
          }
          if (!sane) found.add("calibrate_windows: a size or time out of place");
          if (m.bound != squall::detail::window_bound_of(m) ||
              (m.bound != 0 &&
               std::find(m.sizes.begin(), m.sizes.end(), m.bound) == m.sizes.end())) {
            found.add("calibrate_windows chose " + std::to_string(m.bound) +
                      ", not the bound its times give");
          }
          // the same on every rank: the bound and the times, hashed, gathered
          std::vector<double> mine = m.windows_seconds;
          mine.insert(mine.end(), m.peers_seconds.begin(), m.peers_seconds.end());
          mine.push_back(static_cast<double>(m.bound));
          const auto h = static_cast<std::int64_t>(
              test::hash_bytes(mine.data(), mine.size() * sizeof(double)));
          std::vector<std::int64_t> all(static_cast<std::size_t>(ranks));
          comm.allgather(squall::host_view<const std::int64_t>(&h, 1),
                         squall::host_view<std::int64_t>(all));
          if (std::count(all.begin(), all.end(), h) != ranks) {
            found.add("calibrate_windows: the ranks hold different bounds or times");
          }
        }
        for (const std::size_t count :
             {std::size_t{16384}, std::size_t{1} << 18, half / 64 * 16 + 1}) {
          test::check_allreduce<float, squall::sum_op>(comm, count, false, found);
          test::check_allreduce<float, squall::sum_op>(comm, count, true, found);
        }
        if (found.ok()) return 0;
        std::fprintf(stderr, "rank %d of %d: %s\n", me.rank, me.size, found.text().c_str());
        return 1;
      });
    }

    // Either side of the bound, the same bits: sums of floats of many magnitudes (whose
    // order matters) through the windows (bound 2 MiB) and through the peers' memory (0), in
    // place and not, on 3 and 4 processes; each rank's result hashed into a shared page.
    constexpr std::size_t count = 300'001;  // 1.2 MB a rank: between 64 KiB and half a window
    constexpr int runs = 2 * 2;             // path x in place
    auto* hashes = static_cast<std::uint64_t*>(mmap(nullptr, sizeof(std::uint64_t) * runs * 4,
                                                    PROT_READ | PROT_WRITE,
                                                    MAP_SHARED | MAP_ANONYMOUS, -1, 0));
    REQUIRE(hashes != MAP_FAILED);
    for (int ranks = 3; ranks <= max_ranks; ++ranks) {
      CAPTURE(ranks);
      std::fill(hashes, hashes + runs * 4, std::uint64_t{0});
      for (const std::size_t bound : {std::size_t{2} << 20, std::size_t{0}}) {
        test::expect_ranks_succeed(ranks, [&](const shm_job& me) {
          squall::communicator<shm_transport, squall::direct_topology> comm(
              shm_transport(me, squall::options{.deadline = 60s}), {}, {},
              squall::collective_tuning{.allreduce_window_copy_bytes = bound});
          const auto input = [](int r) {
            std::vector<float> v(count);
            for (std::size_t i = 0; i < count; ++i) {
              const std::uint64_t x = test::mix(77, r, i);
              v[i] = static_cast<float>(std::ldexp(static_cast<double>(x >> 11), -53) - 0.5) *
                     std::ldexp(1.0f, static_cast<int>(x % 24) - 12);
            }
            return v;
          };
          const std::vector<float> in = input(me.rank);
          std::vector<double> want(count, 0);
          double scale = 0;
          for (int q = 0; q < ranks; ++q) {
            const std::vector<float> theirs = input(q);
            for (std::size_t i = 0; i < count; ++i) {
              want[i] += theirs[i];
              scale = std::max(scale, std::fabs(static_cast<double>(theirs[i])));
            }
          }
          for (const bool in_place : {false, true}) {
            std::vector<float> out(count);
            if (in_place) {
              out = in;
              comm.allreduce(squall::host_view<float>(out));
            } else {
              comm.allreduce(squall::host_view<const float>(in), squall::host_view<float>(out));
            }
            for (std::size_t i = 0; i < count; ++i) {
              if (std::fabs(out[i] - want[i]) > 4 * ranks * scale * 0x1p-24) {
                std::fprintf(stderr, "rank %d, bound %zu: element %zu is %g, the sum %g\n", me.rank,
                             bound, i, static_cast<double>(out[i]), want[i]);
                return 1;
              }
            }
            const int run = (bound == 0 ? 2 : 0) + (in_place ? 1 : 0);
            hashes[run * 4 + me.rank] = test::hash_bytes(out.data(), count * sizeof(float));
          }
          return 0;
        });
      }
      CHECK(hashes[0] != 0);
      for (int r = 0; r < ranks; ++r) {
        for (int run = 0; run < runs; ++run) {
          CAPTURE(r);
          CAPTURE(run);
          CHECK(hashes[run * 4 + r] == hashes[0]);  // every rank, path and placement alike
        }
      }
    }
    munmap(hashes, sizeof(std::uint64_t) * runs * 4);
  }

  TEST_CASE("random calls with mismatches between them: every matching call is still right") {
    // test::check_calls_around_mismatches on processes: the windows' paths (the default 4 MiB
    // windows, window copies up to 8 KiB), peer memory (cross-memory copies) from 4 KiB.
    for (int ranks = 2; ranks <= max_ranks; ++ranks) {
      CAPTURE(ranks);
      test::expect_ranks_succeed(ranks, [&](const shm_job& me) {
        squall::communicator<shm_transport, squall::automatic_topology> comm(
            shm_transport(me, squall::options{.deadline = 60s}), {}, {},
            squall::collective_tuning{.peer_memory_bytes = 4096, .window_copy_bytes = 8192});
        test::findings found;
        for (const std::uint64_t seed : {1u, 2u, 3u, 4u}) {
          test::check_calls_around_mismatches(comm, seed, 100, found);
        }
        if (found.ok()) return 0;
        std::fprintf(stderr, "rank %d of %d: %s\n", me.rank, me.size, found.text().c_str());
        return 1;
      });
    }
  }
}

TEST_SUITE("shm_collectives_large") {
  TEST_CASE("allreduce of 2^31 + 7 float16 elements on 2 processes, every element checked") {
    // Ring (the executor's pieces: block offsets past 2^31 elements) and direct (the one-shot
    // rounds through the windows), in place, one 4 GiB buffer per process.
    constexpr std::size_t count = (std::size_t{1} << 31) + 7;
    constexpr int ranks = 2;
    test::expect_ranks_succeed(ranks, [](const shm_job& me) {
      // One period of this rank's input and of the expected sums (the sum over the ranks of
      // small_value, summed as ints: exact), as float16 bits.
      std::vector<squall::float16> input(pattern_period);
      std::vector<std::uint16_t> want(pattern_period);
      for (std::size_t j = 0; j < pattern_period; ++j) {
        input[j] = squall::float16(static_cast<float>(small_value(me.rank, j)));
        int sum = 0;
        for (int q = 0; q < ranks; ++q) sum += small_value(q, j);
        want[j] = squall::float16(static_cast<float>(sum)).bits();
      }
      // Uninitialized: every element is written before each run.
      std::unique_ptr<squall::float16[]> data(new squall::float16[count]);
      const auto run = [&](auto topology) -> int {
        using Topology = decltype(topology);
        squall::communicator<shm_transport, Topology> comm(
            shm_transport(shm_job{me.name + "-" + std::string(Topology::name), me.rank, me.size},
                          squall::options{.deadline = 120s}));
        for (std::size_t base = 0; base < count; base += pattern_period) {
          std::copy_n(input.data(), std::min(pattern_period, count - base), data.get() + base);
        }
        comm.barrier();
        const auto start = std::chrono::steady_clock::now();
        comm.allreduce(squall::host_view<squall::float16>(data.get(), count));
        const double seconds =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        if (me.rank == 0) {
          std::printf(
              "shm_collectives_large: allreduce of %zu float16 (%s, 2 processes) in %.3f s\n",
              count, std::string(Topology::name).c_str(), seconds);
          std::fflush(stdout);
        }
        std::size_t wrong = 0;
        std::size_t first = npos;
        for (std::size_t base = 0; base < count; base += pattern_period) {
          const std::size_t n = std::min(pattern_period, count - base);
          for (std::size_t j = 0; j < n; ++j) {
            if (data[base + j].bits() != want[j] && wrong++ == 0) first = base + j;
          }
        }
        if (wrong != 0) {
          std::fprintf(stderr, "rank %d (%s): %zu of %zu elements wrong, the first at %zu\n",
                       me.rank, std::string(Topology::name).c_str(), wrong, count, first);
          return 1;
        }
        comm.barrier();
        return 0;
      };
      if (run(squall::ring_topology{}) != 0) return 90;
      if (run(squall::direct_topology{}) != 0) return 91;
      return 0;
    });
  }
}
