// SPDX-License-Identifier: Apache-2.0
// gTop-k (collective_tuning::sparse = gtopk): the compressed allreduce of topk and threshold,
// with and without error feedback, ranks as threads over inproc_transport (1 to 6 and 8):
// every rank bitwise the same; bitwise the serial gTop-k of tests/support/gtopk_reference.hpp
// (same tree, same merge rule, written apart); error feedback's residuals bitwise the
// reference's, and inputs = results + residuals over several steps; the bytes each rank moved
// against the tree's count of sets; the default (gather) unchanged.
#include <squall/algorithm/communicator.hpp>
#include <squall/compress/error_feedback.hpp>
#include <squall/compress/sparsify.hpp>
#include <squall/compress/state.hpp>
#include <squall/topology/direct.hpp>
#include <squall/topology/ring.hpp>
#include <squall/transport/inproc.hpp>

#include <doctest/doctest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "../support/collective_data.hpp"
#include "../support/compressed_reference.hpp"
#include "../support/data.hpp"
#include "../support/deferred_backend.hpp"
#include "../support/gtopk_reference.hpp"
#include "../support/thread_ranks.hpp"

namespace {

using squall::inproc_transport;
using squall::test::run_ranks;
using squall::test::step_input;

constexpr squall::collective_tuning gtopk_tuning{
    .chunk_bytes = 64, .pipeline_depth = 3, .aggregation = squall::aggregation::gtopk};
constexpr squall::collective_tuning gtopk_messages{
    .peer_memory_bytes = std::numeric_limits<std::size_t>::max(),
    .aggregation = squall::aggregation::gtopk};

template <class T>
struct record {
  std::vector<std::vector<T>> out;
  std::vector<std::vector<T>> residual;  // after each step (error feedback)
  squall::transfer_stats stats;
};

/// `steps` compressed allreduces of `input(rank, step)` on `p` thread ranks, kernels on
/// `Backend`.
template <class Topology, class C, class T, class Op, class Backend>
std::vector<record<T>> run_on(int p, const C& c, std::size_t count, int steps,
                              const step_input<T>& input, const squall::collective_tuning& tuning,
                              const squall::options& opts, std::size_t window) {
  std::vector<record<T>> records(static_cast<std::size_t>(p));
  run_ranks(
      p,
      [&](inproc_transport& t) {
        const int r = t.rank();
        auto& rec = records[static_cast<std::size_t>(r)];
        squall::communicator<inproc_transport, Topology, C, Backend> comm(std::move(t), {}, c, opts,
                                                                          tuning);
        auto state = comm.template make_state<T>(count);
        for (int s = 0; s < steps; ++s) {
          std::vector<T> data = input(r, s);
          comm.allreduce(squall::host_view<T>(data), state, Op{});
          rec.out.push_back(std::move(data));
          if constexpr (squall::is_error_feedback<C>) {
            const auto res = state.residual().residual();
            rec.residual.emplace_back(res.data(), res.data() + res.count());
          }
        }
        rec.stats = comm.last_transfer();
      },
      {}, window);
  return records;
}

template <class T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0);
}

/// `run_on` on host_backend, and on the deferred backend (kernels queued until the ordering
/// points), whose results, residuals and byte counts must be bitwise the host's; returns the
/// host's.
template <class Topology, class C, class T, class Op = squall::sum_op>
std::vector<record<T>> run(int p, const C& c, std::size_t count, int steps,
                           const step_input<T>& input,
                           const squall::collective_tuning& tuning = gtopk_tuning,
                           const squall::options& opts = {}, std::size_t window = 4096) {
  auto host = run_on<Topology, C, T, Op, squall::host_backend>(p, c, count, steps, input, tuning,
                                                               opts, window);
  if constexpr (squall::test::with_deferred) {
    const auto deferred = run_on<Topology, C, T, Op, squall::test::deferred_backend>(
        p, c, count, steps, input, tuning, opts, window);
    for (std::size_t r = 0; r < host.size(); ++r) {
      CAPTURE(r);
      REQUIRE(deferred[r].out.size() == host[r].out.size());
      for (std::size_t s = 0; s < host[r].out.size(); ++s) {
        REQUIRE(same_bits(deferred[r].out[s], host[r].out[s]));
      }
      REQUIRE(deferred[r].residual.size() == host[r].residual.size());
      for (std::size_t s = 0; s < host[r].residual.size(); ++s) {
        REQUIRE(same_bits(deferred[r].residual[s], host[r].residual[s]));
      }
      REQUIRE(deferred[r].stats.bytes_sent == host[r].stats.bytes_sent);
    }
  }
  return host;
}

