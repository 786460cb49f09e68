// SPDX-License-Identifier: Apache-2.0
// The compressed allreduce over mpi_transport, ranks as real processes under mpiexec (1 to 4),
// on ring, tree, direct and halving-doubling: cast<bfloat16>, randomk, count_sketch, int8
// (gather then reduce, and per-hop requantization on ring and tree), topk with error
// feedback, PowerSGD. Every rank holds bitwise the same result (a hash, its MPI_MIN equal to
// its MPI_MAX), and the result matches a reference independent of squall's collectives:
// - linear: MPI_Allreduce of the inputs in double, within the compressor's bound (cast:
//   one rounding to bfloat16 per input and per partial sum; randomk: the exact sum at the
//   step's indices, zero elsewhere; count_sketch: the decode of the exact sum's sketch);
// - gather then reduce: every rank's payload, encoded on its own rank (through its own
//   residual with error feedback) and MPI_Allgather-ed, decoded and summed in rank order;
// - per hop: the serial re-implementation of the hops (tests/support/requantize_reference.hpp)
//   on the MPI_Allgather-ed inputs, and within half an int8 step per encode of the exact sum;
// - PowerSGD of rank 1 on inputs of rank 1: the exact sum within float rounding;
// - count sketch's two rounds with error feedback: the k coordinates of the MPI_Allreduce-d
//   sketch (in double, from the hash formula) and the MPI_Allreduce-d exact values there.
// A check that fails is counted and reported, never REQUIREd, so that all ranks keep making
// the same calls. Suite mpi_compressed_collectives.

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
#include <squall/topology/ring.hpp>
#include <squall/topology/tree.hpp>
#include <squall/transport/mpi.hpp>
#include <squall/transport/mpi_device.hpp>

#include <doctest/doctest.h>
#include <mpi.h>

#include <algorithm>  // min
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>
#include <type_traits>
#include <utility>  // exchange
#include <vector>

#include "../support/collective_data.hpp"
#include "../support/compressed_reference.hpp"
#include "../support/data.hpp"
#include "../support/deferred_backend.hpp"
#include "../support/requantize_reference.hpp"
#include "../support/result_hash.hpp"
#include "../support/topologies.hpp"

