// SPDX-License-Identifier: Apache-2.0
// Policies written outside the library take the algorithm their declarations ask for: a
// user's linear compressor (fixed-point integers, summed through the topology), a user's
// low-rank compressor (its own rank-one power iteration) and a user's topology (the ring
// turned the other way), each checked against a serial reference, and with the communicator's
// `aggregation()` and the bytes it moved. Also the per-hop walk on direct and halving-doubling
// (now their default for the requantizers) within the per-hop error bound, and a topology
// that declares per_hop_schedule but breaks its rule, refused.
#include <squall/algorithm/communicator.hpp>
#include <squall/compress/error_feedback.hpp>
#include <squall/compress/quantize.hpp>
#include <squall/compress/sketch.hpp>
#include <squall/topology/direct.hpp>
#include <squall/topology/halving_doubling.hpp>
#include <squall/topology/ring.hpp>
#include <squall/topology/schedule.hpp>
#include <squall/transport/inproc.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <mutex>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "../support/data.hpp"
#include "../support/thread_ranks.hpp"

namespace {

using squall::inproc_transport;
using squall::test::run_ranks;

// ---- a user's linear compressor: x as round(x 2^16) in int32, payloads add ----------------

struct fixed_point_compressor {
  static constexpr std::string_view name = "fixed_point";
  static constexpr squall::aggregation_set aggregations{squall::aggregation::linear};
  static constexpr bool fixed_size = true;
  static constexpr float scale = 65536.0f;

  std::size_t max_payload_bytes(squall::dtype, std::size_t count) const {
    return count * sizeof(std::int32_t);
  }
  template <class B, class T>
  std::size_t encode(const B&, squall::buffer_view<const T> in,
                     squall::buffer_view<std::byte> payload, squall::random_stream = {}) const {
    for (std::size_t i = 0; i < in.count(); ++i) {
      const auto q = static_cast<std::int32_t>(std::lround(static_cast<double>(in[i]) * scale));
      std::memcpy(payload.data() + i * sizeof(q), &q, sizeof(q));
    }
    return in.count() * sizeof(std::int32_t);
  }
  template <class B, class T>
  void decode(const B&, squall::buffer_view<const std::byte> payload,
              squall::buffer_view<T> out) const {
    for (std::size_t i = 0; i < out.count(); ++i) {
      std::int32_t q = 0;
      std::memcpy(&q, payload.data() + i * sizeof(q), sizeof(q));
      out[i] = static_cast<T>(static_cast<double>(q) / scale);
    }
  }
};

}  // namespace

// Where the summable body lies: the whole payload, int32 elements.
template <>
struct squall::linear_body<fixed_point_compressor> {
  template <class T>
  using element = std::int32_t;
  template <class T>
  static linear_body_range of(const fixed_point_compressor&, std::size_t count) {
    return {0, count};
  }
};

namespace {

// ---- a user's low-rank compressor: rank one, its own four pieces ----------------------------

struct rank_one_compressor {
  static constexpr std::string_view name = "rank_one";
  static constexpr squall::aggregation_set aggregations{squall::aggregation::low_rank};
  std::size_t rank = 1;
  std::size_t columns = 8;

  squall::powersgd_shape shape(std::size_t count) const {
    return {(count + columns - 1) / columns, columns};
  }
  template <class T>
  squall::powersgd_state<T> make_state(std::size_t count) const {
    return squall::powersgd_state<T>(shape(count), 1, /*seed=*/7);
  }
  std::size_t max_payload_bytes(squall::dtype, std::size_t count) const {
    return (shape(count).rows + columns) * sizeof(double);
  }
  // p = M q, M the rows x columns view of `in` (zero past its end)
  template <class B, class T>
  void multiply(const B&, squall::buffer_view<const T> in, squall::buffer_view<const T> q,
                squall::buffer_view<T> p) const {
    for (std::size_t i = 0; i < p.count(); ++i) {
      T sum = 0;
      for (std::size_t j = 0; j < columns && i * columns + j < in.count(); ++j) {
        sum += in[i * columns + j] * q[j];
      }
      p[i] = sum;
    }
  }
  template <class B, class T>
  void orthogonalize(const B&, squall::buffer_view<T> p) const {
    T norm = 0;
    for (std::size_t i = 0; i < p.count(); ++i) norm += p[i] * p[i];
    norm = std::sqrt(norm);
    if (norm > 0) {
      for (std::size_t i = 0; i < p.count(); ++i) p[i] /= norm;
    }
  }
  // q = M^T p
  template <class B, class T>
  void multiply_transposed(const B&, squall::buffer_view<const T> in,
                           squall::buffer_view<const T> p, squall::buffer_view<T> q) const {
    for (std::size_t j = 0; j < q.count(); ++j) {
      T sum = 0;
      for (std::size_t i = 0; i < p.count() && i * columns + j < in.count(); ++i) {
        sum += in[i * columns + j] * p[i];
      }
      q[j] = sum;
    }
  }
  template <class B, class T>
  void decompress(const B&, squall::buffer_view<const T> p, squall::buffer_view<const T> q,
                  squall::buffer_view<T> out) const {
    for (std::size_t k = 0; k < out.count(); ++k) out[k] = p[k / columns] * q[k % columns];
  }
};

static_assert(squall::low_rank_compressor<rank_one_compressor, float>);

// ---- a user's topology: the ring turned the other way ---------------------------------------

struct reverse_ring_topology {
  static constexpr std::string_view name = "reverse_ring";
  static constexpr bool per_hop_schedule = true;

