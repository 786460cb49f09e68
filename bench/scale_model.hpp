// SPDX-License-Identifier: Apache-2.0
// The scale model of squall-scale-model (issue 16, item 6): predicts a collective's time on P
// hosts from the schedules squall runs (the topologies' own `schedule`s, walked rank by rank),
// the link's payload rate and per-message latency, and the measured throughput of the
// compressor's encode, decode and merge.
//
// Messages: every rank runs its steps in order, as the executor does (post the receive, post
// the send, wait for the receive, apply its action). A host has one link, full duplex: what it
// sends leaves one message at a time at `rate` bytes per second, and what it receives arrives
// one message at a time at the same rate; a message of B bytes posted at t leaves when the
// sender's link is free, and is received `latency` + B / rate later, or once the receiver's
// link has taken the messages before it. Sends do not block; a receive waits for its message;
// a reducing receive then reduces (`reduce_rate`), a merging one merges (`merge_rate`). Pieces
// are not modelled: a step moves its blocks as one message, so a pipelined schedule (the tree)
// is predicted as if it were not pipelined, and the ring and halving-doubling, which move one
// block per step anyway, as they run.
//
// Algorithms (what squall's compressed allreduce does, algorithm/compressed/):
//   dense     the topology's allreduce schedule over the gradient's bytes;
//   gather    encode the gradient; exchange the payload sizes (P - 1 messages of 8 bytes out
//             and in); the topology's allgather schedule over P blocks of the padded payload;
//             decode payload 0 (a pass over the gradient: zero, scatter), then add the k
//             entries of each of the other P - 1 (`decode_add`);
//   gtopk     encode; the binomial tree's steps (binomial_tree_steps), each message a 16-byte
//             head and a set of k (index, value) pairs; every reducing receive merges two sets
//             of k; at the end the gradient is zeroed and the set scattered into it.
#pragma once

#include <squall/topology/ring.hpp>
#include <squall/topology/schedule.hpp>

#include <algorithm>
#include <cstddef>
#include <deque>
#include <functional>
#include <map>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace squall_model {

/// The machine: a link per host, and what a rank computes per second.
struct machine {
  double rate = 0.956e9 / 8;  ///< payload bytes per second each way (1 Gbit/s over TCP)
  double latency = 20e-6;     ///< seconds from posting a message to its first byte arriving
  double reduce_rate = 4e9;   ///< bytes of a received block reduced per second
  double encode_rate = 1e9;   ///< gradient bytes encoded per second
  double decode_rate = 1e9;   ///< gradient bytes per second a dense decode (zero, scatter) takes
  double scatter_rate = 1e8;  ///< sparse entries added into the gradient per second
  double merge_rate = 1e9;    ///< bytes of two sets merged per second (gTop-k)
  double fill_rate = 10e9;    ///< gradient bytes zeroed per second (gTop-k's result)
};

/// A predicted time, split as communicator::last_split splits a call.
struct prediction {
  double encode = 0;
  double transfer = 0;  ///< messages, with the reductions and merges between them
  double decode = 0;
  double total() const { return encode + transfer + decode; }
};

/// The bytes of a step's blocks in a buffer of `bytes` cut into `blocks.parts` blocks (at
/// `granule` bytes: 4 for float elements, the stride for gathered payloads).
inline double block_bytes(const squall::block_range& blocks, std::size_t bytes,
                          std::size_t granule) {
  if (blocks.count == 0) return 0;
  const std::size_t units = bytes / granule;
  std::size_t n = 0;
  for (std::size_t b = blocks.first; b < blocks.first + blocks.count; ++b) {
    n += squall::detail::split_range(units, blocks.parts, b % blocks.parts).count;
  }
  return static_cast<double>(n * granule);
}

/// What a receive costs once its message is in: `reduce` per byte received, or a fixed time.
struct receive_cost {
  double per_reduced_byte = 0;  ///< seconds per byte of a reducing receive
  double per_reduce = 0;        ///< seconds per reducing receive (a merge)
};

