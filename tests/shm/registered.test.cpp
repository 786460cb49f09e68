// SPDX-License-Identifier: Apache-2.0
// Registered memory over shm_transport (issue 22), ranks as real processes: buffers every
// rank maps (`shm_transport::allocate`), on which the peer-memory collectives use plain loads
// and stores. Every result against the serial double reference of exact inputs, bitwise; the
// transport's `mapped_accesses()` shows which path ran. A rank returns 0, or 1 after saying on
// stderr what was wrong.

#include <squall/algorithm/communicator.hpp>
#include <squall/topology/automatic.hpp>
#include <squall/topology/direct.hpp>
#include <squall/transport/detail/shared_heap.hpp>
#include <squall/transport/launch.hpp>
#include <squall/transport/shm.hpp>

#include <doctest/doctest.h>
#include <sys/wait.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <unistd.h>
#include <vector>

#include "../support/collective_checks.hpp"
#include "../support/shm_ranks.hpp"

using squall::shm_job;
using squall::shm_transport;
namespace test = squall::test;
using namespace std::chrono_literals;

namespace {

constexpr int max_ranks = 4;

/// 64 Ki + 3 floats (above the peer-memory threshold, blocks of unequal sizes) and 1 Mi + 1.
constexpr std::size_t counts[] = {(std::size_t{1} << 16) + 3, (std::size_t{1} << 20) + 1};

/// Compares `got` with the reference sum over `ranks` ranks of elements [from, from + n).
void expect_sums(test::findings& found, const float* got, std::size_t n, std::size_t from,
                 int ranks, const std::string& what) {
  for (std::size_t i = 0; i < n; ++i) {
    const auto want = test::reference_element<float, squall::sum_op>(ranks, from + i);
    if (got[i] != want) {
      found.add(what + ": element " + std::to_string(from + i) + " is " + std::to_string(got[i]) +
                ", want " + std::to_string(want));
      return;
    }
  }
}

void expect_values(test::findings& found, const float* got, std::size_t n, int rank,
                   const std::string& what) {
  for (std::size_t i = 0; i < n; ++i) {
    if (got[i] != test::exact_value<float>(rank, i)) {
      found.add(what + ": element " + std::to_string(i) + " of rank " + std::to_string(rank) +
                " is " + std::to_string(got[i]));
      return;
    }
  }
}

/// Where a test's buffers live: the heap (std::vector), registered memory
/// (`shm_transport::allocate`), or the process's shared heap (what libsquall_mpi.so's malloc
/// gives under SQUALL_MPI_SHARED_HEAP).
enum class memory { heap, registered, shared_heap };

/// Frees shared-heap memory.
struct shared_heap_free {
  void operator()(float* p) const { squall::detail::shm::shared_heap::instance().release(p); }
};
using shared_heap_floats = std::unique_ptr<float[], shared_heap_free>;

/// `n` floats of the shared heap; null if the heap could not take them.
shared_heap_floats shared_heap_allocate(std::size_t n) {
  return shared_heap_floats(static_cast<float*>(
      squall::detail::shm::shared_heap::instance().allocate(n * sizeof(float), 64, false)));
}

/// Every collective of `count` floats, on buffers in `where`, each result added to `found`
/// where it differs from the reference.
template <class Topology>
void run_collectives(squall::communicator<shm_transport, Topology>& comm, std::size_t count,
                     memory where, test::findings& found) {
  shm_transport& t = comm.transport();
  const int p = comm.size();
  const int me = comm.rank();
  const std::size_t all = count * static_cast<std::size_t>(p);
  const bool registered = where == memory::registered;
  auto make = [&](std::size_t n) {
    // registered memory, or the heap: a vector kept alive beside it
    return registered ? t.allocate<float>(n) : squall::registered_buffer<float>{};
  };
  std::vector<float> heap_in(where == memory::heap ? all : 0);
  std::vector<float> heap_out(where == memory::heap ? all : 0);
  squall::registered_buffer<float> reg_in = make(all);
  squall::registered_buffer<float> reg_out = make(all);
  shared_heap_floats shared_in = where == memory::shared_heap ? shared_heap_allocate(all) : nullptr;
  shared_heap_floats shared_out =
      where == memory::shared_heap ? shared_heap_allocate(all) : nullptr;
  float* in = registered ? reg_in.data() : where == memory::heap ? heap_in.data() : shared_in.get();
  float* out = registered              ? reg_out.data()
               : where == memory::heap ? heap_out.data()
                                       : shared_out.get();
  if (in == nullptr || out == nullptr) {
    found.add("the shared heap could not allocate " + std::to_string(all) + " floats");
    return;
  }
  const std::string how = std::string(registered              ? "registered"
                                      : where == memory::heap ? "heap"
                                                              : "shared heap") +
                          ", " + std::to_string(count) + " floats";
  const std::vector<float> mine = test::exact_input<float>(me, count);

  // allreduce, out of place then in place
  std::copy(mine.begin(), mine.end(), in);
  comm.allreduce(squall::host_view<const float>(in, count), squall::host_view<float>(out, count));
  expect_sums(found, out, count, 0, p, "allreduce (" + how + ")");
  expect_values(found, in, count, me, "allreduce's input (" + how + ")");
  comm.allreduce(squall::host_view<float>(in, count));
  expect_sums(found, in, count, 0, p, "allreduce in place (" + how + ")");

  // reduce_scatter: rank r gets block r
  std::copy(mine.begin(), mine.end(), in);
  const std::size_t block = comm.block_count(count);
  comm.reduce_scatter(squall::host_view<const float>(in, count),
                      squall::host_view<float>(out, block));
  expect_sums(found, out, block, comm.block_offset(count), p, "reduce_scatter (" + how + ")");

  // allgather into `all` elements
  std::copy(mine.begin(), mine.end(), in);
  comm.allgather(squall::host_view<const float>(in, count), squall::host_view<float>(out, all));
  for (int q = 0; q < p; ++q) {
    expect_values(found, out + static_cast<std::size_t>(q) * count, count, q,
                  "allgather (" + how + ")");
  }

  // broadcast from the last rank
  const int root = p - 1;
  if (me == root) {
    std::copy(mine.begin(), mine.end(), in);
  } else {
    std::fill(in, in + count, -1.0F);
  }
  comm.broadcast(squall::host_view<float>(in, count), root);
  expect_values(found, in, count, root, "broadcast (" + how + ")");
}

template <class Topology>
void collectives_on_registered_buffers() {
  for (int ranks = 1; ranks <= max_ranks; ++ranks) {
    CAPTURE(ranks);
    test::expect_ranks_succeed(ranks, [&](const shm_job& me) {
      squall::communicator<shm_transport, Topology> comm(
          shm_transport(me, squall::options{.deadline = 60s}));
      const shm_transport& t = comm.transport();
      test::findings found;
      for (const std::size_t count : counts) {
        // heap buffers: no mapping reached
        const std::uint64_t before = t.mapped_accesses();
        run_collectives(comm, count, memory::heap, found);
        if (t.mapped_accesses() != before) found.add("heap buffers went through a mapping");
        // registered buffers, then the shared heap's: every peer reached through its mapping
        // (when cross-memory attach, which the peer-memory paths need, is allowed)
        for (const memory where : {memory::registered, memory::shared_heap}) {
          const std::uint64_t mapped = t.mapped_accesses();
          run_collectives(comm, count, where, found);
          if (me.size > 1 && t.can_access_peers() && t.mapped_accesses() == mapped) {
            found.add(std::string(where == memory::registered ? "registered" : "shared-heap") +
                      " buffers never went through a mapping");
          }
        }
      }
      if (found.ok()) return 0;
      std::fprintf(stderr, "rank %d of %d: %s\n", me.rank, me.size, found.text().c_str());
      return 1;
    });
  }
}

}  // namespace

