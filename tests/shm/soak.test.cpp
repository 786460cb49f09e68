// SPDX-License-Identifier: Apache-2.0
// The soak (issue 15): 3 real processes on shm_transport run a random mix of collectives for
// SQUALL_SOAK_SECONDS (default 60) seconds: allreduce (sum, max, min over float, double and
// int32), reduce-scatter, allgather, broadcast from a random root, barrier, and the bf16
// compressed allreduce, at random sizes from 0 to 4 MiB (windows, peer memory, slots and single
// copy), on the automatic, direct and ring topologies, in place and out of place. Every
// result is checked exactly against values computed serially (small integers, exact in every
// type). Each rank's resident memory is measured once warm and at the end: the private part
// must not grow by more than 32 MiB (the shared part grows as the segments' pages are first
// touched, up to their size), and nothing may stay in /dev/shm. Prints the operations and
// the RSS.
#include <squall/algorithm/communicator.hpp>
#include <squall/compress/cast.hpp>
#include <squall/topology/automatic.hpp>
#include <squall/topology/direct.hpp>
#include <squall/topology/ring.hpp>
#include <squall/transport/launch.hpp>
#include <squall/transport/shm.hpp>

#include <doctest/doctest.h>
#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <random>
#include <string>
#include <unistd.h>
#include <vector>

#include "../support/shm_ranks.hpp"

