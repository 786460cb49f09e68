// SPDX-License-Identifier: Apache-2.0
// squall::communicator over shm_transport, ranks as real processes (squall::launch forks
// them). Every rank checks its allreduce result element by element against the serial
// reference (exact inputs: every order of summation gives the same float), and writes a hash
// of its result to a page shared with the parent (mapped before the fork), which then checks
// that every rank holds bitwise the same result. A rank returns 0, or a code naming the check
// that failed (and says which on stderr).
// Suites: shm_collectives (1 to 4 ranks, every topology), shm_collectives_large (an
// allreduce of more than 2^31 elements on 2 ranks).

#include <squall/algorithm/communicator.hpp>
#include <squall/topology/automatic.hpp>
#include <squall/topology/direct.hpp>
#include <squall/topology/halving_doubling.hpp>
#include <squall/topology/hierarchical.hpp>
#include <squall/topology/ring.hpp>
#include <squall/topology/tree.hpp>
#include <squall/transport/launch.hpp>
#include <squall/transport/shm.hpp>

#include <doctest/doctest.h>
#include <sys/mman.h>

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "../support/collective_data.hpp"
#include "../support/deferred_backend.hpp"
#include "../support/result_hash.hpp"
#include "../support/shm_ranks.hpp"
#include "../support/topologies.hpp"

using squall::shm_job;
using squall::shm_transport;
namespace test = squall::test;
using namespace std::chrono_literals;

