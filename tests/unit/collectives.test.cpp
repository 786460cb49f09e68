// SPDX-License-Identifier: Apache-2.0
// The dense collectives on every topology, ranks as threads (inproc_transport): the shared
// checks of collective_checks.hpp (every collective against the serial double reference,
// bitwise; counts 0, 1, P-1, P+1, a prime; in place and out of place), run here on 1 to 8
// ranks, on host_backend, on the deferred backend and on its "device" variant (staged through
// host memory), with tiny pieces (chunk_bytes = 64) so
// the pipeline runs many pieces and windows small enough that the one-shot schedule runs many
// rounds; plus what only threads can check cheaply: random floats within the reassociation
// bound, mismatched calls, bad arguments, calibration, node discovery.
#include <squall/algorithm/communicator.hpp>
#include <squall/backend/dispatch.hpp>
#include <squall/topology/automatic.hpp>
#include <squall/topology/direct.hpp>
#include <squall/topology/halving_doubling.hpp>
#include <squall/topology/hierarchical.hpp>
#include <squall/topology/ring.hpp>
#include <squall/topology/tree.hpp>
#include <squall/transport/inproc.hpp>

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>   // remove
#include <cstdlib>  // setenv, unsetenv
#include <cstring>
#include <mutex>
#include <span>
#include <string>
#include <unistd.h>  // getpid
#include <vector>

#include "../support/collective_checks.hpp"
#include "../support/collective_data.hpp"
#include "../support/data.hpp"
#include "../support/deferred_backend.hpp"
#include "../support/thread_ranks.hpp"
#include "../support/topologies.hpp"

namespace {

using squall::inproc_transport;
using squall::test::run_ranks;

using squall::test::make_topology;

static_assert(squall::check_backend_kernels<squall::test::deferred_backend>());
static_assert(squall::check_backend_kernels<squall::test::deferred_device_backend>());
static_assert(squall::detail::dispatch::has_staging_copies<squall::test::deferred_device_backend>);
static_assert(squall::detail::dispatch::has_marks<squall::test::deferred_device_backend>);

// (and the staged allreduce in pieces of 256 bytes: many marks waited for one by one)
constexpr squall::collective_tuning tiny_pieces{
    .chunk_bytes = 64, .pipeline_depth = 3, .staging_chunk_bytes = 256};
// The one-shot schedule reads the peers' buffers from the first byte (read_peer).
constexpr squall::collective_tuning peer_memory{
    .chunk_bytes = 64, .pipeline_depth = 3, .peer_memory_bytes = 1, .window_copy_bytes = 0};

/// The shared dense checks (collective_checks.hpp) on `p` thread ranks over `Topology` and
/// `Backend`, for each of the communicator settings that reach the executor's paths: messages
/// in tiny pieces, the one-shot schedule through windows of a few rounds and through the
/// peers' buffers from the first byte (with and without windows), and the defaults. `brief`:
/// 1 to 4 ranks, tiny pieces and the defaults only (for the staged backend, whose copies wrap
/// the same host core whatever the setting).
template <class Topology, class Backend = squall::host_backend>
void check_topology_matrix(bool brief = false) {
  struct setting {
    squall::collective_tuning tuning;
    std::size_t window;
  };
  const setting settings[] = {
      {tiny_pieces, 4096}, {{}, 0}, {peer_memory, 4096}, {peer_memory, 0}, {{}, 1 << 16}};
  const std::span<const setting> used(settings, brief ? 2 : std::size(settings));
  for (int p : {1, 2, 3, 4, 5, 8}) {
    if (brief && p > 4) break;
    for (const setting& s : used) {
      CAPTURE(p);
      CAPTURE(s.window);
      CAPTURE(s.tuning.peer_memory_bytes);
      run_ranks(
          p,
          [&](inproc_transport& t) {
            squall::communicator<inproc_transport, Topology, squall::identity_compressor, Backend>
                comm(std::move(t), make_topology<Topology>(p), {}, s.tuning);
            squall::test::findings found;
            squall::test::check_dense_collectives(comm, found);
            INFO(found.text());
            CHECK(found.ok());
          },
          {}, s.window);
    }
  }
}

}  // namespace