namespace {

namespace test = squall::test;
using squall::host_view;

/// This process's resident memory in bytes (/proc/self/statm): all of it, and the private
/// part (less the shared pages: the segments' pages count there as they are first touched).
struct resident {
  std::uint64_t all = 0;
  std::uint64_t own = 0;
};
resident resident_now() {
  std::ifstream statm("/proc/self/statm");
  std::uint64_t pages = 0, in_memory = 0, shared = 0;
  statm >> pages >> in_memory >> shared;
  const auto page = static_cast<std::uint64_t>(sysconf(_SC_PAGESIZE));
  return {in_memory * page, (in_memory - shared) * page};
}

/// What the ranks report through an anonymous shared mapping made before the fork.
struct soak_record {
  std::atomic<std::uint64_t> operations;
  std::atomic<std::uint64_t> warm_rss[3];  ///< all resident bytes, once warm
  std::atomic<std::uint64_t> end_rss[3];
  std::atomic<std::uint64_t> warm_own[3];  ///< private resident bytes
  std::atomic<std::uint64_t> end_own[3];
};

/// Rank r's element i in call `call`: a small integer, so every sum, max and min is exact.
int value(int r, std::size_t i, std::uint64_t call) {
  return static_cast<int>((i * 7 + static_cast<std::size_t>(r) * 3 + call) % 11) - 5;
}

constexpr int wrong = 80;

template <class T, class Comm>
bool check_allreduce(Comm& comm, int op, std::size_t count, bool in_place, std::uint64_t call) {
  const int me = comm.rank();
  const int p = comm.size();
  std::vector<T> in(count), out(count);
  for (std::size_t i = 0; i < count; ++i) in[i] = static_cast<T>(value(me, i, call));
  const auto run = [&](auto op_tag) {
    if (in_place) {
      comm.allreduce(host_view<T>(in), op_tag);
    } else {
      comm.allreduce(host_view<const T>(in), host_view<T>(out), op_tag);
    }
  };
  if (op == 0) run(squall::sum_op{});
  if (op == 1) run(squall::max_op{});
  if (op == 2) run(squall::min_op{});
  const std::vector<T>& got = in_place ? in : out;
  for (std::size_t i = 0; i < count; ++i) {
    int want = value(0, i, call);
    for (int q = 1; q < p; ++q) {
      const int v = value(q, i, call);
      want = op == 0 ? want + v : op == 1 ? std::max(want, v) : std::min(want, v);
    }
    if (got[i] != static_cast<T>(want)) return false;
  }
  return true;
}

template <class Comm>
bool check_reduce_scatter(Comm& comm, std::size_t count, std::uint64_t call) {
  std::vector<float> in(count);
  for (std::size_t i = 0; i < count; ++i) in[i] = static_cast<float>(value(comm.rank(), i, call));
  std::vector<float> out(comm.block_count(count));
  comm.reduce_scatter(host_view<const float>(in), host_view<float>(out));
  const std::size_t begin = comm.block_offset(count);
  for (std::size_t i = 0; i < out.size(); ++i) {
    int want = 0;
    for (int q = 0; q < comm.size(); ++q) want += value(q, begin + i, call);
    if (out[i] != static_cast<float>(want)) return false;
  }
  return true;
}

template <class Comm>
bool check_allgather(Comm& comm, std::size_t count, std::uint64_t call) {
  std::vector<std::int32_t> in(count);
  for (std::size_t i = 0; i < count; ++i) in[i] = value(comm.rank(), i, call);
  std::vector<std::int32_t> out(count * static_cast<std::size_t>(comm.size()));
  comm.allgather(host_view<const std::int32_t>(in), host_view<std::int32_t>(out));
  for (int q = 0; q < comm.size(); ++q) {
    for (std::size_t i = 0; i < count; ++i) {
      if (out[static_cast<std::size_t>(q) * count + i] != value(q, i, call)) return false;
    }
  }
  return true;
}

template <class Comm>
bool check_broadcast(Comm& comm, std::size_t count, int root, std::uint64_t call) {
  std::vector<double> data(count);
  for (std::size_t i = 0; i < count; ++i) data[i] = value(comm.rank(), i, call);
  comm.broadcast(host_view<double>(data), root);
  for (std::size_t i = 0; i < count; ++i) {
    if (data[i] != static_cast<double>(value(root, i, call))) return false;
  }
  return true;
}

/// One collective of the mix, chosen and sized by `random` (the same sequence on every rank).
template <class Comm>
bool one_call(Comm& comm, std::mt19937_64& random, std::uint64_t call) {
  // sizes: mostly small, some up to 4 MiB of floats (1 Mi elements)
  const int scale = std::uniform_int_distribution<int>(0, 20)(random);
  const std::size_t count =
      std::uniform_int_distribution<std::size_t>(0, std::size_t{1} << scale)(random);
  switch (std::uniform_int_distribution<int>(0, 5)(random)) {
    case 0:
      return check_allreduce<float>(comm, std::uniform_int_distribution<int>(0, 2)(random), count,
                                    (random() & 1) != 0, call);
    case 1:
      return check_allreduce<double>(comm, std::uniform_int_distribution<int>(0, 2)(random), count,
                                     (random() & 1) != 0, call);
    case 2:
      return check_allreduce<std::int32_t>(comm, std::uniform_int_distribution<int>(0, 2)(random),
                                           count, (random() & 1) != 0, call);
    case 3:
      return check_reduce_scatter(comm, count, call);
    case 4:
      return check_allgather(comm, count / 3, call);
    default:
      return check_broadcast(comm, count,
                             std::uniform_int_distribution<int>(0, comm.size() - 1)(random), call);
  }
}

int soak_rank(const squall::shm_job& me, double seconds, soak_record* record) {
  const auto transport = [&](const char* suffix) {
    return squall::shm_transport(squall::shm_job{me.name + suffix, me.rank, me.size, me.key},
                                 squall::options{.deadline = std::chrono::seconds(60)});
  };
  squall::communicator<squall::shm_transport, squall::automatic_topology> automatic(
      squall::shm_transport(me, squall::options{.deadline = std::chrono::seconds(60)}));
  squall::communicator<squall::shm_transport, squall::direct_topology> direct(transport("-d"));
  squall::communicator<squall::shm_transport, squall::ring_topology,
                       squall::cast_compressor<squall::bfloat16>>
      compressed(transport("-c"));
  std::mt19937_64 random(20261125);  // the same choices on every rank
  const auto start = std::chrono::steady_clock::now();
  bool warm = false;
  std::uint64_t call = 0;
  for (;; ++call) {
    const double elapsed =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (!warm && elapsed >= std::min(5.0, seconds / 4)) {
      const resident now = resident_now();
      record->warm_rss[me.rank].store(now.all);
      record->warm_own[me.rank].store(now.own);
      warm = true;
    }
    // every rank stops at the same call: the largest "time is up" of any rank
    std::int32_t stop = elapsed >= seconds ? 1 : 0;
    automatic.allreduce(host_view<std::int32_t>(&stop, 1), squall::max_op{});
    if (stop != 0) break;
    const int which = std::uniform_int_distribution<int>(0, 9)(random);
    bool ok = true;
    if (which < 5) {
      ok = one_call(automatic, random, call);
    } else if (which < 8) {
      ok = one_call(direct, random, call);
    } else if (which == 8) {
      direct.barrier();
    } else {
      // bf16 sums of integers of at most 8 over 3 ranks: exact
      const std::size_t count =
          std::uniform_int_distribution<std::size_t>(1, std::size_t{1} << 18)(random);
      auto state = compressed.make_state<float>(count);
      std::vector<float> data(count);
      for (std::size_t i = 0; i < count; ++i)
        data[i] = static_cast<float>(value(me.rank, i, call) + 5);
      compressed.allreduce(host_view<float>(data), state);
      for (std::size_t i = 0; i < count; ++i) {
        int want = 0;
        for (int q = 0; q < me.size; ++q) want += value(q, i, call) + 5;
        if (data[i] != static_cast<float>(want)) ok = false;
      }
    }
    if (!ok) {
      std::printf("rank %d: call %llu gave a wrong result\n", me.rank,
                  static_cast<unsigned long long>(call));
      return wrong;
    }
  }
  if (me.rank == 0) record->operations.store(call);
  const resident now = resident_now();
  record->end_rss[me.rank].store(now.all);
  record->end_own[me.rank].store(now.own);
  return 0;
}

}  // namespace