template <class T>
void check_bitwise_equal(const std::vector<record<T>>& records) {
  for (std::size_t r = 1; r < records.size(); ++r) {
    for (std::size_t s = 0; s < records[0].out.size(); ++s) {
      CAPTURE(r);
      CAPTURE(s);
      const auto& a = records[0].out[s];
      const auto& b = records[r].out[s];
      REQUIRE(a.size() == b.size());
      REQUIRE((a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0));
    }
  }
}

/// Rank r's input at step s: multiples of 1/1024 in [-1, 1] (distinct magnitudes, mostly), or
/// integers in [-8, 8] (many ties at the cut).
template <class T>
std::vector<T> input_of(int r, int s, std::size_t count, bool ties) {
  if (ties) return squall::test::exact_input<T>(r + 5 * s, count);
  auto v = squall::test::random_values<T>(
      count, 1000 + 31 * static_cast<std::uint64_t>(r) + static_cast<std::uint64_t>(s));
  for (auto& x : v) x /= 8;
  return v;
}

template <class T>
std::vector<std::vector<T>> inputs_at(int p, int s, std::size_t count, bool ties) {
  std::vector<std::vector<T>> in;
  for (int q = 0; q < p; ++q) in.push_back(input_of<T>(q, s, count, ties));
  return in;
}

const std::vector<int> rank_counts = {1, 2, 3, 4, 5, 6, 8};

std::vector<std::size_t> counts_for(int p) {
  return {0, 1, 2, static_cast<std::size_t>(p) + 1, 37, 1009};
}

/// Without error feedback: every rank bitwise the serial gTop-k, sum and avg.
template <class C, class T = float>
void check_against_reference(const C& c, std::size_t (*cap)(const C&, std::size_t)) {
  for (const int p : rank_counts) {
    for (const std::size_t count : counts_for(p)) {
      for (const bool ties : {false, true}) {
        CAPTURE(p);
        CAPTURE(count);
        CAPTURE(ties);
        const auto input = [&](int r, int s) { return input_of<T>(r, s, count, ties); };
        const auto records = run<squall::ring_topology, C, T>(p, c, count, 2, input);
        check_bitwise_equal(records);
        const auto averaged =
            run<squall::direct_topology, C, T, squall::avg_op>(p, c, count, 1, input);
        check_bitwise_equal(averaged);
        for (int s = 0; s < 2; ++s) {
          const auto want = squall::test::gtopk_reference(
              c, inputs_at<T>(p, s, count, ties), static_cast<std::uint64_t>(s), cap(c, count));
          REQUIRE(records[0].out[static_cast<std::size_t>(s)] == want);
          if (s == 0) {
            std::vector<T> mean = want;
            for (auto& x : mean) x = x / static_cast<T>(p);
            REQUIRE(averaged[0].out[0] == mean);
          }
        }
      }
    }
  }
}

std::size_t topk_cap(const squall::topk_compressor& c, std::size_t count) {
  return c.entries(count);
}
std::size_t threshold_cap(const squall::threshold_compressor&, std::size_t) { return 0; }

