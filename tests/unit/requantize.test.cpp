// SPDX-License-Identifier: Apache-2.0
// Per-hop requantization (the compressed allreduce of int8, qsgd, terngrad and sign on a ring
// or a tree, collective_tuning::aggregation per_hop or automatic), ranks as threads over
// inproc_transport, 1 to 4 ranks: every rank bitwise alike; bitwise the serial re-implementation
// of the documented hop order and streams (tests/support/requantize_reference.hpp), residuals
// included; within the per-hop error bound of the exact sum (int8: half a step per encode;
// qsgd, terngrad: a step per encode, and unbiased over many steps); error feedback's
// conservation of mass; the bytes each rank sends against the block payloads; the dispatch.
#include <squall/algorithm/communicator.hpp>
#include <squall/compress/error_feedback.hpp>
#include <squall/compress/quantize.hpp>
#include <squall/compress/state.hpp>
#include <squall/topology/direct.hpp>
#include <squall/topology/hierarchical.hpp>
#include <squall/topology/ring.hpp>
#include <squall/topology/tree.hpp>
#include <squall/transport/inproc.hpp>

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "../support/compressed_reference.hpp"
#include "../support/data.hpp"
#include "../support/deferred_backend.hpp"
#include "../support/requantize_reference.hpp"
#include "../support/thread_ranks.hpp"

namespace {

using squall::aggregation;
using squall::inproc_transport;

constexpr squall::options no_check{.check_mismatch = false};

template <class T>
struct record {
  std::vector<std::vector<T>> out;
  std::vector<T> residual;
  squall::transfer_stats stats;
};

/// Rank r's input at `step`: multiples of 1/8192 in [-1/8, 1/8] (`fixed`: the same every step).
std::vector<float> input_of(int r, int step, std::size_t count, bool fixed = false) {
  auto v =
      squall::test::random_values<float>(count, 4000 + 31 * static_cast<std::uint64_t>(r) +
                                                    (fixed ? 0 : static_cast<std::uint64_t>(step)));
  for (auto& x : v) x /= 8;
  return v;
}

std::vector<std::vector<float>> inputs_at(int p, int step, std::size_t count, bool fixed = false) {
  std::vector<std::vector<float>> in;
  for (int q = 0; q < p; ++q) in.push_back(input_of(q, step, count, fixed));
  return in;
}

/// `steps` compressed allreduces on `p` thread ranks, kernels on `Backend`.
template <class Topology, class C, class Op, class Backend>
std::vector<record<float>> run_on(int p, const C& c, std::size_t count, int steps, aggregation how,
                                  bool fixed, const squall::options& opts) {
  std::vector<record<float>> records(static_cast<std::size_t>(p));
  squall::test::run_ranks(p, [&](inproc_transport& t) {
    const int r = t.rank();
    auto& rec = records[static_cast<std::size_t>(r)];
    squall::communicator<inproc_transport, Topology, C, Backend> comm(
        std::move(t), {}, c, opts, {.chunk_bytes = 64, .aggregation = how});
    auto state = comm.template make_state<float>(count);
    for (int s = 0; s < steps; ++s) {
      std::vector<float> data = input_of(r, s, count, fixed);
      comm.allreduce(squall::host_view<float>(data), state, Op{});
      rec.out.push_back(std::move(data));
    }
    rec.stats = comm.last_transfer();
    if constexpr (squall::is_error_feedback<C>) {
      const auto res = state.residual().residual();
      rec.residual.assign(res.data(), res.data() + res.count());
    }
  });
  return records;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * 4) == 0);
}

