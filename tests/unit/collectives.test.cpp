// SPDX-License-Identifier: Apache-2.0
// The dense collectives on every topology, ranks as threads (inproc_transport): results
// against a serial double reference, exact for exact inputs and within the reassociation
// bound for random ones; every rank bitwise the same; counts 0, 1, P-1, P+1, a prime;
// in place and out of place; tiny pieces (chunk_bytes = 64) so the pipeline runs many
// pieces; windows small enough that the one-shot schedule runs many rounds.
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
#include <string>
#include <unistd.h>  // getpid
#include <vector>

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

constexpr squall::collective_tuning tiny_pieces{.chunk_bytes = 64, .pipeline_depth = 3};
// The one-shot schedule reads the peers' buffers from the first byte (read_peer).
constexpr squall::collective_tuning peer_memory{
    .chunk_bytes = 64, .pipeline_depth = 3, .peer_memory_bytes = 1};

template <class Topology, class T, class Op, class Backend = squall::host_backend>
void check_allreduce(int p, std::size_t count, bool in_place,
                     const squall::collective_tuning& tuning, std::size_t window_bytes) {
  CAPTURE(p);
  CAPTURE(count);
  CAPTURE(in_place);
  std::vector<std::vector<T>> results(static_cast<std::size_t>(p));
  run_ranks(
      p,
      [&](inproc_transport& t) {
        const int r = t.rank();
        squall::communicator<inproc_transport, Topology, squall::identity_compressor, Backend> comm(
            std::move(t), make_topology<Topology>(p), {}, tuning);
        std::vector<T> data = squall::test::exact_input<T>(r, count);
        std::vector<T> out(count);
        if (in_place) {
          comm.allreduce(squall::host_view<T>(data), Op{});
          out = data;
        } else {
          const std::vector<T> before = data;
          comm.allreduce(squall::host_view<const T>(data), squall::host_view<T>(out), Op{});
          CHECK(before == data);  // the input is untouched
        }
        results[static_cast<std::size_t>(r)] = std::move(out);
      },
      {}, window_bytes);
  for (std::size_t i = 0; i < count; ++i) {
    double want = squall::test::exact_reference<T, Op>(p, i);
    // avg divides once, in the accumulator type, then rounds to T
    if constexpr (!std::is_integral_v<T> && !std::is_same_v<T, double>) {
      want = squall::test::as_double(static_cast<T>(static_cast<float>(want)));
    }
    if (squall::test::as_double(results[0][i]) != want) {
      CAPTURE(i);
      REQUIRE(squall::test::as_double(results[0][i]) == want);
    }
  }
  for (int r = 1; r < p; ++r) {
    // bitwise: compare the bytes, so that -0.0 and 0.0 (or NaN payloads) differ
    REQUIRE(count == results[static_cast<std::size_t>(r)].size());
    REQUIRE((count == 0 || std::memcmp(results[static_cast<std::size_t>(r)].data(),
                                       results[0].data(), count * sizeof(T)) == 0));
  }
}

template <class Topology, class Backend = squall::host_backend>
void check_topology_matrix() {
  for (int p : {1, 2, 3, 4, 5, 8}) {
    const auto u = static_cast<std::size_t>(p);
    for (std::size_t count :
         {std::size_t{0}, std::size_t{1}, u > 1 ? u - 1 : 3, u + 1, std::size_t{1009}}) {
      check_allreduce<Topology, float, squall::sum_op, Backend>(p, count, true, tiny_pieces, 4096);
      check_allreduce<Topology, std::int32_t, squall::sum_op, Backend>(p, count, false, tiny_pieces,
                                                                       4096);
    }
    check_allreduce<Topology, double, squall::avg_op, Backend>(p, 777, false, tiny_pieces, 4096);
    check_allreduce<Topology, std::int64_t, squall::min_op, Backend>(p, 777, true, {}, 4096);
    check_allreduce<Topology, squall::float16, squall::max_op, Backend>(p, 777, false, tiny_pieces,
                                                                        4096);
    check_allreduce<Topology, squall::bfloat16, squall::sum_op, Backend>(p, 777, true, tiny_pieces,
                                                                         4096);
    check_allreduce<Topology, std::int32_t, squall::avg_op, Backend>(p, 100, true, {}, 0);
    check_allreduce<Topology, float, squall::sum_op, Backend>(p, 100003, false, {}, 1 << 16);
    for (bool in_place : {false, true}) {
      check_allreduce<Topology, float, squall::sum_op, Backend>(p, 100003, in_place, peer_memory,
                                                                4096);
      check_allreduce<Topology, squall::bfloat16, squall::avg_op, Backend>(p, u + 1, in_place,
                                                                           peer_memory, 0);
      check_allreduce<Topology, std::int64_t, squall::max_op, Backend>(p, 1, in_place, peer_memory,
                                                                       0);
    }
  }
}

}  // namespace

