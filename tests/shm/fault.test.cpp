// SPDX-License-Identifier: Apache-2.0
// Faults of real processes on shm_transport: a rank killed mid-transfer, a rank that never
// arrives, a stopped rank, a stale segment from a killed job, a name held by a live job, a
// rank killed between two allreduces of a communicator, a planted segment of another uid or
// with an open mode, peers that keep copying into a rank's memory as it fails, counts that
// differ with the mismatch check off. Nothing may hang, and nothing of this user's may stay in
// /dev/shm.

#include <squall/algorithm/communicator.hpp>
#include <squall/compress/quantize.hpp>
#include <squall/topology/direct.hpp>
#include <squall/topology/ring.hpp>
#include <squall/transport/launch.hpp>
#include <squall/transport/shm.hpp>

#include <doctest/doctest.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fcntl.h>
#include <signal.h>
#include <string>
#include <thread>
#include <unistd.h>
#include <vector>

#include "../support/shm_ranks.hpp"

using squall::buffer_view;
using squall::shm_job;
using squall::shm_transport;
namespace test = squall::test;
using namespace std::chrono_literals;

namespace {

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

/// Rank 0 sends rank 1 a message of 1000 bytes, rank 1 checks it: 0, or 71 if it differs.
int one_message(shm_transport& t, int rank) {
  std::vector<std::byte> buf(1000);
  if (rank == 0) {
    const auto out = test::make_message(0, 1, buf.size());
    t.send(1, buffer_view<const std::byte>(out)).wait();
    return 0;
  }
  t.recv(0, buf).wait();
  return test::is_message(buf, 0, 1) ? 0 : 71;
}

}  // namespace

