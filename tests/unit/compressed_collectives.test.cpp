// SPDX-License-Identifier: Apache-2.0
// The compressed allreduce (communicator::allreduce with a compression_state), ranks as
// threads over inproc_transport, 1 to 4 ranks, on every topology: every rank bitwise the
// same; linear compressors against the exact sum within their documented error (cast:
// rounding per hop; randomk: the exact sum at the step's indices, zero elsewhere;
// count_sketch: the decode of the sum's sketch); gather-then-reduce against the serial sum
// of each rank's payload encoded on its own; sign_vote against the majority vote; PowerSGD
// exact on inputs of rank <= r; error feedback's conservation of mass; state save/restore
// and rejection; the bytes each rank moved against formulas. Every run goes twice: on
// host_backend and on the deferred backend, whose results must be bitwise the host's.
#include <squall/algorithm/communicator.hpp>
#include <squall/compress/cast.hpp>
#include <squall/compress/chain.hpp>
#include <squall/compress/error_feedback.hpp>
#include <squall/compress/fetchsgd.hpp>
#include <squall/compress/homomorphic.hpp>
#include <squall/compress/quantize.hpp>
#include <squall/compress/sketch.hpp>
#include <squall/compress/sparsify.hpp>
#include <squall/compress/state.hpp>
#include <squall/topology/automatic.hpp>
#include <squall/topology/direct.hpp>
#include <squall/topology/halving_doubling.hpp>
#include <squall/topology/hierarchical.hpp>
#include <squall/topology/ring.hpp>
#include <squall/topology/tree.hpp>
#include <squall/transport/inproc.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <concepts>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "../support/collective_data.hpp"
#include "../support/compressed_reference.hpp"
#include "../support/data.hpp"
#include "../support/deferred_backend.hpp"
#include "../support/thread_ranks.hpp"
#include "../support/topologies.hpp"

namespace {

using squall::inproc_transport;
using squall::test::run_ranks;
using squall::test::step_input;

using squall::test::make_topology;

constexpr squall::collective_tuning tiny_pieces{.chunk_bytes = 64, .pipeline_depth = 3};
constexpr squall::collective_tuning peer_memory{
    .chunk_bytes = 64, .pipeline_depth = 3, .peer_memory_bytes = 1, .window_copy_bytes = 0};
constexpr squall::collective_tuning messages_only{.peer_memory_bytes =
                                                      std::numeric_limits<std::size_t>::max()};

// The per-hop compressors (int8, qsgd, terngrad, sign) gather here, where the tuning leaves
// the aggregation automatic: per-hop requantization has its own tests (requantize.test.cpp).
template <class C>
squall::collective_tuning gathering(squall::collective_tuning tuning) {
  if (squall::compression_traits<C>::aggregations.contains(squall::aggregation::per_hop) &&
      tuning.aggregation == squall::aggregation::automatic) {
    tuning.aggregation = squall::aggregation::gather;
  }
  return tuning;
}

/// What one rank saw: its result of every step, the bytes of its last call, its final
/// residual (error feedback) and its saved state.
template <class T>
struct rank_record {
  std::vector<std::vector<T>> out;
  squall::transfer_stats stats;
  std::vector<T> residual;
  std::vector<std::byte> saved;
};

/// Runs `steps` compressed allreduces of `input(rank, step)` on `p` thread ranks with
/// compressor `c`, kernels on `Backend`; with `resume`, each rank's state is first restored
/// from resume[rank].
template <class Topology, class C, class T, class Op, class Backend>
std::vector<rank_record<T>> run_compressed_on(int p, const C& c, std::size_t count, int steps,
                                              const step_input<T>& input,
                                              const squall::collective_tuning& tuning,
                                              std::size_t window, const squall::options& opts,
                                              const std::vector<std::vector<std::byte>>* resume) {
  std::vector<rank_record<T>> records(static_cast<std::size_t>(p));
  run_ranks(
      p,
      [&](inproc_transport& t) {
        const int r = t.rank();
        auto& rec = records[static_cast<std::size_t>(r)];
        using comm_type = squall::communicator<inproc_transport, Topology, C, Backend>;
        comm_type comm(std::move(t), make_topology<Topology>(p), c, opts, gathering<C>(tuning));
        auto state = comm.template make_state<T>(count);
        if (resume != nullptr) {
          state.restore(squall::host_view<const std::byte>((*resume)[static_cast<std::size_t>(r)]));
        }
        for (int s = 0; s < steps; ++s) {
          std::vector<T> data = input(r, static_cast<int>(state.step()));
          comm.allreduce(typename comm_type::template view<T>(data.data(), data.size()), state,
                         Op{});
          rec.out.push_back(std::move(data));
        }
        rec.stats = comm.last_transfer();
        if constexpr (squall::is_error_feedback<C>) {
          const auto res = state.residual().residual();
          rec.residual.assign(res.data(), res.data() + res.count());
        }
        rec.saved = state.save();
      },
      {}, window);
  return records;
}

template <class T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0);
}

/// Every record of `deferred` is bitwise `host`'s: results, residual, saved state, byte counts.
template <class T>
void require_same_records(const std::vector<rank_record<T>>& host,
                          const std::vector<rank_record<T>>& deferred) {
  REQUIRE(deferred.size() == host.size());
  for (std::size_t r = 0; r < host.size(); ++r) {
    CAPTURE(r);
    REQUIRE(deferred[r].out.size() == host[r].out.size());
    for (std::size_t s = 0; s < host[r].out.size(); ++s) {
      CAPTURE(s);
      REQUIRE(same_bits(deferred[r].out[s], host[r].out[s]));
    }
    REQUIRE(same_bits(deferred[r].residual, host[r].residual));
    REQUIRE(same_bits(deferred[r].saved, host[r].saved));
    REQUIRE(deferred[r].stats.bytes_sent == host[r].stats.bytes_sent);
    REQUIRE(deferred[r].stats.bytes_received == host[r].stats.bytes_received);
  }
}