namespace {

using namespace std::chrono_literals;
namespace test = squall::test;

constexpr int steps = 2;

int world_rank() {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}

int world_size() {
  int size = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  return size;
}

/// Rank r's input at `step`: multiples of 1/8192 in [-1/8, 1/8], or integers in [-8, 8]
/// (`exact`: every order of summation exact, also in float).
std::vector<float> input_of(int r, int step, std::size_t count, bool exact) {
  if (exact) return test::exact_input<float>(r + 5 * step, count);
  auto v = test::random_values<float>(
      count, 700 + 31 * static_cast<std::uint64_t>(r) + static_cast<std::uint64_t>(step));
  for (auto& x : v) x /= 8;
  return v;
}

/// Every rank's input at `step`, gathered with MPI_Allgather (not recomputed).
std::vector<std::vector<float>> gathered_inputs(const std::vector<float>& mine) {
  const int p = world_size();
  std::vector<float> all(mine.size() * static_cast<std::size_t>(p));
  MPI_Allgather(mine.data(), static_cast<int>(mine.size()), MPI_FLOAT, all.data(),
                static_cast<int>(mine.size()), MPI_FLOAT, MPI_COMM_WORLD);
  std::vector<std::vector<float>> in;
  for (int q = 0; q < p; ++q) {
    in.emplace_back(all.begin() + static_cast<std::ptrdiff_t>(q * mine.size()),
                    all.begin() + static_cast<std::ptrdiff_t>((q + 1) * mine.size()));
  }
  return in;
}

/// The exact sum of the inputs (MPI_Allreduce in double) and of their magnitudes.
struct exact_sum {
  std::vector<double> sum;
  std::vector<double> magnitude;
};
exact_sum mpi_sum(const std::vector<float>& mine) {
  const std::size_t n = mine.size();
  std::vector<double> local(2 * n);
  for (std::size_t i = 0; i < n; ++i) {
    local[i] = mine[i];
    local[n + i] = std::fabs(mine[i]);
  }
  std::vector<double> all(2 * n);
  MPI_Allreduce(local.data(), all.data(), static_cast<int>(2 * n), MPI_DOUBLE, MPI_SUM,
                MPI_COMM_WORLD);
  return {{all.begin(), all.begin() + static_cast<std::ptrdiff_t>(n)},
          {all.begin() + static_cast<std::ptrdiff_t>(n), all.end()}};
}

/// Every rank's payload of its input, encoded on its own rank with the stream the
/// communicator uses ({step, rank}; through `residual` with error feedback), gathered with
/// MPI_Allgather, decoded and summed in rank order.
template <class C>
std::vector<float> gathered_payload_sum(const C& c, const std::vector<float>& mine,
                                        std::uint64_t step,
                                        squall::error_feedback_state<float>* residual) {
  const squall::host_backend b{};
  const int p = world_size();
  const std::size_t count = mine.size();
  const std::size_t capacity = c.max_payload_bytes(squall::dtype::float32, count);
  std::vector<std::byte> payload(capacity);
  const squall::host_view<const float> in(mine.data(), count);
  const squall::host_view<std::byte> out(payload.data(), capacity);
  const squall::random_stream stream{step, static_cast<std::uint32_t>(world_rank())};
  std::uint64_t size = 0;
  if constexpr (squall::is_error_feedback<C>) {
    std::vector<float> scratch(count);
    size = c.encode(b, *residual, in, out, squall::host_view<float>(scratch), stream);
  } else {
    size = c.encode(b, in, out, stream);
  }
  std::vector<std::uint64_t> sizes(static_cast<std::size_t>(p));
  MPI_Allgather(&size, 1, MPI_UINT64_T, sizes.data(), 1, MPI_UINT64_T, MPI_COMM_WORLD);
  std::vector<std::byte> all(capacity * static_cast<std::size_t>(p));
  MPI_Allgather(payload.data(), static_cast<int>(capacity), MPI_BYTE, all.data(),
                static_cast<int>(capacity), MPI_BYTE, MPI_COMM_WORLD);
  std::vector<float> sum(count, 0.0f);
  std::vector<float> decoded(count);
  for (int q = 0; q < p; ++q) {
    c.decode(b,
             squall::host_view<const std::byte>(
                 all.data() + static_cast<std::size_t>(q) * capacity,
                 static_cast<std::size_t>(sizes[static_cast<std::size_t>(q)])),
             squall::host_view<float>(decoded));
    for (std::size_t i = 0; i < count; ++i) sum[i] = q == 0 ? decoded[i] : sum[i] + decoded[i];
  }
  return sum;
}

/// Counts a failed check on this rank and says which.
int failures = 0;
void fail(const std::string& what) {
  ++failures;
  std::fprintf(stderr, "rank %d: %s\n", world_rank(), what.c_str());
}

/// Runs `steps` compressed allreduces of `count` elements with `c` on `Topology` over
/// mpi_transport; checks that every rank holds the same bits, then
/// `check(step, input, result)` (a collective call: every rank makes it).
template <class Topology, class C, class Check>
void run_case(const C& c, std::size_t count, bool exact, Check check,
              squall::aggregation how = squall::aggregation::automatic) {
  squall::communicator<squall::mpi_transport, Topology, C> comm(
      squall::mpi_transport(MPI_COMM_WORLD, squall::options{.deadline = 120s}),
      test::make_topology<Topology>(world_size()), c, squall::options{},
      squall::collective_tuning{.aggregation = how});
  auto state = comm.template make_state<float>(count);
  const std::string label = squall::compressor_label<C>() + " on " + std::string(Topology::name) +
                            ", " + std::to_string(count) + " elements";
  for (int s = 0; s < steps; ++s) {
    const std::vector<float> in = input_of(world_rank(), s, count, exact);
    std::vector<float> data = in;
    comm.allreduce(squall::host_view<float>(data), state);
    const std::uint64_t h = test::hash_bytes(data.data(), count * sizeof(float));
    std::uint64_t low = 0;
    std::uint64_t high = 0;
    MPI_Allreduce(&h, &low, 1, MPI_UINT64_T, MPI_MIN, MPI_COMM_WORLD);
    MPI_Allreduce(&h, &high, 1, MPI_UINT64_T, MPI_MAX, MPI_COMM_WORLD);
    if (low != high) fail(label + ": ranks differ at step " + std::to_string(s));
    if (!check(s, in, data)) fail(label + ": wrong at step " + std::to_string(s));
  }
}

/// Whether every rank's failures add up to zero (collective).
bool nobody_failed() {
  int total = 0;
  MPI_Allreduce(&failures, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  failures = 0;
  return total == 0;
}

template <class Topology>
void check_linear() {
  const int p = world_size();
  for (const std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{1009}}) {
    // cast: one rounding to bfloat16 (u = 2^-8) of each input and of each partial sum
    run_case<Topology>(
        squall::cast_compressor<squall::bfloat16>{}, count, false,
        [&](int, const std::vector<float>& in, const std::vector<float>& got) {
          const exact_sum e = mpi_sum(in);
          for (std::size_t i = 0; i < got.size(); ++i) {
            if (std::fabs(got[i] - e.sum[i]) > 2.0 * p / 256 * e.magnitude[i] + 1e-7) {
              return false;
            }
          }
          return true;
        });
    // randomk: the exact sum at the step's indices (exact inputs), zero elsewhere
    const squall::randomk_compressor rk{.ratio = 0.1, .seed = 21};
    run_case<Topology>(
        rk, count, true, [&](int s, const std::vector<float>& in, const std::vector<float>& got) {
          const exact_sum e = mpi_sum(in);
          std::vector<double> want(got.size(), 0.0);
          for (const std::size_t i : rk.indices(got.size(), static_cast<std::uint64_t>(s))) {
            want[i] = e.sum[i];
          }
          for (std::size_t i = 0; i < got.size(); ++i) {
            if (got[i] != want[i]) return false;
          }
          return true;
        });
    // count_sketch: linear, so the decode of the sketch of the exact sum
    const squall::count_sketch_compressor<3, 256> cs{.seed = 5};
    run_case<Topology>(
        cs, count, true, [&](int s, const std::vector<float>& in, const std::vector<float>& got) {
          const exact_sum e = mpi_sum(in);
          const std::vector<float> sum(e.sum.begin(), e.sum.end());
          return got == test::decoded_payload(cs, sum, static_cast<std::uint64_t>(s), 0);
        });
  }
}

/// Count sketch's two rounds with error feedback against MPI_Allreduce: each rank mirrors its
/// own residual r; the sketch of the sum is MPI_Allreduce of the ranks' sketches of r (in
/// double, from the hash formula, test::sketch_reference); I = its k largest median estimates;
/// the result is MPI_Allreduce of r at I, zero elsewhere; the mirror is zeroed at I.
template <class Topology>
void check_two_round() {
  using C = squall::count_sketch_compressor<3, 256>;
  const C c{.seed = 7, .heavy_hitters = 40};
  for (const std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{1009}}) {
    std::vector<double> r(count, 0.0);  // this rank's residual, mirrored
    run_case<Topology>(
        squall::error_feedback<C>{c}, count, true,
        [&](int s, const std::vector<float>& in, const std::vector<float>& got) {
          for (std::size_t i = 0; i < count; ++i) r[i] += in[i];
          const test::sketch_reference<3, 256> hashes{.seed = c.seed,
                                                      .step = static_cast<std::uint64_t>(s)};
          std::vector<double> mine(3 * 256, 0.0);
          hashes.add(mine, r);
          std::vector<double> sketch(mine.size());
          MPI_Allreduce(mine.data(), sketch.data(), static_cast<int>(mine.size()), MPI_DOUBLE,
                        MPI_SUM, MPI_COMM_WORLD);
          const std::vector<std::size_t> order =
              test::by_magnitude(hashes.estimates(sketch, count));
          const std::size_t k = std::min(c.kept(), count);
          std::vector<double> sent(k);
          for (std::size_t j = 0; j < k; ++j) sent[j] = std::exchange(r[order[j]], 0.0);
          std::vector<double> sums(k);
          MPI_Allreduce(sent.data(), sums.data(), static_cast<int>(k), MPI_DOUBLE, MPI_SUM,
                        MPI_COMM_WORLD);
          std::vector<float> want(count, 0.0f);
          for (std::size_t j = 0; j < k; ++j) want[order[j]] = static_cast<float>(sums[j]);
          return got == want;
        },
        squall::aggregation::two_round);
  }
}