TEST_SUITE("shm_fault") {
  TEST_CASE("a rank killed mid-transfer: every survivor gets peer_failure naming it") {
    // Both protocols: through slots (the sender dies with part of the message in the ring),
    // and single copy (it dies after publishing where its data is, before the receiver reads).
    for (const std::size_t single_copy_bytes : {std::size_t{0}, std::size_t{64} << 10}) {
      for (int ranks : {2, 3, 4}) {
        CAPTURE(ranks);
        CAPTURE(single_copy_bytes);
        const std::string job = squall::detail::unique_job_name();
        const auto result = squall::launch(
            ranks,
            [single_copy_bytes](const shm_job& me) {
              shm_transport t(me, squall::options{.deadline = 60s},
                              squall::shm_config{.single_copy_bytes = single_copy_bytes});
              const std::size_t size = std::size_t{64} << 20;
              std::vector<std::byte> buf(size);
              t.barrier().wait();
              if (me.rank == 1) {  // start a large send, move part of it, then die
                auto s = t.send(0, buffer_view<const std::byte>(buf));
                for (int i = 0; i < 50; ++i) (void)s.test();
                raise(SIGKILL);
              }
              if (me.rank == 0) std::this_thread::sleep_for(100ms);
              const auto start = std::chrono::steady_clock::now();
              try {
                if (me.rank == 0) {
                  t.recv(1, buf).wait();
                } else {
                  t.barrier().wait();  // bystanders: wait on everybody, rank 1 included
                }
              } catch (const squall::peer_failure& e) {
                const double waited = seconds_since(start);
                std::fprintf(stderr, "rank %d: peer_failure after %.3f s: %s\n", me.rank, waited,
                             e.what());
                if (e.peer() != 1) return 41;
                if (waited > 2.0) return 42;
                // A failed transport stays failed.
                try {
                  t.barrier().wait();
                } catch (const squall::peer_failure&) {
                  return 0;
                }
                return 43;
              }
              return 44;
            },
            {.job = job, .kill_on_failure = false});
        INFO(test::statuses(result));
        CHECK(result.status[1] == 128 + SIGKILL);
        for (int r = 0; r < ranks; ++r) {
          if (r != 1) CHECK(result.status[static_cast<std::size_t>(r)] == 0);
        }
        CHECK_FALSE(test::segment_left(job));
      }
    }
  }

  TEST_CASE("a rank that never arrives: timeout_error naming it, no segment left") {
    const std::string job = squall::detail::unique_job_name();
    const auto result = squall::launch(
        3,
        [](const shm_job& me) {
          if (me.rank == 2) return 0;  // never joins
          const auto start = std::chrono::steady_clock::now();
          try {
            shm_transport t(me, squall::options{.deadline = 500ms});
          } catch (const squall::timeout_error& e) {
            const std::string what = e.what();
            if (me.rank == 0 && what.find("rank(s) 2 did not attach") == std::string::npos)
              return 51;
            const double waited = seconds_since(start);
            return waited >= 0.45 && waited < 3.0 ? 0 : 52;
          }
          return 53;
        },
        {.job = job, .kill_on_failure = false});
    INFO(test::statuses(result));
    CHECK(result.ok());
    CHECK_FALSE(test::segment_left(job));
  }

  TEST_CASE("a stopped rank: timeout_error at the deadline, and the peer learns of it") {
    const std::string job = squall::detail::unique_job_name();
    const auto result =
        squall::launch(2,
                       [](const shm_job& me) {
                         shm_transport t(me, squall::options{.deadline = 1s});
                         if (me.rank == 1) {
                           const pid_t pid = getpid();
                           std::memcpy(t.local_view().data(), &pid, sizeof(pid));
                           t.barrier().wait();
                           raise(SIGSTOP);
                           return 0;
                         }
                         t.barrier().wait();
                         pid_t stopped = 0;
                         std::memcpy(&stopped, t.peer_view(1).data(), sizeof(stopped));
                         std::vector<std::byte> buf(100);
                         const auto start = std::chrono::steady_clock::now();
                         int code = 61;
                         try {
                           t.recv(1, buf).wait();
                         } catch (const squall::timeout_error& e) {
                           const double waited = seconds_since(start);
                           const std::string what = e.what();
                           code = waited >= 0.95 && waited < 3.0 &&
                                          what.find("recv (rank 0, peer 1)") != std::string::npos
                                      ? 0
                                      : 62;
                         }
                         if (code == 0) {  // failed stays failed: the next call throws at once
                           try {
                             (void)t.send(1, buffer_view<const std::byte>(buf));
                             code = 63;
                           } catch (const squall::peer_failure&) {
                           }
                         }
                         kill(stopped, SIGKILL);
                         return code;
                       },
                       {.job = job, .kill_on_failure = false});
    INFO(test::statuses(result));
    CHECK(result.status[0] == 0);
    CHECK(result.status[1] == 128 + SIGKILL);
    CHECK_FALSE(test::segment_left(job));
  }

  TEST_CASE("a stale segment from a killed job is recognised and replaced") {
    const std::string job = squall::detail::unique_job_name();
    // Rank 0 of a 2-rank job creates the segment, then is killed before rank 1 arrives; with
    // no reaper (what a reaper killed along with it, or an older squall, would leave).
    const auto crashed = squall::launch(1, [&](const shm_job&) {
      std::thread killer([] {
        std::this_thread::sleep_for(300ms);
        raise(SIGKILL);
      });
      shm_transport t(shm_job{job, 0, 2}, squall::options{.deadline = 30s},
                      squall::shm_config{.reaper = false});
      killer.join();
    });
    CHECK(crashed.status[0] == 128 + SIGKILL);
    REQUIRE(test::segment_left(job));
    test::expect_ranks_succeed(2,
                               [](const shm_job& me) {
                                 shm_transport t(me, squall::options{.deadline = 10s});
                                 return one_message(t, me.rank);
                               },
                               {.job = job});
    CHECK_FALSE(test::segment_left(job));
  }

  TEST_CASE("a planted segment of another uid, or one open to others, is refused at once") {
    if (geteuid() != 0) {
      MESSAGE("skipped: planting a file of another uid needs root");
      return;
    }
    const std::string job = squall::detail::unique_job_name();
    const std::string name = squall::detail::shm::segment_name(job);
    struct remove_at_end {
      std::string name;
      ~remove_at_end() { shm_unlink(name.c_str()); }
    } cleanup{name};
    // planted by another user (uid 65534, nobody), writable by everyone, no squall header
    const int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    REQUIRE(fd >= 0);
    REQUIRE(ftruncate(fd, 1 << 16) == 0);
    REQUIRE(fchmod(fd, 0666) == 0);
    REQUIRE(fchown(fd, 65534, 65534) == 0);
    close(fd);
    const auto refused = [&](int rank) {
      std::string what = "(nothing thrown)";
      const auto start = std::chrono::steady_clock::now();
      try {
        shm_transport t(shm_job{job, rank, 2}, squall::options{.deadline = 30s});
      } catch (const squall::error& e) {
        what = e.what();
      }
      CHECK(seconds_since(start) < 5.0);  // at once, not at the 30 s deadline
      return what;
    };
    for (int rank : {0, 1}) {  // rank 0 would replace it, rank 1 would attach to it
      CAPTURE(rank);
      const std::string what = refused(rank);
      CHECK(what.find("belongs to uid 65534") != std::string::npos);
      CHECK(what.find("SQUALL_JOB") != std::string::npos);
    }
    CHECK(test::segment_left(job));  // not this user's to remove
    // this user's own file, but open to group and others: an attaching rank refuses it
    const int own = shm_open(name.c_str(), O_RDWR, 0);
    REQUIRE(own >= 0);
    REQUIRE(fchown(own, geteuid(), getegid()) == 0);
    close(own);
    const std::string what = refused(1);
    CHECK(what.find("has mode 0666") != std::string::npos);
  }

  TEST_CASE("a peer that exits after its last send is not a failure for the others") {
    // Rank 3 sends its last message to rank 0 and exits at once; ranks 0-2 go on passing
    // messages among themselves for 600 ms, sleeping between them, so that their waits check
    // the peers' liveness many times. Only a rank whose pending work needs rank 3 may fail.
    test::expect_ranks_succeed(4, [](const shm_job& me) {
      shm_transport t(me, squall::options{.deadline = 30s});
      std::vector<std::byte> buf(4096);
      if (me.rank == 3) {
        const auto out = test::make_message(3, 0, buf.size());
        t.send(0, buffer_view<const std::byte>(out)).wait();
        return 0;  // exits: its part is done
      }
      if (me.rank == 0) {
        t.recv(3, buf).wait();
        if (!test::is_message(buf, 3, 0)) return 71;
      }
      const int next = (me.rank + 1) % 3;
      const int prev = (me.rank + 2) % 3;
      for (int round = 0; round < 4; ++round) {  // 4 x 150 ms
        const auto out = test::make_message(me.rank, next, buf.size());
        auto r = t.recv(prev, buf);
        std::this_thread::sleep_for(me.rank == 0 ? 150ms : 0ms);  // the others wait on rank 0
        t.send(next, buffer_view<const std::byte>(out)).wait();
        r.wait();
        if (!test::is_message(buf, prev, me.rank)) return 72;
      }
      return 0;
    });
  }

  TEST_CASE("two jobs of one name never merge: the job key refuses the stranger at once") {
    const std::string job = squall::detail::unique_job_name();
    const auto result = squall::launch(
        3,
        [&](const shm_job& me) {
          if (me.rank == 2) {  // "rank 1" of another job with the same name
            const auto start = std::chrono::steady_clock::now();
            try {
              shm_transport t(shm_job{job, 1, 2, me.key + 1}, squall::options{.deadline = 20s});
            } catch (const squall::mismatch_error& e) {
              const std::string what = e.what();
              if (seconds_since(start) > 5.0) return 83;
              return what.find("another job of the same name") != std::string::npos ? 0 : 81;
            }
            return 82;
          }
          // ranks 0 and 1 of the real job; rank 1 comes after the stranger has tried
          if (me.rank == 1) std::this_thread::sleep_for(1s);
          shm_transport t(shm_job{job, me.rank, 2, me.key}, squall::options{.deadline = 20s});
          return one_message(t, me.rank);
        },
        {.job = job});
    INFO(test::statuses(result));
    CHECK(result.ok());
    CHECK_FALSE(test::segment_left(job));
  }

  TEST_CASE("a rank that fails before every rank attached leaves no segment behind") {
    const std::string job = squall::detail::unique_job_name();
    const auto result = squall::launch(
        2,
        [&](const shm_job& me) {
          if (me.rank == 1) {  // fails before it ever attaches, once rank 0 made the segment
            std::this_thread::sleep_for(500ms);
            return 5;
          }
          shm_transport t(me, squall::options{.deadline = 30s});  // ended by the launcher
          return 0;
        },
        {.job = job, .grace = std::chrono::milliseconds(200)});
    INFO(test::statuses(result));
    CHECK(result.failed_rank == 1);
    CHECK(result.status[0] == 128 + SIGTERM);
    CHECK_FALSE(test::segment_left(job));
  }

  TEST_CASE("no launcher: the reaper removes the segment of a rank 0 killed during start-up") {
    // What mpiexec does when a rank fails during start-up: every rank is killed, none of them
    // can unlink. Here rank 0 of a 3-rank job runs in a plain forked process (no squall
    // launcher to clean up), makes the segment, and is killed before the others arrive; its
    // whole process group too, as a launcher's group kill would.
    const std::string job = squall::detail::unique_job_name();
    const pid_t rank0 = fork();
    REQUIRE(rank0 >= 0);
    if (rank0 == 0) {
      setpgid(0, 0);
      try {
        shm_transport t(shm_job{job, 0, 3, 42}, squall::options{.deadline = 30s});
      } catch (...) {  // NOLINT(bugprone-empty-catch): killed long before
      }
      std::_Exit(3);
    }
    // the segment's memory is reserved (its size set) after the reaper has started
    const std::string path = "/dev/shm" + squall::detail::shm::segment_name(job);
    const auto reserved = [&] {
      struct stat info {};
      return stat(path.c_str(), &info) == 0 && info.st_size > 0;
    };
    const auto start = std::chrono::steady_clock::now();
    while (!reserved() && seconds_since(start) < 10.0) std::this_thread::sleep_for(5ms);
    REQUIRE(reserved());
    const auto killed = std::chrono::steady_clock::now();
    kill(-rank0, SIGKILL);
    int status = 0;
    waitpid(rank0, &status, 0);
    CHECK(WIFSIGNALED(status));
    while (test::segment_left(job) && seconds_since(killed) < 5.0) std::this_thread::sleep_for(5ms);
    const double took = seconds_since(killed);
    MESSAGE("segment removed " << took << " s after rank 0 was killed");
    CHECK_FALSE(test::segment_left(job));
    CHECK(took < 1.0);
  }

  TEST_CASE("segment size: automatic slots keep it linear in P; one too large is refused") {
    CHECK(squall::automatic_slots(2) == 32);
    CHECK(squall::automatic_slots(8) == 32);
    CHECK(squall::automatic_slots(16) == 16);
    CHECK(squall::automatic_slots(64) == 4);
    CHECK(squall::automatic_slots(1000) == 4);
    // P = 64, 64 KiB slots: the channels take 64^2 x 4 x 64 KiB = 1 GiB (32 slots: 8 GiB)
    const squall::detail::shm::geometry g{64, std::size_t{64} << 10, squall::automatic_slots(64),
                                          0};
    CHECK(g.total_bytes() < (std::size_t{1} << 30) + (std::size_t{1} << 20));
    // a segment above what /dev/shm has free: refused at once, naming the sizes
    const std::string job = squall::detail::unique_job_name();
    std::string what = "(nothing thrown)";
    try {
      shm_transport t(shm_job{job, 0, 1}, squall::options{.deadline = 10s},
                      squall::shm_config{.window_bytes = std::size_t{1} << 50});
    } catch (const squall::invalid_argument& e) {
      what = e.what();
    }
    CHECK(what.find("a job of 1 ranks needs a segment of") != std::string::npos);
    CHECK(what.find("/dev/shm has") != std::string::npos);
    CHECK_FALSE(test::segment_left(job));
  }

  TEST_CASE("an error on one rank inside a collective reaches the others at once, with its cause") {
    for (const int ranks : {2, 3}) {
      CAPTURE(ranks);
      const auto result = squall::launch(
          ranks,
          [](const shm_job& me) {
            using comm_type =
                squall::communicator<shm_transport, squall::ring_topology, squall::int8_compressor>;
            comm_type comm(shm_transport(me, squall::options{.deadline = 30s}));
            // rank 1 passes a state of the wrong count: an error of its own, before any message
            auto state = comm.make_state<float>(me.rank == 1 ? 5 : 4);
            std::vector<float> data(4, 1.0f);
            const auto start = std::chrono::steady_clock::now();
            try {
              comm.allreduce(squall::host_view<float>(data), state);
            } catch (const squall::peer_failure& e) {
              const std::string what = e.what();
              std::printf("rank %d: %.3f s: %s\n", me.rank, seconds_since(start), e.what());
              if (me.rank == 1) return 91;
              if (seconds_since(start) > 5.0) return 92;  // at once, not at the 30 s deadline
              return what.find("rank 1 failed and left") != std::string::npos &&
                             what.find("compression state of 5 elements") != std::string::npos
                         ? 0
                         : 93;
            } catch (const squall::invalid_argument&) {
              return me.rank == 1 ? 0 : 94;
            }
            return 95;
          },
          {.kill_on_failure = false});
      INFO(test::statuses(result));
      CHECK(result.ok());
    }
  }

  TEST_CASE("a name held by a live job is a clear error, never a silent join") {
    const std::string job = squall::detail::unique_job_name();
    const auto result = squall::launch(
        2,
        [&](const shm_job& me) {
          if (me.rank == 0) {  // holds the name: rank 0 of a job whose rank 1 comes late
            try {
              shm_transport t(shm_job{job, 0, 2}, squall::options{.deadline = 3s});
            } catch (const squall::timeout_error&) {
              return 0;
            }
            return 81;
          }
          std::this_thread::sleep_for(500ms);
          try {  // another "rank 0" of the same name
            shm_transport t(shm_job{job, 0, 2}, squall::options{.deadline = 1s});
          } catch (const squall::error& e) {
            const std::string what = e.what();
            return what.find("in use by a live job") != std::string::npos ? 0 : 82;
          }
          return 83;
        },
        {.job = squall::detail::unique_job_name(), .kill_on_failure = false});
    INFO(test::statuses(result));
    CHECK(result.ok());
    CHECK_FALSE(test::segment_left(job));
  }
  TEST_CASE("fault: a rank killed between allreduces of 64 Mi floats, ring and direct") {
    // Rank 2 of 3 dies after the first allreduce; the survivors are in the second (the mismatch
    // check, then the schedule or the windows' barriers) and must get peer_failure
    // naming rank 2 within a few seconds (liveness is checked every 100 ms), never hang until
    // the deadline, and the communicator stays failed.
    const auto run = [](auto topology) {
      using Topology = decltype(topology);
      CAPTURE(Topology::name);
      const std::string job = squall::detail::unique_job_name();
      const auto result = squall::launch(
          3,
          [](const shm_job& me) {
            squall::communicator<shm_transport, Topology> comm(
                shm_transport(me, squall::options{.deadline = 20s}));
            const std::size_t count = std::size_t{64} << 20;
            std::vector<float> data(count);
            for (std::size_t i = 0; i < count; ++i) {
              data[i] = static_cast<float>(
                  static_cast<int>((i + static_cast<std::size_t>(me.rank)) % 5) - 2);
            }
            comm.allreduce(squall::host_view<float>(data));
            for (std::size_t i = 0; i < count; i += 4099) {  // the first call is whole
              float want = 0;
              for (int q = 0; q < 3; ++q) {
                want +=
                    static_cast<float>(static_cast<int>((i + static_cast<std::size_t>(q)) % 5) - 2);
              }
              if (data[i] != want) return 45;
            }
            if (me.rank == 2) raise(SIGKILL);
            const auto start = std::chrono::steady_clock::now();
            try {
              for (int call = 0; call < 100; ++call) comm.allreduce(squall::host_view<float>(data));
            } catch (const squall::peer_failure& e) {
              const double waited = seconds_since(start);
              std::fprintf(stderr, "rank %d (%s): peer_failure after %.3f s: %s\n", me.rank,
                           std::string(Topology::name).c_str(), waited, e.what());
              if (e.peer() != 2) return 41;
              if (waited > 5.0) return 42;
              const auto again = std::chrono::steady_clock::now();
              try {  // a failed communicator stays failed, and says so at once
                comm.allreduce(squall::host_view<float>(data));
                return 43;
              } catch (const squall::peer_failure&) {
              }
              return seconds_since(again) < 1.0 ? 0 : 47;
            } catch (const squall::error& e) {
              std::fprintf(stderr, "rank %d (%s): after %.3f s: %s\n", me.rank,
                           std::string(Topology::name).c_str(), seconds_since(start), e.what());
              return 44;
            }
            return 46;  // 100 allreduces without rank 2
          },
          {.job = job, .kill_on_failure = false});
      INFO(test::statuses(result));
      CHECK(result.status[2] == 128 + SIGKILL);
      CHECK(result.status[0] == 0);
      CHECK(result.status[1] == 0);
      CHECK_FALSE(test::segment_left(job));
    };
    run(squall::ring_topology{});
    run(squall::direct_topology{});
  }

  TEST_CASE("no use after failure: once a rank has failed, no peer reads or writes its memory") {
    // Rank 0 exposes a buffer; the peers write into it and read it, piece after piece, as fast
    // as they can. Rank 0 then fails (abandon), marks the buffer at once and checks 300 ms
    // later that nothing changed it; the peers must stop with peer_failure naming rank 0 (and
    // never a "Bad address" from reading memory rank 0 gave back).
    for (const int ranks : {2, 3, 4}) {
      CAPTURE(ranks);
      const std::string job = squall::detail::unique_job_name();
      const auto result = squall::launch(
          ranks,
          [](const shm_job& me) {
            shm_transport t(me, squall::options{.deadline = 30s});
            if (!t.can_access_peers()) return 0;  // no cross-memory attach here: nothing to test
            constexpr std::size_t bytes = std::size_t{16} << 20;
            constexpr std::size_t piece = std::size_t{256} << 10;
            if (me.rank == 0) {
              void* mapped =
                  mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
              if (mapped == MAP_FAILED) return 61;
              auto* buffer = static_cast<std::byte*>(mapped);
              const auto address = reinterpret_cast<std::uint64_t>(buffer);
              for (int q = 1; q < me.size; ++q) {
                t.send(q, buffer_view<const std::byte>(reinterpret_cast<const std::byte*>(&address),
                                                       sizeof address))
                    .wait();
              }
              std::this_thread::sleep_for(200ms);  // the peers are copying
              t.abandon("rank 0 gives up on purpose");
              std::memset(buffer, 0x11, bytes);
              std::this_thread::sleep_for(300ms);
              for (std::size_t i = 0; i < bytes; ++i) {
                if (buffer[i] != std::byte{0x11}) return 62;
              }
              munmap(mapped, bytes);
              return 0;
            }
            std::uint64_t address = 0;
            t.recv(0,
                   buffer_view<std::byte>(reinterpret_cast<std::byte*>(&address), sizeof address))
                .wait();
            std::vector<std::byte> mine(piece, static_cast<std::byte>(0x40 + me.rank));
            std::vector<std::byte> theirs(piece);
            try {
              for (std::size_t at = 0;; at = (at + piece) % bytes) {
                t.write_peer(0, address + at, buffer_view<const std::byte>(mine));
                t.read_peer(0, address + at, buffer_view<std::byte>(theirs));
              }
            } catch (const squall::peer_failure& e) {
              const std::string what = e.what();
              std::printf("rank %d: %s\n", me.rank, e.what());
              return e.peer() == 0 && what.find("on purpose") != std::string::npos ? 0 : 63;
            } catch (const squall::error& e) {
              std::printf("rank %d: not a peer_failure: %s\n", me.rank, e.what());
              return 64;
            }
          },
          {.job = job, .kill_on_failure = false});
      INFO(test::statuses(result));
      CHECK(result.ok());
      CHECK_FALSE(test::segment_left(job));
    }
  }

  TEST_CASE("no use after failure: a peer stopped mid-copy is ended, or stops at its next copy") {
    // Rank 1 writes 16 MiB pieces into rank 0's buffer; rank 0 stops it (SIGSTOP, most likely
    // inside a copy, so it stops with its touching flag up), fails, marks its buffer, lets
    // rank 1 continue (SIGCONT) and checks 300 ms later that the mark is intact: either rank 0
    // killed the stopped copier, or the copier found rank 0 closed at its next copy.
    int killed = 0;
    for (int trial = 0; trial < 3; ++trial) {
      const auto result = squall::launch(
          2,
          [](const shm_job& me) {
            shm_transport t(me, squall::options{.deadline = 30s});
            if (!t.can_access_peers()) return 0;
            constexpr std::size_t bytes = std::size_t{64} << 20;
            constexpr std::size_t piece = std::size_t{16} << 20;
            if (me.rank == 0) {
              std::vector<std::byte> buffer(bytes);
              const auto address = reinterpret_cast<std::uint64_t>(buffer.data());
              pid_t copier = 0;
              t.send(1, buffer_view<const std::byte>(reinterpret_cast<const std::byte*>(&address),
                                                     sizeof address))
                  .wait();
              t.recv(1,
                     buffer_view<std::byte>(reinterpret_cast<std::byte*>(&copier), sizeof copier))
                  .wait();
              std::this_thread::sleep_for(100ms);
              kill(copier, SIGSTOP);
              std::this_thread::sleep_for(20ms);
              const auto start = std::chrono::steady_clock::now();
              t.abandon("rank 0 gives up while rank 1 is stopped");
              const double took = seconds_since(start);
              std::fill(buffer.begin(), buffer.end(), std::byte{0x11});
              kill(copier, SIGCONT);
              std::this_thread::sleep_for(300ms);
              std::printf("rank 0: abandon took %.3f s\n", took);
              return std::all_of(buffer.begin(), buffer.end(),
                                 [](std::byte b) { return b == std::byte{0x11}; })
                         ? 0
                         : 65;
            }
            std::uint64_t address = 0;
            t.recv(0,
                   buffer_view<std::byte>(reinterpret_cast<std::byte*>(&address), sizeof address))
                .wait();
            const pid_t mine = getpid();
            t.send(0, buffer_view<const std::byte>(reinterpret_cast<const std::byte*>(&mine),
                                                   sizeof mine))
                .wait();
            std::vector<std::byte> data(piece, std::byte{0x42});
            try {
              for (std::size_t at = 0;; at = (at + piece) % bytes) {
                t.write_peer(0, address + at, buffer_view<const std::byte>(data));
              }
            } catch (const squall::peer_failure&) {
              return 0;
            }
          },
          {.kill_on_failure = false});
      INFO(test::statuses(result));
      CHECK(result.status[0] == 0);
      CHECK((result.status[1] == 0 || result.status[1] == 128 + SIGKILL));
      if (result.status[1] == 128 + SIGKILL) ++killed;
    }
    MESSAGE("the stopped copier was killed in " << killed << " of 3 trials");
  }

  TEST_CASE(
      "mismatch check off: counts that differ on the peer-memory paths never go out of bounds") {
    // Rank 1 passes more elements than the others; each rank's buffer is followed by a guard.
    // With the communicator's check off, the peer-memory collectives still compare the kind
    // and size of every rank's buffers before touching any: every rank throws mismatch_error,
    // no guard changes, and the communicator stays usable (a matching call then succeeds).
    for (const int ranks : {2, 3}) {
      CAPTURE(ranks);
      test::expect_ranks_succeed(ranks, [](const shm_job& me) {
        squall::communicator<shm_transport, squall::direct_topology> comm(
            shm_transport(me, squall::options{.deadline = 30s}), {},
            squall::options{.deadline = 30s, .check_mismatch = false});
        if (!comm.transport().can_access_peers()) return 0;
        const std::size_t count = std::size_t{1} << 20;  // 4 MiB of floats: peer memory
        const std::size_t mine = me.rank == 1 ? count + 4096 : count;
        const std::size_t guard = 8192;
        std::vector<float> data(mine * static_cast<std::size_t>(me.size) + guard, 1.0f);
        const auto guard_intact = [&](std::size_t used) {
          return std::all_of(data.begin() + static_cast<std::ptrdiff_t>(used), data.end(),
                             [](float x) { return x == 1.0f; });
        };
        int caught = 0;
        try {
          comm.allreduce(squall::host_view<float>(data.data(), mine));
        } catch (const squall::mismatch_error&) {
          ++caught;
        }
        if (!guard_intact(mine)) return 71;
        try {
          comm.allgather(
              squall::host_view<const float>(data.data(), mine),
              squall::host_view<float>(data.data(), mine * static_cast<std::size_t>(me.size)));
        } catch (const squall::mismatch_error&) {
          ++caught;
        }
        if (!guard_intact(mine * static_cast<std::size_t>(me.size))) return 72;
        try {
          comm.broadcast(squall::host_view<float>(data.data(), mine), me.rank == 1 ? 1 : 0);
        } catch (const squall::mismatch_error&) {
          ++caught;
        }
        if (!guard_intact(mine)) return 73;
        if (caught != 3) return 74;
        std::vector<float> again(count, static_cast<float>(me.rank));
        comm.allreduce(squall::host_view<float>(again));
        const float want = static_cast<float>(me.size * (me.size - 1) / 2);
        return std::all_of(again.begin(), again.end(), [&](float x) { return x == want; }) ? 0 : 75;
      });
    }
  }
}