TEST_SUITE("shm_registered") {
  TEST_CASE_TEMPLATE("collectives on registered buffers equal the serial reference", Topology,
                     squall::direct_topology, squall::automatic_topology) {
    collectives_on_registered_buffers<Topology>();
  }

  TEST_CASE("ranks mixing registered and heap buffers, and subviews, get the reference") {
    for (int ranks = 2; ranks <= max_ranks; ++ranks) {
      CAPTURE(ranks);
      test::expect_ranks_succeed(ranks, [](const shm_job& me) {
        squall::communicator<shm_transport, squall::direct_topology> comm(
            shm_transport(me, squall::options{.deadline = 60s}));
        shm_transport& t = comm.transport();
        test::findings found;
        constexpr std::size_t count = (std::size_t{1} << 18) + 5;
        constexpr std::size_t offset = 1000;  // a subview starting inside the registration
        squall::registered_buffer<float> reg = t.allocate<float>(count + 2 * offset);
        std::vector<float> heap(count);
        // even ranks registered (a subview), odd ranks the heap
        float* data = me.rank % 2 == 0 ? reg.data() + offset : heap.data();
        const std::vector<float> mine = test::exact_input<float>(me.rank, count);
        std::copy(mine.begin(), mine.end(), data);
        comm.allreduce(squall::host_view<float>(data, count));
        expect_sums(found, data, count, 0, me.size, "mixed allreduce");
        if (t.registration_of(reg.data() + offset, count * sizeof(float)) != reg.memory().id()) {
          found.add("a subview is not recognised as registered");
        }
        if (t.registration_of(reg.data() + offset, (count + 2 * offset) * sizeof(float)) != 0) {
          found.add("a range running past the registration is taken as registered");
        }
        // odd ranks read the even ranks' blocks through their mappings
        if (me.rank % 2 == 1 && t.can_access_peers() && t.mapped_accesses() == 0) {
          found.add("no mapping reached for the registered peers");
        }
        // freed on every rank: its address range is no longer registered anywhere
        const std::uint64_t id = reg.memory().id();
        const float* was = reg.data();
        reg = {};
        if (t.registration_of(was, sizeof(float)) != 0) found.add("a freed registration is found");
        const std::uint64_t before = t.mapped_accesses();
        std::copy(mine.begin(), mine.end(), heap.data());
        comm.allreduce(squall::host_view<float>(heap.data(), count));
        expect_sums(found, heap.data(), count, 0, me.size, "allreduce after the free");
        if (t.mapped_accesses() != before) found.add("a freed registration was reached");
        // the next registration gets the next id, everywhere
        squall::registered_buffer<float> again = t.allocate<float>(16);
        if (again.memory().id() != id + 1) found.add("registration ids differ across ranks");
        if (found.ok()) return 0;
        std::fprintf(stderr, "rank %d of %d: %s\n", me.rank, me.size, found.text().c_str());
        return 1;
      });
    }
  }

  TEST_CASE("ranks registering different sizes all get mismatch_error, and go on") {
    test::expect_ranks_succeed(3, [](const shm_job& me) {
      shm_transport t(me, squall::options{.deadline = 20s});
      int failures = 0;
      try {
        auto bad = t.allocate<float>(me.rank == 1 ? 100 : 200);
        std::fprintf(stderr, "rank %d: different sizes were accepted\n", me.rank);
        ++failures;
      } catch (const squall::mismatch_error& e) {
        if (std::string(e.what()).find("ranks register 800, 400, 800 bytes") == std::string::npos) {
          std::fprintf(stderr, "rank %d: the error does not name rank 1: %s\n", me.rank, e.what());
          ++failures;
        }
      }
      try {
        t.allocate<float>(0);
      } catch (const squall::invalid_argument&) {
        std::fprintf(stderr, "rank %d: 0 elements refused\n", me.rank);
        ++failures;
      }
      try {
        (void)t.register_memory(0);
        std::fprintf(stderr, "rank %d: 0 bytes accepted\n", me.rank);
        ++failures;
      } catch (const squall::invalid_argument&) {  // NOLINT(bugprone-empty-catch): expected
      }
      // the transport goes on: a good registration (the third on every rank: 0 elements
      // take a page too)
      squall::registered_buffer<int> good = t.allocate<int>(4);
      if (good.memory().id() != 3) {
        std::fprintf(stderr, "rank %d: registration id %llu, want 3\n", me.rank,
                     static_cast<unsigned long long>(good.memory().id()));
        ++failures;
      }
      return failures == 0 ? 0 : 1;
    });
  }
}

