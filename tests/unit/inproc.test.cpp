// SPDX-License-Identifier: Apache-2.0
// inproc_transport: ranks as threads. Every received byte is checked against a pattern computed
// from (source, destination, size, sequence number, index), never against the sender's buffer.

#include <squall/concepts.hpp>
#include <squall/core/error.hpp>
#include <squall/core/options.hpp>
#include <squall/transport/inproc.hpp>

#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <thread>   // this_thread::sleep_for, yield
#include <utility>  // move
#include <vector>

#include "../support/thread_ranks.hpp"

using namespace std::chrono_literals;
using squall::inproc_completion;
using squall::inproc_transport;
using squall::inproc_world;
using squall::test::run_ranks;

namespace {

constexpr int world_sizes[] = {1, 2, 3, 4, 5, 8};

/// Byte `index` of message number `seq` from `src` to `dst` of `bytes` bytes.
std::byte pattern(int src, int dst, std::size_t bytes, std::size_t seq, std::size_t index) {
  const std::uint64_t value = index * 7 + (index >> 9) + static_cast<std::uint64_t>(src) * 31 +
                              static_cast<std::uint64_t>(dst) * 57 + bytes * 13 + seq * 101;
  return static_cast<std::byte>(value & 0xff);
}

std::vector<std::byte> message(int src, int dst, std::size_t bytes, std::size_t seq = 0) {
  std::vector<std::byte> out(bytes);
  for (std::size_t i = 0; i < bytes; ++i) out[i] = pattern(src, dst, bytes, seq, i);
  return out;
}

/// The index of the first byte of `got` that differs from the pattern, or `got.size()`.
std::size_t first_mismatch(const std::vector<std::byte>& got, int src, int dst,
                           std::size_t seq = 0) {
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (got[i] != pattern(src, dst, got.size(), seq, i)) return i;
  }
  return got.size();
}