/// With error feedback, over `steps` steps: results and residuals bitwise the reference's,
/// and sum of inputs = sum of results + sum of final residuals (to float rounding).
template <class Inner>
void check_error_feedback(const Inner& inner, std::size_t (*cap)(const Inner&, std::size_t),
                          bool ties) {
  using C = squall::error_feedback<Inner>;
  constexpr int steps = 4;
  for (const int p : rank_counts) {
    for (const std::size_t count : {std::size_t{1}, std::size_t{9}, std::size_t{333}}) {
      CAPTURE(p);
      CAPTURE(count);
      CAPTURE(ties);
      const auto input = [&](int r, int s) { return input_of<float>(r, s, count, ties); };
      const auto records = run<squall::ring_topology, C, float>(p, C{inner}, count, steps, input);
      check_bitwise_equal(records);
      std::vector<std::vector<float>> residuals(static_cast<std::size_t>(p),
                                                std::vector<float>(count, 0.0f));
      for (int s = 0; s < steps; ++s) {
        CAPTURE(s);
        const auto want = squall::test::gtopk_reference(inner, inputs_at<float>(p, s, count, ties),
                                                        static_cast<std::uint64_t>(s),
                                                        cap(inner, count), &residuals);
        REQUIRE(records[0].out[static_cast<std::size_t>(s)] == want);
        for (int q = 0; q < p; ++q) {
          REQUIRE(records[static_cast<std::size_t>(q)].residual[static_cast<std::size_t>(s)] ==
                  residuals[static_cast<std::size_t>(q)]);
        }
      }
      // conservation of mass: every input is in a result or in exactly one residual
      double largest = 0;
      for (std::size_t i = 0; i < count; ++i) {
        double inputs = 0;
        double kept = 0;
        double magnitude = 0;
        for (int s = 0; s < steps; ++s) {
          for (const auto& x : inputs_at<float>(p, s, count, ties)) {
            inputs += x[i];
            magnitude += std::fabs(x[i]);
          }
          kept += records[0].out[static_cast<std::size_t>(s)][i];
        }
        for (const auto& rec : records) kept += rec.residual.back()[i];
        // each merge's sum and each add-back rounds once in float
        const double bound = 4.0 * steps * p * magnitude * std::numeric_limits<float>::epsilon();
        largest = std::max(largest, std::fabs(kept - inputs));
        if (std::fabs(kept - inputs) > bound) {
          CAPTURE(i);
          CAPTURE(kept);
          CAPTURE(inputs);
          REQUIRE(std::fabs(kept - inputs) <= bound);
        }
      }
      if constexpr (std::is_same_v<Inner, squall::topk_compressor>) {
        if (ties) CHECK(largest == 0);  // small integers: every sum exact
      }
    }
  }
}

/// Sets rank r sends (= receives) in gTop-k: one up (r != 0), one per child down, one to its
/// fold partner (r < P - P2) or from it (r >= P2).
std::uint64_t sets_of(int r, int p) {
  const int p2 = static_cast<int>(std::bit_floor(static_cast<unsigned>(p)));
  if (r >= p2) return 1;
  const int children = r == 0 ? std::countr_zero(static_cast<unsigned>(p2))
                              : std::countr_zero(static_cast<unsigned>(r));
  return static_cast<std::uint64_t>((r != 0) + children + (r < p - p2));
}

}  // namespace

