// SPDX-License-Identifier: Apache-2.0
// Schedules checked exhaustively without I/O: a simulator runs every rank's steps in the
// executor's order (receives posted, sends posted, receives waited and applied), matches
// messages per ordered pair in posting order, and checks that
// - every receive finds a message of exactly its size (no mismatch), nobody waits forever,
//   and no message is left over;
// - a message's data, read when it is received (as the single-copy path reads it), equals
//   what it was when sent (the executor's invariant: no send region changes under a send);
// - every rank ends with the right result: rank r contributes 2^r to every element, so a sum
//   counts every rank exactly once only if it equals 2^P - 1.
#include <squall/topology/automatic.hpp>
#include <squall/topology/direct.hpp>
#include <squall/topology/halving_doubling.hpp>
#include <squall/topology/hierarchical.hpp>
#include <squall/topology/ring.hpp>
#include <squall/topology/tree.hpp>

#include <doctest/doctest.h>

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace {

using squall::block_range;
using squall::nobody;
using squall::schedule;
using squall::step_action;
using buffer = std::vector<std::uint64_t>;

struct message {
  int from;
  std::size_t begin;
  std::size_t count;
  buffer data;  // as sent
};

struct simulation {
  std::vector<buffer> data;
  std::string failure;  // empty when everything held
};

// The element range of `blocks` (contiguous) in a buffer of `count` elements.
std::pair<std::size_t, std::size_t> span_of(std::size_t count, const block_range& blocks) {
  const auto first = squall::detail::split_range(count, blocks.parts, blocks.first);
  const auto last =
      squall::detail::split_range(count, blocks.parts, blocks.first + blocks.count - 1);
  return {first.begin, last.end() - first.begin};
}

// Runs `schedules[r]` for every rank r over `data[r]`.
simulation simulate(const std::vector<schedule>& schedules, std::vector<buffer> data) {
  const int p = static_cast<int>(schedules.size());
  const std::size_t count = data.empty() ? 0 : data[0].size();
  std::map<std::pair<int, int>, std::deque<message>> wire;  // (from, to) -> in flight
  std::vector<std::size_t> at(static_cast<std::size_t>(p), 0);
  std::vector<bool> sent(static_cast<std::size_t>(p), false);
  simulation out;
  bool moved = true;
  while (moved) {
    moved = false;
    for (int r = 0; r < p; ++r) {
      const auto& steps = schedules[static_cast<std::size_t>(r)].steps;
      auto& i = at[static_cast<std::size_t>(r)];
      while (i < steps.size()) {
        const squall::step& s = steps[i];
        if (!sent[static_cast<std::size_t>(r)] && s.send_to != nobody) {
          if (s.send_to < 0 || s.send_to >= p || s.send_to == r) {
            out.failure = "rank " + std::to_string(r) + " sends to " + std::to_string(s.send_to);
            return out;
          }
          const auto [begin, n] = span_of(count, s.send);
          const auto& mine = data[static_cast<std::size_t>(r)];
          wire[{r, s.send_to}].push_back(
              {r, begin, n,
               buffer(mine.begin() + static_cast<std::ptrdiff_t>(begin),
                      mine.begin() + static_cast<std::ptrdiff_t>(begin + n))});
        }
        sent[static_cast<std::size_t>(r)] = true;
        if (s.recv_from != nobody) {
          auto& queue = wire[{s.recv_from, r}];
          if (queue.empty()) break;  // wait
          message m = std::move(queue.front());
          queue.pop_front();
          const auto [begin, n] = span_of(count, s.recv);
          if (n != m.count) {
            out.failure = "rank " + std::to_string(r) + " step " + std::to_string(i) +
                          " receives " + std::to_string(n) + " elements, rank " +
                          std::to_string(m.from) + " sent " + std::to_string(m.count);
            return out;
          }
          const auto& source = data[static_cast<std::size_t>(m.from)];
          for (std::size_t k = 0; k < n; ++k) {
            if (source[m.begin + k] != m.data[k]) {
              out.failure = "rank " + std::to_string(m.from) +
                            " changed a region it sent to rank " + std::to_string(r) +
                            " before it was received";
              return out;
            }
          }
          auto& mine = data[static_cast<std::size_t>(r)];
          for (std::size_t k = 0; k < n; ++k) {
            mine[begin + k] =
                s.action == step_action::reduce ? mine[begin + k] + m.data[k] : m.data[k];
          }
        }
        sent[static_cast<std::size_t>(r)] = false;
        ++i;
        moved = true;
      }
    }
  }
  for (int r = 0; r < p; ++r) {
    if (at[static_cast<std::size_t>(r)] != schedules[static_cast<std::size_t>(r)].steps.size()) {
      out.failure = "deadlock: rank " + std::to_string(r) + " waits at step " +
                    std::to_string(at[static_cast<std::size_t>(r)]);
      return out;
    }
  }
  for (const auto& [pair, queue] : wire) {
    if (!queue.empty()) {
      out.failure = "rank " + std::to_string(pair.first) + " sent rank " +
                    std::to_string(pair.second) + " a message nobody received";
      return out;
    }
  }
  out.data = std::move(data);
  return out;
}

std::vector<buffer> contributions(int p, std::size_t count) {
  std::vector<buffer> data;
  for (int r = 0; r < p; ++r) data.emplace_back(count, std::uint64_t{1} << r);
  return data;
}

const std::vector<std::size_t> counts_for(int p) {
  const auto u = static_cast<std::size_t>(p);
  return {0, 1, u > 1 ? u - 1 : 2, u + 1, 2 * u, 97, 1000};
}

void check_allreduce(const std::function<schedule(int, int, std::size_t)>& make) {
  for (int p = 1; p <= 16; ++p) {
    for (std::size_t count : counts_for(p)) {
      CAPTURE(p);
      CAPTURE(count);
      std::vector<schedule> schedules;
      for (int r = 0; r < p; ++r) schedules.push_back(make(r, p, count * 8));
      const simulation sim = simulate(schedules, contributions(p, count));
      REQUIRE_MESSAGE(sim.failure.empty(), sim.failure);
      const std::uint64_t total = (std::uint64_t{1} << p) - 1;
      for (int r = 0; r < p; ++r) {
        for (std::size_t i = 0; i < count; ++i) {
          REQUIRE(sim.data[static_cast<std::size_t>(r)][i] == total);
        }
      }
    }
  }
}

template <class Topology>
void check_reduce_and_broadcast() {
  for (int p = 1; p <= 16; ++p) {
    for (int root = 0; root < p; ++root) {
      CAPTURE(p);
      CAPTURE(root);
      const std::size_t count = 37;
      std::vector<schedule> reduce;
      std::vector<schedule> broadcast;
      for (int r = 0; r < p; ++r) {
        reduce.push_back(Topology{}.reduce_schedule(r, p, root));
        broadcast.push_back(Topology{}.broadcast_schedule(r, p, root));
      }
      const simulation up = simulate(reduce, contributions(p, count));
      REQUIRE_MESSAGE(up.failure.empty(), up.failure);
      CHECK(up.data[static_cast<std::size_t>(root)][count - 1] == (std::uint64_t{1} << p) - 1);
      std::vector<buffer> start(static_cast<std::size_t>(p), buffer(count, 0));
      start[static_cast<std::size_t>(root)] = buffer(count, 42);
      const simulation down = simulate(broadcast, start);
      REQUIRE_MESSAGE(down.failure.empty(), down.failure);
      for (int r = 0; r < p; ++r) CHECK(down.data[static_cast<std::size_t>(r)][0] == 42);
    }
  }
}

template <class Topology>
void check_scatter_and_gather() {
  for (int p = 1; p <= 16; ++p) {
    for (std::size_t count : counts_for(p)) {
      CAPTURE(p);
      CAPTURE(count);
      std::vector<schedule> scatter;
      std::vector<schedule> gather;
      for (int r = 0; r < p; ++r) {
        scatter.push_back(Topology{}.reduce_scatter_schedule(r, p));
        gather.push_back(Topology{}.allgather_schedule(r, p));
      }
      const simulation rs = simulate(scatter, contributions(p, count));
      REQUIRE_MESSAGE(rs.failure.empty(), rs.failure);
      const auto parts = static_cast<std::size_t>(p);
      for (int r = 0; r < p; ++r) {
        const auto mine = squall::detail::split_range(count, parts, static_cast<std::size_t>(r));
        for (std::size_t i = mine.begin; i < mine.end(); ++i) {
          REQUIRE(rs.data[static_cast<std::size_t>(r)][i] == (std::uint64_t{1} << p) - 1);
        }
      }
      // allgather: rank r starts with block r = r + 1, the rest 0.
      std::vector<buffer> start(static_cast<std::size_t>(p), buffer(count, 0));
      for (int r = 0; r < p; ++r) {
        const auto mine = squall::detail::split_range(count, parts, static_cast<std::size_t>(r));
        for (std::size_t i = mine.begin; i < mine.end(); ++i) {
          start[static_cast<std::size_t>(r)][i] = static_cast<std::uint64_t>(r) + 1;
        }
      }
      const simulation ag = simulate(gather, start);
      REQUIRE_MESSAGE(ag.failure.empty(), ag.failure);
      for (int r = 0; r < p; ++r) {
        for (int q = 0; q < p; ++q) {
          const auto theirs =
              squall::detail::split_range(count, parts, static_cast<std::size_t>(q));
          for (std::size_t i = theirs.begin; i < theirs.end(); ++i) {
            REQUIRE(ag.data[static_cast<std::size_t>(r)][i] == static_cast<std::uint64_t>(q) + 1);
          }
        }
      }
    }
  }
}

}  // namespace

