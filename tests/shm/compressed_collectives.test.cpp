// SPDX-License-Identifier: Apache-2.0
// The compressed allreduce over shm_transport, 3 ranks as real processes (squall::launch),
// one compressor of each aggregation on a different topology. Every rank checks its
// results against a serial reference it computes from every rank's input (the inputs are a
// function of rank and step), and writes a hash of each result to a page shared with the
// parent, which checks that every rank holds bitwise the same result. A rank returns 0, or a
// code naming the check that failed (and says which on stderr). Each case runs on
// host_backend and again on the deferred backend, whose results must be bitwise the host's.
// Suite: shm_compressed_collectives.

#include <squall/algorithm/communicator.hpp>
#include <squall/compress/cast.hpp>
#include <squall/compress/error_feedback.hpp>
#include <squall/compress/homomorphic.hpp>
#include <squall/compress/quantize.hpp>
#include <squall/compress/sketch.hpp>
#include <squall/compress/sparsify.hpp>
#include <squall/compress/state.hpp>
#include <squall/topology/direct.hpp>
#include <squall/topology/halving_doubling.hpp>
#include <squall/topology/hierarchical.hpp>
#include <squall/topology/ring.hpp>
#include <squall/topology/tree.hpp>
#include <squall/transport/launch.hpp>
#include <squall/transport/shm.hpp>

#include <doctest/doctest.h>
#include <sys/mman.h>

#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "../support/collective_data.hpp"
#include "../support/compressed_reference.hpp"
#include "../support/data.hpp"
#include "../support/deferred_backend.hpp"
#include "../support/gtopk_reference.hpp"
#include "../support/requantize_reference.hpp"
#include "../support/result_hash.hpp"
#include "../support/shm_ranks.hpp"
#include "../support/topologies.hpp"

using squall::shm_job;
using squall::shm_transport;
namespace test = squall::test;
using namespace std::chrono_literals;

namespace {

constexpr int ranks = 3;
constexpr int steps = 2;
constexpr std::size_t count = 10007;  // a prime

/// Each rank's hash of each step's result, in memory the parent maps shared before forking.
class shared_hashes {
 public:
  shared_hashes() {
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    REQUIRE(p != MAP_FAILED);
    data_ = static_cast<std::uint64_t*>(p);
    std::memset(static_cast<void*>(data_), 0, bytes);
  }
  ~shared_hashes() { munmap(data_, bytes); }
  shared_hashes(const shared_hashes&) = delete;
  shared_hashes& operator=(const shared_hashes&) = delete;
  std::uint64_t& at(int rank, int step) const { return data_[rank * steps + step]; }