/// `run_compressed_on` on host_backend, and again on the deferred backend (kernels queued
/// until the algorithms' ordering points, outputs poisoned till then) and, where the
/// aggregation runs staged (linear, low_rank, gather), on the deferred device backend (the
/// communicator stages the payloads through host memory; on ring and direct), whose every
/// result, residual, byte count and saved state must be bitwise the host's; returns the
/// host's records.
template <class Topology, class C, class T = float, class Op = squall::sum_op>
std::vector<rank_record<T>> run_compressed(
    int p, const C& c, std::size_t count, int steps, const step_input<T>& input,
    const squall::collective_tuning& tuning = tiny_pieces, std::size_t window = 4096,
    const squall::options& opts = {}, const std::vector<std::vector<std::byte>>* resume = nullptr) {
  auto host = run_compressed_on<Topology, C, T, Op, squall::host_backend>(
      p, c, count, steps, input, tuning, window, opts, resume);
  if constexpr (squall::test::with_deferred) {
    require_same_records(host,
                         run_compressed_on<Topology, C, T, Op, squall::test::deferred_backend>(
                             p, c, count, steps, input, tuning, window, opts, resume));
    // The staging wraps the host core whatever the topology: ring (messages) and direct (the
    // one-shot paths) stand for all, which keeps this file's build time in bounds.
    constexpr bool staged_here = std::same_as<Topology, squall::ring_topology> ||
                                 std::same_as<Topology, squall::direct_topology>;
    if constexpr (staged_here) {
      const squall::aggregation how =
          squall::detail::aggregation_of<C, Topology>(gathering<C>(tuning), 0, p, false);
      if (how == squall::aggregation::per_hop || how == squall::aggregation::gtopk) return host;
      require_same_records(
          host, run_compressed_on<Topology, C, T, Op, squall::test::deferred_device_backend>(
                    p, c, count, steps, input, tuning, window, opts, resume));
    }
  }
  return host;
}

/// Every rank's result of every step is bitwise rank 0's.
template <class T>
void check_bitwise_equal(const std::vector<rank_record<T>>& records) {
  for (std::size_t r = 1; r < records.size(); ++r) {
    REQUIRE(records[r].out.size() == records[0].out.size());
    for (std::size_t s = 0; s < records[0].out.size(); ++s) {
      const auto& a = records[0].out[s];
      const auto& b = records[r].out[s];
      REQUIRE(a.size() == b.size());
      CAPTURE(r);
      CAPTURE(s);
      REQUIRE((a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0));
    }
  }
}

/// Rank `r`'s input at `step`: multiples of 1/1024 in [-1, 1].
std::vector<float> random_input(int r, int step, std::size_t count) {
  auto v = squall::test::random_values<float>(
      count, 1000 + 31 * static_cast<std::uint64_t>(r) + static_cast<std::uint64_t>(step));
  for (auto& x : v) x /= 8;
  return v;
}

/// Rank `r`'s exact input at `step`: integers in [-8, 8] (every sum order gives the same).
std::vector<float> exact_step_input(int r, int step, std::size_t count) {
  return squall::test::exact_input<float>(r + 5 * step, count);
}

std::vector<std::vector<float>> all_inputs(int p, int step, std::size_t count, bool exact) {
  std::vector<std::vector<float>> in;
  for (int q = 0; q < p; ++q) {
    in.push_back(exact ? exact_step_input(q, step, count) : random_input(q, step, count));
  }
  return in;
}

std::vector<std::size_t> counts_for(int p) { return {0, 1, static_cast<std::size_t>(p) + 1, 1009}; }

// ---- linear: cast ------------------------------------------------------------------------

template <class Topology, class To>
void check_cast() {
  using C = squall::cast_compressor<To>;
  const double u = std::is_same_v<To, squall::float16> ? 1.0 / 2048 : 1.0 / 256;
  for (int p = 1; p <= 4; ++p) {
    for (const std::size_t count : counts_for(p)) {
      for (int variant = 0; variant < 2; ++variant) {
        CAPTURE(p);
        CAPTURE(count);
        CAPTURE(variant);
        const auto input = [count](int r, int s) { return random_input(r, s, count); };
        const auto records =
            variant == 0 ? run_compressed<Topology>(p, C{}, count, 2, input, tiny_pieces, 4096)
                         : run_compressed<Topology>(p, C{}, count, 2, input, peer_memory, 0);
        check_bitwise_equal(records);
        for (int s = 0; s < 2; ++s) {
          const auto in = all_inputs(p, s, count, false);
          for (std::size_t i = 0; i < count; ++i) {
            double exact = 0;
            double magnitude = 0;
            for (const auto& x : in) {
              exact += x[i];
              magnitude += std::fabs(x[i]);
            }
            // one rounding of each input and of each partial sum (p - 1), to To
            const double bound = 2.0 * p * u * magnitude + 1e-7;
            const double got = records[0].out[static_cast<std::size_t>(s)][i];
            if (std::fabs(got - exact) > bound) {
              CAPTURE(i);
              CAPTURE(got);
              CAPTURE(exact);
              REQUIRE(std::fabs(got - exact) <= bound);
            }
          }
        }
      }
    }
  }
}

// ---- linear: randomk and count_sketch ----------------------------------------------------

template <class Topology>
void check_randomk() {
  const squall::randomk_compressor c{.ratio = 0.1, .seed = 77};
  for (int p = 1; p <= 4; ++p) {
    for (const std::size_t count : counts_for(p)) {
      CAPTURE(p);
      CAPTURE(count);
      const auto records = run_compressed<Topology>(
          p, c, count, 2, [count](int r, int s) { return exact_step_input(r, s, count); });
      check_bitwise_equal(records);
      for (int s = 0; s < 2; ++s) {
        const auto in = all_inputs(p, s, count, true);
        std::vector<float> want(count, 0.0f);
        for (const std::size_t i : c.indices(count, static_cast<std::uint64_t>(s))) {
          for (const auto& x : in) want[i] += x[i];
        }
        REQUIRE(records[0].out[static_cast<std::size_t>(s)] == want);
      }
    }
  }
}

template <class Topology>
void check_count_sketch() {
  using C = squall::count_sketch_compressor<3, 64>;
  const C c{.seed = 5};
  for (int p = 1; p <= 4; ++p) {
    for (const std::size_t count : counts_for(p)) {
      CAPTURE(p);
      CAPTURE(count);
      const auto records = run_compressed<Topology>(
          p, c, count, 2, [count](int r, int s) { return exact_step_input(r, s, count); });
      check_bitwise_equal(records);
      for (int s = 0; s < 2; ++s) {
        // sketches add (exactly, for these integers): the result is the decode of the sum's
        const auto in = all_inputs(p, s, count, true);
        std::vector<float> sum(count, 0.0f);
        for (const auto& x : in) {
          for (std::size_t i = 0; i < count; ++i) sum[i] += x[i];
        }
        const auto want = squall::test::decoded_payload(c, sum, static_cast<std::uint64_t>(s), 0);
        REQUIRE(records[0].out[static_cast<std::size_t>(s)] == want);
      }
    }
  }
}

/// FetchSGD, serially in double from the hash formula (kernels/host/sketch.hpp's
/// `sketch_word`, `sketch_bucket`, `sketch_sign_bit`): the ranks' sketches summed, S_u = rho
/// S_u + S, S_e += S_u, the k largest median estimates of S_e (ties to the lower index), S_u
/// and S_e zeroed at the buckets of their support. With integer inputs and rho = 1/2 every
/// value is a short dyadic fraction, so float arithmetic in any order must give these bits.
template <std::size_t Rows, std::size_t Cols>
struct fetchsgd_reference {
  squall::fetchsgd_compressor<Rows, Cols> c;
  std::vector<double> u = std::vector<double>(Rows * Cols, 0.0);
  std::vector<double> e = std::vector<double>(Rows * Cols, 0.0);

