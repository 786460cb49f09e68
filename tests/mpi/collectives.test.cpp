// SPDX-License-Identifier: Apache-2.0
// Oracle test of squall::communicator: every collective on every topology, over
// mpi_transport (MPI_COMM_WORLD) and over shm_transport (a fresh job per communicator), ranks
// as real processes under mpiexec, compared with MPI's own collectives on the same inputs:
// - allreduce: bitwise for integer sums and min/max, exactly for float sums of exact inputs
//   (also against the serial reference), within the reassociation bound for float sums of
//   non-exact inputs (against MPI_Allreduce and against a double sum);
// - allgather, reduce_scatter (uneven blocks: the first count % P one element longer) and
//   broadcast from every root: bitwise (float sums: within the bound);
// - every rank holds bitwise the same result (a hash of it, its MPI_MIN equal to its MPI_MAX);
// - and the shared dense checks (tests/support/collective_checks.hpp), as the thread and shm
//   runners run them, against the serial reference.
// A check that fails is counted and reported, never REQUIREd, so that all ranks keep making
// the same calls and a failure on one rank cannot hang the others.
// Suite mpi_collectives; ctest collective.mpi_collectives.np1 to np4.

#include <squall/algorithm/communicator.hpp>
#include <squall/topology/automatic.hpp>
#include <squall/topology/direct.hpp>
#include <squall/topology/halving_doubling.hpp>
#include <squall/topology/hierarchical.hpp>
#include <squall/topology/ring.hpp>
#include <squall/topology/tree.hpp>
#include <squall/transport/mpi.hpp>
#include <squall/transport/mpi_device.hpp>
#include <squall/transport/shm.hpp>

#include <doctest/doctest.h>
#include <mpi.h>

#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>  // setenv, unsetenv
#include <cstring>
#include <string>
#include <string_view>
#include <type_traits>
#include <unistd.h>  // getpid
#include <vector>

#include "../support/collective_checks.hpp"
#include "../support/collective_data.hpp"
#include "../support/data.hpp"
#include "../support/deferred_backend.hpp"
#include "../support/mpi_types.hpp"
#include "../support/result_hash.hpp"
#include "../support/topologies.hpp"