TEST_SUITE("shm_registered") {
  TEST_CASE("a peer that failed closes its registered memory: with_peer refuses it, naming why") {
    test::expect_ranks_succeed(2, [](const shm_job& me) {
      shm_transport t(me, squall::options{.deadline = 20s});
      squall::registered_buffer<int> buffer = t.allocate<int>(16);
      t.barrier().wait();
      if (me.rank == 1) {
        t.abandon("rank 1 leaves on purpose");
        return 0;
      }
      // until rank 1 has recorded its failure, rank 0 may touch its memory; then never again
      const auto give_up = std::chrono::steady_clock::now() + 10s;
      while (std::chrono::steady_clock::now() < give_up) {
        bool ran = false;
        try {
          t.with_peer(1, [&] { ran = true; });
        } catch (const squall::peer_failure& e) {
          if (ran || std::string(e.what()).find("rank 1 leaves on purpose") == std::string::npos) {
            std::fprintf(stderr, "rank 0: %s (ran: %d)\n", e.what(), ran ? 1 : 0);
            return 1;
          }
          return 0;
        }
        std::this_thread::sleep_for(1ms);
      }
      std::fprintf(stderr, "rank 0: with_peer still ran 10 s after rank 1 failed\n");
      return 1;
    });
  }
}

TEST_SUITE("shm_registered") {
  TEST_CASE("the shared heap: zero-filled, aligned, found by range, freed, private after fork") {
    auto& heap = squall::detail::shm::shared_heap::instance();
    const std::size_t live = heap.live();
    constexpr std::size_t bytes = (std::size_t{3} << 20) + 5;
    auto* p = static_cast<unsigned char*>(heap.allocate(bytes, 64, true));
    REQUIRE(p != nullptr);
    CHECK(heap.owns(p));
    CHECK(heap.live() == live + 1);
    CHECK(reinterpret_cast<std::uintptr_t>(p) % 4096 == 0);
    CHECK(heap.usable(p) >= bytes);
    CHECK(std::all_of(p, p + bytes, [](unsigned char c) { return c == 0; }));
    CHECK(heap.find(p, bytes).fd >= 0);
    CHECK(heap.find(p + 100, bytes - 100).fd >= 0);
    CHECK(heap.find(p, heap.usable(p) + 1).fd < 0);  // past the end
    CHECK(heap.find(p - 1, 2).fd < 0);               // before the start (the header page)
    auto* aligned = static_cast<unsigned char*>(heap.allocate(100, std::size_t{1} << 20, true));
    REQUIRE(aligned != nullptr);
    CHECK(reinterpret_cast<std::uintptr_t>(aligned) % (std::size_t{1} << 20) == 0);
    CHECK(heap.allocate(100, std::size_t{4} << 20, true) == nullptr);  // alignment above 2 MiB
    int local = 0;
    CHECK_FALSE(heap.owns(&local));
    CHECK(heap.find(&local, sizeof local).fd < 0);
    // after fork the child's copy is private: its writes do not reach the parent; a sparse
    // allocation (one byte written, far in) keeps that byte and its zeros
    std::memset(p, 7, bytes);
    auto* sparse = static_cast<unsigned char*>(heap.allocate(std::size_t{5} << 20, 64, true));
    REQUIRE(sparse != nullptr);
    sparse[std::size_t{4} << 20] = 3;
    const pid_t child = fork();
    REQUIRE(child >= 0);
    if (child == 0) {
      const bool same = p[0] == 7 && p[bytes - 1] == 7 && sparse[std::size_t{4} << 20] == 3 &&
                        sparse[0] == 0 && sparse[(std::size_t{4} << 20) - 1] == 0 &&
                        heap.find(sparse, 1).fd < 0;
      const bool private_now = heap.find(p, bytes).fd < 0;
      std::memset(p, 9, bytes);
      _exit(same && private_now ? 0 : 1);
    }
    int status = 0;
    REQUIRE(waitpid(child, &status, 0) == child);
    CHECK((WIFEXITED(status) && WEXITSTATUS(status) == 0));
    CHECK(p[0] == 7);
    CHECK(p[bytes - 1] == 7);
    CHECK(heap.find(p, bytes).fd >= 0);  // still shared here
    CHECK(sparse[std::size_t{4} << 20] == 3);
    heap.release(sparse);
    heap.release(aligned);
    heap.release(p);
    CHECK(heap.live() == live);
    // a freed allocation is taken again for a request of its layout and up to twice its
    // size, zero-filled where asked
    auto* again = static_cast<unsigned char*>(heap.allocate(bytes - 4096, 64, true));
    CHECK(again == p);
    CHECK(heap.find(again, bytes - 4096).fd >= 0);
    CHECK(std::all_of(again, again + bytes - 4096, [](unsigned char c) { return c == 0; }));
    heap.release(again);
    CHECK(heap.owns(p));  // the address range stays the heap's
    CHECK(heap.find(p, 1).fd < 0);
  }

  TEST_CASE("shared-heap buffers freed and made again between calls: the peers map the new ones") {
    for (int ranks = 2; ranks <= 3; ++ranks) {
      CAPTURE(ranks);
      test::expect_ranks_succeed(ranks, [](const shm_job& me) {
        squall::communicator<shm_transport, squall::direct_topology> comm(
            shm_transport(me, squall::options{.deadline = 60s}));
        const shm_transport& t = comm.transport();
        test::findings found;
        const std::uint64_t before = t.mapped_accesses();
        for (int round = 0; round < 4; ++round) {
          // sizes that alternate, so a freed file's address and descriptor come back; above
          // the windows' bound (2 MiB a rank), where 3 ranks reach the peers' memory
          const std::size_t count = (std::size_t{1} << (20 + round % 2)) + 3;
          // five small allocations made and freed: more than the heap keeps for reuse, so
          // the last round's file is given back and a new one may take its descriptor (a
          // new serial, which the peers' mappings must notice)
          if (round % 2 == 1) {
            std::vector<shared_heap_floats> small;
            for (int i = 0; i < 5; ++i) small.push_back(shared_heap_allocate(std::size_t{1} << 18));
          }
          // rank 1 on the ordinary heap in the last round: its peers copy from it
          const bool ordinary = me.rank == 1 && round == 3;
          std::vector<float> plain(ordinary ? count : 0);
          shared_heap_floats shared = ordinary ? nullptr : shared_heap_allocate(count);
          float* data = ordinary ? plain.data() : shared.get();
          if (data == nullptr) {
            found.add("the shared heap could not allocate");
            break;
          }
          const std::vector<float> mine = test::exact_input<float>(me.rank, count);
          std::copy(mine.begin(), mine.end(), data);
          comm.allreduce(squall::host_view<float>(data, count));
          expect_sums(found, data, count, 0, me.size, "round " + std::to_string(round));
        }
        if (t.can_access_peers() && t.mapped_accesses() == before) {
          found.add("no peer's shared-heap buffer was reached through a mapping");
        }
        if (found.ok()) return 0;
        std::fprintf(stderr, "rank %d of %d: %s\n", me.rank, me.size, found.text().c_str());
        return 1;
      });
    }
  }
}