  // step k < P-1: send block r+k+1 to r-1, reduce block r+k+2 from r+1 (rank r ends with
  // block r); step P-1+k: send block r+k to r-1, copy block r+k+1 from r+1.
  squall::schedule allreduce_schedule(int rank, int size, std::size_t) const {
    squall::schedule s{.name = name};
    const auto parts = static_cast<std::size_t>(size);
    const auto block = [&](int b) {
      return squall::block_range{.first = static_cast<std::size_t>(squall::detail::wrap(b, size)),
                                 .count = 1,
                                 .parts = parts};
    };
    const int to = squall::detail::wrap(rank - 1, size);
    const int from = squall::detail::wrap(rank + 1, size);
    for (int phase = 0; phase < 2; ++phase) {
      for (int k = 0; k + 1 < size; ++k) {
        const int lag = phase == 0 ? 1 : 0;
        s.steps.push_back(
            {.send_to = to,
             .send = block(rank + k + lag),
             .recv_from = from,
             .recv = block(rank + k + lag + 1),
             .action = phase == 0 ? squall::step_action::reduce : squall::step_action::copy});
      }
    }
    return s;
  }
};
static_assert(squall::check_topology<reverse_ring_topology>());

// A topology that declares per_hop_schedule but reduces every block twice (two reduce-scatters):
// the walk refuses it.
struct twice_reduced_topology {
  static constexpr std::string_view name = "twice_reduced";
  static constexpr bool per_hop_schedule = true;
  squall::schedule allreduce_schedule(int rank, int size, std::size_t) const {
    squall::schedule s{.name = name,
                       .steps = squall::detail::ring_reduce_scatter_steps(rank, size)};
    for (const auto& st : squall::detail::ring_reduce_scatter_steps(rank, size))
      s.steps.push_back(st);
    for (const auto& st : squall::detail::ring_allgather_steps(rank, size)) s.steps.push_back(st);
    return s;
  }
};

constexpr squall::collective_tuning messages{.peer_memory_bytes =
                                                 std::numeric_limits<std::size_t>::max()};
constexpr squall::options no_check{.check_mismatch = false};

std::vector<float> input_of(int r, int step, std::size_t count) {
  auto v = squall::test::random_values<float>(
      count, 900 + 17 * static_cast<std::uint64_t>(r) + static_cast<std::uint64_t>(step));
  for (auto& x : v) x /= 4;  // in [-1/4, 1/4]
  return v;
}

/// What each rank of a compressed run saw.
struct outcome {
  std::vector<std::vector<float>> out;  ///< per step
  std::vector<float> residual;
  squall::transfer_stats stats;
  squall::aggregation how = squall::aggregation::automatic;
  std::vector<float> q;  ///< the low-rank state's Q after the last step
};

template <class Topology, class C>
std::vector<outcome> run(int p, const C& c, std::size_t count, int steps,
                         const squall::collective_tuning& tuning = messages) {
  std::vector<outcome> seen(static_cast<std::size_t>(p));
  run_ranks(p, [&](inproc_transport& t) {
    const int r = t.rank();
    auto& o = seen[static_cast<std::size_t>(r)];
    squall::communicator<inproc_transport, Topology, C> comm(std::move(t), {}, c, no_check, tuning);
    o.how = comm.aggregation();
    auto state = comm.template make_state<float>(count);
    for (int s = 0; s < steps; ++s) {
      std::vector<float> data = input_of(r, s, count);
      comm.allreduce(squall::host_view<float>(data), state);
      o.out.push_back(std::move(data));
    }
    o.stats = comm.last_transfer();
    if constexpr (squall::is_error_feedback<C>) {
      const auto res = state.residual().residual();
      o.residual.assign(res.data(), res.data() + res.count());
    }
    if constexpr (squall::uses_low_rank<C>) {
      const auto q = state.low_rank().q();
      o.q.assign(q.data(), q.data() + q.count());
    }
  });
  return seen;
}

void require_alike(const std::vector<outcome>& seen) {
  for (const auto& o : seen) {
    for (std::size_t s = 0; s < o.out.size(); ++s) {
      REQUIRE(o.out[s].size() == seen[0].out[s].size());
      if (o.out[s].empty()) continue;  // memcmp takes no null pointer, even for 0 bytes
      REQUIRE(std::memcmp(o.out[s].data(), seen[0].out[s].data(), o.out[s].size() * 4) == 0);
    }
  }
}

/// The dense allreduce's bytes on `Topology` for `count` floats.
template <class Topology>
std::uint64_t dense_bytes(int p, std::size_t count) {
  std::vector<std::uint64_t> sent(static_cast<std::size_t>(p));
  run_ranks(p, [&](inproc_transport& t) {
    const int r = t.rank();
    squall::communicator<inproc_transport, Topology> comm(std::move(t), {}, no_check, messages);
    std::vector<float> data = input_of(r, 0, count);
    comm.allreduce(squall::host_view<float>(data));
    sent[static_cast<std::size_t>(r)] = comm.last_transfer().bytes_sent;
  });
  return sent[0];
}

template <class Topology>
void check_fixed_point() {
  const std::size_t count = 1001;
  for (int p = 1; p <= 4; ++p) {
    CAPTURE(p);
    const auto seen = run<Topology>(p, fixed_point_compressor{}, count, 1);
    require_alike(seen);
    CHECK(seen[0].how == squall::aggregation::linear);
    // the exact sum of the ranks' fixed-point values: integers, so any order gives it
    for (std::size_t i = 0; i < count; ++i) {
      std::int64_t sum = 0;
      for (int q = 0; q < p; ++q) sum += std::lround(double(input_of(q, 0, count)[i]) * 65536.0);
      REQUIRE(seen[0].out[0][i] == static_cast<float>(static_cast<double>(sum) / 65536.0));
    }
    // the payload is 4 bytes an element, as a float: the dense schedule's bytes
    CHECK(seen[0].stats.bytes_sent == dense_bytes<Topology>(p, count));
  }
}

/// Largest over elements of sum over ranks of |x|: a bound on every partial sum.
double magnitude(int p, int step, std::size_t count) {
  double largest = 0;
  for (std::size_t i = 0; i < count; ++i) {
    double m = 0;
    for (int q = 0; q < p; ++q) m += std::fabs(input_of(q, step, count)[i]);
    largest = std::max(largest, m);
  }
  return largest;
}

/// int8 per hop: every element's result is P encodes away from the exact sum (each rank's
/// contribution encoded once on its way, plus the owner's final encode), each off by at most
/// half a step of its bucket (scale / 127 / 2, scale <= the largest partial), plus float
/// rounding.
template <class Topology>
void check_per_hop_bound() {
  const squall::int8_compressor q8{.bucket = 64};
  for (int p = 1; p <= 4; ++p) {
    for (const std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{513}}) {
      CAPTURE(p);
      CAPTURE(count);
      const auto seen = run<Topology>(p, q8, count, 2);
      require_alike(seen);
      CHECK(seen[0].how == squall::aggregation::per_hop);
      for (int s = 0; s < 2; ++s) {
        const double m = magnitude(p, s, count) * 1.01;
        const double bound = p * 0.5 * m / 127 + 1e-6 * p * m;
        for (std::size_t i = 0; i < count; ++i) {
          double exact = 0;
          for (int q = 0; q < p; ++q) exact += input_of(q, s, count)[i];
          const double got = seen[0].out[static_cast<std::size_t>(s)][i];
          if (std::fabs(got - exact) > bound) {
            CAPTURE(i);
            REQUIRE(std::fabs(got - exact) <= bound);
          }
        }
      }
    }
  }
}