TEST_SUITE("shm_soak") {
  TEST_CASE("soak: a random mix of collectives, every result checked, memory flat") {
    const char* text = std::getenv("SQUALL_SOAK_SECONDS");
    const double seconds = text != nullptr ? std::max(1.0, std::atof(text)) : 60.0;
    auto* record = static_cast<soak_record*>(mmap(
        nullptr, sizeof(soak_record), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
    REQUIRE(record != MAP_FAILED);
    const std::string job = squall::detail::unique_job_name();
    const auto result = squall::launch(
        3, [&](const squall::shm_job& me) { return soak_rank(me, seconds, record); }, {.job = job});
    INFO(test::statuses(result));
    CHECK(result.ok());
    std::printf("soak: %.0f s, 3 ranks, %llu operations (each checked)\n", seconds,
                static_cast<unsigned long long>(record->operations.load()));
    const auto mib = [](const std::atomic<std::uint64_t>& bytes) {
      return static_cast<double>(bytes.load()) / (1 << 20);
    };
    for (int r = 0; r < 3; ++r) {
      std::printf(
          "rank %d: RSS warm %.1f MiB, end %.1f MiB; private warm %.1f MiB, end %.1f MiB, "
          "growth %.1f MiB\n",
          r, mib(record->warm_rss[r]), mib(record->end_rss[r]), mib(record->warm_own[r]),
          mib(record->end_own[r]), mib(record->end_own[r]) - mib(record->warm_own[r]));
      CHECK(record->end_rss[r].load() > 0);
      CHECK(mib(record->end_own[r]) - mib(record->warm_own[r]) < 32.0);
    }
    for (const char* suffix : {"", "-d", "-c"}) CHECK_FALSE(test::segment_left(job + suffix));
    CHECK(record->operations.load() > 0);
    munmap(record, sizeof(soak_record));
  }
}
