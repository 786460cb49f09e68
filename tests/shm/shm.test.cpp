// SPDX-License-Identifier: Apache-2.0
// shm_transport between real processes (squall::launch forks them): point-to-point patterns
// at every size the issue names, on 1 to 4 ranks. A rank returns 0 when everything it
// received equals the pattern its sender computed independently, or a code naming the check.

#include <squall/transport/launch.hpp>
#include <squall/transport/shm.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "../support/page_aligned.hpp"
#include "../support/shm_ranks.hpp"

using squall::buffer_view;
using squall::shm_job;
using squall::shm_transport;
namespace test = squall::test;

namespace {

constexpr std::size_t mib = std::size_t{1} << 20;

int ping_pong(shm_transport& t, std::size_t size) {
  if (t.size() < 2 || t.rank() > 1) return 0;
  const int peer = 1 - t.rank();
  const auto out = test::make_message(t.rank(), peer, size);
  std::vector<std::byte> in(size);
  if (t.rank() == 0) {
    t.send(peer, buffer_view<const std::byte>(out)).wait();
    t.recv(peer, in).wait();
  } else {
    t.recv(peer, in).wait();
    t.send(peer, buffer_view<const std::byte>(out)).wait();
  }
  return test::is_message(in, peer, t.rank()) ? 0 : 10;
}

int ring_shift(shm_transport& t, std::size_t size) {
  const int next = (t.rank() + 1) % t.size();
  const int prev = (t.rank() + t.size() - 1) % t.size();
  const auto out = test::make_message(t.rank(), next, size);
  std::vector<std::byte> in(size);
  auto r = t.recv(prev, in);  // posted before waiting: progress must not depend on order
  auto s = t.send(next, buffer_view<const std::byte>(out));
  s.wait();
  r.wait();
  return test::is_message(in, prev, t.rank()) ? 0 : 11;
}

int all_pairs(shm_transport& t, std::size_t size) {
  std::vector<std::vector<std::byte>> out;
  std::vector<std::vector<std::byte>> in(static_cast<std::size_t>(t.size()),
                                         std::vector<std::byte>(size));
  std::vector<squall::shm_completion> pending;
  for (int p = 0; p < t.size(); ++p) {
    out.push_back(test::make_message(t.rank(), p, size));
  }
  for (int p = 0; p < t.size(); ++p) pending.push_back(t.recv(p, in[static_cast<std::size_t>(p)]));
  for (int p = 0; p < t.size(); ++p) {
    pending.push_back(t.send(p, buffer_view<const std::byte>(out[static_cast<std::size_t>(p)])));
  }
  for (auto& c : pending) c.wait();
  for (int p = 0; p < t.size(); ++p) {
    if (!test::is_message(in[static_cast<std::size_t>(p)], p, t.rank())) return 12;
  }
  return 0;
}

int fifo(shm_transport& t) {
  const int next = (t.rank() + 1) % t.size();
  const int prev = (t.rank() + t.size() - 1) % t.size();
  const std::size_t sizes[] = {3, 0, 300000, 17, 4099};
  std::vector<std::vector<std::byte>> out;
  std::vector<std::vector<std::byte>> in;
  std::vector<squall::shm_completion> pending;
  for (std::size_t s : sizes) {
    out.push_back(test::make_message(t.rank(), next, s));
    in.emplace_back(s);
  }
  for (std::size_t i = 0; i < out.size(); ++i) {
    pending.push_back(t.send(next, buffer_view<const std::byte>(out[i])));
  }
  for (std::size_t i = 0; i < in.size(); ++i) pending.push_back(t.recv(prev, in[i]));
  for (auto& c : pending) c.wait();
  for (const auto& m : in) {
    if (!test::is_message(m, prev, t.rank())) return 13;
  }
  return 0;
}

int windows(shm_transport& t) {
  auto mine = t.local_view();
  const std::size_t n = 1 << 16;
  for (std::size_t i = 0; i < n; ++i) mine[i] = test::pattern(t.rank(), -1, n, i);
  t.barrier().wait();
  for (int p = 0; p < t.size(); ++p) {
    auto theirs = t.peer_view(p);
    for (std::size_t i = 0; i < n; i += 7) {
      if (theirs[i] != test::pattern(p, -1, n, i)) return 14;
    }
  }
  t.barrier().wait();
  return 0;
}

// read_peer and write_peer between rank 1 and rank 0's buffers at every distance modulo a
// page around the kernel's slow REP MOVSB case (destination 1-31 bytes after the source),
// which detail::shm::cross_memory bounces through a buffer of its own; sizes below, at and
// above its thresholds (2 KiB, and the 256 KiB bounce piece). Every byte is compared with the
// pattern, and the bytes on both sides of each copy must stay untouched.
int cross_memory_at_every_distance(shm_transport& t) {
  if (t.size() < 2 || t.rank() > 1 || !t.can_access_peers()) return 0;
  constexpr std::size_t page = 4096;
  constexpr std::size_t sizes[] = {100, 2049, 70001, (std::size_t{256} << 10) + 4099};
  constexpr std::size_t distances[] = {0, 8, 16, 31, 32, 64, 128, 2048, 4080};
  constexpr std::size_t room = sizes[3] + 3 * page;
  const auto byte_at = [](std::size_t i) { return static_cast<std::byte>((i * 131 + 7) % 251); };
  // page-aligned: offsets below are offsets in a page
  std::vector<std::byte> store(room + page);
  // the pattern, which the other rank reads or writes
  std::byte* const source = squall::test::page_aligned(store, page);
  std::vector<std::byte> other(room + page);  // where rank 1 reads into, rank 0 is written
  std::byte* const written = squall::test::page_aligned(other, page);
  for (std::size_t i = 0; i < room; ++i) source[i] = byte_at(i);
  // `written` holds the pattern from `from` at [to, to + n) and zeros around it
  const auto holds_copy = [&](std::size_t from, std::size_t to, std::size_t n) {
    for (std::size_t i = 0; i < room; ++i) {
      const bool inside = i >= to && i < to + n;
      if (written[i] != (inside ? byte_at(from + i - to) : std::byte{0})) return false;
    }
    return true;
  };
  const int peer = 1 - t.rank();
  std::uint64_t addresses[2] = {reinterpret_cast<std::uint64_t>(source),
                                reinterpret_cast<std::uint64_t>(written)};
  std::uint64_t theirs[2] = {};
  auto r = t.recv(peer, {reinterpret_cast<std::byte*>(theirs), sizeof theirs});
  t.send(peer, {reinterpret_cast<const std::byte*>(addresses), sizeof addresses}).wait();
  r.wait();
  int code = 0;
  for (const std::size_t from : {std::size_t{0}, std::size_t{16}}) {
    for (const std::size_t apart : distances) {
      for (const std::size_t n : sizes) {
        const std::size_t to = from + apart;
        std::uint8_t verdict = 0;
        if (t.rank() == 1) {
          // read rank 0's pattern at `from` into this rank's buffer at `to`
          std::fill(written, written + room, std::byte{0});
          t.read_peer(0, theirs[0] + from, {written + to, n});
          if (!holds_copy(from, to, n)) verdict = 1;
          // write this rank's pattern at `from` into rank 0's zeroed buffer at `to`
          t.write_peer(0, theirs[1] + to, {source + from, n});
          t.send(0, {reinterpret_cast<const std::byte*>(&verdict), 1}).wait();
          t.recv(0, {reinterpret_cast<std::byte*>(&verdict), 1}).wait();
        } else {
          std::uint8_t read_verdict = 0;
          t.recv(1, {reinterpret_cast<std::byte*>(&read_verdict), 1}).wait();
          if (!holds_copy(from, to, n)) verdict = 2;
          std::fill(written, written + room, std::byte{0});
          if (read_verdict != 0) verdict = read_verdict;
          t.send(1, {reinterpret_cast<const std::byte*>(&verdict), 1}).wait();
        }
        if (verdict != 0 && code == 0) {
          std::fprintf(stderr, "%s %zu bytes from page offset %zu to %zu: wrong bytes\n",
                       verdict == 1 ? "read_peer" : "write_peer", n, from, to);
          code = 15;
        }
      }
    }
  }
  return code;
}

}  // namespace