TEST_SUITE("collectives") {
  TEST_CASE("every collective, ring") { check_topology_matrix<squall::ring_topology>(); }
  TEST_CASE("every collective, tree") { check_topology_matrix<squall::tree_topology>(); }
  TEST_CASE("every collective, direct (windows and messages)") {
    check_topology_matrix<squall::direct_topology>();
  }
  TEST_CASE("every collective, halving-doubling") {
    check_topology_matrix<squall::halving_doubling_topology>();
  }
  TEST_CASE("every collective, hierarchical") {
    check_topology_matrix<squall::hierarchical_topology<>>();
    check_topology_matrix<
        squall::hierarchical_topology<squall::tree_topology, squall::halving_doubling_topology>>();
  }
  TEST_CASE("every collective, automatic") { check_topology_matrix<squall::automatic_topology>(); }
#if SQUALL_TEST_DEFERRED
  TEST_CASE(
      "every collective on the deferred backend (kernels run at the ordering points), every "
      "topology") {
    using deferred = squall::test::deferred_backend;
    check_topology_matrix<squall::ring_topology, deferred>();
    check_topology_matrix<squall::tree_topology, deferred>();
    check_topology_matrix<squall::direct_topology, deferred>();
    check_topology_matrix<squall::halving_doubling_topology, deferred>();
    check_topology_matrix<squall::hierarchical_topology<>, deferred>();
    check_topology_matrix<squall::automatic_topology, deferred>();
  }
  TEST_CASE(
      "every collective on a backend whose memory the transport does not carry: staged through "
      "host memory, its copies deferred") {
    // the "device" memory is host memory in disguise; the staging copies are queued and their
    // targets poisoned, so a missing ordering point around them gives a wrong answer
    using device = squall::test::deferred_device_backend;
    check_topology_matrix<squall::ring_topology, device>(true);
    check_topology_matrix<squall::direct_topology, device>(true);
  }
#endif

  TEST_CASE("random floats: within the reassociation bound of a double sum") {
    for (int p : {2, 3, 5}) {
      const std::size_t count = 5003;
      std::vector<std::vector<float>> in(static_cast<std::size_t>(p));
      for (int r = 0; r < p; ++r) {
        in[static_cast<std::size_t>(r)] =
            squall::test::random_values<float>(count, 100 + static_cast<std::uint64_t>(r));
        for (auto& x : in[static_cast<std::size_t>(r)]) x = x * 0.37f + 1e-3f;  // not exact
      }
      std::vector<std::vector<float>> out(static_cast<std::size_t>(p));
      run_ranks(p, [&](inproc_transport& t) {
        const int r = t.rank();
        squall::communicator<inproc_transport, squall::ring_topology> comm(std::move(t), {}, {},
                                                                           tiny_pieces);
        out[static_cast<std::size_t>(r)] = in[static_cast<std::size_t>(r)];
        comm.allreduce(squall::host_view<float>(out[static_cast<std::size_t>(r)]));
      });
      for (std::size_t i = 0; i < count; ++i) {
        double exact = 0;
        double magnitude = 0;
        for (int r = 0; r < p; ++r) {
          exact += in[static_cast<std::size_t>(r)][i];
          magnitude += std::fabs(in[static_cast<std::size_t>(r)][i]);
        }
        REQUIRE(std::fabs(out[0][i] - exact) <=
                squall::test::reassociation_bound<float>(p, magnitude));
      }
    }
  }

  TEST_CASE("mismatched calls give mismatch_error on every rank") {
    // window 0: signatures swapped by messages; 4096: through the windows' signature slots
    for (const std::size_t window : {std::size_t{0}, std::size_t{4096}})
      for (int p : {2, 3, 4}) {
        CAPTURE(p);
        CAPTURE(window);
        std::mutex m;
        int caught = 0;
        std::string text;
        run_ranks(
            p,
            [&](inproc_transport& t) {
              const int r = t.rank();
              squall::communicator<inproc_transport, squall::ring_topology> comm(std::move(t));
              std::vector<float> a(r == p - 1 ? 11 : 10, 1.0f);
              try {
                comm.allreduce(squall::host_view<float>(a));
              } catch (const squall::mismatch_error& e) {
                const std::lock_guard lock(m);
                ++caught;
                text = e.what();
              }
            },
            {}, window);
        CHECK(caught == p);
        CHECK(text.find("allreduce of 11 float32 sum") != std::string::npos);
        // a different collective, a different op, a different type
        caught = 0;
        run_ranks(
            p,
            [&](inproc_transport& t) {
              const int r = t.rank();
              squall::communicator<inproc_transport, squall::tree_topology> comm(std::move(t));
              std::vector<float> a(8, 1.0f);
              std::vector<double> d(8, 1.0);
              auto count_it = [&](auto&& call) {
                try {
                  call();
                } catch (const squall::mismatch_error&) {
                  const std::lock_guard lock(m);
                  ++caught;
                }
              };
              count_it(
                  [&] { r == 0 ? comm.barrier() : comm.allreduce(squall::host_view<float>(a)); });
              count_it([&] {
                r == 0 ? comm.allreduce(squall::host_view<float>(a), squall::max_op{})
                       : comm.allreduce(squall::host_view<float>(a));
              });
              count_it([&] {
                r == 0 ? comm.allreduce(squall::host_view<double>(d))
                       : comm.allreduce(squall::host_view<float>(a));
              });
              // after the mismatches, matching calls still work
              comm.allreduce(squall::host_view<float>(a));
              CHECK(a[0] == static_cast<float>(p));
            },
            {}, window);
        CHECK(caught == 3 * p);
      }
  }

  TEST_CASE("after a mismatch on the windows' paths every rank reads the peers' right half") {
    // Rank 0 enters a barrier while the others publish an allgather into a window half; all
    // throw mismatch_error. The calls after it must still find each peer's data in the half
    // it wrote: values no earlier call left in a window show a rank reading the other half.
    for (int p : {2, 3, 4}) {
      CAPTURE(p);
      run_ranks(
          p,
          [&](inproc_transport& t) {
            const int r = t.rank();
            squall::communicator<inproc_transport, squall::direct_topology> comm(std::move(t));
            const std::vector<float> a(8, 1.0f);
            std::vector<float> all(8 * static_cast<std::size_t>(p));
            CHECK_THROWS_AS(r == 0 ? comm.barrier()
                                   : comm.allgather(squall::host_view<const float>(a),
                                                    squall::host_view<float>(all)),
                            squall::mismatch_error);
            for (int call = 0; call < 3; ++call) {
              std::vector<float> b(8, static_cast<float>(10 * call + r + 2));
              comm.allreduce(squall::host_view<float>(b));
              CHECK(b[0] == static_cast<float>(p * (10 * call + 2) + p * (p - 1) / 2));
              std::vector<float> g(8 * static_cast<std::size_t>(p));
              const std::vector<float> mine(8, static_cast<float>(100 * call + r));
              comm.allgather(squall::host_view<const float>(mine), squall::host_view<float>(g));
              for (int q = 0; q < p; ++q) {
                CHECK(g[8 * static_cast<std::size_t>(q)] == static_cast<float>(100 * call + q));
              }
            }
          },
          {}, 4096);
    }
  }

  TEST_CASE("random calls with mismatches between them: every matching call is still right") {
    // test::check_calls_around_mismatches on threads, the windows small (4 KiB) and the
    // peer-memory paths from 4 KiB, so that its counts take the windows, peer memory and
    // messages.
    for (const int p : {2, 3, 4})
      for (const std::uint64_t seed : {1u, 2u, 3u}) {
        CAPTURE(p);
        CAPTURE(seed);
        run_ranks(
            p,
            [&](inproc_transport& t) {
              squall::communicator<inproc_transport, squall::automatic_topology> comm(
                  std::move(t), {}, {},
                  squall::collective_tuning{.peer_memory_bytes = 4096, .window_copy_bytes = 1024});
              squall::test::findings found;
              squall::test::check_calls_around_mismatches(comm, seed, 60, found);
              INFO(found.text());
              CHECK(found.ok());
            },
            {}, 4096);
      }
  }

  TEST_CASE_TEMPLATE("bad arguments give invalid_argument (staged too)", Backend,
                     squall::host_backend, squall::test::deferred_device_backend) {
    run_ranks(2, [&](inproc_transport& t) {
      using comm_type = squall::communicator<inproc_transport, squall::ring_topology,
                                             squall::identity_compressor, Backend>;
      comm_type comm(std::move(t));
      const auto view = [](float* p, std::size_t n) {
        return squall::test::view_of<comm_type>(p, n);
      };
      const auto in = [](const float* p, std::size_t n) {
        return squall::test::view_of<comm_type>(p, n);
      };
      std::vector<float> a(10), b(9);
      CHECK_THROWS_AS(comm.allreduce(in(a.data(), 10), view(b.data(), 9)),
                      squall::invalid_argument);
      CHECK_THROWS_AS(comm.broadcast(view(a.data(), 10), 2), squall::invalid_argument);
      CHECK_THROWS_AS(comm.allgather(in(a.data(), 10), view(b.data(), 9)),
                      squall::invalid_argument);
      CHECK_THROWS_AS(comm.reduce_scatter(in(a.data(), 10), view(b.data(), 9)),
                      squall::invalid_argument);
      CHECK_THROWS_AS(comm.allreduce(in(a.data(), 5), view(a.data() + 2, 5)),
                      squall::invalid_argument);
      // allgatherv: counts or places not one per rank, or this rank's block of another size
      const std::vector<std::size_t> three = {1, 2, 3}, two = {4, 5};
      const std::vector<float*> places = {b.data(), b.data() + 4};
      CHECK_THROWS_WITH_AS(comm.allgatherv(in(a.data(), 4), std::span<const std::size_t>(three),
                                           std::span<float* const>(places)),
                           doctest::Contains("must hold one entry per rank (2)"),
                           squall::invalid_argument);
      CHECK_THROWS_AS(comm.allgatherv(in(a.data(), 3), std::span<const std::size_t>(two),
                                      std::span<float* const>(places)),
                      squall::invalid_argument);
      comm.barrier();
    });
  }

  TEST_CASE(
      "automatic starts unmeasured; calibrate measures, every rank agrees, saved and loaded") {
    std::mutex m;
    std::vector<std::string> picks;
    std::vector<squall::cost_model> models;
    run_ranks(3, [&](inproc_transport& t) {
      squall::communicator<inproc_transport, squall::automatic_topology> comm(std::move(t));
      // built without running a collective: the formulas with the transport's link costs
      CHECK_FALSE(comm.topology().model.calibrated());
      CHECK(comm.topology().model.link == squall::inproc_transport::costs);
      CHECK(comm.schedule_for(1 << 20) == "automatic:direct");  // all peers at once: one shot
      const squall::cost_model& model = comm.calibrate(256 << 10);
      CHECK(model.calibrated());
      CHECK(model.ranks == 3);
      CHECK(model.measured[0].back().bytes == (256u << 10));
      std::string mine;
      for (std::size_t b = 4096; b <= (64u << 20); b *= 4) mine += comm.schedule_for(b) + ";";
      CHECK(mine.rfind("automatic:", 0) == 0);
      // the collectives still agree after it
      std::vector<double> x(1000, comm.rank() + 1.0);
      comm.allreduce(squall::host_view<double>(x));
      CHECK(x[999] == 6.0);
      const std::lock_guard lock(m);
      picks.push_back(mine);
      models.push_back(model);
    });
    REQUIRE(picks.size() == 3);
    CHECK(picks[0] == picks[1]);
    CHECK(picks[1] == picks[2]);
    CHECK(models[0] == models[1]);
    CHECK(models[1] == models[2]);

    // Saved and loaded, the model is the same, and a communicator built with it picks the same
    // schedules; one of another rank count refuses it, naming both counts.
    const std::string path = "squall-cost-model-test-" + std::to_string(::getpid()) + ".txt";
    models[0].save(path);
    const squall::cost_model loaded = squall::cost_model::load(path);
    std::remove(path.c_str());
    CHECK(loaded == models[0]);
    picks.clear();
    run_ranks(3, [&](inproc_transport& t) {
      squall::communicator<inproc_transport, squall::automatic_topology> comm(
          std::move(t), squall::automatic_topology{loaded});
      std::string mine;
      for (std::size_t b = 4096; b <= (64u << 20); b *= 4) mine += comm.schedule_for(b) + ";";
      const std::lock_guard lock(m);
      picks.push_back(mine);
    });
    REQUIRE(picks.size() == 3);
    CHECK(picks[0] == picks[2]);
    run_ranks(2, [&](inproc_transport& t) {
      CHECK_THROWS_WITH_AS((squall::communicator<inproc_transport, squall::automatic_topology>(
                               std::move(t), squall::automatic_topology{loaded})),
                           doctest::Contains("measured on 3 ranks, this communicator has 2"),
                           squall::invalid_argument);
    });
  }

  TEST_CASE("hierarchical finds its nodes: SQUALL_RANKS_PER_NODE, else the host names") {
    std::mutex m;
    std::vector<std::vector<int>> seen(4);
    auto run = [&] {
      run_ranks(4, [&](inproc_transport& t) {
        const int r = t.rank();
        squall::communicator<inproc_transport, squall::hierarchical_topology<>> comm(std::move(t));
        std::vector<std::int32_t> a = squall::test::exact_input<std::int32_t>(r, 9);
        comm.allreduce(squall::host_view<std::int32_t>(a));
        for (std::size_t i = 0; i < a.size(); ++i) {
          REQUIRE(a[i] == squall::test::exact_reference<std::int32_t, squall::sum_op>(4, i));
        }
        const std::lock_guard lock(m);
        seen[static_cast<std::size_t>(r)] = comm.topology().node_of;
      });
    };
    REQUIRE(setenv(squall::ranks_per_node_env_var, "3", 1) == 0);
    run();
    for (const auto& nodes : seen) CHECK(nodes == std::vector<int>{0, 0, 0, 1});
    REQUIRE(unsetenv(squall::ranks_per_node_env_var) == 0);
    run();  // threads share a host: one node, led by rank 0
    for (const auto& nodes : seen) CHECK(nodes == std::vector<int>{0, 0, 0, 0});
    REQUIRE(setenv(squall::ranks_per_node_env_var, "two", 1) == 0);
    CHECK_THROWS_AS(run(), squall::invalid_argument);
    REQUIRE(unsetenv(squall::ranks_per_node_env_var) == 0);
  }
}