  std::vector<float> step(const std::vector<std::vector<float>>& in, std::size_t count) {
    const squall::test::sketch_reference<Rows, Cols> hashes{.seed = c.seed, .step = 0};
    std::vector<double> sum(Rows * Cols, 0.0);
    for (const auto& x : in) hashes.add(sum, x);
    for (std::size_t j = 0; j < sum.size(); ++j) {
      u[j] = c.momentum * u[j] + sum[j];
      e[j] += u[j];
    }
    const std::vector<double> est = hashes.estimates(e, count);
    const std::vector<std::size_t> order = squall::test::by_magnitude(est);
    const std::size_t k = c.heavy_hitters != 0 ? c.heavy_hitters : Cols / 4;
    std::vector<float> out(count, 0.0f);
    for (std::size_t j = 0; j < std::min(k, count); ++j) {
      out[order[j]] = static_cast<float>(est[order[j]]);
    }
    for (std::size_t i = 0; i < count; ++i) {
      if (out[i] == 0.0f) continue;
      for (std::size_t r = 0; r < Rows; ++r) {
        const auto b = hashes.at(r, i).first;
        u[b] = 0;
        e[b] = 0;
      }
    }
    return out;
  }
};

/// FetchSGD over four steps: bitwise the serial reference, every rank alike; a state saved
/// after two steps and restored gives the same last two steps.
template <class Topology>
void check_fetchsgd() {
  const squall::fetchsgd_compressor<3, 64> c{.seed = 9, .heavy_hitters = 12, .momentum = 0.5};
  for (int p = 1; p <= 4; ++p) {
    for (const std::size_t count : counts_for(p)) {
      CAPTURE(p);
      CAPTURE(count);
      const auto input = [count](int r, int s) { return exact_step_input(r, s, count); };
      const auto records = run_compressed<Topology>(p, c, count, 4, input);
      check_bitwise_equal(records);
      fetchsgd_reference<3, 64> want{c};
      for (int s = 0; s < 4; ++s) {
        CAPTURE(s);
        REQUIRE(records[0].out[static_cast<std::size_t>(s)] ==
                want.step(all_inputs(p, s, count, true), count));
      }
      std::vector<std::vector<std::byte>> saved;
      for (const auto& r : run_compressed<Topology>(p, c, count, 2, input))
        saved.push_back(r.saved);
      const auto resumed =
          run_compressed<Topology>(p, c, count, 2, input, tiny_pieces, 4096, {}, &saved);
      for (std::size_t s = 0; s < 2; ++s) REQUIRE(resumed[0].out[s] == records[0].out[s + 2]);
    }
  }
}

/// Count sketch's two rounds, with and without error feedback, over three steps: bitwise the
/// serial reference, every rank alike, the residuals the reference's.
template <class Topology>
void check_two_round() {
  using C = squall::count_sketch_compressor<3, 64>;
  const C c{.seed = 6, .heavy_hitters = 12};
  squall::collective_tuning tuning = tiny_pieces;
  tuning.aggregation = squall::aggregation::two_round;
  for (int p = 1; p <= 4; ++p) {
    for (const std::size_t count : counts_for(p)) {
      CAPTURE(p);
      CAPTURE(count);
      const auto input = [count](int r, int s) { return exact_step_input(r, s, count); };
      const auto plain = run_compressed<Topology>(p, c, count, 3, input, tuning);
      const auto fed =
          run_compressed<Topology>(p, squall::error_feedback<C>{c}, count, 3, input, tuning);
      check_bitwise_equal(plain);
      check_bitwise_equal(fed);
      squall::test::two_round_reference<3, 64> want_plain{c, false, {}};
      squall::test::two_round_reference<3, 64> want_fed{c, true, {}};
      for (int s = 0; s < 3; ++s) {
        CAPTURE(s);
        const auto in = all_inputs(p, s, count, true);
        const auto step = static_cast<std::uint64_t>(s);
        REQUIRE(plain[0].out[static_cast<std::size_t>(s)] == want_plain.step(in, count, step));
        REQUIRE(fed[0].out[static_cast<std::size_t>(s)] == want_fed.step(in, count, step));
      }
      for (std::size_t q = 0; q < fed.size(); ++q) {
        CAPTURE(q);
        const std::vector<double>& want = want_fed.residual[q];
        REQUIRE(fed[q].residual == std::vector<float>(want.begin(), want.end()));
      }
    }
  }
}

/// hq: linear, bitwise the serial reference (the ranks' payloads against the agreed range,
/// their bodies added as integers, decoded once); gathered, the payloads of one rank per field
/// decoded and summed in rank order.
template <class Topology>
void check_homomorphic() {
  const squall::homomorphic_compressor c{.bits = 4, .seed = 8};
  for (int p = 1; p <= 4; ++p) {
    for (const std::size_t count : counts_for(p)) {
      CAPTURE(p);
      CAPTURE(count);
      const auto input = [count](int r, int s) { return random_input(r, s, count); };
      const auto linear = run_compressed<Topology>(p, c, count, 2, input);
      squall::collective_tuning gather = tiny_pieces;
      gather.aggregation = squall::aggregation::gather;
      const auto gathered = run_compressed<Topology>(p, c, count, 2, input, gather);
      check_bitwise_equal(linear);
      check_bitwise_equal(gathered);
      for (int s = 0; s < 2; ++s) {
        const auto in = all_inputs(p, s, count, false);
        const auto step = static_cast<std::uint64_t>(s);
        REQUIRE(linear[0].out[static_cast<std::size_t>(s)] ==
                squall::test::hq_reference(c, in, step));
        REQUIRE(gathered[0].out[static_cast<std::size_t>(s)] ==
                squall::test::hq_gather_reference(c, in, step));
      }
    }
  }
}

// ---- gather then reduce ------------------------------------------------------------------

template <class Topology, class C, class Op = squall::sum_op>
void check_gather(const C& c) {
  for (int p = 1; p <= 4; ++p) {
    for (const std::size_t count : counts_for(p)) {
      for (int variant = 0; variant < 2; ++variant) {  // messages; peers' memory
        CAPTURE(p);
        CAPTURE(count);
        CAPTURE(variant);
        const auto input = [count](int r, int s) { return random_input(r, s, count); };
        const auto records =
            variant == 0
                ? run_compressed<Topology, C, float, Op>(p, c, count, 2, input, tiny_pieces, 4096)
                : run_compressed<Topology, C, float, Op>(p, c, count, 2, input, peer_memory, 0);
        check_bitwise_equal(records);
        for (int s = 0; s < 2; ++s) {
          const auto in = all_inputs(p, s, count, false);
          std::vector<float> want =
              squall::compression_traits<C>::majority_vote
                  ? squall::test::vote_reference(c, in, static_cast<std::uint64_t>(s))
                  : squall::test::gather_reference(c, in, static_cast<std::uint64_t>(s));
          if constexpr (std::is_same_v<Op, squall::avg_op>) {
            for (auto& x : want) x = x / static_cast<float>(p);
          }
          REQUIRE(records[0].out[static_cast<std::size_t>(s)] == want);
        }
      }
    }
  }
}