namespace {

using squall::test::mpi_op;
using squall::test::mpi_type;

using namespace std::chrono_literals;
using clock_type = std::chrono::steady_clock;
namespace test = squall::test;

constexpr std::size_t npos = static_cast<std::size_t>(-1);

/// The large allreduce: 64 Mi floats (256 MiB per rank), on every topology and transport.
/// The whole ctest took about 13 s at np4 on 2 cores (Open MPI 4.1, oversubscribed), well
/// under a minute, so np4 keeps the full size too.
constexpr std::size_t large_count = std::size_t{64} << 20;

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

/// Well below ctest's timeout, so that a hang reports the wait that hung.
squall::options transport_options() { return {.deadline = 120s}; }

/// A shm job name unique to this run: rank 0's pid and clock, the tag and a serial number.
/// Collective (MPI_Bcast).
squall::shm_job unique_job(std::string_view tag) {
  static unsigned serial = 0;
  long long id[2] = {static_cast<long long>(getpid()),
                     static_cast<long long>(clock_type::now().time_since_epoch().count())};
  MPI_Bcast(id, 2, MPI_LONG_LONG, 0, MPI_COMM_WORLD);
  return {"squall-mpi-" + std::to_string(id[0]) + "-" + std::to_string(id[1]) + "-" +
              std::string(tag) + "-" + std::to_string(serial++),
          world_rank(), world_size()};
}

struct over_mpi {
  using transport = squall::mpi_transport;
  static constexpr std::string_view name = "mpi_transport";
  static transport make(std::string_view) { return transport(MPI_COMM_WORLD, transport_options()); }
};

struct over_shm {
  using transport = squall::shm_transport;
  static constexpr std::string_view name = "shm_transport";
  static transport make(std::string_view tag) {
    return transport(unique_job(tag), transport_options());
  }
};

using squall::test::make_topology;

template <class Via, class Topology>
squall::communicator<typename Via::transport, Topology> make_communicator() {
  return squall::communicator<typename Via::transport, Topology>(
      Via::make(Topology::name), make_topology<Topology>(world_size()));
}

// ---- inputs ------------------------------------------------------------------------------------

enum class input_kind {
  exact,  ///< test::exact_input: small integers, every order of summation exact
  noisy,  ///< full-mantissa values: float sums round, differently in different orders
};

/// Element i of rank `rank`'s input; every rank can compute every rank's.
template <class T>
T input_value(input_kind kind, std::uint64_t seed, int rank, std::size_t i) {
  if (kind == input_kind::exact) return test::exact_value<T>(rank, i);
  const std::uint64_t h = test::mix(seed, rank, i);
  if constexpr (std::is_same_v<T, std::int32_t>) {
    return static_cast<std::int32_t>(static_cast<std::int64_t>(h % 2000001u) - 1000000);
  } else if constexpr (std::is_same_v<T, std::int64_t>) {
    return static_cast<std::int64_t>(h);  // the whole range: fine for min and max
  } else {
    // In [-1000, 1000), 53 (or 24) significant bits, plus an offset no power of two.
    const double unit = static_cast<double>(h >> 11) * 0x1.0p-53;
    return static_cast<T>((unit * 2.0 - 1.0) * 1000.0 * 0.37 + 1e-3);
  }
}

template <class T>
std::vector<T> make_input(input_kind kind, std::uint64_t seed, int rank, std::size_t count) {
  std::vector<T> v(count);
  for (std::size_t i = 0; i < count; ++i) v[i] = input_value<T>(kind, seed, rank, i);
  return v;
}

/// A buffer of `count` elements whose bytes are all 0xA5: what a collective never wrote.
template <class T>
std::vector<T> poisoned(std::size_t count) {
  std::vector<T> v(count);
  if (count != 0) std::memset(static_cast<void*>(v.data()), 0xA5, count * sizeof(T));
  return v;
}

// ---- checks ------------------------------------------------------------------------------------

/// Wrong elements: how many, and the first.
struct tally {
  std::size_t wrong = 0;
  std::size_t first = npos;
  void add(std::size_t i) {
    if (wrong++ == 0) first = i;
  }
};

/// Bitwise, element by element.
template <class T>
tally compare_bitwise(const T* got, const T* want, std::size_t count) {
  tally t;
  for (std::size_t i = 0; i < count; ++i) {
    if (std::memcmp(got + i, want + i, sizeof(T)) != 0) t.add(i);
  }
  return t;
}

/// Whether every rank holds bitwise the same `count` elements at `data` (collective).
template <class T>
bool same_on_every_rank(const T* data, std::size_t count) {
  const std::uint64_t mine = test::hash_bytes(data, count * sizeof(T));
  std::uint64_t lowest = 0;
  std::uint64_t highest = 0;
  MPI_Allreduce(&mine, &lowest, 1, MPI_UINT64_T, MPI_MIN, MPI_COMM_WORLD);
  MPI_Allreduce(&mine, &highest, 1, MPI_UINT64_T, MPI_MAX, MPI_COMM_WORLD);
  return lowest == highest && lowest == mine;
}

// Float sums of noisy inputs: |got - want| and |got - exact| within the reassociation bound
// of element i, the exact value a double sum over every rank's input.
template <class T>
tally compare_within_bound(const T* got, const T* want, std::size_t count, std::size_t first_index,
                           std::uint64_t seed) {
  const int p = world_size();
  tally t;
  for (std::size_t k = 0; k < count; ++k) {
    const std::size_t i = first_index + k;
    double exact = 0;
    double magnitude = 0;
    for (int q = 0; q < p; ++q) {
      const double x = static_cast<double>(input_value<T>(input_kind::noisy, seed, q, i));
      exact += x;
      magnitude += std::fabs(x);
    }
    const double bound = test::reassociation_bound<T>(p, magnitude);
    const auto g = static_cast<double>(got[k]);
    if (!(std::fabs(g - static_cast<double>(want[k])) <= bound) ||
        !(std::fabs(g - exact) <= bound)) {
      t.add(i);
    }
  }
  return t;
}

/// Element i of the serial reference for exact inputs, against `got`.
template <class T, class Op>
tally compare_exact_reference(const T* got, std::size_t count) {
  const int p = world_size();
  tally t;
  for (std::size_t i = 0; i < count; ++i) {
    if (test::as_double(got[i]) != test::exact_reference<T, Op>(p, i)) t.add(i);
  }
  return t;
}

#define SQUALL_CHECK_TALLY(t) \
  do {                        \
    const tally tally_ = (t); \
    CAPTURE(tally_.first);    \
    CHECK(tally_.wrong == 0); \
  } while (false)

// ---- allreduce
// -----------------------------------------------------------------------------------

/// One allreduce of `count` elements against MPI_Allreduce of the same inputs.
template <class T, class Op, class Comm>
void check_allreduce(Comm& comm, std::size_t count, input_kind kind, bool in_place,
                     std::uint64_t seed) {
  CAPTURE(count);
  CAPTURE(in_place);
  CAPTURE(kind == input_kind::exact);
  const int rank = comm.rank();
  const std::vector<T> mine = make_input<T>(kind, seed, rank, count);
  std::vector<T> want(count);
  MPI_Allreduce(mine.data(), want.data(), static_cast<int>(count), mpi_type<T>(), mpi_op<Op>(),
                MPI_COMM_WORLD);
  std::vector<T> got;
  if (in_place) {
    got = mine;
    comm.allreduce(squall::host_view<T>(got), Op{});
  } else {
    got = poisoned<T>(count);
    comm.allreduce(squall::host_view<const T>(mine), squall::host_view<T>(got), Op{});
    const std::vector<T> again = make_input<T>(kind, seed, rank, count);
    CHECK(std::memcmp(again.data(), mine.data(), count * sizeof(T)) == 0);  // input untouched
  }
  if constexpr (std::is_floating_point_v<T> && std::is_same_v<Op, squall::sum_op>) {
    if (kind == input_kind::noisy) {
      SQUALL_CHECK_TALLY(compare_within_bound(got.data(), want.data(), count, 0, seed));
    } else {
      SQUALL_CHECK_TALLY(compare_bitwise(got.data(), want.data(), count));
      SQUALL_CHECK_TALLY((compare_exact_reference<T, Op>(got.data(), count)));
    }
  } else {
    SQUALL_CHECK_TALLY(compare_bitwise(got.data(), want.data(), count));
    if (kind == input_kind::exact)
      SQUALL_CHECK_TALLY((compare_exact_reference<T, Op>(got.data(), count)));
  }
  CHECK(same_on_every_rank(got.data(), count));
}

/// Exact float inputs of `large_count` elements and MPI_Allreduce's sum of them, made once
/// (collective on first use) and checked once against the serial reference.
struct large_case {
  std::vector<float> input;
  std::vector<float> want;
  tally mpi_against_reference;
};

const large_case& large() {
  static const large_case c = [] {
    large_case made;
    made.input = test::exact_input<float>(world_rank(), large_count);
    made.want.resize(large_count);
    MPI_Allreduce(made.input.data(), made.want.data(), static_cast<int>(large_count), MPI_FLOAT,
                  MPI_SUM, MPI_COMM_WORLD);
    made.mpi_against_reference =
        compare_exact_reference<float, squall::sum_op>(made.want.data(), large_count);
    return made;
  }();
  return c;
}

template <class Via, class Topology>
void allreduce_against_mpi() {
  const int p = world_size();
  const std::string what = std::string(Via::name) + ", " + std::string(Topology::name);
  CAPTURE(what);
  auto comm = make_communicator<Via, Topology>();
  REQUIRE(comm.size() == p);
  REQUIRE(comm.rank() == world_rank());
  std::uint64_t seed = 1;
  const std::size_t sizes[] = {0, 1, 7, static_cast<std::size_t>(p) + 1, 1009, 65536 + 3};
  for (const std::size_t count : sizes) {
    check_allreduce<float, squall::sum_op>(comm, count, input_kind::noisy, true, ++seed);
    check_allreduce<float, squall::sum_op>(comm, count, input_kind::noisy, false, ++seed);
    check_allreduce<float, squall::sum_op>(comm, count, input_kind::exact, count % 2 == 0, ++seed);
    check_allreduce<std::int32_t, squall::sum_op>(comm, count, input_kind::noisy, count % 2 == 1,
                                                  ++seed);
    check_allreduce<double, squall::max_op>(comm, count, input_kind::noisy, count % 2 == 0, ++seed);
    check_allreduce<std::int64_t, squall::min_op>(comm, count, input_kind::noisy, count % 2 == 1,
                                                  ++seed);
  }

  // Large, in place: exact inputs, so MPI's sum, the reference and ours agree bitwise.
  const large_case& big = large();
  {
    CAPTURE(big.mpi_against_reference.first);
    CHECK(big.mpi_against_reference.wrong == 0);  // the oracle itself
  }
  std::vector<float> got = big.input;
  MPI_Barrier(MPI_COMM_WORLD);
  const auto start = clock_type::now();
  comm.allreduce(squall::host_view<float>(got));
  const double seconds = std::chrono::duration<double>(clock_type::now() - start).count();
  if (comm.rank() == 0) {
    std::printf("mpi_collectives: %s (%s), np%d: allreduce of %zu floats in %.3f s\n", what.c_str(),
                comm.schedule_for(large_count * sizeof(float)).c_str(), p, large_count, seconds);
    std::fflush(stdout);
  }
  {
    const std::size_t count = large_count;
    CAPTURE(count);
    if (std::memcmp(got.data(), big.want.data(), got.size() * sizeof(float)) != 0) {
      SQUALL_CHECK_TALLY(compare_bitwise(got.data(), big.want.data(), got.size()));
    }
    CHECK(same_on_every_rank(got.data(), got.size()));
  }
}

// ---- allgather, reduce_scatter, broadcast
// ----------------------------------------------------------

template <class Via, class Topology>
void others_against_mpi() {
  const int p = world_size();
  const auto up = static_cast<std::size_t>(p);
  const std::string what = std::string(Via::name) + ", " + std::string(Topology::name);
  CAPTURE(what);
  auto comm = make_communicator<Via, Topology>();
  const int rank = comm.rank();
  std::uint64_t seed = 1000;
  for (const std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{7}, up + 1,
                                  std::size_t{1009}, std::size_t{65536 + 3}}) {
    CAPTURE(count);
    // The blocks MPI_Reduce_scatter is given: the first count % P one element longer.
    std::vector<int> counts(up);
    std::vector<std::size_t> offsets(up);
    for (std::size_t q = 0, at = 0; q < up; ++q) {
      counts[q] = static_cast<int>(count / up + (q < count % up ? 1 : 0));
      offsets[q] = at;
      at += static_cast<std::size_t>(counts[q]);
    }
    const auto me = static_cast<std::size_t>(rank);
    const auto block = static_cast<std::size_t>(counts[me]);
    CHECK(comm.block_count(count) == block);
    CHECK(comm.block_offset(count) == offsets[me]);

    {  // allgather, out of place: doubles
      ++seed;
      const auto mine = make_input<double>(input_kind::noisy, seed, rank, count);
      auto got = poisoned<double>(count * up);
      comm.allgather(squall::host_view<const double>(mine), squall::host_view<double>(got));
      std::vector<double> want(count * up);
      MPI_Allgather(mine.data(), static_cast<int>(count), MPI_DOUBLE, want.data(),
                    static_cast<int>(count), MPI_DOUBLE, MPI_COMM_WORLD);
      SQUALL_CHECK_TALLY(compare_bitwise(got.data(), want.data(), got.size()));
      CHECK(same_on_every_rank(got.data(), got.size()));
    }
    {  // allgather, in place (the input is this rank's block of the output): int32
      ++seed;
      const auto mine = make_input<std::int32_t>(input_kind::noisy, seed, rank, count);
      auto got = poisoned<std::int32_t>(count * up);
      if (count != 0)
        std::memcpy(got.data() + me * count, mine.data(), count * sizeof(std::int32_t));
      comm.allgather(squall::host_view<const std::int32_t>(got.data() + me * count, count),
                     squall::host_view<std::int32_t>(got));
      std::vector<std::int32_t> want(count * up);
      MPI_Allgather(mine.data(), static_cast<int>(count), MPI_INT32_T, want.data(),
                    static_cast<int>(count), MPI_INT32_T, MPI_COMM_WORLD);
      SQUALL_CHECK_TALLY(compare_bitwise(got.data(), want.data(), got.size()));
    }
    {  // reduce_scatter, out of place: int32 sum
      ++seed;
      const auto in = make_input<std::int32_t>(input_kind::noisy, seed, rank, count);
      auto got = poisoned<std::int32_t>(block);
      comm.reduce_scatter(squall::host_view<const std::int32_t>(in),
                          squall::host_view<std::int32_t>(got));
      std::vector<std::int32_t> want(block);
      MPI_Reduce_scatter(in.data(), want.data(), counts.data(), MPI_INT32_T, MPI_SUM,
                         MPI_COMM_WORLD);
      SQUALL_CHECK_TALLY(compare_bitwise(got.data(), want.data(), block));
    }
    {  // reduce_scatter, in place: double max; this rank's block holds the result
      ++seed;
      const auto in = make_input<double>(input_kind::noisy, seed, rank, count);
      auto whole = in;
      comm.reduce_scatter(squall::host_view<double>(whole), squall::max_op{});
      std::vector<double> want(block);
      MPI_Reduce_scatter(in.data(), want.data(), counts.data(), MPI_DOUBLE, MPI_MAX,
                         MPI_COMM_WORLD);
      SQUALL_CHECK_TALLY(compare_bitwise(whole.data() + offsets[me], want.data(), block));
    }
    {  // reduce_scatter, out of place: float sum of noisy inputs, within the bound
      ++seed;
      const auto in = make_input<float>(input_kind::noisy, seed, rank, count);
      auto got = poisoned<float>(block);
      comm.reduce_scatter(squall::host_view<const float>(in), squall::host_view<float>(got));
      std::vector<float> want(block);
      MPI_Reduce_scatter(in.data(), want.data(), counts.data(), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      SQUALL_CHECK_TALLY(compare_within_bound(got.data(), want.data(), block, offsets[me], seed));
    }
    {  // reduce_scatter, in place: float sum of exact inputs, exactly
      const auto in = test::exact_input<float>(rank, count);
      auto whole = in;
      comm.reduce_scatter(squall::host_view<float>(whole));
      std::vector<float> want(block);
      MPI_Reduce_scatter(in.data(), want.data(), counts.data(), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      SQUALL_CHECK_TALLY(compare_bitwise(whole.data() + offsets[me], want.data(), block));
      tally t;
      for (std::size_t i = 0; i < block; ++i) {
        if (static_cast<double>(whole[offsets[me] + i]) !=
            test::exact_reference<float, squall::sum_op>(p, offsets[me] + i)) {
          t.add(offsets[me] + i);
        }
      }
      SQUALL_CHECK_TALLY(t);
    }
    // broadcast from every root: int64, the other ranks' buffers hold something else
    for (int root = 0; root < p; ++root) {
      CAPTURE(root);
      ++seed;
      auto data = make_input<std::int64_t>(input_kind::noisy, seed, rank, count);
      auto want = data;
      comm.broadcast(squall::host_view<std::int64_t>(data), root);
      MPI_Bcast(want.data(), static_cast<int>(count), MPI_INT64_T, root, MPI_COMM_WORLD);
      SQUALL_CHECK_TALLY(compare_bitwise(data.data(), want.data(), count));
      CHECK(same_on_every_rank(data.data(), count));
    }
  }
  comm.barrier();
}

/// The shared dense checks (collective_checks.hpp): every collective against the serial
/// reference, as the thread and shm runners run them.
template <class Via, class Topology>
void shared_checks() {
  const std::string what = std::string(Via::name) + ", " + std::string(Topology::name);
  CAPTURE(what);
  auto comm = make_communicator<Via, Topology>();
  test::findings found;
  test::check_dense_collectives(comm, found);
  INFO(found.text());
  CHECK(found.ok());
}

/// Device pointers handed to MPI as they are (`device_mpi_transport`, what a CUDA-aware MPI
/// takes) with kernels that run late, as on a stream: the deferred device backend, whose
/// "device" buffers are host memory that any MPI carries, queues every reduction and copy
/// until an ordering point and poisons what it will overwrite, so a message posted before
/// the kernels that wrote its bytes, or a receive into a buffer a queued kernel still reads,
/// gives a wrong answer here. The shared dense checks against the serial reference.
template <class Topology>
void device_pointer_checks() {
  using backend = test::deferred_device_backend;
  using transport = squall::device_mpi_transport<backend>;
  CAPTURE(std::string(Topology::name));
  const backend on;  // the transport's and the communicator's: copies share one queue
  squall::communicator<transport, Topology, squall::identity_compressor, backend> comm(
      transport(squall::mpi_transport(MPI_COMM_WORLD, transport_options()), on),
      make_topology<Topology>(world_size()), transport_options(), {}, on);
  test::findings found;
  test::check_dense_collectives(comm, found);
  INFO(found.text());
  CHECK(found.ok());
  CHECK(on.synchronizations() > 0);
}

}  // namespace

#define SQUALL_TOPOLOGIES                                                 \
  squall::ring_topology, squall::tree_topology, squall::direct_topology,  \
      squall::halving_doubling_topology, squall::hierarchical_topology<>, \
      squall::automatic_topology

TEST_SUITE("mpi_collectives") {
  TEST_CASE_TEMPLATE("every collective equals the serial reference, over mpi_transport", Topology,
                     SQUALL_TOPOLOGIES) {
    shared_checks<over_mpi, Topology>();
  }
  TEST_CASE_TEMPLATE("every collective equals the serial reference, over shm_transport", Topology,
                     SQUALL_TOPOLOGIES) {
    shared_checks<over_shm, Topology>();
  }
  TEST_CASE_TEMPLATE("allreduce matches MPI_Allreduce, over mpi_transport", Topology,
                     SQUALL_TOPOLOGIES) {
    allreduce_against_mpi<over_mpi, Topology>();
  }
  TEST_CASE_TEMPLATE("allreduce matches MPI_Allreduce, over shm_transport", Topology,
                     SQUALL_TOPOLOGIES) {
    allreduce_against_mpi<over_shm, Topology>();
  }
  TEST_CASE_TEMPLATE("allgather, reduce_scatter, broadcast match MPI, over mpi_transport", Topology,
                     SQUALL_TOPOLOGIES) {
    others_against_mpi<over_mpi, Topology>();
  }
  TEST_CASE_TEMPLATE("allgather, reduce_scatter, broadcast match MPI, over shm_transport", Topology,
                     SQUALL_TOPOLOGIES) {
    others_against_mpi<over_shm, Topology>();
  }
  TEST_CASE_TEMPLATE(
      "device pointers to MPI directly (device_mpi_transport), kernels deferred: every "
      "collective equals the serial reference",
      Topology, squall::ring_topology, squall::tree_topology, squall::direct_topology,
      squall::halving_doubling_topology) {
    device_pointer_checks<Topology>();
  }
  TEST_CASE("device_mpi_transport: SQUALL_MPI_CUDA_AWARE decides, a bad value is named") {
    // (the variable is this process's: every rank sets the same, so all agree)
    setenv("SQUALL_MPI_CUDA_AWARE", "1", 1);
    CHECK(squall::mpi_cuda_aware());
    CHECK(squall::query_mpi_device_support().source == "SQUALL_MPI_CUDA_AWARE");
    setenv("SQUALL_MPI_CUDA_AWARE", "0", 1);
    CHECK_FALSE(squall::mpi_cuda_aware());
    setenv("SQUALL_MPI_CUDA_AWARE", "yes", 1);
    CHECK_THROWS_WITH_AS(squall::mpi_cuda_aware(), doctest::Contains("SQUALL_MPI_CUDA_AWARE=yes"),
                         squall::invalid_argument);
    unsetenv("SQUALL_MPI_CUDA_AWARE");
    // this machine's MPI has no GPU support built in: its own answer is no
    const squall::mpi_device_support asked = squall::query_mpi_device_support();
    MESSAGE("MPI takes CUDA device pointers: " << asked.cuda << " (" << asked.source << ")");
  }
}