template <class Topology>
void check_gather() {
  for (const std::size_t count : {std::size_t{1}, std::size_t{1009}}) {
    const squall::int8_compressor q8{.bucket = 64};
    run_case<Topology>(
        q8, count, false,
        [&](int s, const std::vector<float>& in, const std::vector<float>& got) {
          return got == gathered_payload_sum(q8, in, static_cast<std::uint64_t>(s), nullptr);
        },
        squall::aggregation::gather);
    using ef_topk = squall::error_feedback<squall::topk_compressor>;
    const ef_topk top{{.ratio = 0.05}};
    squall::error_feedback_state<float> residual(count);  // this rank's, mirrored
    run_case<Topology>(
        top, count, false, [&](int s, const std::vector<float>& in, const std::vector<float>& got) {
          return got == gathered_payload_sum(top, in, static_cast<std::uint64_t>(s), &residual);
        });
  }
}

template <class Topology>
void check_per_hop() {
  const int p = world_size();
  for (const std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{1009}}) {
    const squall::int8_compressor q8{.bucket = 64};
    run_case<Topology>(
        q8, count, false,
        [&](int s, const std::vector<float>& in, const std::vector<float>& got) {
          const auto all = gathered_inputs(in);
          const auto ref = std::is_same_v<Topology, squall::ring_topology>
                               ? test::ring_reference(q8, all, static_cast<std::uint64_t>(s))
                               : test::tree_reference(q8, all, static_cast<std::uint64_t>(s));
          if (got != ref.out) return false;
          const exact_sum e = mpi_sum(in);
          for (std::size_t i = 0; i < got.size(); ++i) {
            const double bound =
                0.5 * ref.steps[i] + 4e-7 * (p + 1) * (e.magnitude[i] + ref.steps[i]);
            if (std::fabs(got[i] - e.sum[i]) > bound) return false;
          }
          return true;
        },
        squall::aggregation::per_hop);
  }
}