TEST_SUITE("schedule") {
  TEST_CASE("ring allreduce, reduce-scatter, allgather, chain reduce and broadcast") {
    check_allreduce([](int r, int p, std::size_t b) {
      return squall::ring_topology{}.allreduce_schedule(r, p, b);
    });
    check_scatter_and_gather<squall::ring_topology>();
    check_reduce_and_broadcast<squall::ring_topology>();
    // 2(P-1) steps, each moving one of P blocks each way.
    const schedule s = squall::ring_topology{}.allreduce_schedule(2, 5, 0);
    CHECK(s.steps.size() == 8);
  }
  TEST_CASE("tree allreduce, reduce and broadcast") {
    check_allreduce([](int r, int p, std::size_t b) {
      return squall::tree_topology{}.allreduce_schedule(r, p, b);
    });
    check_reduce_and_broadcast<squall::tree_topology>();
    // A leaf of 16 ranks: one step up, one step down; the root: two children each way.
    CHECK(squall::tree_topology{}.allreduce_schedule(15, 16, 0).steps.size() == 2);
    CHECK(squall::tree_topology{}.allreduce_schedule(0, 16, 0).steps.size() == 4);
  }
  TEST_CASE("binomial tree allreduce (gTop-k's merge tree), powers of two and the fold") {
    check_allreduce([](int r, int p, std::size_t) {
      return schedule{.name = "binomial_tree", .steps = squall::detail::binomial_tree_steps(r, p)};
    });
    // 8 ranks: rank 0 receives from 1, 2, 4 and sends back to 4, 2, 1; rank 5 sends to 4
    // and receives from 4. 6 ranks: rank 4 folds into 0 (send, receive back).
    CHECK(squall::detail::binomial_tree_steps(0, 8).size() == 6);
    CHECK(squall::detail::binomial_tree_steps(5, 8).size() == 2);
    const auto folded = squall::detail::binomial_tree_steps(4, 6);
    REQUIRE(folded.size() == 2);
    CHECK(folded[0].send_to == 0);
    CHECK(folded[1].recv_from == 0);
    CHECK(folded[1].new_phase);
  }
  TEST_CASE("direct allreduce, reduce-scatter, allgather, flat reduce and broadcast") {
    check_allreduce([](int r, int p, std::size_t b) {
      return squall::direct_topology{}.allreduce_schedule(r, p, b);
    });
    check_scatter_and_gather<squall::direct_topology>();
    check_reduce_and_broadcast<squall::direct_topology>();
    CHECK(squall::direct_topology{}.allreduce_schedule(0, 4, 0).one_shot);
  }
  TEST_CASE("halving-doubling allreduce, powers of two and the fold") {
    check_allreduce([](int r, int p, std::size_t b) {
      return squall::halving_doubling_topology{}.allreduce_schedule(r, p, b);
    });
    // 8 ranks: 3 halving + 3 doubling steps; 6 ranks: ranks 0, 2 fold (send, receive back).
    CHECK(squall::halving_doubling_topology{}.allreduce_schedule(5, 8, 0).steps.size() == 6);
    CHECK(squall::halving_doubling_topology{}.allreduce_schedule(2, 6, 0).steps.size() == 2);
  }
  TEST_CASE("hierarchical allreduce over every node layout") {
    for (int per = 1; per <= 5; ++per) {
      CAPTURE(per);
      check_allreduce([per](int r, int p, std::size_t b) {
        squall::hierarchical_topology<squall::tree_topology, squall::ring_topology> h;
        for (int q = 0; q < p; ++q) h.node_of.push_back(q / per);
        return h.allreduce_schedule(r, p, b);
      });
      check_allreduce([per](int r, int p, std::size_t b) {
        squall::hierarchical_topology<> h;                         // direct inside, ring across
        for (int q = 0; q < p; ++q) h.node_of.push_back(q % per);  // interleaved nodes
        return h.allreduce_schedule(r, p, b);
      });
    }
    squall::hierarchical_topology<> h;
    h.node_of = {0, 0};
    CHECK_THROWS_AS((void)h.allreduce_schedule(0, 3, 0), squall::invalid_argument);
  }
  TEST_CASE("automatic picks each candidate somewhere and its schedules are correct") {
    squall::automatic_topology a;
    check_allreduce([&a](int r, int p, std::size_t b) { return a.allreduce_schedule(r, p, b); });
    // A measured model: tree is fastest small, direct in the middle, ring large.
    auto& m = a.model.measured;
    m[0] = {{4096, 9e-6}, {1 << 20, 100e-6}, {16 << 20, 1.0e-3}};
    m[1] = {{4096, 3e-6}, {1 << 20, 400e-6}, {16 << 20, 7.0e-3}};
    m[2] = {{4096, 4e-6}, {1 << 20, 80e-6}, {16 << 20, 1.4e-3}};
    m[3] = {{4096, 6e-6}, {1 << 20, 150e-6}, {16 << 20, 2.0e-3}};
    REQUIRE(a.model.calibrated());
    CHECK(a.choice(4096, 4) == "tree");
    CHECK(a.choice(1 << 20, 4) == "direct");
    CHECK(a.choice(16 << 20, 4) == "ring");
    CHECK(a.choice(std::size_t{256} << 20, 4) == "ring");  // extends the last band's line
    CHECK(a.allreduce_schedule(0, 4, 4096).name == "tree");
    // Unmeasured: the alpha-beta-gamma formulas; latency terms win small, and halving-
    // doubling's fold costs it at P = 3.
    squall::automatic_topology formulas;
    CHECK(formulas.model.predict(0, 0, 8) > formulas.model.predict(3, 0, 8));
    CHECK(formulas.model.predict(3, 1 << 20, 3) > formulas.model.predict(0, 1 << 20, 3));
    // One port (a network): direct pays an alpha per peer, halving-doubling wins small at P =
    // 8 and ring large at P = 6; all peers at once (shared memory): direct wins at every size.
    formulas.model.link = squall::link_costs{.alpha = 5e-6, .beta = 1e-10, .gamma = 5e-11};
    CHECK(formulas.choice(4096, 8) == "halving_doubling");
    CHECK(formulas.choice(std::size_t{64} << 20, 6) == "ring");
    formulas.model.link->all_peers_at_once = true;
    for (std::size_t b = 64; b <= (std::size_t{256} << 20); b *= 8) {
      for (int p : {2, 3, 4, 8}) CHECK(formulas.choice(b, p) == "direct");
    }
    // A model that names its schedule runs it at every size; a wrong name is refused.
    for (const std::string_view name : squall::cost_model::names) {
      const squall::automatic_topology only{.model = squall::cost_model::of_name(name)};
      for (std::size_t b = 64; b <= (std::size_t{256} << 20); b *= 8) {
        for (int p : {2, 3, 4, 8}) CHECK(only.choice(b, p) == name);
      }
    }
    CHECK(squall::cost_model::of_name("automatic") == squall::cost_model{});
    CHECK_THROWS_WITH_AS(squall::cost_model::of_name("star"),
                         doctest::Contains("unknown schedule 'star'"), squall::invalid_argument);
  }
  TEST_CASE("a cost model reads back what it wrote; a malformed one names its line") {
    squall::cost_model model;
    model.link = squall::link_costs{
        .alpha = 1.5e-6, .beta = 1.0 / 3e9, .gamma = 0.1, .all_peers_at_once = true};
    model.ranks = 4;
    for (std::size_t c = 0; c < squall::cost_model::candidates; ++c) {
      model.measured[c] = {{4096, 1e-6 * static_cast<double>(c + 1) / 3.0}, {65536, 2e-5 + c}};
    }
    const std::string text = model.to_text();
    CHECK(text.rfind("squall cost model 1\nranks 4\nlink ", 0) == 0);
    CHECK(squall::cost_model::from_text(text) == model);  // bit for bit: shortest round trip
    squall::cost_model formulas;
    CHECK(squall::cost_model::from_text(formulas.to_text()) == formulas);
    const auto bad = [](const std::string& t, const char* why) {
      CAPTURE(t);
      CHECK_THROWS_WITH_AS((void)squall::cost_model::from_text(t), doctest::Contains(why),
                           squall::invalid_argument);
    };
    bad("", "empty text");
    bad("squall cost model 2\n", "line 1");
    bad("squall cost model 1\nranks x\n", "line 2 (\"ranks x\"): \"x\" is not a number");
    bad("squall cost model 1\nlink 1 2 3\n", "expected ranks, link or measured");
    bad("squall cost model 1\nlink 1 2 -3 0\n", "finite and >= 0");
    bad("squall cost model 1\nlink 1 2 3 2\n", "all_peers_at_once is 0 or 1");
    bad("squall cost model 1\nranks 2\nmeasured star 1:1 2:2\n", "unknown schedule");
    bad("squall cost model 1\nranks 2\nmeasured ring 2:1 1:2\n", "ascend");
    bad("squall cost model 1\nranks 2\nmeasured ring 1-1 2:2\n", "<bytes>:<seconds>");
    bad("squall cost model 1\nranks 2\nmeasured ring 1:1 2:2\n", "two points for every");
    CHECK_THROWS_WITH_AS((void)squall::cost_model::load("/nonexistent/squall-model"),
                         doctest::Contains("cannot read /nonexistent/squall-model"),
                         squall::invalid_argument);
  }
}
