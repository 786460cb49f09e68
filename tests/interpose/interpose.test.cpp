// SPDX-License-Identifier: Apache-2.0
// libsquall_mpi.so under mpiexec: every intercepted call against PMPI_*'s answer in the same
// run, and squall_mpi_counts() says whether squall or MPI took each call. The executable links
// the library before MPI (the other way in, LD_PRELOAD, is tested by the mpi4py scripts and
// the MPI suites rerun preloaded). Run with SQUALL_MPI_MIN_BYTES=4096.
//
// SQUALL_TEST_EXPECT_OFF=1: the job was started with settings that differ between ranks, so
// squall must be off and MPI must take every call (the results are still checked).
// SQUALL_RANKS_PER_NODE=k: communicators of more than k ranks span "nodes" of k consecutive
// ranks, and every allreduce squall takes on them must run in tiers (shared memory inside the
// nodes, MPI across); SQUALL_TEST_NODE_WIDTH=k says the same of real hosts of k ranks each.

#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <malloc.h>  // malloc_usable_size
#include <string>
#include <tuple>
#include <utility>
#include <vector>

extern "C" int squall_mpi_counts(unsigned long long* handled, unsigned long long* passed,
                                 unsigned long long* compressed);
extern "C" unsigned long long squall_mpi_tiered_calls();
extern "C" unsigned long long squall_mpi_shared_heap_mappings();