TEST_SUITE("collectives") {
  TEST_CASE("allreduce, ring") { check_topology_matrix<squall::ring_topology>(); }
  TEST_CASE("allreduce, tree") { check_topology_matrix<squall::tree_topology>(); }
  TEST_CASE("allreduce, direct (windows and messages)") {
    check_topology_matrix<squall::direct_topology>();
  }
  TEST_CASE("allreduce, halving-doubling") {
    check_topology_matrix<squall::halving_doubling_topology>();
  }
  TEST_CASE("allreduce, hierarchical") {
    check_topology_matrix<squall::hierarchical_topology<>>();
    check_topology_matrix<
        squall::hierarchical_topology<squall::tree_topology, squall::halving_doubling_topology>>();
  }
  TEST_CASE("allreduce, automatic") { check_topology_matrix<squall::automatic_topology>(); }
  TEST_CASE(
      "allreduce on the deferred backend (kernels run at the ordering points), every topology") {
    using deferred = squall::test::deferred_backend;
    check_topology_matrix<squall::ring_topology, deferred>();
    check_topology_matrix<squall::tree_topology, deferred>();
    check_topology_matrix<squall::direct_topology, deferred>();
    check_topology_matrix<squall::halving_doubling_topology, deferred>();
    check_topology_matrix<squall::hierarchical_topology<>, deferred>();
    check_topology_matrix<squall::automatic_topology, deferred>();
  }

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

  TEST_CASE("reduce_scatter, allgather and broadcast on every topology") {
    // as messages in tiny pieces, and through peer memory from the first byte
    auto run = [](auto topology_tag, auto backend_tag) {
      using Topology = decltype(topology_tag);
      using Backend = decltype(backend_tag);
      for (const squall::collective_tuning& tuning : {tiny_pieces, peer_memory})
        for (int p : {1, 2, 3, 4, 5}) {
          for (std::size_t count :
               {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{1001}}) {
            CAPTURE(p);
            CAPTURE(count);
            CAPTURE(tuning.peer_memory_bytes);
            run_ranks(p, [&](inproc_transport& t) {
              const int r = t.rank();
              squall::communicator<inproc_transport, Topology, squall::identity_compressor, Backend>
                  comm(std::move(t), make_topology<Topology>(p), {}, tuning);
              // reduce_scatter, out of place then in place
              const std::vector<std::int32_t> in =
                  squall::test::exact_input<std::int32_t>(r, count);
              std::vector<std::int32_t> block(comm.block_count(count));
              comm.reduce_scatter(squall::host_view<const std::int32_t>(in),
                                  squall::host_view<std::int32_t>(block));
              for (std::size_t i = 0; i < block.size(); ++i) {
                REQUIRE(block[i] == squall::test::exact_reference<std::int32_t, squall::sum_op>(
                                        p, comm.block_offset(count) + i));
              }
              std::vector<std::int32_t> whole = in;
              comm.reduce_scatter(squall::host_view<std::int32_t>(whole), squall::max_op{});
              for (std::size_t i = 0; i < comm.block_count(count); ++i) {
                const std::size_t at = comm.block_offset(count) + i;
                REQUIRE(whole[at] ==
                        squall::test::exact_reference<std::int32_t, squall::max_op>(p, at));
              }
              // allgather, out of place then in place
              const std::vector<double> mine(count, 10.0 * r + 0.5);
              std::vector<double> all(count * static_cast<std::size_t>(p), -1.0);
              comm.allgather(squall::host_view<const double>(mine), squall::host_view<double>(all));
              for (int q = 0; q < p; ++q) {
                for (std::size_t i = 0; i < count; ++i)
                  REQUIRE(all[static_cast<std::size_t>(q) * count + i] == 10.0 * q + 0.5);
              }
              std::vector<double> again(count * static_cast<std::size_t>(p), -1.0);
              std::copy(
                  mine.begin(), mine.end(),
                  again.begin() + static_cast<std::ptrdiff_t>(static_cast<std::size_t>(r) * count));
              comm.allgather(squall::host_view<const double>(
                                 again.data() + static_cast<std::size_t>(r) * count, count),
                             squall::host_view<double>(again));
              CHECK(again == all);
              // broadcast from every root
              for (int root = 0; root < p; ++root) {
                std::vector<squall::bfloat16> b(
                    count, squall::bfloat16(static_cast<float>(r == root ? root + 1 : -3)));
                comm.broadcast(squall::host_view<squall::bfloat16>(b), root);
                for (const auto& x : b)
                  REQUIRE(static_cast<float>(x) == static_cast<float>(root + 1));
              }
              comm.barrier();
            });
          }
        }
    };
    // on the host, and on the deferred backend (kernels run at the ordering points)
    const auto both = [&](auto topology_tag) {
      run(topology_tag, squall::host_backend{});
      run(topology_tag, squall::test::deferred_backend{});
    };
    both(squall::ring_topology{});
    both(squall::tree_topology{});
    both(squall::direct_topology{});
    both(squall::halving_doubling_topology{});
    both(squall::hierarchical_topology<>{});
    both(squall::automatic_topology{});
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

  TEST_CASE("bad arguments give invalid_argument") {
    run_ranks(2, [&](inproc_transport& t) {
      squall::communicator<inproc_transport, squall::ring_topology> comm(std::move(t));
      std::vector<float> a(10), b(9);
      CHECK_THROWS_AS(
          comm.allreduce(squall::host_view<const float>(a), squall::host_view<float>(b)),
          squall::invalid_argument);
      CHECK_THROWS_AS(comm.broadcast(squall::host_view<float>(a), 2), squall::invalid_argument);
      CHECK_THROWS_AS(
          comm.allgather(squall::host_view<const float>(a), squall::host_view<float>(b)),
          squall::invalid_argument);
      CHECK_THROWS_AS(comm.allreduce(squall::host_view<const float>(a.data(), 5),
                                     squall::host_view<float>(a.data() + 2, 5)),
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