/// Rank r's input of rank 1: (r + 1) u v^T as a 40 x 25 matrix.
std::vector<float> low_rank(int r) {
  std::vector<float> m(40 * 25);
  for (std::size_t i = 0; i < 40; ++i) {
    for (std::size_t j = 0; j < 25; ++j) {
      m[i * 25 + j] = static_cast<float>((r + 1) * (0.1 * static_cast<double>(i) - 2.0) *
                                         std::cos(0.7 * static_cast<double>(j)));
    }
  }
  return m;
}

template <class Topology>
void check_powersgd() {
  const squall::powersgd_compressor c{.rank = 1, .columns = 25, .seed = 4};
  squall::communicator<squall::mpi_transport, Topology, squall::powersgd_compressor> comm(
      squall::mpi_transport(MPI_COMM_WORLD, squall::options{.deadline = 120s}),
      test::make_topology<Topology>(world_size()), c);
  auto state = comm.template make_state<float>(1000);
  for (int s = 0; s < steps; ++s) {
    const std::vector<float> in = low_rank(world_rank());
    std::vector<float> data = in;
    comm.allreduce(squall::host_view<float>(data), state);
    const std::uint64_t h = test::hash_bytes(data.data(), data.size() * sizeof(float));
    std::uint64_t low = 0;
    std::uint64_t high = 0;
    MPI_Allreduce(&h, &low, 1, MPI_UINT64_T, MPI_MIN, MPI_COMM_WORLD);
    MPI_Allreduce(&h, &high, 1, MPI_UINT64_T, MPI_MAX, MPI_COMM_WORLD);
    if (low != high) fail("powersgd on " + std::string(Topology::name) + ": ranks differ");
    const exact_sum e = mpi_sum(in);
    double largest = 0;
    double error = 0;
    for (std::size_t i = 0; i < data.size(); ++i) {
      largest = std::max(largest, std::fabs(e.sum[i]));
      error = std::max(error, std::fabs(data[i] - e.sum[i]));
    }
    if (error > 1e-4 * largest) {
      fail("powersgd on " + std::string(Topology::name) + ": error " + std::to_string(error) +
           " of " + std::to_string(largest));
    }
  }
}