TEST_SUITE("gtopk") {
  TEST_CASE("topk: every rank bitwise the serial gTop-k, sum and avg, ties to the lower index") {
    check_against_reference(squall::topk_compressor{.ratio = 0.1}, topk_cap);
    check_against_reference(squall::topk_compressor{.ratio = 0.3}, topk_cap);  // k P > count
  }

  TEST_CASE("topk on doubles, and the sampled threshold (up to k entries a rank)") {
    check_against_reference<squall::topk_compressor, double>(squall::topk_compressor{.ratio = 0.1},
                                                             topk_cap);
    check_against_reference(
        squall::topk_compressor{.ratio = 0.1,
                                .method = squall::topk_method::sampled_threshold,
                                .sample_ratio = 0.5,
                                .seed = 3},
        topk_cap);
  }

  TEST_CASE("threshold: the cap is the largest entry count in the merged subtree") {
    check_against_reference(squall::threshold_compressor{.tau = 0.5}, threshold_cap);
    check_against_reference(squall::threshold_compressor{.tau = 100}, threshold_cap);  // none
  }

  TEST_CASE("error feedback: residuals as the reference's, inputs = results + residuals") {
    for (const bool ties : {false, true}) {
      check_error_feedback(squall::topk_compressor{.ratio = 0.05}, topk_cap, ties);
      check_error_feedback(squall::threshold_compressor{.tau = 0.6}, threshold_cap, ties);
    }
  }

  TEST_CASE("bytes: each rank sends and receives its tree's sets of 16 + k (4 + 4) bytes") {
    const squall::options no_check{.check_mismatch = false};
    const squall::topk_compressor top{.ratio = 0.05};
    const squall::threshold_compressor thr{.tau = 0.7};
    for (const int p : rank_counts) {
      CAPTURE(p);
      const auto up = static_cast<std::uint64_t>(p);
      const std::uint64_t rounds =
          static_cast<std::uint64_t>(std::bit_width(static_cast<unsigned>(p - 1)));  // ceil log2
      for (const std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{1009}}) {
        CAPTURE(count);
        const std::uint64_t k = top.entries(count);
        const std::uint64_t set_bytes = 16 + k * (4 + sizeof(float));
        const auto input = [&](int r, int s) { return input_of<float>(r, s, count, false); };
        const auto records = run<squall::ring_topology, squall::topk_compressor, float>(
            p, top, count, 1, input, gtopk_messages, no_check, 0);
        for (int r = 0; r < p; ++r) {
          CAPTURE(r);
          const auto& st = records[static_cast<std::size_t>(r)].stats;
          const std::uint64_t want = count == 0 ? 0 : sets_of(r, p) * set_bytes;
          CHECK(st.bytes_sent == want);
          CHECK(st.bytes_received == want);
          // the paper's 2 k log2 P entries per rank, sent and received together
          CHECK(st.bytes_sent + st.bytes_received <= 2 * rounds * set_bytes);
        }
        (void)up;
        // threshold: sets of at most the largest local count
        std::uint64_t most = 0;
        for (const auto& x : inputs_at<float>(p, 0, count, false)) {
          std::uint64_t n = 0;
          for (const float v : x) n += std::fabs(v) >= 0.7f;
          most = std::max(most, n);
        }
        const auto t_records = run<squall::ring_topology, squall::threshold_compressor, float>(
            p, thr, count, 1, input, gtopk_messages, no_check, 0);
        for (int r = 0; r < p; ++r) {
          const auto& st = t_records[static_cast<std::size_t>(r)].stats;
          const std::uint64_t bound =
              count == 0 ? 0 : sets_of(r, p) * (16 + most * (4 + sizeof(float)));
          CHECK(st.bytes_sent <= bound);
          CHECK(st.bytes_received <= bound);
        }
      }
    }
  }

  TEST_CASE("the default is gather: the serial sum of every rank's decoded payload") {
    CHECK(squall::collective_tuning{}.aggregation == squall::aggregation::automatic);
    CHECK(squall::topk_compressor::aggregations[0] == squall::aggregation::gather);
    const squall::topk_compressor c{.ratio = 0.1};
    const std::size_t count = 101;
    const auto input = [&](int r, int s) { return input_of<float>(r, s, count, false); };
    const auto records =
        run<squall::ring_topology, squall::topk_compressor, float>(3, c, count, 1, input, {});
    check_bitwise_equal(records);
    const auto in = inputs_at<float>(3, 0, count, false);
    CHECK(records[0].out[0] == squall::test::gather_reference(c, in, 0));
    CHECK(records[0].out[0] != squall::test::gtopk_reference(c, in, 0, c.entries(count)));
  }
}