/// `run_on` on host_backend, and on the deferred backend (kernels queued until the ordering
/// points), whose results, residuals and byte counts must be bitwise the host's; returns the
/// host's.
template <class Topology, class C, class Op = squall::sum_op>
std::vector<record<float>> run(int p, const C& c, std::size_t count, int steps,
                               aggregation how = aggregation::per_hop, bool fixed = false,
                               const squall::options& opts = {}) {
  auto host = run_on<Topology, C, Op, squall::host_backend>(p, c, count, steps, how, fixed, opts);
  if constexpr (squall::test::with_deferred) {
    const auto deferred = run_on<Topology, C, Op, squall::test::deferred_backend>(
        p, c, count, steps, how, fixed, opts);
    for (std::size_t r = 0; r < host.size(); ++r) {
      CAPTURE(r);
      REQUIRE(deferred[r].out.size() == host[r].out.size());
      for (std::size_t s = 0; s < host[r].out.size(); ++s) {
        REQUIRE(same_bits(deferred[r].out[s], host[r].out[s]));
      }
      REQUIRE(same_bits(deferred[r].residual, host[r].residual));
      REQUIRE(deferred[r].stats.bytes_sent == host[r].stats.bytes_sent);
    }
  }
  return host;
}

template <class Topology, class C>
squall::test::hop_reference<float> reference(const C& c, const std::vector<std::vector<float>>& in,
                                             std::uint64_t step,
                                             std::vector<std::vector<float>>* residuals) {
  if constexpr (std::is_same_v<Topology, squall::ring_topology>) {
    return squall::test::ring_reference(c, in, step, residuals);
  } else {
    return squall::test::tree_reference(c, in, step, residuals);
  }
}

std::vector<std::size_t> counts_for(int p) {
  const auto up = static_cast<std::size_t>(p);
  // 0, 1, P+1, a prime, and blocks of exactly one bucket (64), one more and one less
  return {0, 1, up + 1, 1009, 64 * up, 64 * up + up, 64 * up - up};
}

/// Bitwise the serial hop reference (and its residuals), every rank alike, and within
/// `per_step` x the sum of the encodes' quantization steps of the exact double sum.
template <class Topology, class Inner, bool Feedback>
void check_against_reference(const Inner& inner, double per_step) {
  using C = std::conditional_t<Feedback, squall::error_feedback<Inner>, Inner>;
  const C c{inner};
  constexpr int steps = 2;
  for (int p = 1; p <= 4; ++p) {
    for (const std::size_t count : counts_for(p)) {
      CAPTURE(p);
      CAPTURE(count);
      const auto records = run<Topology>(p, c, count, steps);
      std::vector<std::vector<float>> residuals(static_cast<std::size_t>(p),
                                                std::vector<float>(count, 0.0f));
      for (int s = 0; s < steps; ++s) {
        CAPTURE(s);
        const auto in = inputs_at(p, s, count);
        const auto ref = reference<Topology>(inner, in, static_cast<std::uint64_t>(s),
                                             Feedback ? &residuals : nullptr);
        for (const auto& rec : records)
          REQUIRE(same_bits(rec.out[static_cast<std::size_t>(s)], ref.out));
        if (Feedback) continue;  // the error bound is against the inputs, without residuals
        for (std::size_t i = 0; i < count; ++i) {
          double exact = 0;
          double magnitude = 0;
          for (const auto& x : in) {
            exact += x[i];
            magnitude += std::fabs(x[i]);
          }
          // float rounding of the additions and of decode's (code - s) x scale / s
          const double bound =
              per_step * ref.steps[i] + 4e-7 * (p + 1) * (magnitude + ref.steps[i]);
          const double got = records[0].out[static_cast<std::size_t>(s)][i];
          if (std::fabs(got - exact) > bound) {
            CAPTURE(i);
            CAPTURE(got);
            CAPTURE(exact);
            REQUIRE(std::fabs(got - exact) <= bound);
          }
        }
      }
      if (Feedback) {
        for (int q = 0; q < p; ++q) {
          REQUIRE(same_bits(records[static_cast<std::size_t>(q)].residual,
                            residuals[static_cast<std::size_t>(q)]));
        }
      }
    }
  }
}