std::size_t first_mismatch(squall::buffer_view<std::byte> got, int src, int dst) {
  for (std::size_t i = 0; i < got.count(); ++i) {
    if (got[i] != pattern(src, dst, got.count(), 0, i)) return i;
  }
  return got.count();
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

TEST_SUITE("inproc") {
  TEST_CASE("inproc_transport models transport and direct_transport") {
    static_assert(squall::completion<inproc_completion>);
    static_assert(squall::transport<inproc_transport>);
    static_assert(squall::direct_transport<inproc_transport>);
    static_assert(squall::check_transport<inproc_transport>());
    inproc_completion done;
    CHECK(done.test());
    done.wait();
  }

  TEST_CASE("rank, size and deadline") {
    for (const int p : world_sizes) {
      std::atomic<int> rank_sum = 0;
      run_ranks(p,
                [&](inproc_transport& t) {
                  CHECK(t.size() == p);
                  CHECK(t.deadline() == 3s);
                  rank_sum += t.rank();
                },
                {.deadline = 3s});
      CHECK(rank_sum == p * (p - 1) / 2);
    }
  }

  TEST_CASE("ping-pong") {
    constexpr std::size_t rounds = 200;
    constexpr std::size_t bytes = 64;
    run_ranks(2, [&](inproc_transport& t) {
      const int peer = 1 - t.rank();
      std::size_t bad = 0;
      for (std::size_t round = 0; round < rounds; ++round) {
        std::vector<std::byte> in(bytes);
        if (t.rank() == 0) {
          t.send(peer, message(0, 1, bytes, round)).wait();
          t.recv(peer, in).wait();
          bad += first_mismatch(in, 1, 0, round) != bytes;
        } else {
          t.recv(peer, in).wait();
          bad += first_mismatch(in, 0, 1, round) != bytes;
          t.send(peer, message(1, 0, bytes, round)).wait();
        }
      }
      CHECK(bad == 0);
    });
  }

  TEST_CASE("ring shift with both operations posted before either is waited") {
    for (const int p : world_sizes) {
      for (const std::size_t bytes : {std::size_t{0}, std::size_t{1}, std::size_t{4099}}) {
        for (const bool send_first : {true, false}) {
          CAPTURE(p);
          CAPTURE(bytes);
          CAPTURE(send_first);
          run_ranks(p, [&](inproc_transport& t) {
            const int next = (t.rank() + 1) % p;
            const int prev = (t.rank() + p - 1) % p;
            const auto out = message(t.rank(), next, bytes);
            std::vector<std::byte> in(bytes);
            auto sent = t.send(next, out);
            auto received = t.recv(prev, in);
            if (send_first) {
              sent.wait();
              received.wait();
            } else {
              received.wait();
              sent.wait();
            }
            CHECK(first_mismatch(in, prev, t.rank()) == bytes);
          });
        }
      }
    }
  }

  TEST_CASE("all-pairs exchange, self included") {
    // Sizes differ per ordered pair, so a message routed to the wrong recv fails loudly.
    const auto size_of = [](int src, int dst) {
      return 1 + 37 * static_cast<std::size_t>(src) + 11 * static_cast<std::size_t>(dst);
    };
    for (const int p : world_sizes) {
      CAPTURE(p);
      run_ranks(p, [&](inproc_transport& t) {
        const int me = t.rank();
        std::vector<std::vector<std::byte>> out(static_cast<std::size_t>(p));
        std::vector<std::vector<std::byte>> in(static_cast<std::size_t>(p));
        std::vector<inproc_completion> sends;
        std::vector<inproc_completion> recvs;
        for (int q = 0; q < p; ++q) {
          const auto slot = static_cast<std::size_t>(q);
          in[slot].resize(size_of(q, me));
          recvs.push_back(t.recv(q, in[slot]));
          out[slot] = message(me, q, size_of(me, q));
          sends.push_back(t.send(q, out[slot]));
        }
        for (auto it = sends.rbegin(); it != sends.rend(); ++it) it->wait();
        for (auto& r : recvs) r.wait();
        for (int q = 0; q < p; ++q) {
          const auto& got = in[static_cast<std::size_t>(q)];
          CHECK(first_mismatch(got, q, me) == got.size());
        }
      });
    }
  }

  TEST_CASE("messages of one ordered pair match in FIFO order") {
    constexpr std::size_t count = 300;
    const auto size_of = [](std::size_t seq) { return (seq * 13) % 97; };
    for (const bool recvs_first : {false, true}) {
      CAPTURE(recvs_first);
      run_ranks(2, [&](inproc_transport& t) {
        if (t.rank() == 0) {
          if (recvs_first) t.barrier().wait();
          std::vector<std::vector<std::byte>> out;
          std::vector<inproc_completion> sends;
          out.reserve(count);
          for (std::size_t seq = 0; seq < count; ++seq) {
            out.push_back(message(0, 1, size_of(seq), seq));
            sends.push_back(t.send(1, out.back()));
          }
          for (auto& s : sends) s.wait();
        } else {
          std::vector<std::vector<std::byte>> in(count);
          std::vector<inproc_completion> recvs;
          for (std::size_t seq = 0; seq < count; ++seq) {
            in[seq].resize(size_of(seq));
            recvs.push_back(t.recv(0, in[seq]));
          }
          if (recvs_first) t.barrier().wait();
          for (auto it = recvs.rbegin(); it != recvs.rend(); ++it) it->wait();
          std::size_t bad = 0;
          for (std::size_t seq = 0; seq < count; ++seq) {
            bad += first_mismatch(in[seq], 0, 1, seq) != in[seq].size();
          }
          CHECK(bad == 0);
        }
      });
    }
  }

  TEST_CASE("message sizes 0, 1, 4099, 1 MiB and 64 MiB") {
    for (const std::size_t bytes : {std::size_t{0}, std::size_t{1}, std::size_t{4099},
                                    std::size_t{1} << 20, std::size_t{64} << 20}) {
      CAPTURE(bytes);
      run_ranks(2, [&](inproc_transport& t) {
        const int peer = 1 - t.rank();
        const auto out = message(t.rank(), peer, bytes);
        std::vector<std::byte> in(bytes);
        auto received = t.recv(peer, in);
        auto sent = t.send(peer, out);
        received.wait();
        sent.wait();
        CHECK(first_mismatch(in, peer, t.rank()) == bytes);
      });
    }
  }

  TEST_CASE("send to self, posted both ways round before waiting") {
    for (const bool recv_first : {false, true}) {
      run_ranks(1, [&](inproc_transport& t) {
        const auto out = message(0, 0, 4099);
        std::vector<std::byte> in(4099);
        inproc_completion sent;
        inproc_completion received;
        if (recv_first) {
          received = t.recv(0, in);
          sent = t.send(0, out);
        } else {
          sent = t.send(0, out);
          received = t.recv(0, in);
        }
        sent.wait();
        received.wait();
        CHECK(first_mismatch(in, 0, 0) == in.size());
      });
    }
  }

  TEST_CASE("test() drives both sides to completion without wait()") {
    run_ranks(2, [&](inproc_transport& t) {
      const int peer = 1 - t.rank();
      const auto out = message(t.rank(), peer, 4099);
      std::vector<std::byte> in(4099);
      auto sent = t.send(peer, out);
      auto received = t.recv(peer, in);
      bool sent_done = false;
      bool received_done = false;
      while (!(sent_done && received_done)) {
        sent_done = sent_done || sent.test();
        received_done = received_done || received.test();
        std::this_thread::yield();
      }
      CHECK(sent.test());
      CHECK(first_mismatch(in, peer, t.rank()) == in.size());
    });
  }

  TEST_CASE("the destructor of a pending completion waits for it") {
    std::atomic<bool> recv_posted = false;
    run_ranks(2, [&](inproc_transport& t) {
      if (t.rank() == 0) {
        const auto out = message(0, 1, 128);
        { auto sent = t.send(1, out); }
        // The copy needs the recv, posted after the flag was set.
        CHECK(recv_posted.load());
      } else {
        std::this_thread::sleep_for(20ms);
        recv_posted = true;
        std::vector<std::byte> in(128);
        t.recv(0, in).wait();
        CHECK(first_mismatch(in, 0, 1) == in.size());
      }
    });
  }

  TEST_CASE("barrier, repeated and reused") {
    for (const int p : world_sizes) {
      CAPTURE(p);
      constexpr int rounds = 300;
      std::atomic<int> arrived = 0;
      run_ranks(p, [&](inproc_transport& t) {
        int bad = 0;
        for (int round = 0; round < rounds; ++round) {
          ++arrived;
          t.barrier().wait();
          // Everyone has arrived for this round; nobody can be past the next barrier.
          const int seen = arrived.load();
          bad += seen < (round + 1) * p || seen > (round + 2) * p - 1;
        }
        CHECK(bad == 0);
        // Barriers may be posted ahead of waiting; each completes with its own generation.
        auto first = t.barrier();
        auto second = t.barrier();
        second.wait();
        CHECK(first.test());
      });
      CHECK(arrived == rounds * p);
    }
  }

  TEST_CASE("windows: each rank writes its own, then reads every peer's") {
    constexpr std::size_t window_bytes = 4099;
    for (const int p : world_sizes) {
      CAPTURE(p);
      run_ranks(
          p,
          [&](inproc_transport& t) {
            const int me = t.rank();
            auto local = t.local_view();
            REQUIRE(local.count() == window_bytes);
            CHECK(local.data() == t.peer_view(me).data());
            for (std::size_t i = 0; i < window_bytes; ++i) local[i] = pattern(me, me, 0, 0, i);
            t.barrier().wait();
            for (int q = 0; q < p; ++q) {
              const auto window = t.peer_view(q);
              std::size_t bad = 0;
              for (std::size_t i = 0; i < window.count(); ++i) {
                bad += window[i] != pattern(q, q, 0, 0, i);
              }
              CHECK(bad == 0);
            }
            t.barrier().wait();
            // Then each rank writes into the next rank's window, and reads its own.
            const int next = (me + 1) % p;
            const int prev = (me + p - 1) % p;
            auto theirs = t.peer_view(next);
            for (std::size_t i = 0; i < window_bytes; ++i) {
              theirs[i] = pattern(me, next, window_bytes, 0, i);
            }
            t.barrier().wait();
            CHECK(first_mismatch(t.local_view(), prev, me) == window_bytes);
          },
          {}, window_bytes);
    }
  }

  TEST_CASE("a size mismatch fails the recv with mismatch_error, and the send too") {
    run_ranks(2, [&](inproc_transport& t) {
      if (t.rank() == 0) {
        const auto out = message(0, 1, 8);
        auto sent = t.send(1, out);
        try {
          sent.wait();
          FAIL("the send of a mismatched pair completed");
        } catch (const squall::mismatch_error& e) {
          CHECK(e.operation() == "send");
          CHECK(e.rank() == 0);
          CHECK(e.peer() == 1);
        }
        CHECK_THROWS_AS(sent.wait(), squall::mismatch_error);
        // The pair still works afterwards.
        t.send(1, message(0, 1, 16, 1)).wait();
      } else {
        std::vector<std::byte> in(16);
        auto received = t.recv(0, in);
        try {
          received.wait();
          FAIL("the recv of a mismatched pair completed");
        } catch (const squall::mismatch_error& e) {
          const std::string what = e.what();
          CHECK(contains(what, "recv"));
          CHECK(contains(what, "rank 1"));
          CHECK(contains(what, "peer 0"));
          CHECK(contains(what, "16 bytes"));
          CHECK(contains(what, "has 8"));
        }
        t.recv(0, in).wait();
        CHECK(first_mismatch(in, 0, 1, 1) == in.size());
      }
    });
  }

  TEST_CASE("a recv nobody matches times out, then the transport is failed") {
    inproc_world world(2, {.deadline = 200ms});
    auto t0 = world.transport(0);
    auto t1 = world.transport(1);  // alive, but never sends
    std::vector<std::byte> in(16);
    auto received = t0.recv(1, in);
    CHECK_FALSE(received.test());
    const auto start = std::chrono::steady_clock::now();
    try {
      received.wait();
      FAIL("a recv that nobody matched completed");
    } catch (const squall::timeout_error& e) {
      const std::string what = e.what();
      CHECK(contains(what, "recv"));
      CHECK(contains(what, "rank 0"));
      CHECK(contains(what, "peer 1"));
      CHECK(e.code() == squall::errc::timeout);
    }
    const double waited = seconds_since(start);
    CHECK(waited >= 0.2);
    CHECK(waited < 2.0);
    // Later calls throw at once.
    const auto later = std::chrono::steady_clock::now();
    const auto out = message(0, 1, 16);
    CHECK_THROWS_AS((void)t0.send(1, out), squall::timeout_error);
    CHECK_THROWS_AS((void)t0.recv(1, in), squall::timeout_error);
    CHECK_THROWS_AS((void)t0.barrier(), squall::timeout_error);
    CHECK_THROWS_AS(received.wait(), squall::timeout_error);
    CHECK(seconds_since(later) < 0.1);
    // The timed-out recv was withdrawn: a late send of the peer finds no recv to write into,
    // and fails once rank 0 has left.
    auto late = t1.send(0, out);
    CHECK_FALSE(late.test());
    { const auto gone = std::move(t0); }
    CHECK_THROWS_AS(late.wait(), squall::peer_failure);
  }

  TEST_CASE("a barrier that one rank never reaches times out, naming that rank") {
    inproc_world world(3, {.deadline = 100ms});
    auto t0 = world.transport(0);
    auto t1 = world.transport(1);
    auto t2 = world.transport(2);
    auto b1 = t1.barrier();
    try {
      t0.barrier().wait();
      FAIL("a barrier completed without rank 2");
    } catch (const squall::timeout_error& e) {
      const std::string what = e.what();
      CHECK(contains(what, "barrier"));
      CHECK(contains(what, "rank 0"));
      CHECK(contains(what, "peer 2"));
    }
    { const auto gone = std::move(t2); }
    CHECK_THROWS_AS(b1.wait(), squall::peer_failure);
  }

  TEST_CASE("operations waiting for a peer that left fail with peer_failure at once") {
    inproc_world world(2, {.deadline = 30s});
    auto t0 = world.transport(0);
    const auto out = message(1, 0, 64);
    inproc_completion early;
    {
      auto t1 = world.transport(1);
      early = t1.send(0, out);
    }
    // A send posted before the peer left is still delivered.
    std::vector<std::byte> in(64);
    t0.recv(1, in).wait();
    early.wait();
    CHECK(first_mismatch(in, 1, 0) == in.size());
    const auto start = std::chrono::steady_clock::now();
    CHECK_THROWS_AS(t0.recv(1, in).wait(), squall::peer_failure);
    CHECK_THROWS_AS(t0.send(1, out).wait(), squall::peer_failure);
    CHECK_THROWS_AS(t0.barrier().wait(), squall::peer_failure);
    CHECK(seconds_since(start) < 1.0);
  }

  TEST_CASE("run_ranks rethrows the first exception, and its peers do not hang") {
    const auto start = std::chrono::steady_clock::now();
    CHECK_THROWS_WITH_AS(run_ranks(3,
                                   [](inproc_transport& t) {
                                     if (t.rank() == 0) throw std::runtime_error("boom");
                                     std::vector<std::byte> in(4);
                                     t.recv(0, in).wait();
                                   },
                                   {.deadline = 30s}),
                         "boom", std::runtime_error);
    CHECK(seconds_since(start) < 5.0);
  }

  TEST_CASE("bad sizes, ranks and peers throw invalid_argument") {
    CHECK_THROWS_AS(inproc_world(0), squall::invalid_argument);
    CHECK_THROWS_AS(inproc_world(-1), squall::invalid_argument);
    CHECK_THROWS_AS(inproc_world(2, {.deadline = 0s}), squall::invalid_argument);
    inproc_world world(2);
    CHECK(world.size() == 2);
    CHECK_THROWS_AS(world.transport(-1), squall::invalid_argument);
    CHECK_THROWS_AS(world.transport(2), squall::invalid_argument);
    auto t = world.transport(0);
    CHECK_THROWS_AS(world.transport(0), squall::invalid_argument);
    std::vector<std::byte> bytes(4);
    CHECK_THROWS_AS((void)t.send(-1, bytes), squall::invalid_argument);
    CHECK_THROWS_AS((void)t.send(2, bytes), squall::invalid_argument);
    CHECK_THROWS_AS((void)t.recv(2, bytes), squall::invalid_argument);
    CHECK_THROWS_AS((void)t.peer_view(2), squall::invalid_argument);
    CHECK_THROWS_AS((void)t.peer_view(-1), squall::invalid_argument);
    try {
      (void)t.send(5, bytes);
    } catch (const squall::invalid_argument& e) {
      CHECK(contains(e.what(), "send"));
      CHECK(contains(e.what(), "rank 0"));
      CHECK(contains(e.what(), "peer 5"));
    }
    CHECK(t.local_view().empty());
  }
}