namespace {

int rank_of(MPI_Comm comm) {
  int r = 0;
  MPI_Comm_rank(comm, &r);
  return r;
}
int size_of(MPI_Comm comm) {
  int s = 0;
  MPI_Comm_size(comm, &s);
  return s;
}

/// Whether the test asked MPI for MPI_THREAD_MULTIPLE (SQUALL_TEST_THREAD_MULTIPLE=1).
bool thread_multiple() {
  const char* multiple = std::getenv("SQUALL_TEST_THREAD_MULTIPLE");
  return multiple != nullptr && std::string(multiple) == "1";
}

bool expect_off() {
  const char* off = std::getenv("SQUALL_TEST_EXPECT_OFF");
  return off != nullptr && std::string(off) == "1";
}

/// Whether the settings let squall take collective `name` (SQUALL_MPI_COLLECTIVES, as the
/// library reads it; unset: all but ibcast, barrier, ibarrier, iallgather and iallgatherv).
bool takes(const std::string& name) {
  const char* list = std::getenv("SQUALL_MPI_COLLECTIVES");
  const std::string text = list != nullptr ? "," + std::string(list) + ","
                                           : ",allreduce,allgather,reduce_scatter_block,bcast,"
                                             "iallreduce,ireduce_scatter_block,allgatherv,"
                                             "reduce_scatter,ireduce_scatter,";
  return text.find(",all,") != std::string::npos ||
         text.find("," + name + ",") != std::string::npos;
}

bool takes_nonblocking(const std::string& name, MPI_Comm comm, std::size_t bytes);

/// Runs `call` and checks that squall took it (`handled`) or MPI did.
template <class F>
void expect_route(bool handled, F&& call) {
  unsigned long long h0 = 0, p0 = 0, h1 = 0, p1 = 0;
  squall_mpi_counts(&h0, &p0, nullptr);
  REQUIRE(call() == MPI_SUCCESS);
  squall_mpi_counts(&h1, &p1, nullptr);
  const bool squall_took = h1 == h0 + 1 && p1 == p0;
  const bool mpi_took = p1 == p0 + 1 && h1 == h0;
  CHECK((handled && !expect_off() ? squall_took : mpi_took));
}

/// Whether squall's allreduces on `comm` must run in tiers: nodes of SQUALL_RANKS_PER_NODE
/// consecutive ranks, or SQUALL_TEST_NODE_WIDTH per real host (tests/cluster).
bool spans_nodes(MPI_Comm comm) {
  const char* per = std::getenv("SQUALL_RANKS_PER_NODE");
  if (per == nullptr) per = std::getenv("SQUALL_TEST_NODE_WIDTH");
  return per != nullptr && !expect_off() && size_of(comm) > std::atoi(per);
}

/// Whether the nodes `comm` spans hold alike many ranks (the width divides its size).
bool nodes_alike(MPI_Comm comm) {
  const char* per = std::getenv("SQUALL_RANKS_PER_NODE");
  if (per == nullptr) per = std::getenv("SQUALL_TEST_NODE_WIDTH");
  return per != nullptr && size_of(comm) % std::atoi(per) == 0;
}

/// Runs `call` through `expect_route`, and checks that it ran in tiers (shared memory inside
/// the nodes, MPI across) exactly when `tiered`.
template <class F>
void expect_tiered_route(bool handled, bool tiered, F&& call) {
  const unsigned long long before = squall_mpi_tiered_calls();
  expect_route(handled, call);
  CHECK(squall_mpi_tiered_calls() == before + (tiered && !expect_off() ? 1 : 0));
}

/// An allreduce or broadcast `call` on `comm`: in tiers whenever squall takes it on a
/// communicator that spans nodes.
template <class F>
void expect_allreduce_route(bool handled, MPI_Comm comm, F&& call) {
  expect_tiered_route(handled, handled && spans_nodes(comm), call);
}

/// A reduce_scatter_block or allgather `call` on `comm`: in tiers where squall takes it on a
/// communicator that spans nodes of alike many ranks (otherwise on MPI alone).
template <class F>
void expect_scatter_route(bool handled, MPI_Comm comm, F&& call) {
  expect_tiered_route(handled, handled && spans_nodes(comm) && nodes_alike(comm), call);
}

/// Whether squall takes an MPI_Bcast of `bytes` on `comm` (the tests' SQUALL_MPI_MIN_BYTES is
/// 4096): with SQUALL_MPI_COLLECTIVES unset only up to 1 MiB and on one host (shared memory,
/// not SQUALL_MPI_TRANSPORT=mpi); naming bcast takes every size on any communicator.
bool takes_bcast(std::size_t bytes, MPI_Comm comm) {
  if (!takes("bcast") || bytes < 4096) return false;
  if (std::getenv("SQUALL_MPI_COLLECTIVES") != nullptr) return true;
  const char* transport = std::getenv("SQUALL_MPI_TRANSPORT");
  return bytes <= (std::size_t{1} << 20) && !spans_nodes(comm) &&
         (transport == nullptr || std::string(transport) != "mpi");
}

/// Integer-valued data (exact in every type and any reduction order), different per rank.
template <class T>
std::vector<T> data_of(std::size_t count, int rank, int salt) {
  std::vector<T> v(count);
  for (std::size_t i = 0; i < count; ++i) {
    v[i] = static_cast<T>(
        static_cast<long>(
            (i * 7 + static_cast<std::size_t>(rank) * 13 + static_cast<std::size_t>(salt)) % 1001) -
        500);
  }
  return v;
}

template <class T>
void allreduce_case(MPI_Datatype type, MPI_Op op, std::size_t count, bool in_place,
                    MPI_Comm comm = MPI_COMM_WORLD) {
  CAPTURE(count);
  CAPTURE(in_place);
  const int rank = rank_of(comm);
  const std::vector<T> input = data_of<T>(count, rank, static_cast<int>(count % 17));
  std::vector<T> reference(count);
  REQUIRE(PMPI_Allreduce(input.data(), reference.data(), static_cast<int>(count), type, op, comm) ==
          MPI_SUCCESS);
  std::vector<T> result = in_place ? input : std::vector<T>(count);
  const int n = static_cast<int>(count);
  expect_allreduce_route(count * sizeof(T) >= 4096, comm, [&] {
    return in_place ? MPI_Allreduce(MPI_IN_PLACE, result.data(), n, type, op, comm)
                    : MPI_Allreduce(input.data(), result.data(), n, type, op, comm);
  });
  CHECK(std::memcmp(result.data(), reference.data(), count * sizeof(T)) == 0);
}

TEST_CASE("allreduce: every handled type and op, in and out of place, against PMPI") {
  for (const std::size_t count : {1ul, 1000ul, 1024ul, 65537ul, 300001ul}) {
    for (const bool in_place : {false, true}) {
      for (MPI_Op op : {MPI_SUM, MPI_MIN, MPI_MAX}) {
        allreduce_case<float>(MPI_FLOAT, op, count, in_place);
        allreduce_case<double>(MPI_DOUBLE, op, count, in_place);
        allreduce_case<std::int32_t>(MPI_INT, op, count, in_place);
        allreduce_case<std::int32_t>(MPI_INT32_T, op, count, in_place);
        allreduce_case<long>(MPI_LONG, op, count, in_place);
        allreduce_case<std::int64_t>(MPI_INT64_T, op, count, in_place);
      }
    }
  }
}

#if MPI_VERSION >= 4
TEST_CASE("the large-count forms (MPI 4) take the same routes") {
  const int rank = rank_of(MPI_COMM_WORLD);
  const int size = size_of(MPI_COMM_WORLD);
  const MPI_Count count = 70001;
  const std::vector<double> input = data_of<double>(static_cast<std::size_t>(count), rank, 4);
  std::vector<double> reference(input.size()), result(input.size());
  PMPI_Allreduce_c(input.data(), reference.data(), count, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  expect_route(true, [&] {
    return MPI_Allreduce_c(input.data(), result.data(), count, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  });
  CHECK(result == reference);
  std::vector<double> gathered(input.size() * static_cast<std::size_t>(size));
  std::vector<double> gathered_ref(gathered.size());
  PMPI_Allgather_c(input.data(), count, MPI_DOUBLE, gathered_ref.data(), count, MPI_DOUBLE,
                   MPI_COMM_WORLD);
  expect_scatter_route(true, MPI_COMM_WORLD, [&] {
    return MPI_Allgather_c(input.data(), count, MPI_DOUBLE, gathered.data(), count, MPI_DOUBLE,
                           MPI_COMM_WORLD);
  });
  CHECK(gathered == gathered_ref);
  std::vector<double> block(input.size()), block_ref(input.size());
  PMPI_Reduce_scatter_block_c(gathered.data(), block_ref.data(), count, MPI_DOUBLE, MPI_MAX,
                              MPI_COMM_WORLD);
  expect_scatter_route(true, MPI_COMM_WORLD, [&] {
    return MPI_Reduce_scatter_block_c(gathered.data(), block.data(), count, MPI_DOUBLE, MPI_MAX,
                                      MPI_COMM_WORLD);
  });
  CHECK(block == block_ref);
  // the -v forms of alike blocks: the allgatherv's blocks in reverse order
  const std::vector<MPI_Count> counts(static_cast<std::size_t>(size), count);
  std::vector<MPI_Aint> reversed(counts.size());
  for (std::size_t q = 0; q < reversed.size(); ++q) {
    reversed[q] = static_cast<MPI_Aint>(reversed.size() - 1 - q) * count;
  }
  PMPI_Allgatherv_c(input.data(), count, MPI_DOUBLE, gathered_ref.data(), counts.data(),
                    reversed.data(), MPI_DOUBLE, MPI_COMM_WORLD);
  expect_scatter_route(takes("allgatherv"), MPI_COMM_WORLD, [&] {
    return MPI_Allgatherv_c(input.data(), count, MPI_DOUBLE, gathered.data(), counts.data(),
                            reversed.data(), MPI_DOUBLE, MPI_COMM_WORLD);
  });
  CHECK(gathered == gathered_ref);
  PMPI_Reduce_scatter_c(gathered.data(), block_ref.data(), counts.data(), MPI_DOUBLE, MPI_SUM,
                        MPI_COMM_WORLD);
  expect_scatter_route(takes("reduce_scatter"), MPI_COMM_WORLD, [&] {
    return MPI_Reduce_scatter_c(gathered.data(), block.data(), counts.data(), MPI_DOUBLE, MPI_SUM,
                                MPI_COMM_WORLD);
  });
  CHECK(block == block_ref);
  // blocks of different sizes in squall's split (the last rank's one shorter), and the
  // non-blocking allgatherv of the reversed blocks
  std::vector<MPI_Count> split(counts);
  if (size > 1) split.back() -= 1;
  PMPI_Reduce_scatter_c(gathered.data(), block_ref.data(), split.data(), MPI_DOUBLE, MPI_SUM,
                        MPI_COMM_WORLD);
  expect_scatter_route(takes("reduce_scatter"), MPI_COMM_WORLD, [&] {
    return MPI_Reduce_scatter_c(gathered.data(), block.data(), split.data(), MPI_DOUBLE, MPI_SUM,
                                MPI_COMM_WORLD);
  });
  const auto mine = static_cast<long>(split[static_cast<std::size_t>(rank)]);
  CHECK(std::equal(block.begin(), block.begin() + mine, block_ref.begin()));
  std::fill(gathered.begin(), gathered.end(), -1.0);
  MPI_Request request = MPI_REQUEST_NULL;
  expect_scatter_route(
      takes_nonblocking("iallgatherv", MPI_COMM_WORLD, gathered.size() * sizeof(double)),
      MPI_COMM_WORLD, [&] {
        return MPI_Iallgatherv_c(input.data(), count, MPI_DOUBLE, gathered.data(), counts.data(),
                                 reversed.data(), MPI_DOUBLE, MPI_COMM_WORLD, &request);
      });
  REQUIRE(MPI_Wait(&request, MPI_STATUS_IGNORE) == MPI_SUCCESS);
  CHECK(gathered == gathered_ref);
  std::vector<double> data = rank == 0 ? input : std::vector<double>(input.size());
  const std::vector<double> expected = data_of<double>(static_cast<std::size_t>(count), 0, 4);
  expect_allreduce_route(
      takes_bcast(static_cast<std::size_t>(count) * 8, MPI_COMM_WORLD), MPI_COMM_WORLD,
      [&] { return MPI_Bcast_c(data.data(), count, MPI_DOUBLE, 0, MPI_COMM_WORLD); });
  CHECK(data == expected);
}
#endif

TEST_CASE("allreduce: random floats within reassociation of the exact sum") {
  const int rank = rank_of(MPI_COMM_WORLD);
  const int size = size_of(MPI_COMM_WORLD);
  const std::size_t count = 100003;
  const auto value = [](int r, std::size_t i) {
    return static_cast<float>(std::sin(0.37 * static_cast<double>(i) + r) * 3.0);
  };
  std::vector<float> data(count);
  for (std::size_t i = 0; i < count; ++i) data[i] = value(rank, i);
  expect_allreduce_route(true, MPI_COMM_WORLD, [&] {
    return MPI_Allreduce(MPI_IN_PLACE, data.data(), static_cast<int>(count), MPI_FLOAT, MPI_SUM,
                         MPI_COMM_WORLD);
  });
  std::size_t bad = 0;
  for (std::size_t i = 0; i < count; ++i) {
    double exact = 0, magnitude = 0;
    for (int r = 0; r < size; ++r) {
      exact += value(r, i);
      magnitude += std::fabs(value(r, i));
    }
    if (std::fabs(data[i] - exact) > size * 1.2e-7 * magnitude) ++bad;
  }
  CHECK(bad == 0);
  // Every rank holds the same bits (MPI's broadcast, not squall's, says so).
  std::vector<float> first(data);
  PMPI_Bcast(first.data(), static_cast<int>(count), MPI_FLOAT, 0, MPI_COMM_WORLD);
  CHECK(std::memcmp(first.data(), data.data(), count * sizeof(float)) == 0);
}

unsigned long long compressed_calls() {
  unsigned long long compressed = 0;
  squall_mpi_counts(nullptr, nullptr, &compressed);
  return compressed;
}

// Run with SQUALL_MPI_COMPRESSOR=cast:bf16 SQUALL_MPI_COMPRESSOR_COMMS=squall_test_grads
// SQUALL_TEST_COMPRESSED=1; the other cases run beside it and must stay exact, so they show
// that nothing else is compressed.
TEST_CASE("lossy compression: float sums on the communicators named, within bf16's bound") {
  const char* flag = std::getenv("SQUALL_TEST_COMPRESSED");
  if (flag == nullptr || std::string(flag) != "1") return;
  MPI_Comm grads = MPI_COMM_NULL;
  MPI_Comm_dup(MPI_COMM_WORLD, &grads);
  MPI_Comm_set_name(grads, "squall_test_grads");
  const int rank = rank_of(grads);
  const int size = size_of(grads);
  const std::size_t count = 50021;
  const auto value = [](int r, std::size_t i) {
    return static_cast<float>(std::sin(0.61 * static_cast<double>(i) + 2 * r) * 5.0);
  };
  std::vector<float> data(count), reference(count);
  for (std::size_t i = 0; i < count; ++i) data[i] = value(rank, i);
  PMPI_Allreduce(data.data(), reference.data(), static_cast<int>(count), MPI_FLOAT, MPI_SUM, grads);
  const unsigned long long before = compressed_calls();
  expect_allreduce_route(true, grads, [&] {
    return MPI_Allreduce(MPI_IN_PLACE, data.data(), static_cast<int>(count), MPI_FLOAT, MPI_SUM,
                         grads);
  });
  CHECK(compressed_calls() == before + 1);
  // bf16 keeps 8 significant bits (u = 2^-8): each input rounds once and each partial sum at
  // most once per rank, so |result - exact| <= 2 P u sum_r |x_r|.
  std::size_t outside = 0, lossy = 0;
  for (std::size_t i = 0; i < count; ++i) {
    double exact = 0, magnitude = 0;
    for (int r = 0; r < size; ++r) {
      exact += value(r, i);
      magnitude += std::fabs(value(r, i));
    }
    if (std::fabs(data[i] - exact) > 2.0 * size * std::ldexp(1.0, -8) * magnitude) ++outside;
    if (data[i] != reference[i]) ++lossy;
  }
  CHECK(outside == 0);
  CHECK(lossy > count / 4);  // it was compressed: most sums lost bits
  std::vector<float> first(data);
  PMPI_Bcast(first.data(), static_cast<int>(count), MPI_FLOAT, 0, grads);
  CHECK(std::memcmp(first.data(), data.data(), count * sizeof(float)) == 0);
  // Doubles, ints and float MAX on that communicator stay exact and uncompressed.
  allreduce_case<double>(MPI_DOUBLE, MPI_SUM, 30000, false, grads);
  allreduce_case<std::int32_t>(MPI_INT, MPI_SUM, 30000, true, grads);
  allreduce_case<float>(MPI_FLOAT, MPI_MAX, 30000, false, grads);
  CHECK(compressed_calls() == before + 1);
  MPI_Comm_free(&grads);
}

// Run with SQUALL_MPI_SHARED_HEAP=1M SQUALL_TEST_SHARED_HEAP=1 (and the rest of this program
// beside it, every large buffer of its other cases then on the shared heap too).
TEST_CASE("SQUALL_MPI_SHARED_HEAP: large mallocs shared, the peers' buffers reached by mapping") {
  const char* flag = std::getenv("SQUALL_TEST_SHARED_HEAP");
  if (flag == nullptr || std::string(flag) != "1") return;
  const int rank = rank_of(MPI_COMM_WORLD);
  const int size = size_of(MPI_COMM_WORLD);
  // 4 MiB and 16 MiB of floats: above the windows' bound, where squall reads and writes the
  // peers' buffers; new allocations each time, so the peers map them afresh
  for (const std::size_t count : {(std::size_t{1} << 20) + 7, (std::size_t{1} << 22) + 1}) {
    CAPTURE(count);
    std::vector<float> in(count), out(count), want(count);
    for (std::size_t i = 0; i < count; ++i) in[i] = static_cast<float>((rank + 1) * (i % 13));
    PMPI_Allreduce(in.data(), want.data(), static_cast<int>(count), MPI_FLOAT, MPI_SUM,
                   MPI_COMM_WORLD);
    const unsigned long long before = squall_mpi_shared_heap_mappings();
    expect_allreduce_route(true, MPI_COMM_WORLD, [&] {
      return MPI_Allreduce(in.data(), out.data(), static_cast<int>(count), MPI_FLOAT, MPI_SUM,
                           MPI_COMM_WORLD);
    });
    CHECK(std::memcmp(out.data(), want.data(), count * sizeof(float)) == 0);
    expect_allreduce_route(true, MPI_COMM_WORLD, [&] {
      return MPI_Allreduce(MPI_IN_PLACE, in.data(), static_cast<int>(count), MPI_FLOAT, MPI_SUM,
                           MPI_COMM_WORLD);
    });
    CHECK(std::memcmp(in.data(), want.data(), count * sizeof(float)) == 0);
    if (size > 1 && !expect_off()) CHECK(squall_mpi_shared_heap_mappings() > before);
  }
  // realloc of a shared-heap allocation keeps its bytes, within it and moved out of it
  auto* p = static_cast<unsigned char*>(std::malloc(std::size_t{3} << 20));
  REQUIRE(p != nullptr);
  std::memset(p, 5, std::size_t{3} << 20);
  CHECK(malloc_usable_size(p) >= (std::size_t{3} << 20));
  p = static_cast<unsigned char*>(std::realloc(p, std::size_t{3} << 20 | 1));  // within
  REQUIRE(p != nullptr);
  p = static_cast<unsigned char*>(std::realloc(p, std::size_t{9} << 20));  // moved
  REQUIRE(p != nullptr);
  CHECK(std::all_of(p, p + (std::size_t{3} << 20), [](unsigned char c) { return c == 5; }));
  std::free(p);
  void* aligned = nullptr;
  REQUIRE(posix_memalign(&aligned, 4096, std::size_t{2} << 20) == 0);
  CHECK(reinterpret_cast<std::uintptr_t>(aligned) % 4096 == 0);
  std::free(aligned);
  auto* zeros = static_cast<unsigned char*>(std::calloc(std::size_t{1} << 20, 4));
  REQUIRE(zeros != nullptr);
  CHECK(std::all_of(zeros, zeros + (std::size_t{4} << 20), [](unsigned char c) { return c == 0; }));
  std::free(zeros);
}

TEST_CASE("allreduce: derived types of one element type; ranks describe one signature alike") {
  // Open MPI 4.1 refuses predefined ops on derived types (MPI_ERR_OP), so with squall off
  // there is nothing to compare.
  if (expect_off()) return;
  const int rank = rank_of(MPI_COMM_WORLD);
  const std::size_t groups = 3001;  // 4 floats each
  const std::vector<float> input = data_of<float>(groups * 4, rank, 3);
  std::vector<float> reference(groups * 4);
  PMPI_Allreduce(input.data(), reference.data(), static_cast<int>(groups * 4), MPI_FLOAT, MPI_SUM,
                 MPI_COMM_WORLD);

  // A contiguous type of 4 floats on even ranks, plain floats on odd ones: one signature.
  MPI_Datatype four = MPI_DATATYPE_NULL;
  MPI_Type_contiguous(4, MPI_FLOAT, &four);
  MPI_Type_commit(&four);
  std::vector<float> result(groups * 4);
  expect_route(true, [&] {
    return rank % 2 == 0 ? MPI_Allreduce(input.data(), result.data(), static_cast<int>(groups),
                                         four, MPI_SUM, MPI_COMM_WORLD)
                         : MPI_Allreduce(input.data(), result.data(), static_cast<int>(groups * 4),
                                         MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  });
  CHECK(result == reference);

  // Every other float of a buffer twice as long (a vector with gaps): packed around squall.
  MPI_Datatype strided = MPI_DATATYPE_NULL;
  MPI_Type_vector(static_cast<int>(groups * 4), 1, 2, MPI_FLOAT, &strided);
  MPI_Type_commit(&strided);
  std::vector<float> sparse(groups * 8, -1.0f);
  for (std::size_t i = 0; i < groups * 4; ++i) sparse[2 * i] = input[i];
  expect_route(true, [&] {
    return MPI_Allreduce(MPI_IN_PLACE, sparse.data(), 1, strided, MPI_SUM, MPI_COMM_WORLD);
  });
  for (std::size_t i = 0; i < groups * 4; ++i) {
    REQUIRE(sparse[2 * i] == reference[i]);
    REQUIRE(sparse[2 * i + 1] == -1.0f);  // the gaps untouched
  }
  MPI_Type_free(&strided);
  MPI_Type_free(&four);
}

void user_sum(void* in, void* inout, int* len, MPI_Datatype*) {
  for (int i = 0; i < *len; ++i) static_cast<float*>(inout)[i] += static_cast<float*>(in)[i];
}

TEST_CASE("what squall does not handle goes to MPI and gets MPI's answer") {
  const int rank = rank_of(MPI_COMM_WORLD);
  const std::size_t count = 20000;
  const std::vector<float> input = data_of<float>(count, rank, 5);
  const auto compare = [&](MPI_Datatype type, MPI_Op op, int n, const void* in, std::size_t bytes) {
    std::vector<char> reference(bytes), result(bytes);
    REQUIRE(PMPI_Allreduce(in, reference.data(), n, type, op, MPI_COMM_WORLD) == MPI_SUCCESS);
    expect_route(false,
                 [&] { return MPI_Allreduce(in, result.data(), n, type, op, MPI_COMM_WORLD); });
    CHECK(result == reference);
  };
  SUBCASE("a user-defined op") {
    MPI_Op op = MPI_OP_NULL;
    MPI_Op_create(user_sum, 1, &op);
    compare(MPI_FLOAT, op, static_cast<int>(count), input.data(), count * sizeof(float));
    MPI_Op_free(&op);
  }
  SUBCASE("MPI_PROD") {
    compare(MPI_FLOAT, MPI_PROD, static_cast<int>(count), input.data(), count * sizeof(float));
  }
  SUBCASE("MPI_MAXLOC on float-int pairs") {
    struct pair {
      float value;
      int index;
    };
    std::vector<pair> pairs(count);
    for (std::size_t i = 0; i < count; ++i) pairs[i] = {input[i], rank};
    compare(MPI_FLOAT_INT, MPI_MAXLOC, static_cast<int>(count), pairs.data(), count * sizeof(pair));
  }
  SUBCASE("element types squall does not reduce: short, unsigned, a pair") {
    const std::vector<std::int32_t> words = data_of<std::int32_t>(count, rank, 9);
    compare(MPI_SHORT, MPI_SUM, static_cast<int>(count * 2), words.data(), count * 4);
    compare(MPI_UNSIGNED, MPI_MAX, static_cast<int>(count), words.data(), count * 4);
    compare(MPI_2INT, MPI_MINLOC, static_cast<int>(count / 2), words.data(), count * 4);
  }
  SUBCASE("below SQUALL_MPI_MIN_BYTES") {
    compare(MPI_FLOAT, MPI_SUM, 1000, input.data(), 1000 * sizeof(float));
  }
  SUBCASE("an intercommunicator") {
    const int size = size_of(MPI_COMM_WORLD);
    if (size < 2) return;
    MPI_Comm half = MPI_COMM_NULL, inter = MPI_COMM_NULL;
    MPI_Comm_split(MPI_COMM_WORLD, rank % 2, rank, &half);
    MPI_Intercomm_create(half, 0, MPI_COMM_WORLD, rank % 2 == 0 ? 1 : 0, 7, &inter);
    std::vector<float> ref(count), out(count);
    REQUIRE(PMPI_Allreduce(input.data(), ref.data(), static_cast<int>(count), MPI_FLOAT, MPI_SUM,
                           inter) == MPI_SUCCESS);
    expect_route(false, [&] {
      return MPI_Allreduce(input.data(), out.data(), static_cast<int>(count), MPI_FLOAT, MPI_SUM,
                           inter);
    });
    CHECK(out == ref);
    MPI_Comm_free(&inter);
    MPI_Comm_free(&half);
  }
}

TEST_CASE("reduce_scatter_block, allgather, bcast and barrier against PMPI") {
  const int rank = rank_of(MPI_COMM_WORLD);
  const int size = size_of(MPI_COMM_WORLD);
  for (const std::size_t block : {10ul, 3000ul, 70001ul}) {
    CAPTURE(block);
    const bool big = block * 4 * static_cast<std::size_t>(size) >= 4096;
    const std::vector<float> input =
        data_of<float>(block * static_cast<std::size_t>(size), rank, 1);
    std::vector<float> reference(block), out(block);
    PMPI_Reduce_scatter_block(input.data(), reference.data(), static_cast<int>(block), MPI_FLOAT,
                              MPI_SUM, MPI_COMM_WORLD);
    expect_scatter_route(big, MPI_COMM_WORLD, [&] {
      return MPI_Reduce_scatter_block(input.data(), out.data(), static_cast<int>(block), MPI_FLOAT,
                                      MPI_SUM, MPI_COMM_WORLD);
    });
    CHECK(out == reference);
    std::vector<float> in_place = input;
    expect_scatter_route(big, MPI_COMM_WORLD, [&] {
      return MPI_Reduce_scatter_block(MPI_IN_PLACE, in_place.data(), static_cast<int>(block),
                                      MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    });
    CHECK(std::vector<float>(in_place.begin(), in_place.begin() + static_cast<long>(block)) ==
          reference);

    const std::vector<std::int32_t> mine = data_of<std::int32_t>(block, rank, 2);
    std::vector<std::int32_t> gathered_ref(block * static_cast<std::size_t>(size));
    std::vector<std::int32_t> gathered(gathered_ref.size());
    PMPI_Allgather(mine.data(), static_cast<int>(block), MPI_INT, gathered_ref.data(),
                   static_cast<int>(block), MPI_INT, MPI_COMM_WORLD);
    expect_scatter_route(big, MPI_COMM_WORLD, [&] {
      return MPI_Allgather(mine.data(), static_cast<int>(block), MPI_INT, gathered.data(),
                           static_cast<int>(block), MPI_INT, MPI_COMM_WORLD);
    });
    CHECK(gathered == gathered_ref);
    std::vector<std::int32_t> gathered_in_place(gathered_ref.size());
    std::copy(mine.begin(), mine.end(),
              gathered_in_place.begin() + static_cast<long>(block) * rank);
    expect_scatter_route(big, MPI_COMM_WORLD, [&] {
      return MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, gathered_in_place.data(),
                           static_cast<int>(block), MPI_INT, MPI_COMM_WORLD);
    });
    CHECK(gathered_in_place == gathered_ref);

    for (int root = 0; root < size; ++root) {
      std::vector<double> data = data_of<double>(block, rank, root);
      const std::vector<double> expected = data_of<double>(block, root, root);
      expect_allreduce_route(takes_bcast(block * 8, MPI_COMM_WORLD), MPI_COMM_WORLD, [&] {
        return MPI_Bcast(data.data(), static_cast<int>(block), MPI_DOUBLE, root, MPI_COMM_WORLD);
      });
      CHECK(data == expected);
    }
  }
  // The default's bound: squall takes a broadcast of 1 MiB, MPI one of 4 bytes more (unless
  // SQUALL_MPI_COLLECTIVES names bcast).
  for (const std::size_t words : {std::size_t{1} << 18, (std::size_t{1} << 18) + 1}) {
    CAPTURE(words);
    const int root = size - 1;
    std::vector<float> data = data_of<float>(words, rank, 5);
    const std::vector<float> expected = data_of<float>(words, root, 5);
    expect_allreduce_route(takes_bcast(words * 4, MPI_COMM_WORLD), MPI_COMM_WORLD, [&] {
      return MPI_Bcast(data.data(), static_cast<int>(words), MPI_FLOAT, root, MPI_COMM_WORLD);
    });
    CHECK(data == expected);
  }
  // Bytes per rank not a multiple of 4: MPI moves them.
  std::vector<char> odd(5001, static_cast<char>(rank == 0 ? 7 : 0));
  expect_route(false, [&] { return MPI_Bcast(odd.data(), 5001, MPI_CHAR, 0, MPI_COMM_WORLD); });
  CHECK(odd == std::vector<char>(5001, 7));
  // Squall holds MPI_COMM_WORLD by now (a handled call above), so it takes the barrier.
  expect_route(takes("barrier"), [] { return MPI_Barrier(MPI_COMM_WORLD); });
}

/// MPI_Reduce_scatter of blocks `counts` on MPI_COMM_WORLD against PMPI_Reduce_scatter: float
/// sums out of place and in place, int maxima; squall takes each where `taken`.
void reduce_scatter_v_case(const std::vector<int>& counts, bool taken, int salt) {
  const int rank = rank_of(MPI_COMM_WORLD);
  std::size_t total = 0;
  for (const int c : counts) total += static_cast<std::size_t>(c);
  const int mine = counts[static_cast<std::size_t>(rank)];
  const std::vector<float> input = data_of<float>(total, rank, salt);
  std::vector<float> sums(static_cast<std::size_t>(mine)), out(sums.size());
  PMPI_Reduce_scatter(input.data(), sums.data(), counts.data(), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  expect_scatter_route(takes("reduce_scatter") && taken, MPI_COMM_WORLD, [&] {
    return MPI_Reduce_scatter(input.data(), out.data(), counts.data(), MPI_FLOAT, MPI_SUM,
                              MPI_COMM_WORLD);
  });
  CHECK(out == sums);
  std::vector<float> in_place = input;
  expect_scatter_route(takes("reduce_scatter") && taken, MPI_COMM_WORLD, [&] {
    return MPI_Reduce_scatter(MPI_IN_PLACE, in_place.data(), counts.data(), MPI_FLOAT, MPI_SUM,
                              MPI_COMM_WORLD);
  });
  CHECK(std::vector<float>(in_place.begin(), in_place.begin() + mine) == sums);
  const std::vector<std::int32_t> values = data_of<std::int32_t>(total, rank, salt + 1);
  std::vector<std::int32_t> maxima(sums.size()), got(sums.size());
  PMPI_Reduce_scatter(values.data(), maxima.data(), counts.data(), MPI_INT, MPI_MAX,
                      MPI_COMM_WORLD);
  expect_scatter_route(takes("reduce_scatter") && taken, MPI_COMM_WORLD, [&] {
    return MPI_Reduce_scatter(values.data(), got.data(), counts.data(), MPI_INT, MPI_MAX,
                              MPI_COMM_WORLD);
  });
  CHECK(got == maxima);
}

TEST_CASE("allgatherv and reduce_scatter: alike and nearly alike blocks squall's, against PMPI") {
  const int rank = rank_of(MPI_COMM_WORLD);
  const int size = size_of(MPI_COMM_WORLD);
  const auto p = static_cast<std::size_t>(size);
  for (const std::size_t block : {10ul, 3000ul, 70001ul}) {
    CAPTURE(block);
    const bool big = block * 4 * p >= 4096;
    const int n = static_cast<int>(block);
    const std::vector<int> counts(p, n);
    const std::vector<std::int32_t> mine = data_of<std::int32_t>(block, rank, 3);
    // end to end: as MPI_Allgather
    std::vector<int> end_to_end(p);
    for (std::size_t q = 0; q < p; ++q) end_to_end[q] = static_cast<int>(q * block);
    std::vector<std::int32_t> reference(block * p, -7), gathered(block * p, -7);
    PMPI_Allgatherv(mine.data(), n, MPI_INT, reference.data(), counts.data(), end_to_end.data(),
                    MPI_INT, MPI_COMM_WORLD);
    expect_scatter_route(takes("allgatherv") && big, MPI_COMM_WORLD, [&] {
      return MPI_Allgatherv(mine.data(), n, MPI_INT, gathered.data(), counts.data(),
                            end_to_end.data(), MPI_INT, MPI_COMM_WORLD);
    });
    CHECK(gathered == reference);
    // displaced: blocks in reverse order with gaps, on every rank but 0 (whose blocks lie end
    // to end): the displacements are each rank's own, the route must be the same everywhere
    const std::size_t stride = block + 5;
    std::vector<int> displaced(p);
    for (std::size_t q = 0; q < p; ++q) {
      displaced[q] = rank == 0 ? end_to_end[q] : static_cast<int>((p - 1 - q) * stride);
    }
    const std::size_t extent = rank == 0 ? block * p : stride * p;
    for (const bool in_place : {false, true}) {
      CAPTURE(in_place);
      std::vector<std::int32_t> want(extent, -7), got(extent, -7);
      const auto own = static_cast<std::size_t>(displaced[static_cast<std::size_t>(rank)]);
      if (in_place) std::copy(mine.begin(), mine.end(), got.begin() + static_cast<long>(own));
      PMPI_Allgatherv(mine.data(), n, MPI_INT, want.data(), counts.data(), displaced.data(),
                      MPI_INT, MPI_COMM_WORLD);
      expect_scatter_route(takes("allgatherv") && big, MPI_COMM_WORLD, [&] {
        return in_place ? MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, got.data(),
                                         counts.data(), displaced.data(), MPI_INT, MPI_COMM_WORLD)
                        : MPI_Allgatherv(mine.data(), n, MPI_INT, got.data(), counts.data(),
                                         displaced.data(), MPI_INT, MPI_COMM_WORLD);
      });
      CHECK(got == want);  // the gaps untouched too
    }
    reduce_scatter_v_case(counts, big, 4);  // alike blocks
  }
  // blocks of different sizes: an allgatherv's read into their places; a reduce-scatter's in
  // squall's own split reduced where they lie, others through a small padded copy or by MPI
  const auto split_of = [&](std::size_t total) {
    std::vector<int> counts(p);
    for (std::size_t q = 0; q < p; ++q) {
      counts[q] = static_cast<int>(total / p + (q < total % p ? 1 : 0));
    }
    return counts;
  };
  const auto near = [&](int most) {
    std::vector<int> counts(p);
    for (std::size_t q = 0; q < p; ++q) counts[q] = most - static_cast<int>(q % 3);
    return counts;
  };
  std::vector<int> one_holds_most(p, 10);
  one_holds_most[0] = 20000;
  for (const auto& [name, counts] :
       {std::pair{"split", split_of(3000 * p - 1)},
        std::pair{"split, large", split_of(70001 * p - 1)}, std::pair{"near", near(3001)},
        std::pair{"near, large", near(70001)}, std::pair{"one holds most", one_holds_most}}) {
    const std::string shape = name;
    CAPTURE(shape);
    std::vector<int> displs(p);
    for (std::size_t q = 1; q < p; ++q) displs[q] = displs[q - 1] + counts[q - 1];
    const bool alike = std::count(counts.begin(), counts.end(), counts[0]) == size;
    const auto total = static_cast<std::size_t>(displs[p - 1] + counts[p - 1]);
    // libsquall_mpi's rules (4-byte items here): an allgatherv of whole words is squall's on
    // one host at any size (each rank reads every block into its place), elsewhere where
    // padding the blocks to the largest adds at most a quarter of the bytes; a reduce-scatter
    // is squall's in squall's split, or through a padded copy below 64 KiB adding at most that
    const std::size_t padded =
        static_cast<std::size_t>(*std::max_element(counts.begin(), counts.end())) * 4 * p;
    const bool padding_cheap = padded * 4 <= total * 4 * 5;
    const char* transport = std::getenv("SQUALL_MPI_TRANSPORT");
    const bool one_host =
        !spans_nodes(MPI_COMM_WORLD) && (transport == nullptr || std::string(transport) != "mpi");
    const bool taken_v = alike || one_host || padding_cheap;
    const bool taken_rs =
        alike || counts == split_of(total) || (padded < (std::size_t{64} << 10) && padding_cheap);
    const int mine_count = counts[static_cast<std::size_t>(rank)];
    const std::vector<std::int32_t> mine =
        data_of<std::int32_t>(static_cast<std::size_t>(mine_count), rank, 5);
    // end to end, and in reverse order with gaps (in place too)
    std::vector<int> reversed(p);
    for (std::size_t q = 0, at = 0; q < p; ++q) {
      const std::size_t r = p - 1 - q;
      reversed[r] = static_cast<int>(at);
      at += static_cast<std::size_t>(counts[r]) + 3;
    }
    for (const auto* displacements : {&displs, &reversed}) {
      for (const bool in_place : {false, true}) {
        CAPTURE(in_place);
        const std::size_t extent = total + 3 * p;
        std::vector<std::int32_t> want(extent, -7), got(extent, -7);
        const auto own = static_cast<std::size_t>((*displacements)[static_cast<std::size_t>(rank)]);
        if (in_place) std::copy(mine.begin(), mine.end(), got.begin() + static_cast<long>(own));
        PMPI_Allgatherv(mine.data(), mine_count, MPI_INT, want.data(), counts.data(),
                        displacements->data(), MPI_INT, MPI_COMM_WORLD);
        expect_scatter_route(takes("allgatherv") && taken_v, MPI_COMM_WORLD, [&] {
          return in_place
                     ? MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, got.data(), counts.data(),
                                      displacements->data(), MPI_INT, MPI_COMM_WORLD)
                     : MPI_Allgatherv(mine.data(), mine_count, MPI_INT, got.data(), counts.data(),
                                      displacements->data(), MPI_INT, MPI_COMM_WORLD);
        });
        CHECK(got == want);  // the gaps untouched too
      }
    }
    reduce_scatter_v_case(counts, taken_rs, 6);
  }
  // alike blocks of bytes that are no multiple of 4: gathered in padded words
  {
    const std::vector<int> counts(p, 5001), displs = [&] {
      std::vector<int> d(p);
      for (std::size_t q = 0; q < p; ++q) d[q] = static_cast<int>(q * 5001);
      return d;
    }();
    const std::vector<char> mine(5001, static_cast<char>('a' + rank));
    std::vector<char> want(5001 * p, '-'), got(5001 * p, '-');
    PMPI_Allgatherv(mine.data(), 5001, MPI_CHAR, want.data(), counts.data(), displs.data(),
                    MPI_CHAR, MPI_COMM_WORLD);
    expect_scatter_route(takes("allgatherv"), MPI_COMM_WORLD, [&] {
      return MPI_Allgatherv(mine.data(), 5001, MPI_CHAR, got.data(), counts.data(), displs.data(),
                            MPI_CHAR, MPI_COMM_WORLD);
    });
    CHECK(got == want);
  }
}

TEST_CASE("split and duplicated communicators get their own state, freed with them") {
  const int rank = rank_of(MPI_COMM_WORLD);
  for (int round = 0; round < 3; ++round) {
    MPI_Comm half = MPI_COMM_NULL, copy = MPI_COMM_NULL;
    MPI_Comm_split(MPI_COMM_WORLD, rank % 2, -rank, &half);  // reversed order inside
    MPI_Comm_dup(half, &copy);
    allreduce_case<float>(MPI_FLOAT, MPI_SUM, 50000, round % 2 == 0, half);
    allreduce_case<std::int64_t>(MPI_INT64_T, MPI_MAX, 50000, false, copy);
    expect_route(takes("barrier"), [&] { return MPI_Barrier(copy); });
    MPI_Comm_free(&copy);
    MPI_Comm_free(&half);
  }
}

TEST_CASE("communicators of one size that do not all remember a window bound measure it again") {
  // SQUALL_MPI_WINDOW_COPY_BYTES=auto: A (all ranks but the last) measures its allreduce's
  // bound or takes one its ranks remember; B (all but the first) holds a rank that A did not
  // hold, so at 4 ranks its ranks disagree and B measures again (the verbose lines, checked by
  // collective.mpi_interpose_calibrated_windows.np4). Either way the results are PMPI's.
  const int rank = rank_of(MPI_COMM_WORLD);
  const int size = size_of(MPI_COMM_WORLD);
  if (size < 2) return;
  MPI_Comm a = MPI_COMM_NULL, b = MPI_COMM_NULL;
  MPI_Comm_split(MPI_COMM_WORLD, rank < size - 1 ? 0 : MPI_UNDEFINED, rank, &a);
  if (a != MPI_COMM_NULL) {
    allreduce_case<float>(MPI_FLOAT, MPI_SUM, 300001, false, a);
    MPI_Comm_free(&a);
  }
  MPI_Comm_split(MPI_COMM_WORLD, rank > 0 ? 0 : MPI_UNDEFINED, rank, &b);
  if (b != MPI_COMM_NULL) {
    allreduce_case<float>(MPI_FLOAT, MPI_SUM, 300001, true, b);
    MPI_Comm_free(&b);
  }
}

/// Whether squall takes a non-blocking call `name` (iallreduce, iallgather,
/// ireduce_scatter_block, ibcast) of `bytes` on `comm`: on one host only (shared memory: across
/// hosts squall's progress thread would call MPI), once squall holds `comm` (`hold`).
bool takes_nonblocking(const std::string& name, MPI_Comm comm, std::size_t bytes) {
  const char* transport = std::getenv("SQUALL_MPI_TRANSPORT");
  const char* floor = std::getenv("SQUALL_MPI_IALLREDUCE_MIN_BYTES");  // digits, K or none
  std::size_t least = std::size_t{256} << 10;
  if (floor != nullptr) {
    char* end = nullptr;
    least = std::strtoull(floor, &end, 10) << (*end == 'K' ? 10 : 0);
  }
  // across hosts (or on squall's MPI transport) squall's thread calls MPI: only where the
  // program asked for MPI_THREAD_MULTIPLE (SQUALL_TEST_THREAD_MULTIPLE=1)
  const bool on_mpi =
      spans_nodes(comm) || (transport != nullptr && std::string(transport) == "mpi");
  return takes(name) && !expect_off() && bytes >= std::max<std::size_t>(least, 4096) &&
         (!on_mpi || thread_multiple());
}

/// Whether a non-blocking call `name` squall takes (`taken`) on `comm` runs in tiers: across
/// nodes, reduce_scatter_block and allgather where the nodes hold alike many ranks.
bool tiered_nonblocking(const std::string& name, MPI_Comm comm, bool taken) {
  const bool any_nodes = name == "iallreduce" || name == "ibcast";
  if (name == "ibarrier") return false;  // on the whole communicator
  return taken && spans_nodes(comm) && (any_nodes || nodes_alike(comm));
}

/// A blocking allreduce squall takes, so that it holds `comm` (as MPI_Barrier, MPI_Iallreduce
/// goes to squall only then: making the state is a blocking collective).
void hold(MPI_Comm comm) {
  std::vector<float> data(4096, 1.0f);
  MPI_Allreduce(MPI_IN_PLACE, data.data(), 4096, MPI_FLOAT, MPI_SUM, comm);
  CHECK(data.front() == static_cast<float>(size_of(comm)));
}

/// The calls squall and MPI have taken so far.
std::pair<unsigned long long, unsigned long long> routes() {
  unsigned long long handled = 0, passed = 0;
  squall_mpi_counts(&handled, &passed, nullptr);
  return {handled, passed};
}

TEST_CASE("iallreduce: many in flight with MPI's own requests, completed every way, against PMPI") {
  MPI_Comm comm = MPI_COMM_NULL;
  MPI_Comm_dup(MPI_COMM_WORLD, &comm);
  {  // before squall holds the communicator, MPI takes it
    std::vector<float> data(8192, 1.0f);
    MPI_Request request = MPI_REQUEST_NULL;
    expect_route(false, [&] {
      return MPI_Iallreduce(MPI_IN_PLACE, data.data(), 8192, MPI_FLOAT, MPI_SUM, comm, &request);
    });
    REQUIRE(MPI_Wait(&request, MPI_STATUS_IGNORE) == MPI_SUCCESS);
    CHECK(data.back() == static_cast<float>(size_of(comm)));
  }
  hold(comm);
  const int rank = rank_of(comm);
  const int size = size_of(comm);
  const int next = (rank + 1) % size, prev = (rank + size - 1) % size;
  // float, double and int64 sums, MIN and MAX, in and out of place, above and below the
  // smallest size squall takes; each against PMPI_Allreduce of the same input
  struct one {
    std::vector<double> input, result, reference;
    MPI_Op op;
    bool in_place;
  };
  std::vector<one> calls;
  for (const std::size_t count : {100ul, 5000ul, 70001ul, 300000ul}) {
    for (MPI_Op op : {MPI_SUM, MPI_MAX}) {
      const std::vector<double> input = data_of<double>(count, rank, static_cast<int>(count % 13));
      calls.push_back({input, {}, std::vector<double>(count), op, calls.size() % 2 == 1});
      calls.back().result = calls.back().in_place ? input : std::vector<double>(count);
      REQUIRE(PMPI_Allreduce(input.data(), calls.back().reference.data(), static_cast<int>(count),
                             MPI_DOUBLE, op, comm) == MPI_SUCCESS);
    }
  }
  std::vector<float> floats = data_of<float>(40000, rank, 3), float_sum(40000);
  PMPI_Allreduce(floats.data(), float_sum.data(), 40000, MPI_FLOAT, MPI_SUM, comm);
  std::vector<std::int64_t> longs = data_of<std::int64_t>(9000, rank, 5), long_min(9000);
  PMPI_Allreduce(longs.data(), long_min.data(), 9000, MPI_INT64_T, MPI_MIN, comm);

  for (int how = 0; how < 5; ++how) {  // Waitall reversed, Wait, Test, Waitany, Waitsome
    CAPTURE(how);
    for (one& c : calls) {
      if (!c.in_place) std::fill(c.result.begin(), c.result.end(), 0.0);
      if (c.in_place) c.result = c.input;
    }
    std::vector<float> f_result(floats.size());
    std::vector<std::int64_t> l_result = longs;
    const auto [h0, p0] = routes();
    std::vector<MPI_Request> requests;
    std::size_t squall_takes = 0;
    for (one& c : calls) {
      const int n = static_cast<int>(c.input.size());
      requests.emplace_back();
      REQUIRE((c.in_place ? MPI_Iallreduce(MPI_IN_PLACE, c.result.data(), n, MPI_DOUBLE, c.op, comm,
                                           &requests.back())
                          : MPI_Iallreduce(c.input.data(), c.result.data(), n, MPI_DOUBLE, c.op,
                                           comm, &requests.back())) == MPI_SUCCESS);
      squall_takes +=
          takes_nonblocking("iallreduce", comm, c.input.size() * sizeof(double)) ? 1 : 0;
    }
    // MPI's own requests in the same arrays: a ring of point-to-point messages (rendezvous
    // size, so they need MPI's progress while squall's requests are waited for)
    std::vector<double> to_next(100000, rank), from_prev(100000);
    requests.emplace_back();
    MPI_Irecv(from_prev.data(), 100000, MPI_DOUBLE, prev, 7, comm, &requests.back());
    requests.emplace_back();
    MPI_Isend(to_next.data(), 100000, MPI_DOUBLE, next, 7, comm, &requests.back());
    requests.emplace_back();
    REQUIRE(MPI_Iallreduce(floats.data(), f_result.data(), 40000, MPI_FLOAT, MPI_SUM, comm,
                           &requests.back()) == MPI_SUCCESS);
    requests.emplace_back();
    REQUIRE(MPI_Iallreduce(MPI_IN_PLACE, l_result.data(), 9000, MPI_INT64_T, MPI_MIN, comm,
                           &requests.back()) == MPI_SUCCESS);
    squall_takes += (takes_nonblocking("iallreduce", comm, 40000 * sizeof(float)) ? 1 : 0) +
                    (takes_nonblocking("iallreduce", comm, 9000 * sizeof(std::int64_t)) ? 1 : 0);
    const auto [h1, p1] = routes();
    CHECK(h1 - h0 == squall_takes);
    CHECK(p1 - p0 == calls.size() + 2 - squall_takes);
    const int n = static_cast<int>(requests.size());
    if (how == 0) {
      std::reverse(requests.begin(), requests.end());
      REQUIRE(MPI_Waitall(n, requests.data(), MPI_STATUSES_IGNORE) == MPI_SUCCESS);
    } else if (how == 1) {
      for (int i = n - 1; i >= 0; --i) REQUIRE(MPI_Wait(&requests[i], MPI_STATUS_IGNORE) == 0);
    } else if (how == 2) {
      for (int flag = 0; flag == 0;) {
        REQUIRE(MPI_Testall(n, requests.data(), &flag, MPI_STATUSES_IGNORE) == MPI_SUCCESS);
        for (MPI_Request& r : requests) {  // and one by one
          int one_flag = 0;
          if (r != MPI_REQUEST_NULL) MPI_Test(&r, &one_flag, MPI_STATUS_IGNORE);
        }
        if (std::all_of(requests.begin(), requests.end(),
                        [](MPI_Request r) { return r == MPI_REQUEST_NULL; })) {
          flag = 1;
        }
      }
    } else if (how == 3) {
      for (int done = 0; done < n; ++done) {
        int index = -1;
        REQUIRE(MPI_Waitany(n, requests.data(), &index, MPI_STATUS_IGNORE) == MPI_SUCCESS);
        REQUIRE(index != MPI_UNDEFINED);
      }
    } else {
      int done = 0;
      std::vector<int> indices(requests.size());
      while (done < n) {
        int got = 0;
        REQUIRE(MPI_Waitsome(n, requests.data(), &got, indices.data(), MPI_STATUSES_IGNORE) ==
                MPI_SUCCESS);
        REQUIRE(got != MPI_UNDEFINED);
        done += got;
      }
    }
    for (MPI_Request r : requests) CHECK(r == MPI_REQUEST_NULL);
    for (const one& c : calls) {
      CAPTURE(c.input.size());
      CHECK(std::memcmp(c.result.data(), c.reference.data(), c.input.size() * sizeof(double)) == 0);
    }
    CHECK(std::memcmp(f_result.data(), float_sum.data(), 40000 * sizeof(float)) == 0);
    CHECK(std::memcmp(l_result.data(), long_min.data(), 9000 * sizeof(std::int64_t)) == 0);
    CHECK(std::all_of(from_prev.begin(), from_prev.end(), [&](double v) { return v == prev; }));
  }
  MPI_Comm_free(&comm);
}

TEST_CASE("iallgather(v), ireduce_scatter(_block), ibcast and ibarrier in flight together") {
  MPI_Comm comm = MPI_COMM_NULL;
  MPI_Comm_dup(MPI_COMM_WORLD, &comm);
  hold(comm);
  const int rank = rank_of(comm);
  const int size = size_of(comm);
  const std::size_t p = static_cast<std::size_t>(size);
  for (const std::size_t block : {3000ul, 70001ul}) {  // below and above the smallest taken
    CAPTURE(block);
    // the inputs and MPI's own answers
    const std::vector<float> input = data_of<float>(block * p, rank, 4);
    std::vector<float> scattered_ref(block);
    PMPI_Reduce_scatter_block(input.data(), scattered_ref.data(), static_cast<int>(block),
                              MPI_FLOAT, MPI_SUM, comm);
    const std::vector<std::int32_t> mine = data_of<std::int32_t>(block, rank, 6);
    std::vector<std::int32_t> gathered_ref(block * p);
    PMPI_Allgather(mine.data(), static_cast<int>(block), MPI_INT, gathered_ref.data(),
                   static_cast<int>(block), MPI_INT, comm);
    const int root = size - 1;
    const std::vector<double> broadcast_ref = data_of<double>(block, root, 8);

    // every form at once, with an iallreduce among them, waited for together
    std::vector<float> scattered(block), scattered_in_place = input;
    std::vector<std::int32_t> gathered(block * p), gathered_in_place(block * p);
    std::copy(mine.begin(), mine.end(),
              gathered_in_place.begin() + static_cast<long>(block) * rank);
    std::vector<double> broadcast = data_of<double>(block, rank, 8);
    std::vector<float> summed = input;
    std::vector<float> scattered_v(block);
    const std::vector<int> counts(p, static_cast<int>(block));
    std::vector<float> summed_ref(input.size());
    PMPI_Allreduce(input.data(), summed_ref.data(), static_cast<int>(input.size()), MPI_FLOAT,
                   MPI_SUM, comm);
    const int n = static_cast<int>(block);
    // an ireduce_scatter of blocks of different sizes in squall's split (the last rank's one
    // element shorter), and an iallgatherv into blocks in reverse order with gaps
    const std::size_t uneven_total = block * p - (p > 1 ? 1 : 0);
    std::vector<int> uneven(p), reversed(p);
    for (std::size_t q = 0; q < p; ++q) {
      uneven[q] = static_cast<int>(uneven_total / p + (q < uneven_total % p ? 1 : 0));
    }
    for (std::size_t q = 0, at = 0; q < p; ++q) {
      reversed[p - 1 - q] = static_cast<int>(at);
      at += block + 2;
    }
    const int own_count = uneven[static_cast<std::size_t>(rank)];
    const std::vector<float> uneven_input = data_of<float>(uneven_total, rank, 10);
    std::vector<float> uneven_scattered(static_cast<std::size_t>(own_count));
    std::vector<float> uneven_scattered_ref(uneven_scattered.size());
    PMPI_Reduce_scatter(uneven_input.data(), uneven_scattered_ref.data(), uneven.data(), MPI_FLOAT,
                        MPI_SUM, comm);
    std::vector<std::int32_t> gathered_v((block + 2) * p, -7), gathered_v_ref(gathered_v);
    PMPI_Allgatherv(mine.data(), n, MPI_INT, gathered_v_ref.data(), counts.data(), reversed.data(),
                    MPI_INT, comm);
    std::vector<MPI_Request> requests(10, MPI_REQUEST_NULL);
    const auto [h0, p0] = routes();
    const unsigned long long tiered_before = squall_mpi_tiered_calls();
    REQUIRE(MPI_Ireduce_scatter_block(input.data(), scattered.data(), n, MPI_FLOAT, MPI_SUM, comm,
                                      &requests[0]) == MPI_SUCCESS);
    REQUIRE(MPI_Iallgather(mine.data(), n, MPI_INT, gathered.data(), n, MPI_INT, comm,
                           &requests[1]) == MPI_SUCCESS);
    REQUIRE(MPI_Ibcast(broadcast.data(), n, MPI_DOUBLE, root, comm, &requests[2]) == MPI_SUCCESS);
    REQUIRE(MPI_Ireduce_scatter_block(MPI_IN_PLACE, scattered_in_place.data(), n, MPI_FLOAT,
                                      MPI_SUM, comm, &requests[3]) == MPI_SUCCESS);
    REQUIRE(MPI_Iallgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, gathered_in_place.data(), n, MPI_INT,
                           comm, &requests[4]) == MPI_SUCCESS);
    REQUIRE(MPI_Iallreduce(MPI_IN_PLACE, summed.data(), static_cast<int>(summed.size()), MPI_FLOAT,
                           MPI_SUM, comm, &requests[5]) == MPI_SUCCESS);
    REQUIRE(MPI_Ireduce_scatter(input.data(), scattered_v.data(), counts.data(), MPI_FLOAT, MPI_SUM,
                                comm, &requests[6]) == MPI_SUCCESS);
    REQUIRE(MPI_Ireduce_scatter(uneven_input.data(), uneven_scattered.data(), uneven.data(),
                                MPI_FLOAT, MPI_SUM, comm, &requests[7]) == MPI_SUCCESS);
    REQUIRE(MPI_Iallgatherv(mine.data(), n, MPI_INT, gathered_v.data(), counts.data(),
                            reversed.data(), MPI_INT, comm, &requests[8]) == MPI_SUCCESS);
    REQUIRE(MPI_Ibarrier(comm, &requests[9]) == MPI_SUCCESS);
    const auto [h1, p1] = routes();
    const std::size_t all_bytes = block * p * 4;
    std::size_t taken = 0;
    unsigned long long tiered = 0;
    for (const auto& [name, calls, bytes] :
         {std::tuple{"ireduce_scatter_block", 2, all_bytes}, std::tuple{"iallgather", 2, all_bytes},
          std::tuple{"ibcast", 1, block * 8}, std::tuple{"iallreduce", 1, all_bytes},
          std::tuple{"ireduce_scatter", 2, all_bytes}, std::tuple{"iallgatherv", 1, all_bytes},
          std::tuple{"ibarrier", 1, ~std::size_t{0}}}) {
      const bool takes_it = takes_nonblocking(name, comm, bytes);
      taken += takes_it ? static_cast<std::size_t>(calls) : 0;
      tiered += tiered_nonblocking(name, comm, takes_it) ? static_cast<unsigned>(calls) : 0;
    }
    CHECK(h1 - h0 == taken);
    CHECK(p1 - p0 == 10 - taken);
    CHECK(squall_mpi_tiered_calls() - tiered_before == tiered);
    // a blocking allreduce while they are in flight: queued behind them, in this order on
    // every rank
    std::vector<float> blocking = data_of<float>(70001, rank, 9), blocking_ref(70001);
    PMPI_Allreduce(blocking.data(), blocking_ref.data(), 70001, MPI_FLOAT, MPI_SUM, comm);
    REQUIRE(MPI_Allreduce(MPI_IN_PLACE, blocking.data(), 70001, MPI_FLOAT, MPI_SUM, comm) ==
            MPI_SUCCESS);
    CHECK(blocking == blocking_ref);
    std::reverse(requests.begin(), requests.end());
    REQUIRE(MPI_Waitall(10, requests.data(), MPI_STATUSES_IGNORE) == MPI_SUCCESS);
    CHECK(uneven_scattered == uneven_scattered_ref);
    CHECK(gathered_v == gathered_v_ref);
    CHECK(scattered == scattered_ref);
    CHECK(scattered_v == scattered_ref);
    CHECK(std::vector<float>(scattered_in_place.begin(),
                             scattered_in_place.begin() + static_cast<long>(block)) ==
          scattered_ref);
    CHECK(gathered == gathered_ref);
    CHECK(gathered_in_place == gathered_ref);
    CHECK(broadcast == broadcast_ref);
    CHECK(summed == summed_ref);
  }
  MPI_Comm_free(&comm);
}

TEST_CASE("iallreduce: one waited while a peer waits on this rank's send, and a freed comm") {
  // Rank 0 starts the allreduce and a large send to rank 1, then waits for the allreduce;
  // rank 1 first receives that message, only then starts the allreduce. Valid MPI: rank 0's
  // MPI_Wait must keep MPI's progress going for the send while squall's request is pending.
  MPI_Comm comm = MPI_COMM_NULL;
  MPI_Comm_dup(MPI_COMM_WORLD, &comm);
  hold(comm);
  const int rank = rank_of(comm);
  const int size = size_of(comm);
  std::vector<float> data = data_of<float>(100000, rank, 1), reference(100000);
  PMPI_Allreduce(data.data(), reference.data(), 100000, MPI_FLOAT, MPI_SUM, comm);
  std::vector<double> message(1 << 20, 1.5);
  MPI_Request reduce = MPI_REQUEST_NULL, send = MPI_REQUEST_NULL;
  if (rank == 0) {
    MPI_Iallreduce(MPI_IN_PLACE, data.data(), 100000, MPI_FLOAT, MPI_SUM, comm, &reduce);
    if (size > 1) MPI_Isend(message.data(), 1 << 20, MPI_DOUBLE, 1, 3, comm, &send);
    REQUIRE(MPI_Wait(&reduce, MPI_STATUS_IGNORE) == MPI_SUCCESS);
    REQUIRE(MPI_Wait(&send, MPI_STATUS_IGNORE) == MPI_SUCCESS);
  } else {
    if (rank == 1) {
      std::vector<double> got(1 << 20);
      MPI_Recv(got.data(), 1 << 20, MPI_DOUBLE, 0, 3, comm, MPI_STATUS_IGNORE);
      CHECK(got == message);
    }
    MPI_Iallreduce(MPI_IN_PLACE, data.data(), 100000, MPI_FLOAT, MPI_SUM, comm, &reduce);
    REQUIRE(MPI_Wait(&reduce, MPI_STATUS_IGNORE) == MPI_SUCCESS);
  }
  CHECK(std::memcmp(data.data(), reference.data(), 100000 * sizeof(float)) == 0);
  // A communicator freed while an allreduce on it runs (MPI lets the operation finish): the
  // request still completes with the right answer. Only where squall takes it: Open MPI 4.1's
  // own MPI_Iallreduce crashes in MPI_Wait after the free.
  if (!takes_nonblocking("iallreduce", comm, 50000 * sizeof(float))) {
    MPI_Comm_free(&comm);
    return;
  }
  std::vector<float> more = data_of<float>(50000, rank, 2), more_sum(50000);
  PMPI_Allreduce(more.data(), more_sum.data(), 50000, MPI_FLOAT, MPI_SUM, comm);
  MPI_Iallreduce(MPI_IN_PLACE, more.data(), 50000, MPI_FLOAT, MPI_SUM, comm, &reduce);
  MPI_Comm_free(&comm);
  REQUIRE(MPI_Wait(&reduce, MPI_STATUS_IGNORE) == MPI_SUCCESS);
  CHECK(std::memcmp(more.data(), more_sum.data(), 50000 * sizeof(float)) == 0);
}

TEST_CASE("iallreduce: freeing or cancelling a pending one is refused, naming why") {
  if (!takes_nonblocking("iallreduce", MPI_COMM_WORLD, 4 << 20)) return;
  MPI_Comm comm = MPI_COMM_NULL;
  MPI_Comm_dup(MPI_COMM_WORLD, &comm);
  hold(comm);
  MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
  std::vector<float> data(1 << 20, 1.0f);
  MPI_Request request = MPI_REQUEST_NULL;
  REQUIRE(MPI_Iallreduce(MPI_IN_PLACE, data.data(), 1 << 20, MPI_FLOAT, MPI_SUM, comm, &request) ==
          MPI_SUCCESS);
  // (it may already be done: then freeing it is legal and MPI's)
  int flag = 0;
  MPI_Request_get_status(request, &flag, MPI_STATUS_IGNORE);
  if (flag == 0) {
    CHECK(MPI_Cancel(&request) == MPI_ERR_REQUEST);
    CHECK(MPI_Request_free(&request) == MPI_ERR_REQUEST);
  }
  REQUIRE(MPI_Wait(&request, MPI_STATUS_IGNORE) == MPI_SUCCESS);
  CHECK(std::all_of(data.begin(), data.end(),
                    [&](float v) { return v == static_cast<float>(size_of(comm)); }));
  MPI_Comm_free(&comm);
}

TEST_CASE("a squall error reaches the communicator's error handler and returns") {
  if (!takes_bcast(4096 * 4, MPI_COMM_WORLD) || expect_off()) return;  // squall's broadcast's
  MPI_Comm comm = MPI_COMM_NULL;
  MPI_Comm_dup(MPI_COMM_WORLD, &comm);
  MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
  std::vector<float> data(4096);
  // A root outside the communicator: squall refuses it on every rank before anything moves.
  const int code = MPI_Bcast(data.data(), 4096, MPI_FLOAT, size_of(comm), comm);
  CHECK(code != MPI_SUCCESS);
  MPI_Comm_free(&comm);
}

}  // namespace

int main(int argc, char** argv) {
  if (thread_multiple()) {
    int provided = MPI_THREAD_SINGLE;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    if (provided != MPI_THREAD_MULTIPLE) {
      std::fprintf(stderr, "SQUALL_TEST_THREAD_MULTIPLE=1 but MPI gives thread level %d\n",
                   provided);
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
  } else {
    MPI_Init(&argc, &argv);
  }
  unsigned long long handled = 0, passed = 0;
  const int on = squall_mpi_counts(&handled, &passed, nullptr);
  doctest::Context context(argc, argv);
  if (rank_of(MPI_COMM_WORLD) != 0) context.setOption("minimal", true);
  int failed = context.run();
  if (on != (expect_off() ? 0 : 1)) {
    std::fprintf(stderr, "squall_mpi is %s, expected %s\n", on ? "on" : "off",
                 expect_off() ? "off" : "on");
    failed = 1;
  }
  int any_failed = 0;
  PMPI_Allreduce(&failed, &any_failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return any_failed != 0 ? 1 : 0;
}