template <class Topology>
void check_every_quantizer() {
  // int8 rounds to the nearest level: half a step per encode; the stochastic ones to a
  // neighbouring level: less than a step; sign: bitwise only (biased, no per-hop bound)
  const squall::int8_compressor q8{.bucket = 64};
  const squall::qsgd_compressor<4> qsgd{.bucket = 64, .seed = 3};
  const squall::terngrad_compressor tern{.bucket = 64, .seed = 9};
  const squall::sign_compressor sign{.bucket = 64};
  check_against_reference<Topology, squall::int8_compressor, false>(q8, 0.5);
  check_against_reference<Topology, squall::qsgd_compressor<4>, false>(qsgd, 1.0);
  check_against_reference<Topology, squall::terngrad_compressor, false>(tern, 1.0);
  check_against_reference<Topology, squall::sign_compressor, false>(sign, 1e30);
  // E4M3 to nearest: half an ulp, at most 16 of the reference's steps (scale / 448) at the
  // top of the range, where the ulp of 256..448 is 32
  using e4m3 = squall::quantize_compressor<squall::fp8_spec<1, false>>;
  check_against_reference<Topology, e4m3, false>(e4m3{.bucket = 64}, 16.0);
  check_against_reference<Topology, squall::int8_compressor, true>(q8, 0);
  check_against_reference<Topology, squall::qsgd_compressor<4>, true>(qsgd, 0);
  check_against_reference<Topology, squall::terngrad_compressor, true>(tern, 0);
  check_against_reference<Topology, squall::sign_compressor, true>(sign, 0);
  // least-squares scales (biased: bitwise the reference only), as error feedback uses them
  const squall::qsgd_compressor<4> qsgd_fit{.bucket = 64, .seed = 3, .fit_scale = true};
  const squall::terngrad_compressor tern_fit{.bucket = 64, .seed = 9, .fit_scale = true};
  check_against_reference<Topology, squall::qsgd_compressor<4>, true>(qsgd_fit, 0);
  check_against_reference<Topology, squall::terngrad_compressor, true>(tern_fit, 0);
}

/// The stochastic quantizers are unbiased through the hops: over `steps` calls on the same
/// inputs, the mean error of each element is within 5 standard deviations, the variance of
/// the sum of the hops' errors being at most the sum of (step / 2)^2 (a martingale: each
/// hop's rounding has mean zero given the partial it rounds).
template <class Topology, class C>
void check_unbiased(const C& c) {
  constexpr int steps = 200;
  for (const int p : {3, 4}) {
    CAPTURE(p);
    const std::size_t count = 257;
    const auto records = run<Topology>(p, c, count, steps, aggregation::per_hop, true);
    const auto in = inputs_at(p, 0, count, true);
    std::vector<double> mean(count, 0.0);
    std::vector<double> variance(count, 0.0);
    for (int s = 0; s < steps; ++s) {
      const auto ref = reference<Topology>(c, in, static_cast<std::uint64_t>(s), nullptr);
      REQUIRE(same_bits(records[0].out[static_cast<std::size_t>(s)], ref.out));
      for (std::size_t i = 0; i < count; ++i) {
        mean[i] += ref.out[i];
        variance[i] += ref.steps2[i] / 4;
      }
    }
    std::size_t beyond_three = 0;
    for (std::size_t i = 0; i < count; ++i) {
      double exact = 0;
      for (const auto& x : in) exact += x[i];
      const double error = mean[i] / steps - exact;
      const double sigma = std::sqrt(variance[i]) / steps;
      if (std::fabs(error) > 3 * sigma + 1e-6) ++beyond_three;
      if (std::fabs(error) > 5 * sigma + 1e-6) {
        CAPTURE(i);
        CAPTURE(error);
        CAPTURE(sigma);
        REQUIRE(std::fabs(error) <= 5 * sigma + 1e-6);
      }
    }
    CHECK(beyond_three <= count / 50);  // a bias would push many past 3 sigma
  }
}

using squall::test::what_of;

}  // namespace