/// With error feedback the per-hop walk encodes each element once per rank, so the results
/// and the residuals add up to the inputs.
template <class Topology>
void check_per_hop_conserves() {
  using C = squall::error_feedback<squall::sign_compressor>;
  constexpr int steps = 4;
  const std::size_t count = 333;
  for (int p = 1; p <= 4; ++p) {
    CAPTURE(p);
    const auto seen = run<Topology>(p, C{{.bucket = 64}}, count, steps);
    require_alike(seen);
    CHECK(seen[0].how == squall::aggregation::per_hop);
    for (std::size_t i = 0; i < count; ++i) {
      double inputs = 0;
      double kept = 0;
      for (int s = 0; s < steps; ++s) {
        for (int q = 0; q < p; ++q) inputs += input_of(q, s, count)[i];
        kept += seen[0].out[static_cast<std::size_t>(s)][i];
      }
      for (const auto& o : seen) kept += o.residual[i];
      REQUIRE(std::fabs(kept - inputs) <= 1e-4);
    }
  }
}

// ---- a user's backend whose work fails, as a device reports a failed kernel ---------------

/// Host memory and kernels, but every wait reports what a CUDA backend's would after a bad
/// kernel: a `squall::error` in the cuda category naming the call and the device, no rank.
struct failing_backend : squall::host_backend {
  static constexpr std::string_view name = "failing";
  void synchronize() const {
    throw squall::error(std::error_code(700, squall::cuda_category()),
                        {.operation = "cudaStreamSynchronize(stream)"},
                        "cudaErrorIllegalAddress (an illegal memory access was encountered) on "
                        "device 0 at kernel.cu:1");
  }
};
static_assert(squall::backend<failing_backend>);

}  // namespace

