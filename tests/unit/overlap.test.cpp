// SPDX-License-Identifier: Apache-2.0
// Overlap of a compressed allreduce's phases (collective_tuning::overlap_chunks,
// algorithm/compressed/overlap.hpp), ranks as threads over inproc_transport, 1 to 4 ranks:
// the chunk plans; compressors whose chunks encode as the whole tensor does give bitwise the
// unchunked results and residuals on the gather path (int8, threshold + error feedback), and
// cast on the linear path stays within its rounding bound of the exact sum; top-k in chunks is each
// chunk's own top-k summed over ranks (an independent serial reference in double); an encode that
// throws in a later chunk reaches every caller and the communicator works after it; ranks asking
// for different chunks get mismatch_error; the phase split says how many chunks ran.
#include <squall/algorithm/communicator.hpp>
#include <squall/compress/cast.hpp>
#include <squall/compress/error_feedback.hpp>
#include <squall/compress/quantize.hpp>
#include <squall/compress/sparsify.hpp>
#include <squall/topology/direct.hpp>
#include <squall/topology/ring.hpp>
#include <squall/transport/inproc.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>  // memcmp
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include "../support/data.hpp"
#include "../support/thread_ranks.hpp"

namespace {

using squall::inproc_transport;
using squall::detail::chunk_plan;
using squall::detail::plan_chunks;
using squall::test::run_ranks;

/// Rank r's input: near-Gaussian values, distinct per rank and element.
std::vector<float> input_of(int rank, std::size_t count) {
  return squall::test::normal_values<float>(count, 1000u + static_cast<unsigned>(rank));
}

/// What one rank got: its result, its residual (error feedback) and its last split.
struct outcome {
  std::vector<float> out;
  std::vector<float> residual;
  squall::phase_split split;
};

/// One compressed allreduce (sum) of `input_of(rank)` on `p` thread ranks with compressor `c`
/// over `Topology`, `chunks` asked for, twice from one state (the second call shows the
/// residual carried over).
template <class Topology, class C>
std::vector<outcome> run_chunked(int p, const C& c, std::size_t count, std::size_t chunks,
                                 squall::aggregation how = squall::aggregation::automatic) {
  std::vector<outcome> got(static_cast<std::size_t>(p));
  run_ranks(p, [&](inproc_transport& t) {
    const int r = t.rank();
    squall::collective_tuning tuning{.aggregation = how, .overlap_chunks = chunks};
    squall::communicator<inproc_transport, Topology, C> comm(std::move(t), {}, c, {}, tuning);
    auto state = comm.template make_state<float>(count);
    auto& mine = got[static_cast<std::size_t>(r)];
    for (int call = 0; call < 2; ++call) {
      mine.out = input_of(r + call, count);
      comm.allreduce(squall::host_view<float>(mine.out), state);
    }
    mine.split = comm.last_split();
    if constexpr (squall::is_error_feedback<C>) {
      const auto res = state.residual().residual();
      mine.residual.assign(res.data(), res.data() + res.count());
    }
  });
  return got;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](float x, float y) {
           return std::memcmp(&x, &y, sizeof x) == 0;
         });
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

}  // namespace