 private:
  static constexpr std::size_t bytes = sizeof(std::uint64_t) * ranks * steps;
  std::uint64_t* data_ = nullptr;
};

/// Rank r's input at `step`: multiples of 1/1024 in [-1, 1], or integers in [-8, 8] (`exact`).
std::vector<float> input_of(int r, int step, bool exact) {
  if (exact) return test::exact_input<float>(r + 5 * step, count);
  auto v = test::random_values<float>(
      count, 500 + 31 * static_cast<std::uint64_t>(r) + static_cast<std::uint64_t>(step));
  for (auto& x : v) x /= 8;
  return v;
}

std::vector<std::vector<float>> inputs_at(int step, bool exact) {
  std::vector<std::vector<float>> in;
  for (int q = 0; q < ranks; ++q) in.push_back(input_of(q, step, exact));
  return in;
}

/// The largest |got - want| over the elements, as a double.
double largest_error(const std::vector<float>& got, const std::vector<double>& want) {
  double e = 0;
  for (std::size_t i = 0; i < got.size(); ++i) e = std::max(e, std::fabs(got[i] - want[i]));
  return e;
}

/// Runs `steps` compressed allreduces with compressor `c` on `Topology` over 3 processes,
/// kernels on `Backend`; `check(step, result)` returns whether a result is right. Each rank's
/// hash of each result goes to `hashes`.
template <class Topology, class C, class Backend, class Check>
void run_on_processes_with(const shared_hashes& hashes, const C& c, bool exact, Check check,
                           const squall::collective_tuning& tuning) {
  const auto start = std::chrono::steady_clock::now();
  test::expect_ranks_succeed(ranks, [&](const shm_job& me) {
    using comm_type = squall::communicator<shm_transport, Topology, C, Backend>;
    comm_type comm(shm_transport(me, squall::options{.deadline = 60s}),
                   test::make_topology<Topology>(me.size), c, squall::options{}, tuning);
    auto state = comm.template make_state<float>(count);
    for (int s = 0; s < steps; ++s) {
      std::vector<float> data = input_of(me.rank, s, exact);
      comm.allreduce(typename comm_type::template view<float>(data.data(), data.size()), state);
      if (!check(s, data)) {
        std::fprintf(stderr, "rank %d: %s on %s, %s backend: step %d is wrong\n", me.rank,
                     squall::compressor_label<C>().c_str(), std::string(Topology::name).c_str(),
                     std::string(Backend::name).c_str(), s);
        return 10 + s;
      }
      if (comm.size() > 1 && comm.last_transfer().bytes_sent == 0) {
        std::fprintf(stderr, "rank %d: no bytes sent\n", me.rank);
        return 20 + s;
      }
      hashes.at(me.rank, s) = test::hash_bytes(data.data(), count * sizeof(float));
    }
    comm.barrier();
    return 0;
  });
  MESSAGE(squall::compressor_label<C>()
          << " on " << Topology::name << ", " << Backend::name << " backend, 3 processes: "
          << std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count()
          << " s");
}

/// `run_on_processes_with` on host_backend and on the deferred backend (kernels queued until
/// the algorithms' ordering points), and where the aggregation runs staged (not per_hop or
/// gtopk) on the deferred device backend (payloads staged through host memory): every rank
/// holds bitwise the same result, and the deferred runs' results are bitwise the host run's.
template <class Topology, class C, class Check>
void run_on_processes(const C& c, bool exact, Check check,
                      const squall::collective_tuning& tuning = {}) {
  const shared_hashes host;
  const shared_hashes deferred;
  const shared_hashes staged;
  const squall::aggregation how =
      squall::detail::aggregation_of<C, Topology>(tuning, 0, ranks, false);
  const bool stages = how != squall::aggregation::per_hop && how != squall::aggregation::gtopk;
  run_on_processes_with<Topology, C, squall::host_backend>(host, c, exact, check, tuning);
  constexpr bool deferred_too = test::with_deferred;
  if constexpr (deferred_too) {
    run_on_processes_with<Topology, C, test::deferred_backend>(deferred, c, exact, check, tuning);
    if (stages) {
      run_on_processes_with<Topology, C, test::deferred_device_backend>(staged, c, exact, check,
                                                                        tuning);
    }
  }
  for (int s = 0; s < steps; ++s) {
    CAPTURE(s);
    CHECK(host.at(0, s) != 0);
    for (int r = 0; r < ranks; ++r) {
      CAPTURE(r);
      if (r != 0) CHECK(host.at(r, s) == host.at(0, s));
      if (deferred_too) CHECK(deferred.at(r, s) == host.at(r, s));
      if (deferred_too && stages) CHECK(staged.at(r, s) == host.at(r, s));
    }
  }
}

/// The gather-then-reduce compressors: bitwise the serial sum of the decoded payloads.
template <class Topology, class C>
void gather_on_processes(const C& c) {
  run_on_processes<Topology>(
      c, false,
      [&](int s, const std::vector<float>& got) {
        const auto in = inputs_at(s, false);
        const auto want = squall::compression_traits<C>::majority_vote
                              ? test::vote_reference(c, in, static_cast<std::uint64_t>(s))
                              : test::gather_reference(c, in, static_cast<std::uint64_t>(s));
        return got == want;
      },
      squall::collective_tuning{.aggregation = squall::aggregation::gather});
}

}  // namespace