TEST_SUITE("shm") {
  TEST_CASE("point-to-point patterns between 1 to 4 processes") {
    for (int ranks = 1; ranks <= 4; ++ranks) {
      CAPTURE(ranks);
      test::expect_ranks_succeed(ranks, [](const shm_job& job) {
        shm_transport t(job);
        for (std::size_t size : {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{4099},
                                 mib, 3 * mib + 1}) {
          if (const int code = ping_pong(t, size)) return code;
          if (const int code = ring_shift(t, size)) return code;
        }
        if (const int code = all_pairs(t, 65537)) return code;
        if (const int code = fifo(t)) return code;
        if (const int code = windows(t)) return code;
        if (const int code = cross_memory_at_every_distance(t)) return code;
        for (int i = 0; i < 200; ++i) t.barrier().wait();
        return 0;
      });
    }
  }

  TEST_CASE("barrier notes: after a barrier every rank reads every rank's note of its parity") {
    // 1 to 8 processes: up to 7 the notes ride in the barrier's cache line, alternating by
    // parity, so a rank a call ahead leaves the other parity's notes alone; at 8 there are
    // none (notes_barriers() false, the mismatch check reads the window slots instead).
    for (const int ranks : {1, 2, 3, 4, 8}) {
      CAPTURE(ranks);
      test::expect_ranks_succeed(ranks, [](const shm_job& job) {
        shm_transport t(job);
        if (t.notes_barriers() != (job.size <= 7)) return 1;
        if (!t.notes_barriers()) return 0;
        const auto note = [](int rank, unsigned call) { return 1000u * call + 7u * rank + 1u; };
        for (unsigned call = 1; call <= 300; ++call) {
          t.note_next_barrier(note(job.rank, call), call % 2);
          t.barrier().wait();
          for (int q = 0; q < job.size; ++q) {
            if (t.barrier_note(q, call % 2) != note(q, call)) return 2;
            // the other parity holds the call before (or nothing before the first)
            if (call > 1 && t.barrier_note(q, (call + 1) % 2) != note(q, call - 1)) return 3;
          }
          t.barrier().wait();  // no note: the notes read above stay
          if (t.barrier_note(job.size - 1, call % 2) != note(job.size - 1, call)) return 4;
        }
        return 0;
      });
    }
  }

  TEST_CASE("256 MiB messages: ping-pong on 2 ranks, ring shift on 3") {
    for (int ranks : {2, 3}) {
      CAPTURE(ranks);
      test::expect_ranks_succeed(ranks, [ranks](const shm_job& job) {
        shm_transport t(job);
        return ranks == 2 ? ping_pong(t, 256 * mib) : ring_shift(t, 256 * mib + 1);
      });
    }
  }

  TEST_CASE("a size mismatch is a mismatch_error on the receiver and fails the peer") {
    const auto result = squall::launch(
        2,
        [](const shm_job& job) {
          shm_transport t(job, squall::options{.deadline = std::chrono::seconds(5)});
          std::vector<std::byte> buf(16);
          if (t.rank() == 0) {
            t.send(1, buffer_view<const std::byte>(buf).subview(0, 8)).wait();
            try {
              t.barrier().wait();
            } catch (const squall::peer_failure& e) {
              return e.peer() == 1 ? 0 : 21;
            }
            return 22;
          }
          try {
            t.recv(0, buf).wait();
          } catch (const squall::mismatch_error& e) {
            const std::string what = e.what();
            return what.find("16 bytes") != std::string::npos && e.peer() == 0 ? 0 : 23;
          }
          return 24;
        },
        {.kill_on_failure = false});
    INFO(test::statuses(result));
    CHECK(result.ok());
  }

  TEST_CASE("bad peers and jobs are invalid arguments") {
    test::expect_ranks_succeed(2, [](const shm_job& job) {
      shm_transport t(job);
      std::vector<std::byte> buf(4);
      try {
        (void)t.send(2, buffer_view<const std::byte>(buf));
        return 31;
      } catch (const squall::invalid_argument&) {
      }
      try {
        (void)t.recv(-1, buf);
        return 32;
      } catch (const squall::invalid_argument&) {
      }
      t.barrier().wait();
      return 0;
    });
    CHECK_THROWS_AS(shm_job({"bad/name", 0, 2}).validate(), squall::invalid_argument);
    CHECK_THROWS_AS(shm_job({"ok", 2, 2}).validate(), squall::invalid_argument);
    CHECK_THROWS_AS(shm_transport(shm_job{"cfg", 0, 1}, {}, squall::shm_config{.slot_bytes = 100}),
                    squall::invalid_argument);
  }
}