TEST_SUITE("overlap") {
  TEST_CASE("chunk plans: aligned, covering, automatic only where chunks mean the same") {
    // 4 chunks of 1,000 elements aligned to 64: 256, 256, 256, 232
    const chunk_plan a = plan_chunks(1000, 4, 4, 64, 0);
    CHECK(a.chunks == 4);
    CHECK(a.length == 256);
    CHECK(a.offset(3) + a.count_of(3) == 1000);
    std::size_t covered = 0;
    for (std::size_t c = 0; c < a.chunks; ++c) {
      CHECK(a.offset(c) % 64 == 0);
      covered += a.count_of(c);
    }
    CHECK(covered == 1000);
    // fewer chunks than asked where the tensor has fewer aligned units
    CHECK(plan_chunks(100, 4, 8, 64, 0).chunks == 2);
    CHECK(plan_chunks(10, 4, 8, 64, 0).chunks == 1);
    CHECK(plan_chunks(0, 4, 8, 1, 0).chunks == 1);
    CHECK(plan_chunks(5, 4, 8, 0, 0).chunks == 5);  // explicit: also without an alignment
    // automatic: one chunk per 4 MiB, at most 8, none without an alignment
    const std::size_t mib = std::size_t{1} << 20;
    CHECK(plan_chunks(mib, 4, 0, 1, 0).chunks == 1);
    CHECK(plan_chunks(4 * mib, 4, 0, 1, 0).chunks == 4);
    CHECK(plan_chunks(64 * mib, 4, 0, 1, 0).chunks == 8);
    CHECK(plan_chunks(64 * mib, 4, 0, 0, 0).chunks == 1);
    // more than 32 is refused, naming the field
    std::string what;
    try {
      (void)plan_chunks(1000, 4, 33, 1, 2);
    } catch (const squall::invalid_argument& e) {
      what = e.what();
    }
    CHECK(contains(what, "overlap_chunks is 33"));
  }

  TEST_CASE("chunks encoding as the whole tensor does: bitwise the unchunked results") {
    const std::size_t count = 5000;  // not a multiple of the chunks or of int8's bucket
    for (int p = 1; p <= 4; ++p) {
      CAPTURE(p);
      SUBCASE("cast bf16, linear, ring: every rank alike, within rounding per hop") {
        // the ring's blocks, and so each element's order of additions, follow the chunks: not
        // bitwise the unchunked sum, but within the same bound of the exact one
        const squall::cast_compressor<squall::bfloat16> c{};
        const auto parts = run_chunked<squall::ring_topology>(p, c, count, 5);
        for (int r = 0; r < p; ++r) {
          CHECK(same_bits(parts[r].out, parts[0].out));
          CHECK(parts[r].split.chunks == 5);
        }
        std::vector<std::vector<float>> in;
        for (int q = 0; q < p; ++q) in.push_back(input_of(q + 1, count));
        std::size_t off = 0;
        for (std::size_t i = 0; i < count; ++i) {
          double exact = 0;
          double magnitude = 0;
          for (int q = 0; q < p; ++q) {
            const double x = in[static_cast<std::size_t>(q)][i];
            exact += x;
            magnitude += std::fabs(x);
          }
          if (std::fabs(parts[0].out[i] - exact) > 2.0 * p * magnitude / 256 + 1e-7) ++off;
        }
        CHECK(off == 0);
        CHECK(run_chunked<squall::ring_topology>(p, c, count, 1)[0].split.chunks == 1);
      }
      SUBCASE("int8, gather, direct") {
        const squall::int8_compressor c{};
        const auto whole =
            run_chunked<squall::direct_topology>(p, c, count, 1, squall::aggregation::gather);
        const auto parts =
            run_chunked<squall::direct_topology>(p, c, count, 3, squall::aggregation::gather);
        for (int r = 0; r < p; ++r) CHECK(same_bits(parts[r].out, whole[r].out));
      }
      SUBCASE("threshold + error feedback, gather, ring: results and residuals") {
        const squall::error_feedback<squall::threshold_compressor> c{{.tau = 0.8}};
        const auto whole = run_chunked<squall::ring_topology>(p, c, count, 1);
        const auto parts = run_chunked<squall::ring_topology>(p, c, count, 7);
        for (int r = 0; r < p; ++r) {
          CHECK(same_bits(parts[r].out, whole[r].out));
          CHECK(same_bits(parts[r].residual, whole[r].residual));
        }
      }
    }
  }

  TEST_CASE("top-k in chunks: each chunk's own k largest, summed over ranks") {
    const std::size_t count = 3001;
    const std::size_t chunks = 4;
    const double ratio = 0.05;
    for (int p = 1; p <= 4; ++p) {
      CAPTURE(p);
      const auto got = run_chunked<squall::ring_topology>(
          p, squall::topk_compressor{.ratio = ratio}, count, chunks);
      // serial reference: the second call's inputs, cut as plan_chunks cuts them (no
      // alignment), each chunk's round(ratio x n) largest magnitudes kept, summed in double
      const chunk_plan plan = plan_chunks(count, sizeof(float), chunks, 0, 0);
      REQUIRE(plan.chunks == chunks);
      std::vector<double> want(count, 0.0);
      for (int q = 0; q < p; ++q) {
        const std::vector<float> x = input_of(q + 1, count);
        for (std::size_t c = 0; c < plan.chunks; ++c) {
          const std::size_t n = plan.count_of(c);
          const auto k = static_cast<std::size_t>(std::round(ratio * static_cast<double>(n)));
          std::vector<std::size_t> order(n);
          std::iota(order.begin(), order.end(), plan.offset(c));
          std::nth_element(
              order.begin(), order.begin() + static_cast<std::ptrdiff_t>(k) - 1, order.end(),
              [&](std::size_t i, std::size_t j) { return std::fabs(x[i]) > std::fabs(x[j]); });
          for (std::size_t i = 0; i < k; ++i) want[order[i]] += x[order[i]];
        }
      }
      for (int r = 0; r < p; ++r) {
        std::size_t off = 0;
        for (std::size_t i = 0; i < count; ++i) {
          if (std::fabs(static_cast<double>(got[r].out[i]) - want[i]) >
              1e-6 * (1.0 + std::fabs(want[i]))) {
            ++off;
          }
        }
        CHECK(off == 0);
      }
    }
  }

  TEST_CASE("an encode that throws in a later chunk reaches every caller; the next call works") {
    const std::size_t count = 4096;
    std::vector<std::string> errors(2);
    std::vector<std::vector<float>> after(2);
    run_ranks(2, [&](inproc_transport& t) {
      const int r = t.rank();
      const squall::threshold_compressor c{.tau = 0.5, .check_finite = true};
      squall::collective_tuning tuning{.overlap_chunks = 4};
      squall::communicator<inproc_transport, squall::ring_topology, squall::threshold_compressor>
          comm(std::move(t), {}, c, {}, tuning);
      auto state = comm.make_state<float>(count);
      std::vector<float> data = input_of(r, count);
      data[3500] = std::numeric_limits<float>::quiet_NaN();  // in the last chunk, every rank
      try {
        comm.allreduce(squall::host_view<float>(data), state);
      } catch (const squall::invalid_argument& e) {
        errors[static_cast<std::size_t>(r)] = e.what();
      }
      after[static_cast<std::size_t>(r)] = input_of(r, count);
      comm.allreduce(squall::host_view<float>(after[static_cast<std::size_t>(r)]), state);
    });
    const std::vector<float> x0 = input_of(0, count);
    const std::vector<float> x1 = input_of(1, count);
    for (int r = 0; r < 2; ++r) {
      CHECK(contains(errors[r], "threshold"));
      // the next call: elements with |x| >= tau sent as +-tau, summed over both ranks
      std::size_t off = 0;
      for (std::size_t i = 0; i < count; ++i) {
        const auto kept = [](float v) {
          return std::fabs(v) >= 0.5f ? std::copysign(0.5f, v) : 0.0f;
        };
        if (after[r][i] != kept(x0[i]) + kept(x1[i])) ++off;
      }
      CHECK(off == 0);
    }
  }

  TEST_CASE("ranks asking for different chunks get mismatch_error naming both") {
    std::string what = "(nothing thrown)";
    try {
      run_ranks(2, [](inproc_transport& t) {
        squall::collective_tuning tuning{.overlap_chunks = t.rank() == 0 ? 2u : 3u};
        squall::communicator<inproc_transport, squall::ring_topology,
                             squall::cast_compressor<squall::bfloat16>>
            comm(std::move(t), {}, squall::cast_compressor<squall::bfloat16>{}, {}, tuning);
        std::vector<float> data(1000, 1.0f);
        auto state = comm.make_state<float>(data.size());
        comm.allreduce(squall::host_view<float>(data), state);
      });
    } catch (const squall::mismatch_error& e) {
      what = e.what();
    }
    CHECK(contains(what, "linear in 2 chunks"));
    CHECK(contains(what, "linear in 3 chunks"));
  }
}