TEST_SUITE("shm_compressed_collectives") {
  TEST_CASE("linear: cast to float16 on a ring, within one rounding per input and per hop") {
    run_on_processes<squall::ring_topology>(
        squall::cast_compressor<squall::float16>{}, false,
        [](int s, const std::vector<float>& got) {
          const auto in = inputs_at(s, false);
          for (std::size_t i = 0; i < count; ++i) {
            double exact = 0;
            double magnitude = 0;
            for (const auto& x : in) {
              exact += x[i];
              magnitude += std::fabs(x[i]);
            }
            if (std::fabs(got[i] - exact) > 2.0 * ranks / 2048 * magnitude + 1e-7) return false;
          }
          return true;
        });
  }

  TEST_CASE("linear: randomk on a tree, the exact sum at the step's indices") {
    const squall::randomk_compressor c{.ratio = 0.05, .seed = 11};
    run_on_processes<squall::tree_topology>(c, true, [&](int s, const std::vector<float>& got) {
      const auto in = inputs_at(s, true);
      std::vector<float> want(count, 0.0f);
      for (const std::size_t i : c.indices(count, static_cast<std::uint64_t>(s))) {
        for (const auto& x : in) want[i] += x[i];
      }
      return got == want;
    });
  }

  TEST_CASE("linear: count_sketch on direct, the decode of the sum's sketch") {
    const squall::count_sketch_compressor<3, 256> c{.seed = 2};
    run_on_processes<squall::direct_topology>(c, true, [&](int s, const std::vector<float>& got) {
      std::vector<float> sum(count, 0.0f);
      for (const auto& x : inputs_at(s, true)) {
        for (std::size_t i = 0; i < count; ++i) sum[i] += x[i];
      }
      return got == test::decoded_payload(c, sum, static_cast<std::uint64_t>(s), 0);
    });
  }

  TEST_CASE("two_round: count sketch with error feedback on a ring, the serial two rounds") {
    using C = squall::count_sketch_compressor<3, 256>;
    const C c{.seed = 4};
    // each process checks its own steps in order, so the residuals advance step by step
    test::two_round_reference<3, 256> want{c, true, {}};
    run_on_processes<squall::ring_topology>(
        squall::error_feedback<C>{c}, true,
        [&](int s, const std::vector<float>& got) {
          return got == want.step(inputs_at(s, true), count, static_cast<std::uint64_t>(s));
        },
        squall::collective_tuning{.aggregation = squall::aggregation::two_round});
  }

  TEST_CASE("linear: hq on halving-doubling, the integer sum of the agreed payloads") {
    const squall::homomorphic_compressor c{.bits = 4, .seed = 6};
    run_on_processes<squall::halving_doubling_topology>(
        c, false, [&](int s, const std::vector<float>& got) {
          return got == test::hq_reference(c, inputs_at(s, false), static_cast<std::uint64_t>(s));
        });
  }

  TEST_CASE("gather then reduce: int8, qsgd, topk, threshold, sign_vote on three topologies") {
    gather_on_processes<squall::ring_topology>(squall::int8_compressor{});
    gather_on_processes<squall::halving_doubling_topology>(squall::qsgd_compressor<4>{.seed = 3});
    gather_on_processes<squall::direct_topology>(squall::topk_compressor{.ratio = 0.01});
    gather_on_processes<squall::ring_topology>(squall::threshold_compressor{.tau = 0.9});
    gather_on_processes<squall::hierarchical_topology<>>(squall::sign_vote_compressor{});
  }

  TEST_CASE("per-hop requantization: int8 on a ring, qsgd with error feedback on a tree") {
    // bitwise the serial re-implementation of the hops (tests/support/requantize_reference.hpp)
    const squall::int8_compressor q8{};
    run_on_processes<squall::ring_topology>(
        q8, false,
        [&](int s, const std::vector<float>& got) {
          return got ==
                 test::ring_reference(q8, inputs_at(s, false), static_cast<std::uint64_t>(s)).out;
        },
        squall::collective_tuning{.aggregation = squall::aggregation::per_hop});
    const squall::qsgd_compressor<4> qsgd{.seed = 12};
    // each process checks its own steps in order, so the residuals advance step by step
    std::vector<std::vector<float>> residuals(ranks, std::vector<float>(count, 0.0f));
    run_on_processes<squall::tree_topology>(
        squall::error_feedback<squall::qsgd_compressor<4>>{qsgd}, false,
        [&](int s, const std::vector<float>& got) {
          return got == test::tree_reference(qsgd, inputs_at(s, false),
                                             static_cast<std::uint64_t>(s), &residuals)
                            .out;
        });  // automatic: per hop on a tree
  }

  TEST_CASE("powersgd on halving-doubling: exact on an input of rank 1") {
    // rank r's input: (r + 1) u v^T on a 10007 x 1 view is rank 1: exact
    const squall::powersgd_compressor c{.rank = 1, .columns = 1, .seed = 8};
    run_on_processes<squall::halving_doubling_topology>(
        c, true, [](int s, const std::vector<float>& got) {
          std::vector<double> want(count, 0.0);
          for (const auto& x : inputs_at(s, true)) {
            for (std::size_t i = 0; i < count; ++i) want[i] += x[i];
          }
          return largest_error(got, want) <= 1e-4 * 8 * ranks;
        });
  }

  TEST_CASE("error feedback around topk on a ring: every rank alike") {
    using C = squall::error_feedback<squall::topk_compressor>;
    // step 0 starts from a zero residual: the plain topk result; step 1 carries residuals
    const squall::topk_compressor inner{.ratio = 0.01};
    run_on_processes<squall::ring_topology>(
        C{inner}, false, [&](int s, const std::vector<float>& got) {
          return s != 0 || got == test::gather_reference(inner, inputs_at(0, false), 0);
        });
  }

  TEST_CASE("gtopk: topk with error feedback and threshold, the serial gTop-k") {
    const squall::collective_tuning gtopk{.aggregation = squall::aggregation::gtopk};
    const squall::topk_compressor top{.ratio = 0.01};
    // each process checks its own steps in order, so the residuals advance step by step
    std::vector<std::vector<float>> residuals(ranks, std::vector<float>(count, 0.0f));
    run_on_processes<squall::ring_topology>(
        squall::error_feedback<squall::topk_compressor>{top}, false,
        [&](int s, const std::vector<float>& got) {
          return got == test::gtopk_reference(top, inputs_at(s, false),
                                              static_cast<std::uint64_t>(s), top.entries(count),
                                              &residuals);
        },
        gtopk);
    const squall::threshold_compressor thr{.tau = 0.9};
    run_on_processes<squall::direct_topology>(
        thr, false,
        [&](int s, const std::vector<float>& got) {
          return got ==
                 test::gtopk_reference(thr, inputs_at(s, false), static_cast<std::uint64_t>(s), 0);
        },
        gtopk);
  }
}