TEST_SUITE("requantize") {
  TEST_CASE_TEMPLATE("per hop: bitwise the serial hop sequence, within the per-hop bound", Topology,
                     squall::ring_topology, squall::tree_topology) {
    check_every_quantizer<Topology>();
  }

  TEST_CASE_TEMPLATE("per hop: qsgd and terngrad stay unbiased through the hops", Topology,
                     squall::ring_topology, squall::tree_topology) {
    check_unbiased<Topology>(squall::qsgd_compressor<4>{.bucket = 64, .seed = 5});
    check_unbiased<Topology>(squall::terngrad_compressor{.bucket = 64, .seed = 6});
  }

  TEST_CASE_TEMPLATE("per hop with error feedback: results plus residuals add up to the inputs",
                     Topology, squall::ring_topology, squall::tree_topology) {
    // every encode feeds its error back to the rank that made it, so the errors telescope
    using C = squall::error_feedback<squall::sign_compressor>;
    constexpr int steps = 5;
    const std::size_t count = 333;
    for (int p = 1; p <= 4; ++p) {
      CAPTURE(p);
      const auto records = run<Topology>(p, C{{.bucket = 64}}, count, steps);
      for (std::size_t i = 0; i < count; ++i) {
        double inputs = 0;
        double kept = 0;
        for (int s = 0; s < steps; ++s) {
          for (const auto& x : inputs_at(p, s, count)) inputs += x[i];
          kept += records[0].out[static_cast<std::size_t>(s)][i];
        }
        for (const auto& rec : records) kept += rec.residual[i];
        REQUIRE(std::fabs(kept - inputs) <= 1e-4);
      }
    }
  }

  TEST_CASE("per hop, avg: the hop sum divided by P") {
    const squall::int8_compressor c{.bucket = 64};
    const std::size_t count = 1009;
    for (int p = 1; p <= 4; ++p) {
      const auto records =
          run<squall::ring_topology, squall::int8_compressor, squall::avg_op>(p, c, count, 1);
      auto want = squall::test::ring_reference(c, inputs_at(p, 0, count), 0).out;
      for (auto& x : want) x = x / static_cast<float>(p);
      for (const auto& rec : records) CHECK(same_bits(rec.out[0], want));
    }
  }

  TEST_CASE("per hop: the bytes each rank sends and receives") {
    // ring: rank r sends the encoded partial of every block but r (reduce-scatter) and the
    // final payload of every block but r+1 (allgather); it receives every block's but r-1's
    // and every block's but r's. Tree: one payload to the parent and one to each child.
    const squall::int8_compressor c{.bucket = 64};
    for (int p = 1; p <= 4; ++p) {
      for (const std::size_t count : {std::size_t{1}, std::size_t{1009}, std::size_t{4096}}) {
        CAPTURE(p);
        CAPTURE(count);
        const auto up = static_cast<std::size_t>(p);
        const auto payload = [&](int b) {
          const auto block =
              squall::detail::split_range(count, up, static_cast<std::size_t>((b + p) % p));
          return static_cast<std::uint64_t>(
              c.max_payload_bytes(squall::dtype::float32, block.count));
        };
        std::uint64_t all = 0;
        for (int b = 0; b < p; ++b) all += payload(b);
        const auto ring =
            run<squall::ring_topology>(p, c, count, 1, aggregation::per_hop, false, no_check);
        for (int r = 0; r < p; ++r) {
          CAPTURE(r);
          const auto& st = ring[static_cast<std::size_t>(r)].stats;
          const std::uint64_t sent = p == 1 ? 0 : 2 * all - payload(r) - payload(r + 1);
          const std::uint64_t received = p == 1 ? 0 : 2 * all - payload(r - 1) - payload(r);
          CHECK(st.bytes_sent == sent);
          CHECK(st.bytes_received == received);
        }
        // with equal blocks: 2 (P - 1) block payloads, the dense ring's 2 (P - 1) / P x count
        // elements at the compressed size
        if (count % up == 0) CHECK(ring[0].stats.bytes_sent == 2 * (up - 1) * payload(0));
        const std::uint64_t whole = c.max_payload_bytes(squall::dtype::float32, count);
        const auto tree =
            run<squall::tree_topology>(p, c, count, 1, aggregation::per_hop, false, no_check);
        for (int r = 0; r < p; ++r) {
          CAPTURE(r);
          const std::uint64_t links = static_cast<std::uint64_t>(r != 0) +
                                      static_cast<std::uint64_t>(2 * r + 1 < p) +
                                      static_cast<std::uint64_t>(2 * r + 2 < p);
          CHECK(tree[static_cast<std::size_t>(r)].stats.bytes_sent == links * whole);
          CHECK(tree[static_cast<std::size_t>(r)].stats.bytes_received == links * whole);
        }
      }
    }
  }

  TEST_CASE(
      "automatic aggregation of a per-hop compressor: per hop where the schedule allows, else "
      "gather") {
    const squall::qsgd_compressor<2> c{.bucket = 64, .seed = 4};
    const std::size_t count = 300;
    for (int p = 1; p <= 4; ++p) {
      CAPTURE(p);
      const auto in = inputs_at(p, 0, count);
      const auto hop_ring = squall::test::ring_reference(c, in, 0).out;
      const auto hop_tree = squall::test::tree_reference(c, in, 0).out;
      const auto gathered = squall::test::gather_reference(c, in, 0);
      CHECK(same_bits(run<squall::ring_topology>(p, c, count, 1, aggregation::automatic)[0].out[0],
                      hop_ring));
      CHECK(same_bits(run<squall::tree_topology>(p, c, count, 1, aggregation::automatic)[0].out[0],
                      hop_tree));
      CHECK(same_bits(run<squall::ring_topology>(p, c, count, 1, aggregation::gather)[0].out[0],
                      gathered));
      CHECK(same_bits(
          run<squall::hierarchical_topology<>>(p, c, count, 1, aggregation::automatic)[0].out[0],
          gathered));
      // direct declares per_hop_schedule: automatic is its per-hop walk
      CHECK(
          same_bits(run<squall::direct_topology>(p, c, count, 1, aggregation::automatic)[0].out[0],
                    run<squall::direct_topology>(p, c, count, 1, aggregation::per_hop)[0].out[0]));
    }
    // one rank: one encode with the gather path's stream {step, 0}, so all three agree
    CHECK(same_bits(squall::test::ring_reference(c, inputs_at(1, 0, count), 0).out,
                    squall::test::gather_reference(c, inputs_at(1, 0, count), 0)));
  }

  TEST_CASE("aggregation::per_hop on another topology is refused, naming it") {
    const std::string what = what_of([] {
      run<squall::hierarchical_topology<>>(2, squall::int8_compressor{}, 10, 1,
                                           aggregation::per_hop);
    });
    CHECK(what.find("per_hop_schedule") != std::string::npos);
    CHECK(what.find("'hierarchical'") != std::string::npos);
  }

  TEST_CASE("hop streams: a rank word per (rank, hop), below P^2, never shared_rank") {
    for (int p = 1; p <= 16; ++p) {
      std::vector<bool> seen(static_cast<std::size_t>(p * p), false);
      for (int r = 0; r < p; ++r) {
        for (int hop = 0; hop < p; ++hop) {
          const auto s = squall::detail::hop_stream(7, r, p, hop);
          CHECK(s.step == 7);
          REQUIRE(s.rank < static_cast<std::uint32_t>(p * p));
          CHECK(!seen[s.rank]);
          seen[s.rank] = true;
        }
      }
    }
    const auto top = squall::detail::hop_stream(0, 65534, 65535, 65534);
    CHECK(top.rank == 65535u * 65535u - 1);
    CHECK(top.rank != squall::shared_rank);
  }
}
