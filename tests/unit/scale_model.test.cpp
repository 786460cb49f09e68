// SPDX-License-Identifier: Apache-2.0
// squall-scale-model's model (bench/scale_model.hpp) against the closed forms of the
// literature for the schedules it walks: the ring allreduce's 2 (P - 1) steps of B / P bytes
// (Patarasuk and Yuan 2009; Thakur et al. 2005: 2 (P - 1) alpha + 2 (P - 1) / P x B beta), the
// ring allgather's P - 1 steps of one block, and gTop-k's 2 log2 P rounds of one k-set each
// (Shi et al. 2019: 2 alpha log2 P + 4 k beta log2 P, here with the 16-byte head as its own
// message), with the fold's extra round where P is not a power of two.
#include "../../bench/scale_model.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <stdexcept>

namespace {

using squall_model::machine;

machine link(double rate, double latency) {
  machine m;
  m.rate = rate;
  m.latency = latency;
  m.reduce_rate = 1e30;  // free
  m.encode_rate = 1e30;
  m.decode_rate = 1e30;
  m.merge_rate = 1e30;
  m.fill_rate = 1e30;
  m.scatter_rate = 1e30;
  return m;
}

}  // namespace

TEST_SUITE("scale_model") {
  TEST_CASE("dense ring: 2 (P - 1) x (alpha + B / P / rate), and B / P / rate x 2 (P - 1) alone") {
    for (int p = 2; p <= 9; ++p) {
      CAPTURE(p);
      const std::size_t bytes = std::size_t{4} * 2520 * 1000;  // divisible by 1..9 blocks
      const double rate = 1e8;
      for (const double alpha : {0.0, 50e-6}) {
        CAPTURE(alpha);
        const double want = 2.0 * (p - 1) * (alpha + static_cast<double>(bytes) / p / rate);
        const double got =
            squall_model::dense(squall::ring_topology{}, p, bytes, link(rate, alpha)).total();
        CHECK(got == doctest::Approx(want).epsilon(1e-12));
      }
    }
  }

  TEST_CASE("a reduce costs what it is told, once per reducing step on the critical path") {
    const int p = 4;
    const std::size_t bytes = 4000000;
    machine m = link(1e8, 0);
    m.reduce_rate = 1e9;
    const double want = 2.0 * (p - 1) * bytes / p / 1e8 + (p - 1) * (bytes / p / 1e9);
    CHECK(squall_model::dense(squall::ring_topology{}, p, bytes, m).total() ==
          doctest::Approx(want).epsilon(1e-12));
  }

  TEST_CASE("allgather top-k: encode, sizes, (P - 1) padded payloads, one decode and P - 1 adds") {
    for (int p = 2; p <= 8; ++p) {
      CAPTURE(p);
      machine m = link(1e8, 20e-6);
      m.encode_rate = 2e9;
      m.decode_rate = 1e9;
      m.scatter_rate = 1e8;
      const std::size_t bytes = 40000000;
      const std::size_t k = 10001;  // 24 + 8 k = 80032 bytes, a multiple of 8
      const auto got = squall_model::gather_topk(squall::ring_topology{}, p, bytes, k, 4, m);
      CHECK(got.encode == doctest::Approx(bytes / 2e9));
      CHECK(got.decode == doctest::Approx(bytes / 1e9 + (p - 1) * (k / 1e8)));
      const double sizes = 20e-6 + (p - 1) * 8 / 1e8;
      CHECK(got.transfer ==
            doctest::Approx(sizes + (p - 1) * (20e-6 + 80032 / 1e8)).epsilon(1e-12));
    }
  }

  TEST_CASE(
      "gTop-k: 2 log2 P rounds with a merge per level; the fold adds at most a round each way") {
    machine m = link(1e8, 30e-6);
    m.merge_rate = 4e9;
    const std::size_t k = 5000;
    const double set = k * 8.0;
    const double round = 2 * 30e-6 + (16 + set) / 1e8;  // the head and the set
    const double merge = 2 * set / 4e9;
    const auto time = [&](int p) { return squall_model::gtopk(p, 4000000, k, 4, m).transfer; };
    for (int levels = 1; levels <= 5; ++levels) {
      const int p = 1 << levels;
      CAPTURE(p);
      CHECK(time(p) == doctest::Approx(2 * levels * round + levels * merge).epsilon(1e-12));
      // P not a power of two: the extra ranks fold into the first ones before the tree and
      // get the result after it, overlapping with the tree where they can
      for (int q = p + 1; q < 2 * p; ++q) {
        CAPTURE(q);
        CHECK(time(q) > time(p));
        CHECK(time(q) <= doctest::Approx(time(p) + 2 * round + merge).epsilon(1e-12));
      }
    }
  }

  TEST_CASE("a receive that no rank sends is a deadlock, not a wrong time") {
    const auto steps = [](int r) {
      std::vector<squall::step> s;
      if (r == 0)
        s.push_back(squall::recv_step(1, squall::whole_buffer, squall::step_action::copy));
      return s;
    };
    CHECK_THROWS_AS(squall_model::walk(2, steps, [](const squall::block_range&) { return 8.0; },
                                       link(1e8, 0), {}),
                    std::logic_error);
  }
}