template <class Topology>
void check_every_gather_compressor() {
  check_gather<Topology>(squall::int8_compressor{.bucket = 64});
  check_gather<Topology>(squall::fp8_compressor{.format = squall::fp8_format::e5m2, .bucket = 64});
  check_gather<Topology>(squall::fp8_compressor{.stochastic = true, .bucket = 64, .seed = 3});
  check_gather<Topology>(squall::qsgd_compressor<4>{.bucket = 64, .seed = 3});
  check_gather<Topology>(squall::terngrad_compressor{.bucket = 64, .seed = 9});
  check_gather<Topology>(squall::sign_compressor{.bucket = 64});
  check_gather<Topology>(squall::sign_vote_compressor{});
  check_gather<Topology>(squall::topk_compressor{.ratio = 0.1});
  check_gather<Topology>(squall::threshold_compressor{.tau = 0.5});
  check_gather<Topology>(squall::chain<squall::topk_compressor, squall::int4_compressor>{
      {.ratio = 0.1}, {.bucket = 64}});
}

// ---- PowerSGD ----------------------------------------------------------------------------

/// Rank r's 12 x 10 input of rank 2: (r + 1) u1 v1^T + (1 + r / 4) u2 v2^T.
std::vector<float> low_rank_input(int r, std::size_t rows, std::size_t cols) {
  std::vector<float> m(rows * cols);
  for (std::size_t i = 0; i < rows; ++i) {
    for (std::size_t j = 0; j < cols; ++j) {
      const double u1 = 0.1 * static_cast<double>(i) - 0.5;
      const double v1 = std::cos(0.7 * static_cast<double>(j));
      const double u2 = (i % 3 == 0) ? 1.0 : -0.25;
      const double v2 = 0.05 * static_cast<double>(j * j) - 1.0;
      m[i * cols + j] = static_cast<float>((r + 1) * u1 * v1 + (1 + r / 4.0) * u2 * v2);
    }
  }
  return m;
}

template <class Topology>
void check_powersgd() {
  const squall::powersgd_compressor c{.rank = 2, .columns = 10, .seed = 4};
  for (int p = 1; p <= 4; ++p) {
    CAPTURE(p);
    const auto records = run_compressed<Topology>(
        p, c, 120, 3, [](int r, int) { return low_rank_input(r, 12, 10); });
    check_bitwise_equal(records);
    std::vector<double> want(120, 0.0);
    double largest = 0;
    for (int q = 0; q < p; ++q) {
      const auto m = low_rank_input(q, 12, 10);
      for (std::size_t i = 0; i < 120; ++i) want[i] += m[i];
    }
    for (const double x : want) largest = std::max(largest, std::fabs(x));
    for (int s = 0; s < 3; ++s) {  // exact from the first step, and warm-started after
      CAPTURE(s);
      for (std::size_t i = 0; i < 120; ++i) {
        REQUIRE(std::fabs(records[0].out[static_cast<std::size_t>(s)][i] - want[i]) <=
                1e-4 * largest);
      }
    }
    // counts 0 and 1 (a 1 x 1 view of rank 1 <= r: exact)
    const auto one = run_compressed<Topology>(
        p, c, 1, 1, [](int r, int) { return std::vector<float>{static_cast<float>(r) + 0.5f}; });
    check_bitwise_equal(one);
    REQUIRE(std::fabs(one[0].out[0][0] - (p * p / 2.0)) <= 1e-5 * p * p);
    const auto none =
        run_compressed<Topology>(p, c, 0, 1, [](int, int) { return std::vector<float>{}; });
    REQUIRE(none[0].out[0].empty());
  }
}

// ---- error feedback ----------------------------------------------------------------------

/// Over `steps` calls: the results plus every rank's final residual add up to all inputs.
template <class Topology, class C>
void check_conservation(const C& c, double tolerance) {
  constexpr int steps = 5;
  for (int p : {1, 3, 4}) {
    constexpr std::size_t count = 333;
    CAPTURE(p);
    const auto records = run_compressed<Topology>(
        p, c, count, steps, [](int r, int s) { return random_input(r, s, count); });
    check_bitwise_equal(records);
    for (std::size_t i = 0; i < count; ++i) {
      double inputs = 0;
      double kept = 0;
      for (int s = 0; s < steps; ++s) {
        for (const auto& x : all_inputs(p, s, count, false)) inputs += x[i];
        kept += records[0].out[static_cast<std::size_t>(s)][i];
      }
      for (const auto& rec : records) kept += rec.residual[i];
      if (std::fabs(kept - inputs) > tolerance) {
        CAPTURE(i);
        CAPTURE(kept);
        CAPTURE(inputs);
        REQUIRE(std::fabs(kept - inputs) <= tolerance);
      }
    }
    // the residual is not zero: something was held back
    double held = 0;
    for (const double x : records[0].residual) held += std::fabs(x);
    CHECK(held > 0);
  }
}

using squall::test::what_of;

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

}  // namespace

#define SQUALL_LINEAR_TOPOLOGIES                                          \
  squall::ring_topology, squall::tree_topology, squall::direct_topology,  \
      squall::halving_doubling_topology, squall::hierarchical_topology<>, \
      squall::automatic_topology