namespace {

constexpr std::size_t npos = static_cast<std::size_t>(-1);
constexpr int max_ranks = 4;

/// Counts 0, 1, a prime, 1 Mi + 1 and 16 Mi.
constexpr std::array<std::size_t, 5> counts = {0, 1, 1009, (std::size_t{1} << 20) + 1,
                                               std::size_t{16} << 20};

using squall::test::make_topology;

/// Memory the parent maps shared before forking: each rank's hash of each result.
template <class T>
class shared_array {
 public:
  explicit shared_array(std::size_t count) : count_(count) {
    void* p = mmap(nullptr, bytes(), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    REQUIRE(p != MAP_FAILED);
    data_ = static_cast<T*>(p);
    std::memset(static_cast<void*>(data_), 0, bytes());
  }
  ~shared_array() { munmap(data_, bytes()); }
  shared_array(const shared_array&) = delete;
  shared_array& operator=(const shared_array&) = delete;
  T& operator[](std::size_t i) const { return data_[i]; }

 private:
  std::size_t bytes() const { return count_ * sizeof(T); }
  std::size_t count_;
  T* data_ = nullptr;
};

/// The serial references of every count for `ranks` ranks, as floats (exact), made in the
/// parent once per rank count; the forked ranks read them.
const std::vector<std::vector<float>>& references(int ranks) {
  static std::map<int, std::vector<std::vector<float>>> made;
  auto& refs = made[ranks];
  if (refs.empty()) {
    for (const std::size_t count : counts) {
      std::vector<float> ref(count);
      for (std::size_t i = 0; i < count; ++i) {
        ref[i] = static_cast<float>(test::exact_reference<float, squall::sum_op>(ranks, i));
      }
      refs.push_back(std::move(ref));
    }
  }
  return refs;
}

/// The first element where `got` differs bitwise from `want`, or npos.
std::size_t first_difference(const float* got, const float* want, std::size_t count) {
  if (count == 0 || std::memcmp(got, want, count * sizeof(float)) == 0) return npos;
  for (std::size_t i = 0; i < count; ++i) {
    if (std::memcmp(got + i, want + i, sizeof(float)) != 0) return i;
  }
  return npos;
}

template <class Topology, class Backend = squall::host_backend>
void allreduce_on_processes() {
  for (int ranks = 1; ranks <= max_ranks; ++ranks) {
    CAPTURE(ranks);
    const auto& refs = references(ranks);
    const shared_array<std::uint64_t> hashes(max_ranks * counts.size());
    const auto start = std::chrono::steady_clock::now();
    test::expect_ranks_succeed(ranks, [&](const shm_job& me) {
      squall::communicator<shm_transport, Topology, squall::identity_compressor, Backend> comm(
          shm_transport(me, squall::options{.deadline = 60s}), make_topology<Topology>(me.size));
      for (std::size_t k = 0; k < counts.size(); ++k) {
        const std::size_t count = counts[k];
        // In place, and out of place for the prime and 1 Mi + 1.
        const bool out_of_place = k == 2 || k == 3;
        std::vector<float> data = test::exact_input<float>(me.rank, count);
        std::vector<float> out;
        if (out_of_place) {
          out.assign(count, -1000.0f);
          comm.allreduce(squall::host_view<const float>(data), squall::host_view<float>(out));
          const std::vector<float> again = test::exact_input<float>(me.rank, count);
          if (first_difference(data.data(), again.data(), count) != npos) {
            std::fprintf(stderr, "rank %d: %s: input of %zu changed\n", me.rank,
                         comm.schedule_for(count * sizeof(float)).c_str(), count);
            return 20 + static_cast<int>(k);
          }
        } else {
          comm.allreduce(squall::host_view<float>(data));
          out = std::move(data);
        }
        const std::size_t wrong = first_difference(out.data(), refs[k].data(), count);
        if (wrong != npos) {
          std::fprintf(stderr, "rank %d of %d: %s: allreduce of %zu: element %zu is %g, not %g\n",
                       me.rank, me.size, comm.schedule_for(count * sizeof(float)).c_str(), count,
                       wrong, static_cast<double>(out[wrong]), static_cast<double>(refs[k][wrong]));
          return 10 + static_cast<int>(k);
        }
        hashes[static_cast<std::size_t>(me.rank) * counts.size() + k] =
            test::hash_bytes(out.data(), count * sizeof(float));
      }
      comm.barrier();
      return 0;
    });
    MESSAGE(std::string(Topology::name)
            << " on " << ranks << " processes: "
            << std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count()
            << " s");
    // Every rank holds bitwise the same result (and wrote one).
    for (std::size_t k = 0; k < counts.size(); ++k) {
      CAPTURE(counts[k]);
      CHECK(hashes[k] != 0);
      for (int r = 1; r < ranks; ++r) {
        CAPTURE(r);
        CHECK(hashes[static_cast<std::size_t>(r) * counts.size() + k] == hashes[k]);
      }
    }
  }
}

// ---- above 2^31 elements ------------------------------------------------------------------------

/// Rank r's element i in the large test: -1, 0 or 1, so any sum of 2 is exact in float16.
int small_value(int rank, std::size_t i) {
  const std::uint64_t x =
      (static_cast<std::uint64_t>(i) ^ (static_cast<std::uint64_t>(rank + 1) << 40)) *
      0x9E3779B97F4A7C15ull;
  return static_cast<int>((x >> 32) % 3) - 1;
}

}  // namespace

#define SQUALL_TOPOLOGIES                                                 \
  squall::ring_topology, squall::tree_topology, squall::direct_topology,  \
      squall::halving_doubling_topology, squall::hierarchical_topology<>, \
      squall::automatic_topology

TEST_SUITE("shm_collectives") {
  TEST_CASE_TEMPLATE("allreduce of exact float sums on 1 to 4 processes equals the serial sum",
                     Topology, SQUALL_TOPOLOGIES) {
    allreduce_on_processes<Topology>();
  }
  TEST_CASE_TEMPLATE("the same on the deferred backend (kernels run at the ordering points)",
                     Topology, squall::ring_topology, squall::direct_topology,
                     squall::hierarchical_topology<>) {
    allreduce_on_processes<Topology, squall::test::deferred_backend>();
  }
}

TEST_SUITE("shm_collectives_large") {
  TEST_CASE("allreduce of 2^31 + 7 float16 elements on 2 processes, every element checked") {
    // Ring (the executor's pieces: block offsets past 2^31 elements) and direct (the one-shot
    // rounds through the windows), in place, one 4 GiB buffer per process.
    constexpr std::size_t count = (std::size_t{1} << 31) + 7;
    constexpr int ranks = 2;
    test::expect_ranks_succeed(ranks, [](const shm_job& me) {
      // The bits of -1, 0, 1 and of the sums -2 to 2, each converted once.
      std::array<squall::float16, 3> input_of{};
      std::array<std::uint16_t, 2 * ranks + 1> sum_bits{};
      for (int v = -1; v <= 1; ++v) {
        input_of[static_cast<std::size_t>(v + 1)] = squall::float16(static_cast<float>(v));
      }
      for (int s = -ranks; s <= ranks; ++s) {
        sum_bits[static_cast<std::size_t>(s + ranks)] =
            squall::float16(static_cast<float>(s)).bits();
      }
      // Uninitialized: every element is written before each run.
      std::unique_ptr<squall::float16[]> data(new squall::float16[count]);
      const auto run = [&](auto topology) -> int {
        using Topology = decltype(topology);
        squall::communicator<shm_transport, Topology> comm(
            shm_transport(shm_job{me.name + "-" + std::string(Topology::name), me.rank, me.size},
                          squall::options{.deadline = 120s}));
        for (std::size_t i = 0; i < count; ++i) {
          data[i] = input_of[static_cast<std::size_t>(small_value(me.rank, i) + 1)];
        }
        comm.barrier();
        const auto start = std::chrono::steady_clock::now();
        comm.allreduce(squall::host_view<squall::float16>(data.get(), count));
        const double seconds =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        if (me.rank == 0) {
          std::printf(
              "shm_collectives_large: allreduce of %zu float16 (%s, 2 processes) in %.3f s\n",
              count, std::string(Topology::name).c_str(), seconds);
          std::fflush(stdout);
        }
        std::size_t wrong = 0;
        std::size_t first = npos;
        for (std::size_t i = 0; i < count; ++i) {
          int want = 0;
          for (int q = 0; q < ranks; ++q) want += small_value(q, i);
          if (data[i].bits() != sum_bits[static_cast<std::size_t>(want + ranks)]) {
            if (wrong++ == 0) first = i;
          }
        }
        if (wrong != 0) {
          std::fprintf(stderr, "rank %d (%s): %zu of %zu elements wrong, the first at %zu\n",
                       me.rank, std::string(Topology::name).c_str(), wrong, count, first);
          return 1;
        }
        comm.barrier();
        return 0;
      };
      if (run(squall::ring_topology{}) != 0) return 90;
      if (run(squall::direct_topology{}) != 0) return 91;
      return 0;
    });
  }
}