/// The compressed allreduce on device memory handed to MPI as it is (`device_mpi_transport`,
/// what a CUDA-aware MPI takes) with kernels that run late (the deferred device backend; its
/// buffers are host memory, which any MPI carries), against the same steps on host_backend
/// over mpi_transport in the same processes: results and saved states bitwise. The
/// aggregations that move payloads over the transport themselves and so do not run staged:
/// gtopk (top-k with error feedback) and per_hop (int8), and hq's integer sum (linear).
template <class Topology, class C>
void device_pointers_equal_host(const C& c, squall::aggregation how) {
  using backend = test::deferred_device_backend;
  using transport = squall::device_mpi_transport<backend>;
  const squall::collective_tuning tuning{.aggregation = how};
  const squall::options opts{.deadline = 120s};
  const backend on;
  squall::communicator<transport, Topology, C, backend> device(
      transport(squall::mpi_transport(MPI_COMM_WORLD, opts), on),
      test::make_topology<Topology>(world_size()), c, opts, tuning, on);
  squall::communicator<squall::mpi_transport, Topology, C> host(
      squall::mpi_transport(MPI_COMM_WORLD, opts), test::make_topology<Topology>(world_size()), c,
      opts, tuning);
  for (const std::size_t count : {std::size_t{1}, std::size_t{1009}, std::size_t{70001}}) {
    const std::string label = squall::compressor_label<C>() + " (" +
                              std::string(squall::to_string(how)) + ") on " +
                              std::string(Topology::name) + ", " + std::to_string(count);
    auto on_device = device.template make_state<float>(count);
    auto on_host = host.template make_state<float>(count);
    for (int s = 0; s < 3; ++s) {
      const std::vector<float> in = input_of(world_rank(), s, count, false);
      std::vector<float> a = in;
      std::vector<float> b = in;
      device.allreduce(squall::device_view<float>(a.data(), count), on_device);
      host.allreduce(squall::host_view<float>(b), on_host);
      if (a != b) fail(label + ": the device-memory result differs at step " + std::to_string(s));
    }
    if (on_device.save() != on_host.save()) fail(label + ": saved states differ");
  }
}

}  // namespace

#define SQUALL_MPI_TOPOLOGIES                                            \
  squall::ring_topology, squall::tree_topology, squall::direct_topology, \
      squall::halving_doubling_topology

TEST_SUITE("mpi_compressed_collectives") {
  TEST_CASE_TEMPLATE("linear: cast<bfloat16>, randomk, count_sketch against MPI_Allreduce",
                     Topology, SQUALL_MPI_TOPOLOGIES) {
    check_linear<Topology>();
    CHECK(nobody_failed());
  }

  TEST_CASE_TEMPLATE("two_round: count sketch with error feedback against MPI_Allreduce", Topology,
                     squall::ring_topology, squall::direct_topology) {
    check_two_round<Topology>();
    CHECK(nobody_failed());
  }

  TEST_CASE_TEMPLATE("gather then reduce: int8, topk with error feedback, against the payloads",
                     Topology, SQUALL_MPI_TOPOLOGIES) {
    check_gather<Topology>();
    CHECK(nobody_failed());
  }

  TEST_CASE_TEMPLATE("per hop: int8 against the serial hops and the exact sum", Topology,
                     squall::ring_topology, squall::tree_topology) {
    check_per_hop<Topology>();
    CHECK(nobody_failed());
  }

  TEST_CASE_TEMPLATE("powersgd: exact on inputs of rank 1", Topology, SQUALL_MPI_TOPOLOGIES) {
    check_powersgd<Topology>();
    CHECK(nobody_failed());
  }

  TEST_CASE_TEMPLATE(
      "device pointers to MPI directly (device_mpi_transport), kernels deferred: gtopk, per_hop "
      "and hq's integer sum equal the host's",
      Topology, squall::ring_topology, squall::tree_topology) {
    using topk_ef = squall::error_feedback<squall::topk_compressor>;
    device_pointers_equal_host<Topology>(topk_ef{{.ratio = 0.01}}, squall::aggregation::gtopk);
    device_pointers_equal_host<Topology>(squall::int8_compressor{}, squall::aggregation::per_hop);
    device_pointers_equal_host<Topology>(squall::homomorphic_compressor{.bits = 4},
                                         squall::aggregation::linear);
    CHECK(nobody_failed());
  }
}