/// Walks every rank's steps (`steps_of(rank)`) with messages of `bytes_of(step side, blocks)`
/// bytes on `m`'s links; returns the time the last rank finishes. Throws std::logic_error if
/// the schedules deadlock (a receive no rank ever sends).
inline double walk(int p, const std::function<std::vector<squall::step>(int)>& steps_of,
                   const std::function<double(const squall::block_range&)>& bytes_of,
                   const machine& m, const receive_cost& cost) {
  struct rank_state {
    std::vector<squall::step> steps;
    std::size_t next = 0;
    double now = 0;
    bool posted = false;  // the current step's send is posted; its receive is awaited
  };
  std::vector<rank_state> ranks(static_cast<std::size_t>(p));
  for (int r = 0; r < p; ++r) ranks[static_cast<std::size_t>(r)].steps = steps_of(r);
  std::vector<double> out_free(static_cast<std::size_t>(p), 0);
  std::vector<double> in_free(static_cast<std::size_t>(p), 0);
  std::map<std::pair<int, int>, std::deque<double>> in_flight;  // (from, to): arrival times
  for (bool progress = true; progress;) {
    progress = false;
    // the rank that can act earliest acts first, so the links serve messages in time order
    int who = -1;
    for (int r = 0; r < p; ++r) {
      rank_state& s = ranks[static_cast<std::size_t>(r)];
      if (s.next == s.steps.size()) continue;
      const squall::step& st = s.steps[s.next];
      const bool can =
          !s.posted || st.recv_from == squall::nobody || !in_flight[{st.recv_from, r}].empty();
      if (can && (who < 0 || s.now < ranks[static_cast<std::size_t>(who)].now)) who = r;
    }
    if (who < 0) break;
    progress = true;
    rank_state& s = ranks[static_cast<std::size_t>(who)];
    const squall::step& st = s.steps[s.next];
    if (!s.posted) {
      s.posted = true;
      if (st.send_to != squall::nobody) {
        const double b = bytes_of(st.send);
        const auto to = static_cast<std::size_t>(st.send_to);
        const double leave = std::max(s.now, out_free[static_cast<std::size_t>(who)]);
        out_free[static_cast<std::size_t>(who)] = leave + b / m.rate;
        const double arrive = std::max(leave + m.latency + b / m.rate, in_free[to] + b / m.rate);
        in_free[to] = arrive;
        in_flight[{who, st.send_to}].push_back(arrive);
      }
      continue;  // the receive next time round, once its message is known
    }
    if (st.recv_from != squall::nobody) {
      auto& queue = in_flight[{st.recv_from, who}];
      s.now = std::max(s.now, queue.front());
      queue.pop_front();
      if (st.action == squall::step_action::reduce) {
        s.now += bytes_of(st.recv) * cost.per_reduced_byte + cost.per_reduce;
      }
    }
    s.posted = false;
    ++s.next;
  }
  double last = 0;
  for (const rank_state& s : ranks) {
    if (s.next != s.steps.size()) {
      throw std::logic_error("the schedules deadlock: a receive that no rank sends");
    }
    last = std::max(last, s.now);
  }
  return last;
}

/// The dense allreduce of `bytes` (float elements) over `topology` on `p` ranks.
template <class Topology>
prediction dense(const Topology& topology, int p, std::size_t bytes, const machine& m) {
  prediction out;
  out.transfer = walk(
      p, [&](int r) { return topology.allreduce_schedule(r, p, bytes).steps; },
      [&](const squall::block_range& b) { return block_bytes(b, bytes, 4); }, m,
      {.per_reduced_byte = 1 / m.reduce_rate});
  return out;
}

/// Allgather top-k (`aggregation::gather`) of a float gradient of `bytes` with k entries a
/// rank (`index_bytes` + 4 bytes each, 24 bytes of header) over `topology`'s allgather.
template <class Topology>
prediction gather_topk(const Topology& topology, int p, std::size_t bytes, std::size_t k,
                       std::size_t index_bytes, const machine& m) {
  prediction out;
  out.encode = static_cast<double>(bytes) / m.encode_rate;
  const std::size_t payload = 24 + k * (index_bytes + 4);
  const std::size_t stride = (payload + 7) / 8 * 8;
  const double sizes = p > 1 ? m.latency + static_cast<double>(p - 1) * 8 / m.rate : 0;
  out.transfer = sizes + walk(
                             p, [&](int r) { return topology.allgather_schedule(r, p).steps; },
                             [&](const squall::block_range& b) {
                               return block_bytes(b, stride * static_cast<std::size_t>(p), stride);
                             },
                             m, {});
  out.decode = static_cast<double>(bytes) / m.decode_rate +
               static_cast<double>(p - 1) * static_cast<double>(k) / m.scatter_rate;
  return out;
}

/// gTop-k (`aggregation::gtopk`) with k entries a rank, as `gather_topk` counts them.
inline prediction gtopk(int p, std::size_t bytes, std::size_t k, std::size_t index_bytes,
                        const machine& m) {
  prediction out;
  out.encode = static_cast<double>(bytes) / m.encode_rate;
  const double set = static_cast<double>(k * (index_bytes + 4));
  // each step moves a head and then a set: two messages, one latency more
  machine two = m;
  two.latency = 2 * m.latency;
  out.transfer = walk(
      p, [&](int r) { return squall::detail::binomial_tree_steps(r, p); },
      [&](const squall::block_range&) { return 16 + set; }, two,
      {.per_reduce = 2 * set / m.merge_rate});
  // the gradient zeroed and the global set scattered (counted as transfer in squall)
  out.transfer += static_cast<double>(bytes) / m.fill_rate;
  return out;
}

}  // namespace squall_model
