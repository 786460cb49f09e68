// SPDX-License-Identifier: Apache-2.0
#pragma once
/// The vocabulary of schedules: what a topology returns and the executor walks.
///
/// A collective's buffer is cut into `parts` near-equal blocks (`detail::split_range`). A step
/// sends a range of blocks to one peer and/or receives a range of blocks from one peer, then
/// copies the received blocks into place or reduces them into place. Schedules are pure data:
/// no I/O, no buffers, so tests run them exhaustively on the host (tests/unit/schedule.test.cpp).
///
/// The executor cuts every block into pieces of at most `chunk_bytes` and walks the steps of a
/// *phase* once per piece index (chunk-major, as NCCL's `runRing`), so consecutive steps of
/// successive pieces overlap. A phase is a maximal run of steps with the same `parts` that
/// no step marks `new_phase`; a phase runs to the end on this rank before the next starts.
///
/// Invariant every schedule keeps: a region a step sends is overwritten later only with values
/// that depend on that send having been received (true of every reduce-then-distribute
/// schedule), so outstanding sends need no wait before their region changes.

#include <squall/detail/math.hpp>

#include <cstddef>  // size_t
#include <string_view>
#include <utility>  // move
#include <vector>

namespace squall {

/// Blocks `[first, first + count)` of a buffer cut into `parts` near-equal blocks.
struct block_range {
  std::size_t first = 0;
  std::size_t count = 0;
  std::size_t parts = 1;
  friend constexpr bool operator==(const block_range&, const block_range&) = default;
};

/// The whole buffer as one block.
inline constexpr block_range whole_buffer{.first = 0, .count = 1, .parts = 1};

/// What a step does with the blocks it receives.
enum class step_action : unsigned char {
  none,    ///< receives nothing
  copy,    ///< the received blocks replace this rank's
  reduce,  ///< the received blocks are reduced into this rank's (dst = dst op received)
};

/// No peer: the step does not send (`send_to`) or does not receive (`recv_from`).
inline constexpr int nobody = -1;

/// One step of a schedule: send `send` to `send_to`, receive `recv` from `recv_from` and apply
/// `action` to it. Either side may be absent (`nobody`).
struct step {
  int send_to = nobody;
  block_range send{};
  int recv_from = nobody;
  block_range recv{};
  step_action action = step_action::none;
  /// Starts a new phase even when `parts` does not change (tree: broadcast down only after
  /// every piece went up, so the pieces pipeline through each half).
  bool new_phase = false;
  friend constexpr bool operator==(const step&, const step&) = default;
};

/// The steps one rank runs for one collective, and the schedule's name.
struct schedule {
  std::string_view name{};
  std::vector<step> steps{};
  /// The one-shot schedule (`direct_topology`): on a `direct_transport` the executor runs it
  /// through the peers' windows instead of messages (publish, reduce own slice out of every
  /// window, gather the slices).
  bool one_shot = false;
};

/// A step that sends `blocks` to `peer`.
constexpr step send_step(int peer, block_range blocks) { return {.send_to = peer, .send = blocks}; }
/// A step that receives `blocks` from `peer` and applies `action`.
constexpr step recv_step(int peer, block_range blocks, step_action action) {
  return {.recv_from = peer, .recv = blocks, .action = action};
}

namespace detail {

/// `a mod p` in `[0, p)` for any int `a` and `p > 0`.
constexpr int wrap(int a, int p) { return ((a % p) + p) % p; }

/// Appends `part`'s steps to `into` with every peer `p` renamed `ranks[p]`: how a schedule of
/// a subgroup (the ranks of one node, the node leaders) becomes steps of the whole job.
inline void append_mapped(std::vector<step>& into, const std::vector<step>& part,
                          const std::vector<int>& ranks) {
  for (step s : part) {
    if (s.send_to != nobody) s.send_to = ranks[static_cast<std::size_t>(s.send_to)];
    if (s.recv_from != nobody) s.recv_from = ranks[static_cast<std::size_t>(s.recv_from)];
    into.push_back(s);
  }
}

/// The heap-ordered binary tree over `size` ranks rooted at virtual rank 0: parent and
/// children of virtual rank `v`.
constexpr int tree_parent(int v) { return v == 0 ? nobody : (v - 1) / 2; }
constexpr int tree_child(int v, int which) { return 2 * v + 1 + which; }

/// Reduce to `root` up a pipelined binary tree: receive and reduce from each child, then send
/// the partial to the parent. `root` ends with the total.
inline std::vector<step> tree_reduce_steps(int rank, int size, int root) {
  std::vector<step> steps{};
  const int v = wrap(rank - root, size);
  auto real = [&](int u) { return wrap(u + root, size); };
  for (int which = 0; which < 2; ++which) {
    const int child = tree_child(v, which);
    if (child < size) steps.push_back(recv_step(real(child), whole_buffer, step_action::reduce));
  }
  if (v != 0) steps.push_back(send_step(real(tree_parent(v)), whole_buffer));
  return steps;
}

/// Broadcast from `root` down the same tree: receive from the parent, send to each child.
inline std::vector<step> tree_broadcast_steps(int rank, int size, int root) {
  std::vector<step> steps{};
  const int v = wrap(rank - root, size);
  auto real = [&](int u) { return wrap(u + root, size); };
  if (v != 0) steps.push_back(recv_step(real(tree_parent(v)), whole_buffer, step_action::copy));
  for (int which = 0; which < 2; ++which) {
    const int child = tree_child(v, which);
    if (child < size) steps.push_back(send_step(real(child), whole_buffer));
  }
  if (!steps.empty()) steps.front().new_phase = true;
  return steps;
}

/// The binomial tree's allreduce of the whole buffer, rooted at rank 0, with the fold for
/// sizes that are not powers of two (P2 = bit_floor(P), extra = P - P2): reduce: rank
/// r >= P2 sends to r - P2, which reduces it; then for d = 1, 2, ..., P2 / 2 rank r with
/// r mod 2d = d sends to r - d and rank r with r mod 2d = 0 receives from r + d and reduces;
/// broadcast (a new phase): each rank r < P2 but 0 receives from r - (r & -r), then sends to
/// r + d for d from half its lowest set bit (P2 / 2 at rank 0) down to 1, and to r + P2 if
/// r < extra; rank r >= P2 receives from r - P2. One send or one receive per step, so a
/// walker may forward what it received. gTop-k's merge tree (algorithm/detail/gtopk.hpp)
/// walks it with sparse sets in place of elements.
inline std::vector<step> binomial_tree_steps(int rank, int size) {
  std::vector<step> steps;
  int p2 = 1;
  while (p2 * 2 <= size) p2 *= 2;
  const int extra = size - p2;
  // reduce
  if (rank >= p2) {
    steps.push_back(send_step(rank - p2, whole_buffer));
  } else {
    if (rank < extra) steps.push_back(recv_step(rank + p2, whole_buffer, step_action::reduce));
    for (int d = 1; d < p2; d *= 2) {
      if (rank % (2 * d) == d) {
        steps.push_back(send_step(rank - d, whole_buffer));
        break;
      }
      steps.push_back(recv_step(rank + d, whole_buffer, step_action::reduce));
    }
  }
  // broadcast
  const std::size_t down = steps.size();
  if (rank >= p2) {
    steps.push_back(recv_step(rank - p2, whole_buffer, step_action::copy));
  } else {
    int d = p2 / 2;
    if (rank != 0) {
      const int low = rank & -rank;  // the round this rank sent in
      steps.push_back(recv_step(rank - low, whole_buffer, step_action::copy));
      d = low / 2;
    }
    for (; d >= 1; d /= 2) steps.push_back(send_step(rank + d, whole_buffer));
    if (rank < extra) steps.push_back(send_step(rank + p2, whole_buffer));
  }
  if (down < steps.size()) steps[down].new_phase = true;
  return steps;
}

/// The ring's `size - 1` steps over `size` blocks: step k sends block r-k-`lag` to r+1 and
/// receives block r-k-`lag`-1 from r-1, applying `action`.
inline std::vector<step> ring_steps(int rank, int size, int lag, step_action action) {
  std::vector<step> steps;
  const auto parts = static_cast<std::size_t>(size);
  auto block = [&](int b) {
    return block_range{
        .first = static_cast<std::size_t>(wrap(b, size)), .count = 1, .parts = parts};
  };
  for (int k = 0; k + 1 < size; ++k) {
    steps.push_back({.send_to = wrap(rank + 1, size),
                     .send = block(rank - k - lag),
                     .recv_from = wrap(rank - 1, size),
                     .recv = block(rank - k - lag - 1),
                     .action = action});
  }
  return steps;
}

/// Ring reduce-scatter: after `size - 1` steps rank r holds block r reduced over all ranks
/// (step k: send block r-k-1, reduce block r-k-2).
inline std::vector<step> ring_reduce_scatter_steps(int rank, int size) {
  return ring_steps(rank, size, 1, step_action::reduce);
}

/// Ring allgather, rank r starting with block r (step k: send block r-k, copy block r-k-1).
inline std::vector<step> ring_allgather_steps(int rank, int size) {
  return ring_steps(rank, size, 0, step_action::copy);
}

}  // namespace detail
}  // namespace squall