TEST_SUITE("shm_env") {
  TEST_CASE("the job comes from squall's, Open MPI's, MPICH's or torchrun's variables") {
    for (const char* v :
         {"SQUALL_JOB", "SQUALL_RANK", "SQUALL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
          "OMPI_COMM_WORLD_LOCAL_SIZE", "OMPI_MCA_ess_base_jobid", "PMIX_NAMESPACE",
          "MPI_LOCALRANKID", "MPI_LOCALNRANKS", "TORCHELASTIC_RUN_ID", "LOCAL_RANK",
          "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"}) {
      unsetenv(v);
    }
    CHECK_THROWS_WITH_AS(shm_job::from_environment(), doctest::Contains("SQUALL_WORLD_SIZE"),
                         squall::invalid_argument);
    // torchrun's: named by the run id and the rendezvous address, which key it too
    setenv("TORCHELASTIC_RUN_ID", "run/7", 1);
    setenv("LOCAL_RANK", "1", 1);
    setenv("LOCAL_WORLD_SIZE", "2", 1);
    setenv("MASTER_ADDR", "127.0.0.1", 1);
    setenv("MASTER_PORT", "29500", 1);
    auto job = shm_job::from_environment();
    CHECK(job.name.rfind("torch-run_7-", 0) == 0);
    CHECK(job.rank == 1);
    CHECK(job.size == 2);
    const std::uint64_t torch_key = job.key;
    setenv("MASTER_PORT", "29501", 1);
    CHECK(shm_job::from_environment().key != torch_key);
    CHECK(shm_job::from_environment().name != job.name);
    for (const char* v : {"TORCHELASTIC_RUN_ID", "LOCAL_RANK", "LOCAL_WORLD_SIZE"}) unsetenv(v);
    setenv("OMPI_COMM_WORLD_LOCAL_RANK", "1", 1);
    setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "3", 1);
    setenv("OMPI_MCA_ess_base_jobid", "4242", 1);
    job = shm_job::from_environment();
    CHECK(job.name == "ompi-4242");
    CHECK(job.rank == 1);
    CHECK(job.size == 3);
    unsetenv("OMPI_COMM_WORLD_LOCAL_RANK");
    setenv("MPI_LOCALRANKID", "0", 1);
    setenv("MPI_LOCALNRANKS", "2", 1);
    job = shm_job::from_environment();
    CHECK(job.name.rfind("hydra-", 0) == 0);
    CHECK(job.size == 2);
    setenv("SQUALL_JOB", "mine", 1);
    setenv("SQUALL_RANK", "2", 1);
    setenv("SQUALL_WORLD_SIZE", "4", 1);
    job = shm_job::from_environment();
    CHECK(job.name == "mine");
    CHECK(job.rank == 2);
    CHECK(job.size == 4);
    setenv("SQUALL_RANK", "4", 1);
    CHECK_THROWS_AS(shm_job::from_environment(), squall::invalid_argument);
    setenv("SQUALL_RANK", "x", 1);
    CHECK_THROWS_AS(shm_job::from_environment(), squall::invalid_argument);
    for (const char* v :
         {"SQUALL_JOB", "SQUALL_RANK", "SQUALL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE",
          "OMPI_MCA_ess_base_jobid", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"}) {
      unsetenv(v);
    }
  }

  TEST_CASE("launch reports the failing rank and ends the others") {
    const auto start = std::chrono::steady_clock::now();
    const auto result = squall::launch(3, [](const shm_job& job) {
      if (job.rank == 1) return 7;
      std::this_thread::sleep_for(std::chrono::seconds(20));
      return 0;
    });
    CHECK(result.failed_rank == 1);
    CHECK(result.exit_code() == 7);
    CHECK(result.status[0] == 128 + SIGTERM);
    CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(5));
    const auto thrown = squall::launch(2, [](const shm_job& job) {
      if (job.rank == 0) throw std::runtime_error("boom");
    });
    CHECK(thrown.failed_rank == 0);
    CHECK(thrown.exit_code() == 1);
  }

  TEST_CASE("ranks ended right after their fork die of the SIGTERM, not of the SIGKILL after it") {
    // Rank 0 fails at once, often before the later ranks have run a single instruction of
    // their own: the launcher's SIGTERM must still end them (it once reached the handler they
    // inherited from the launcher, which only records it, and they lived on until SIGKILL).
    for (int trial = 0; trial < 20; ++trial) {
      CAPTURE(trial);
      const auto result = squall::launch(4, [](const shm_job& job) {
        if (job.rank == 0) return 7;
        std::this_thread::sleep_for(std::chrono::seconds(20));
        return 0;
      });
      REQUIRE(result.failed_rank == 0);
      for (std::size_t r = 1; r < 4; ++r) REQUIRE(result.status[r] == 128 + SIGTERM);
    }
  }
}

TEST_SUITE("shm_large") {
  TEST_CASE("one message of 2^31 + 11 bytes between two processes") {
    test::expect_ranks_succeed(2, [](const shm_job& job) {
      shm_transport t(job);
      const std::size_t size = (std::size_t{1} << 31) + 11;
      std::vector<std::byte> buf(size);
      // Sampled pattern: every 4 KiB page and the last bytes, past the 2^31 boundary.
      const auto mark = [&](std::size_t i) { return test::pattern(0, 1, size, i); };
      if (t.rank() == 0) {
        for (std::size_t i = 0; i < size; i += 4093) buf[i] = mark(i);
        for (std::size_t i = size - 64; i < size; ++i) buf[i] = mark(i);
        t.send(1, buffer_view<const std::byte>(buf)).wait();
        return 0;
      }
      t.recv(0, buf).wait();
      for (std::size_t i = 0; i < size; i += 4093) {
        if (buf[i] != mark(i)) return 91;
      }
      for (std::size_t i = size - 64; i < size; ++i) {
        if (buf[i] != mark(i)) return 92;
      }
      return 0;
    });
  }
}