TEST_SUITE("user policies") {
  TEST_CASE_TEMPLATE("a user's linear compressor sums through the topology, exactly", Topology,
                     squall::ring_topology, reverse_ring_topology) {
    check_fixed_point<Topology>();
  }

  TEST_CASE("a user's low-rank compressor runs the power iteration across ranks") {
    const rank_one_compressor c;
    const std::size_t count = 61;  // 8 rows of 8 columns, the last row 5 long
    for (int p = 1; p <= 3; ++p) {
      CAPTURE(p);
      const auto seen = run<reverse_ring_topology>(p, c, count, 1);
      require_alike(seen);
      CHECK(seen[0].how == squall::aggregation::low_rank);
      // serial in double: P = sum_q M_q Q0, normalized; Q = sum_q M_q^T P; result P Q^T
      const auto fresh = c.make_state<float>(count);
      const auto q0 = fresh.q();
      const std::size_t rows = c.shape(count).rows;
      std::vector<double> pv(rows, 0.0);
      std::vector<double> qv(c.columns, 0.0);
      for (int q = 0; q < p; ++q) {
        const auto m = input_of(q, 0, count);
        for (std::size_t k = 0; k < count; ++k) pv[k / 8] += double(m[k]) * double(q0[k % 8]);
      }
      double norm = 0;
      for (double x : pv) norm += x * x;
      for (double& x : pv) x /= std::sqrt(norm);
      for (int q = 0; q < p; ++q) {
        const auto m = input_of(q, 0, count);
        for (std::size_t k = 0; k < count; ++k) qv[k % 8] += double(m[k]) * pv[k / 8];
      }
      for (std::size_t k = 0; k < count; ++k) {
        REQUIRE(std::fabs(seen[0].out[0][k] - pv[k / 8] * qv[k % 8]) <= 1e-5);
      }
      // the state keeps the summed Q for the next call's warm start
      for (std::size_t j = 0; j < c.columns; ++j) REQUIRE(std::fabs(seen[0].q[j] - qv[j]) <= 1e-5);
    }
  }

  TEST_CASE("a compressor asked for an aggregation it does not allow is refused, naming both") {
    const squall::collective_tuning gather{.aggregation = squall::aggregation::gather};
    run_ranks(2, [&](inproc_transport& t) {
      squall::communicator<inproc_transport, squall::ring_topology, rank_one_compressor> comm(
          std::move(t), {}, rank_one_compressor{}, no_check, gather);
      CHECK_THROWS_WITH_AS((void)comm.aggregation(),
                           doctest::Contains("aggregation is gather, which compressor 'rank_one' "
                                             "does not allow (it allows low_rank)"),
                           squall::invalid_argument);
    });
  }

  TEST_CASE("the refusal is raised in the compressed allreduce's body: at wait() when started") {
    const squall::collective_tuning gather{.aggregation = squall::aggregation::gather};
    run_ranks(2, [&](inproc_transport& t) {
      squall::communicator<inproc_transport, squall::ring_topology, rank_one_compressor> comm(
          std::move(t), {}, rank_one_compressor{}, no_check, gather);
      std::vector<float> g(30, 1.0f);
      auto state = comm.make_state<float>(g.size());
      // non-blocking: the request carries the error (the calls' contract), the call does not
      squall::request started;
      REQUIRE_NOTHROW(started = comm.iallreduce(squall::host_view<float>(g), state));
      CHECK_THROWS_WITH_AS(started.wait(), doctest::Contains("does not allow"),
                           squall::invalid_argument);
      CHECK_THROWS_WITH_AS(comm.allreduce(squall::host_view<float>(g), state),
                           doctest::Contains("does not allow"), squall::invalid_argument);
    });
  }

  TEST_CASE_TEMPLATE("per hop on the topology's own schedule, within P half-steps", Topology,
                     squall::direct_topology, squall::halving_doubling_topology,
                     reverse_ring_topology) {
    check_per_hop_bound<Topology>();
  }

  TEST_CASE_TEMPLATE("per hop with error feedback conserves on every per-hop schedule", Topology,
                     squall::direct_topology, squall::halving_doubling_topology,
                     reverse_ring_topology) {
    check_per_hop_conserves<Topology>();
  }

  TEST_CASE("per hop on the reversed ring moves the ring's payload bytes") {
    const squall::int8_compressor q8{.bucket = 64};
    const std::size_t count = 1000;
    for (int p = 2; p <= 4; ++p) {
      CAPTURE(p);
      const auto seen = run<reverse_ring_topology>(p, q8, count, 1);
      // 2(P-1) payloads: P-1 partials and P-1 finals, one block each
      std::uint64_t want = 0;
      const int r = 0;
      for (int k = 0; k + 1 < p; ++k) {
        for (const int b : {r + k + 1, r + k}) {
          const auto blk = squall::detail::split_range(count, static_cast<std::size_t>(p),
                                                       static_cast<std::size_t>(b % p));
          want += q8.max_payload_bytes(squall::dtype::float32, blk.count);
        }
      }
      CHECK(seen[0].stats.bytes_sent == want);
    }
  }

  TEST_CASE("a schedule that breaks the per-hop rule is refused, naming it") {
    std::mutex m;
    std::vector<std::string> said;
    run_ranks(3, [&](inproc_transport& t) {
      squall::communicator<inproc_transport, twice_reduced_topology, squall::int8_compressor> comm(
          std::move(t), {}, squall::int8_compressor{}, no_check, messages);
      auto state = comm.make_state<float>(30);
      std::vector<float> data(30, 1.0f);
      std::string what = "(nothing thrown)";
      try {
        comm.allreduce(squall::host_view<float>(data), state);
      } catch (const squall::invalid_argument& e) {
        what = e.what();
      }
      const std::lock_guard lock(m);
      said.push_back(what);
    });
    for (const auto& w : said) {
      CHECK(w.find("schedule 'twice_reduced', which makes a rank encode a block twice") !=
            std::string::npos);
    }
  }

  TEST_CASE("a backend's error names its call and device, and the communicator adds the rank") {
    // one rank: with two, the first to fail abandons the transport, and the other may see
    // that (peer_failure) before its own wait fails
    run_ranks(1, [&](inproc_transport& t) {
      squall::communicator<inproc_transport, squall::ring_topology, squall::identity_compressor,
                           failing_backend>
          comm(std::move(t));
      std::vector<float> grad(8, 1.0f);
      try {
        comm.allreduce(squall::host_view<float>(grad));
        FAIL("the failing backend's wait did not throw");
      } catch (const squall::error& e) {
        CHECK(e.rank() == comm.rank());
        CHECK(e.code() == std::error_code(700, squall::cuda_category()));
        CHECK(e.operation() == "cudaStreamSynchronize(stream)");
        const std::string what = e.what();
        CHECK(what.find("(rank " + std::to_string(comm.rank()) + ")") != std::string::npos);
        CHECK(what.find("on device 0 at kernel.cu:1") != std::string::npos);
      }
    });
  }
}