TEST_SUITE("compressed_collectives") {
  TEST_CASE_TEMPLATE(
      "linear: cast to float16 and bfloat16 through the topology, within rounding per hop",
      Topology, SQUALL_LINEAR_TOPOLOGIES) {
    check_cast<Topology, squall::float16>();
    check_cast<Topology, squall::bfloat16>();
  }

  TEST_CASE_TEMPLATE("linear: randomk is the exact sum at the step's indices, zero elsewhere",
                     Topology, SQUALL_LINEAR_TOPOLOGIES) {
    check_randomk<Topology>();
  }

  TEST_CASE_TEMPLATE("linear: count_sketch is the decode of the sum's sketch", Topology,
                     SQUALL_LINEAR_TOPOLOGIES) {
    check_count_sketch<Topology>();
  }

  TEST_CASE_TEMPLATE("linear: fetchsgd, momentum and error in sketch space (serial reference)",
                     Topology, SQUALL_LINEAR_TOPOLOGIES) {
    check_fetchsgd<Topology>();
  }

  TEST_CASE_TEMPLATE("two_round: count sketch's k coordinates, their exact sums (serial reference)",
                     Topology, squall::ring_topology, squall::direct_topology,
                     squall::tree_topology) {
    check_two_round<Topology>();
  }

  TEST_CASE_TEMPLATE("linear: hq, the integer sum of the payloads against the agreed range",
                     Topology, SQUALL_LINEAR_TOPOLOGIES) {
    check_homomorphic<Topology>();
  }

  TEST_CASE_TEMPLATE("gather then reduce: the serial sum of every rank's decoded payload", Topology,
                     squall::ring_topology, squall::tree_topology, squall::direct_topology,
                     squall::hierarchical_topology<>) {
    check_every_gather_compressor<Topology>();
  }

  TEST_CASE("identity: the compressed path with no compression is the plain sum") {
    for (int p = 1; p <= 4; ++p) {
      CAPTURE(p);
      constexpr std::size_t count = 1009;
      const auto records = run_compressed<squall::ring_topology>(
          p, squall::identity_compressor{}, count, 1,
          [](int r, int) { return squall::test::exact_input<float>(r, count); });
      check_bitwise_equal(records);
      for (std::size_t i = 0; i < count; ++i) {
        REQUIRE(records[0].out[0][i] == squall::test::exact_reference<float, squall::sum_op>(p, i));
      }
    }
  }

  TEST_CASE("gather then reduce, avg: the serial sum divided by P") {
    check_gather<squall::ring_topology, squall::int8_compressor, squall::avg_op>(
        squall::int8_compressor{.bucket = 64});
    check_gather<squall::direct_topology, squall::topk_compressor, squall::avg_op>(
        squall::topk_compressor{.ratio = 0.2});
    check_gather<squall::tree_topology, squall::sign_vote_compressor, squall::avg_op>(
        squall::sign_vote_compressor{});
  }

  TEST_CASE("sign_vote: majority of the signs times the sum of the scales, ties zero") {
    // two ranks of opposite sign tie (0); three ranks: 2 to 1
    const auto records = run_compressed<squall::ring_topology>(
        3, squall::sign_vote_compressor{}, 4, 1, [](int r, int) {
          return r == 0   ? std::vector<float>{1, -1, 2, -2}
                 : r == 1 ? std::vector<float>{2, -2, -4, 4}
                          : std::vector<float>{-3, 3, 6, -6};
        });
    // mean |g|: 1.5, 3, 4.5; signs per element: (+,+,-), (-,-,+), (+,-,+), (-,+,-)
    const float scales = 1.5f + 3.0f + 4.5f;
    CHECK(records[0].out[0] == std::vector<float>{scales, -scales, scales, -scales});
    const auto tie = run_compressed<squall::ring_topology>(
        2, squall::sign_vote_compressor{}, 2, 1, [](int r, int) {
          return r == 0 ? std::vector<float>{1, 1} : std::vector<float>{-1, 1};
        });
    CHECK(tie[0].out[0] == std::vector<float>{0, 2});
  }

  TEST_CASE_TEMPLATE("powersgd: exact on inputs of rank <= r, warm-started, every rank alike",
                     Topology, squall::ring_topology, squall::tree_topology,
                     squall::direct_topology, squall::halving_doubling_topology,
                     squall::hierarchical_topology<>) {
    check_powersgd<Topology>();
  }

  TEST_CASE("powersgd avg: the mean") {
    const squall::powersgd_compressor c{.rank = 2, .columns = 10};
    const auto records =
        run_compressed<squall::ring_topology, squall::powersgd_compressor, float, squall::avg_op>(
            3, c, 120, 1, [](int r, int) { return low_rank_input(r, 12, 10); });
    for (std::size_t i = 0; i < 120; ++i) {
      double want = 0;
      for (int q = 0; q < 3; ++q) want += low_rank_input(q, 12, 10)[i];
      REQUIRE(std::fabs(records[0].out[0][i] - want / 3) <= 1e-4);
    }
  }

  TEST_CASE("powersgd: a state's own view (each rank a rank-1 16 x 25 layer) sums exactly") {
    // at rank 4 the sum of P <= 4 rank-1 matrices is exact in their 16 x 25 view; the same
    // elements in the default 20 x 20 view are not of rank 4, which shows the view is used
    const squall::powersgd_compressor c{.rank = 4, .seed = 6};
    const std::size_t count = 400;
    const auto layer = [](int r) {
      std::vector<float> m(count);
      for (std::size_t i = 0; i < 16; ++i) {
        for (std::size_t j = 0; j < 25; ++j) {
          m[i * 25 + j] = static_cast<float>(std::sin(0.3 * static_cast<double>(i * (r + 1)) + r) *
                                             std::cos(0.45 * static_cast<double>(j) * (r + 2)));
        }
      }
      return m;
    };
    for (int p = 1; p <= 4; ++p) {
      CAPTURE(p);
      std::vector<double> want(count, 0.0);
      for (int q = 0; q < p; ++q) {
        const auto m = layer(q);
        for (std::size_t i = 0; i < count; ++i) want[i] += m[i];
      }
      std::vector<std::vector<float>> own(static_cast<std::size_t>(p));
      std::vector<std::vector<float>> square(static_cast<std::size_t>(p));
      std::atomic<int> refused{0};
      run_ranks(p, [&](inproc_transport& t) {
        const int r = t.rank();
        squall::communicator<inproc_transport, squall::ring_topology, squall::powersgd_compressor>
            comm(std::move(t), squall::ring_topology{}, c);
        auto own_state = comm.make_state<float>(count, squall::powersgd_shape::of(count, 25));
        auto square_state = comm.make_state<float>(count);
        auto& mine = own[static_cast<std::size_t>(r)];
        for (int step = 0; step < 2; ++step) {  // fresh and warm-started
          mine = layer(r);
          comm.allreduce(squall::host_view<float>(mine), own_state);
        }
        auto& sq = square[static_cast<std::size_t>(r)];
        sq = layer(r);
        comm.allreduce(squall::host_view<float>(sq), square_state);
        try {
          (void)comm.make_state<float>(count, squall::powersgd_shape{17, 25});
        } catch (const squall::invalid_argument&) {
          ++refused;
        }
      });
      CHECK(refused == p);
      double largest = 0, square_error = 0;
      for (const double x : want) largest = std::max(largest, std::fabs(x));
      for (int r = 0; r < p; ++r) {
        REQUIRE(own[static_cast<std::size_t>(r)] == own[0]);
        for (std::size_t i = 0; i < count; ++i) {
          REQUIRE(std::fabs(own[static_cast<std::size_t>(r)][i] - want[i]) <= 1e-4 * largest);
          square_error =
              std::max(square_error, std::fabs(square[static_cast<std::size_t>(r)][i] - want[i]));
        }
      }
      CHECK(square_error > 0.01 * largest);
    }
  }

  TEST_CASE("error feedback: results plus residuals add up to the inputs") {
    using squall::error_feedback;
    check_conservation<squall::ring_topology>(
        error_feedback<squall::topk_compressor>{{.ratio = 0.05}}, 1e-4);
    check_conservation<squall::direct_topology>(
        error_feedback<squall::sign_compressor>{{.bucket = 64}}, 1e-4);
    check_conservation<squall::tree_topology>(
        error_feedback<squall::int8_compressor>{{.bucket = 64}}, 1e-4);
    check_conservation<squall::ring_topology>(
        error_feedback<squall::qsgd_compressor<2>>{{.bucket = 64, .seed = 1}}, 1e-4);
    check_conservation<squall::ring_topology>(
        error_feedback<squall::randomk_compressor>{{.ratio = 0.1, .seed = 2}}, 1e-4);
    check_conservation<squall::tree_topology>(
        error_feedback<squall::homomorphic_compressor>{{.bits = 3, .seed = 4}}, 1e-4);
    using cocktail = squall::chain<squall::randomk_compressor,
                                   squall::chain<squall::topk_compressor, squall::int4_compressor>>;
    check_conservation<squall::ring_topology>(
        error_feedback<cocktail>{{{.ratio = 0.5, .seed = 5}, {{.ratio = 0.2}, {.bucket = 64}}}},
        1e-4);
    // bfloat16: the sums are rounded per hop, which error feedback does not see
    check_conservation<squall::ring_topology>(
        error_feedback<squall::cast_compressor<squall::bfloat16>>{}, 5 * 2 * 4 * 8.0 / 256);
    check_conservation<squall::halving_doubling_topology>(
        error_feedback<squall::powersgd_compressor>{{.rank = 1, .columns = 0, .seed = 3}}, 1e-4);
  }

  TEST_CASE("state: save and restore, and resuming gives the same results") {
    using C = squall::error_feedback<squall::topk_compressor>;
    const C c{{.ratio = 0.1}};
    constexpr std::size_t count = 100;
    const auto input = [](int r, int s) { return random_input(r, s, count); };
    const auto straight = run_compressed<squall::ring_topology>(3, c, count, 4, input);
    const auto first = run_compressed<squall::ring_topology>(3, c, count, 2, input);
    std::vector<std::vector<std::byte>> saved;
    for (const auto& rec : first) saved.push_back(rec.saved);
    const auto resumed =
        run_compressed<squall::ring_topology>(3, c, count, 2, input, tiny_pieces, 4096, {}, &saved);
    for (std::size_t r = 0; r < 3; ++r) {
      REQUIRE(resumed[r].out[0] == straight[r].out[2]);
      REQUIRE(resumed[r].out[1] == straight[r].out[3]);
      REQUIRE(resumed[r].saved == straight[r].saved);
    }
    squall::compression_state<C, float> state(c, count);
    state.restore(squall::host_view<const std::byte>(saved[1]));
    CHECK(state.step() == 2);
    CHECK(std::vector<float>(state.residual().residual().data(),
                             state.residual().residual().data() + count) == first[1].residual);
    CHECK(state.save() == saved[1]);
  }

  TEST_CASE("state: another compressor, element type or count is refused, and the state kept") {
    using C = squall::error_feedback<squall::topk_compressor>;
    const std::size_t count = 100;
    squall::compression_state<C, float> made(C{}, count);
    made.set_step(7);
    const std::vector<std::byte> bytes = made.save();
    const squall::host_view<const std::byte> view(bytes);

    squall::compression_state<squall::error_feedback<squall::int8_compressor>, float> other(count);
    CHECK(contains(what_of([&] { other.restore(view); }), "error_feedback<topk>"));
    squall::compression_state<squall::topk_compressor, float> plain(count);
    CHECK(contains(what_of([&] { plain.restore(view); }), "compressor"));
    squall::compression_state<C, double> wide(count);
    CHECK(contains(what_of([&] { wide.restore(view); }), "float32"));
    squall::compression_state<C, float> longer(count + 1);
    CHECK(contains(what_of([&] { longer.restore(view); }), "100 elements restored for 101"));
    CHECK(longer.step() == 0);
    squall::compression_state<C, float> same(count);
    CHECK(contains(what_of([&] { same.restore(view.subview(0, view.count() - 1)); }), "checksum"));
    std::vector<std::byte> longer_bytes = bytes;
    longer_bytes.push_back(std::byte{0});
    CHECK(contains(what_of([&] { same.restore(squall::host_view<const std::byte>(longer_bytes)); }),
                   "checksum mismatch"));
    // every single changed byte is refused (the checksum, or the magic and version before it)
    std::size_t accepted = 0;
    for (std::size_t i = 0; i < bytes.size(); ++i) {
      std::vector<std::byte> changed = bytes;
      changed[i] ^= std::byte{0x10};
      try {
        same.restore(squall::host_view<const std::byte>(changed));
        ++accepted;
      } catch (const squall::invalid_argument&) {
      }
    }
    CHECK(accepted == 0);
    // a version-1 state (no checksum: saved before it existed) still restores, and is checked
    // structurally: a byte too many is refused after the sub-states
    std::vector<std::byte> version1(bytes.begin(), bytes.end() - 8);
    version1[4] = std::byte{1};
    squall::compression_state<C, float> old_format(count);
    old_format.restore(squall::host_view<const std::byte>(version1));
    CHECK(old_format.step() == 7);
    version1.push_back(std::byte{0});
    CHECK(contains(what_of([&] { same.restore(squall::host_view<const std::byte>(version1)); }),
                   "after the sub-states"));
    std::vector<std::byte> foreign = bytes;
    foreign[0] = std::byte{0};
    CHECK(contains(what_of([&] { same.restore(squall::host_view<const std::byte>(foreign)); }),
                   "not a saved compression state"));
    CHECK(same.step() == 0);
    same.restore(view);
    CHECK(same.step() == 7);

    // PowerSGD: Q saved and restored; another view shape is refused
    const squall::powersgd_compressor p{.rank = 2, .columns = 10, .seed = 1};
    squall::compression_state<squall::powersgd_compressor, float> ps(p, 120);
    const auto ps_bytes = ps.save();
    squall::compression_state<squall::powersgd_compressor, float> ps_back(
        squall::powersgd_compressor{.rank = 2, .columns = 10, .seed = 99}, 120);
    ps_back.restore(squall::host_view<const std::byte>(ps_bytes));
    CHECK(ps_back.save() == ps_bytes);
    squall::compression_state<squall::powersgd_compressor, float> ps_other(
        squall::powersgd_compressor{.rank = 2, .columns = 12}, 120);
    CHECK(contains(what_of([&] { ps_other.restore(squall::host_view<const std::byte>(ps_bytes)); }),
                   "low-rank state of 12 x 10 rank 2 restored for 10 x 12 rank 2"));
  }

  TEST_CASE("check_finite: a NaN or infinity on one rank stops every rank before sending") {
    using C = squall::error_feedback<squall::int8_compressor>;
    const std::size_t count = 1000;
    for (const float bad :
         {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
      CAPTURE(bad);
      std::vector<std::string> what(3);
      std::vector<std::vector<float>> residual(3), after(3);
      run_ranks(3, [&](inproc_transport& t) {
        const int r = t.rank();
        const auto me = static_cast<std::size_t>(r);
        squall::communicator<inproc_transport, squall::ring_topology, C> comm(
            std::move(t), {}, C{}, {.check_finite = true},
            {.aggregation = squall::aggregation::gather});
        auto state = comm.make_state<float>(count);
        std::vector<float> data(count, static_cast<float>(r + 1));
        if (r == 1) data[17] = bad;
        what[me] = what_of([&] { comm.allreduce(squall::host_view<float>(data), state); });
        const auto res = state.residual().residual();
        residual[me].assign(res.data(), res.data() + res.count());
        after[me].assign(count, static_cast<float>(r + 1));  // the next call, clean
        comm.allreduce(squall::host_view<float>(after[me]), state);
      });
      for (std::size_t r = 0; r < 3; ++r) {
        CAPTURE(r);
        CHECK(contains(what[r], "rank 1's input has a NaN or infinity at element 17"));
        CHECK(std::all_of(residual[r].begin(), residual[r].end(), [](float x) { return x == 0; }));
        CHECK(std::all_of(after[r].begin(), after[r].end(),
                          [](float x) { return std::fabs(x - 6.0f) < 1e-4f; }));
      }
    }
  }

  TEST_CASE("a state of another count is refused, naming both counts") {
    const std::string what = what_of([] {
      run_ranks(2, [](inproc_transport& t) {
        squall::communicator<inproc_transport, squall::ring_topology, squall::int8_compressor> comm(
            std::move(t));
        auto state = comm.make_state<float>(5);
        std::vector<float> data(4, 1.0f);
        comm.allreduce(squall::host_view<float>(data), state);
      });
    });
    CHECK(contains(what, "state of 5 elements used for data of 4 elements"));
  }

  TEST_CASE(
      "staged (a device backend over a host transport): per_hop and gtopk refused, gather "
      "chosen") {
    using squall::aggregation;
    using device = squall::test::deferred_device_backend;
    // int8 allows per_hop then gather: automatic takes gather where it stages
    run_ranks(2, [](inproc_transport& t) {
      squall::communicator<inproc_transport, squall::ring_topology, squall::int8_compressor, device>
          comm(std::move(t));
      CHECK(comm.aggregation() == aggregation::gather);
    });
    run_ranks(2, [](inproc_transport& t) {
      squall::communicator<inproc_transport, squall::ring_topology, squall::int8_compressor> comm(
          std::move(t));
      CHECK(comm.aggregation() == aggregation::per_hop);
    });
    for (const aggregation asked : {aggregation::per_hop, aggregation::gtopk}) {
      CAPTURE(squall::to_string(asked));
      const std::string what = what_of([asked] {
        run_ranks(1, [asked](inproc_transport& t) {
          auto tuning = squall::collective_tuning{.aggregation = asked};
          if (asked == aggregation::per_hop) {
            squall::communicator<inproc_transport, squall::ring_topology, squall::int8_compressor,
                                 device>
                comm(std::move(t), {}, squall::int8_compressor{}, {}, tuning);
            (void)comm.aggregation();
          } else {
            squall::communicator<inproc_transport, squall::ring_topology, squall::topk_compressor,
                                 device>
                comm(std::move(t), {}, squall::topk_compressor{}, {}, tuning);
            (void)comm.aggregation();
          }
        });
      });
      CHECK(
          contains(what, "aggregation " + std::string(squall::to_string(asked)) +
                             " moves payloads over the transport itself and does not run staged"));
    }
  }

  TEST_CASE("ranks at different steps, or one dense and one compressed, get mismatch_error") {
    for (int variant = 0; variant < 2; ++variant) {
      CAPTURE(variant);
      std::string what = "(nothing thrown)";
      try {
        run_ranks(2, [variant](inproc_transport& t) {
          squall::communicator<inproc_transport, squall::ring_topology, squall::randomk_compressor>
              comm(std::move(t));
          const int r = comm.rank();
          auto state = comm.make_state<float>(10);
          if (r == 1) state.set_step(3);
          std::vector<float> data(10, 1.0f);
          if (variant == 1 && r == 0) {
            comm.allreduce(squall::host_view<float>(data));
          } else {
            comm.allreduce(squall::host_view<float>(data), state);
          }
        });
      } catch (const squall::mismatch_error& e) {
        what = e.what();
      }
      CHECK(contains(what, variant == 0 ? "at step 3" : "compressed (linear), at step"));
    }
  }

  TEST_CASE("ranks tuned for different algorithms get mismatch_error naming both, not a hang") {
    for (int variant = 0; variant < 2; ++variant) {
      CAPTURE(variant);
      std::string what = "(nothing thrown)";
      try {
        run_ranks(2, [variant](inproc_transport& t) {
          const bool first = t.rank() == 0;
          squall::collective_tuning tuning;
          std::vector<float> data(12, 1.0f);
          if (variant == 0) {  // sparse: gTop-k on rank 0, the allgather-union on rank 1
            tuning.aggregation = first ? squall::aggregation::gtopk : squall::aggregation::gather;
            squall::communicator<inproc_transport, squall::ring_topology, squall::topk_compressor>
                comm(std::move(t), {}, squall::topk_compressor{.ratio = 0.25}, {}, tuning);
            auto state = comm.make_state<float>(data.size());
            comm.allreduce(squall::host_view<float>(data), state);
          } else {  // requantize: per hop on rank 0, gather on rank 1
            tuning.aggregation = first ? squall::aggregation::per_hop : squall::aggregation::gather;
            squall::communicator<inproc_transport, squall::ring_topology, squall::int8_compressor>
                comm(std::move(t), {}, squall::int8_compressor{}, {}, tuning);
            auto state = comm.make_state<float>(data.size());
            comm.allreduce(squall::host_view<float>(data), state);
          }
        });
      } catch (const squall::mismatch_error& e) {
        what = e.what();
      }
      CHECK(contains(what, variant == 0 ? "compressed (gtopk)" : "compressed (per_hop)"));
      CHECK(contains(what, "compressed (gather)"));
    }
  }

  TEST_CASE("transfer stats: the bytes each rank moved") {
    const squall::options no_check{.check_mismatch = false};
    for (int p = 1; p <= 4; ++p) {
      CAPTURE(p);
      const auto up = static_cast<std::uint64_t>(p);
      constexpr std::size_t count = 1200;  // divisible by 1..4: ring blocks of equal size
      const auto input = [](int r, int s) { return random_input(r, s, count); };
      // gather, fixed size: P - 1 payloads (padded to 8 bytes) out and in, on ring and direct
      const squall::int8_compressor q8{.bucket = 64};
      const std::uint64_t q8_bytes =
          (q8.max_payload_bytes(squall::dtype::float32, count) + 7) / 8 * 8;
      for (const auto& rec : run_compressed<squall::ring_topology>(p, q8, count, 1, input,
                                                                   messages_only, 0, no_check)) {
        CHECK(rec.stats.bytes_sent == (up - 1) * q8_bytes);
        CHECK(rec.stats.bytes_received == (up - 1) * q8_bytes);
      }
      for (const auto& rec : run_compressed<squall::direct_topology>(p, q8, count, 1, input,
                                                                     messages_only, 0, no_check)) {
        CHECK(rec.stats.bytes_sent == (up - 1) * q8_bytes);
        CHECK(rec.stats.bytes_received == (up - 1) * q8_bytes);
      }
      // gather, sizes vary: an 8-byte size to every peer first
      const squall::topk_compressor top{.ratio = 0.05};
      const std::uint64_t top_bytes =
          (top.max_payload_bytes(squall::dtype::float32, count) + 7) / 8 * 8;
      for (const auto& rec : run_compressed<squall::direct_topology>(p, top, count, 1, input,
                                                                     messages_only, 0, no_check)) {
        CHECK(rec.stats.bytes_sent == (up - 1) * (8 + top_bytes));
        CHECK(rec.stats.bytes_received == (up - 1) * (8 + top_bytes));
      }
      // linear on a ring: the body (2 bytes an element) crosses P - 1 links in each half
      const auto cast =
          run_compressed<squall::ring_topology>(p, squall::cast_compressor<squall::float16>{},
                                                count, 1, input, messages_only, 0, no_check);
      for (const auto& rec : cast) {
        CHECK(rec.stats.bytes_sent == 2 * (up - 1) * (2 * count) / up);
        CHECK(rec.stats.bytes_received == rec.stats.bytes_sent);
      }
      // PowerSGD on a ring: P (m r) and Q (c r) each summed by a ring allreduce
      const squall::powersgd_compressor ps{.rank = 2, .columns = 24};  // 50 x 24
      std::uint64_t sent = 0;
      for (const auto& rec : run_compressed<squall::ring_topology>(p, ps, count, 1, input,
                                                                   messages_only, 0, no_check)) {
        sent += rec.stats.bytes_sent;
      }
      CHECK(sent == 2 * (up - 1) * (50 * 2 + 24 * 2) * 4);
      // the dense allreduce reports too: 4 bytes an element
      std::vector<squall::transfer_stats> dense(static_cast<std::size_t>(p));
      run_ranks(p, [&](inproc_transport& t) {
        const int r = t.rank();
        squall::communicator<inproc_transport, squall::ring_topology> comm(std::move(t), {},
                                                                           no_check, messages_only);
        std::vector<float> data = random_input(r, 0, count);
        comm.allreduce(squall::host_view<float>(data));
        dense[static_cast<std::size_t>(r)] = comm.last_transfer();
      });
      for (const auto& s : dense) {
        CHECK(s.bytes_sent == 2 * (up - 1) * (4 * count) / up);
        CHECK(s.bytes_received == s.bytes_sent);
      }
      // the one-shot schedule through the windows, and through the peers' memory (which
      // first swaps its kind, size, two addresses and their registrations, 48 bytes, with every
      // peer): every rank reads its slice out of P - 1 peers and every other slice back, so 2 (P -
      // 1) x bytes over all ranks
      for (const bool through_memory : {false, true}) {
        CAPTURE(through_memory);
        std::vector<squall::transfer_stats> one_shot(static_cast<std::size_t>(p));
        run_ranks(
            p,
            [&](inproc_transport& t) {
              const int r = t.rank();
              squall::communicator<inproc_transport, squall::direct_topology> comm(
                  std::move(t), {}, no_check, through_memory ? peer_memory : tiny_pieces);
              std::vector<float> data = random_input(r, 0, count);
              comm.allreduce(squall::host_view<float>(data));
              one_shot[static_cast<std::size_t>(r)] = comm.last_transfer();
            },
            {}, through_memory ? 0 : 4096);
        std::uint64_t all_sent = 0;
        std::uint64_t all_received = 0;
        for (const auto& s : one_shot) {
          all_sent += s.bytes_sent;
          all_received += s.bytes_received;
        }
        // each rank's 48-byte table entry (kind, bytes, two addresses, their registrations) to
        // every peer
        const std::uint64_t addresses = through_memory ? 48 * up * (up - 1) : 0;
        CHECK(all_sent == 2 * (up - 1) * 4 * count + addresses);
        CHECK(all_received == all_sent);
      }
    }
  }

  TEST_CASE_TEMPLATE("phase split: each phase its algorithm has, adding up to within the call", C,
                     squall::int8_compressor, squall::cast_compressor<squall::bfloat16>,
                     squall::powersgd_compressor, squall::topk_compressor) {
    // gather (int8 asked to gather), linear (cast), low_rank (powersgd) and gtopk (topk)
    // mark encode, transfer and decode; per-hop requantization (int8 by default on a ring)
    // counts all of its hops as transfer. Each call's split is its own (reset per call).
    using clock = std::chrono::steady_clock;
    const std::size_t count = 1 << 14;
    for (const bool per_hop : {false, true}) {
      if (per_hop && !std::same_as<C, squall::int8_compressor>) continue;
      CAPTURE(per_hop);
      squall::collective_tuning tuning = messages_only;
      if constexpr (std::same_as<C, squall::topk_compressor>)
        tuning.aggregation = squall::aggregation::gtopk;
      if constexpr (std::same_as<C, squall::int8_compressor>) {
        tuning.aggregation = per_hop ? squall::aggregation::per_hop : squall::aggregation::gather;
      }
      std::vector<std::vector<squall::phase_split>> splits(2);
      std::vector<std::vector<double>> walls(2);
      run_ranks(2, [&](inproc_transport& t) {
        const int r = t.rank();
        squall::communicator<inproc_transport, squall::ring_topology, C> comm(std::move(t), {}, C{},
                                                                              {}, tuning);
        auto state = comm.template make_state<float>(count);
        CHECK(comm.last_split().encode + comm.last_split().transfer + comm.last_split().decode ==
              0.0);
        for (int step = 0; step < 2; ++step) {
          std::vector<float> data = random_input(r, step, count);
          const auto start = clock::now();
          comm.allreduce(squall::host_view<float>(data), state);
          walls[static_cast<std::size_t>(r)].push_back(
              std::chrono::duration<double>(clock::now() - start).count());
          splits[static_cast<std::size_t>(r)].push_back(comm.last_split());
        }
      });
      for (std::size_t r = 0; r < 2; ++r) {
        for (std::size_t step = 0; step < 2; ++step) {
          CAPTURE(r);
          CAPTURE(step);
          const squall::phase_split& s = splits[r][step];
          CHECK(s.encode + s.transfer + s.decode <= walls[r][step]);
          CHECK(s.transfer > 0);
          CHECK(s.decode > 0);  // at least the final scaling's check
          if (per_hop)
            CHECK(s.encode == 0.0);
          else
            CHECK(s.encode > 0);
        }
      }
    }
  }
}
