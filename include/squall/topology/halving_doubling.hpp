// SPDX-License-Identifier: Apache-2.0
#pragma once
/// `halving_doubling_topology`: Rabenseifner's allreduce, recursive halving reduce-scatter
/// then recursive doubling allgather, with the standard fold for non-powers of two.

#include <squall/topology/schedule.hpp>

#include <bit>      // bit_floor
#include <cstddef>  // size_t
#include <string_view>

namespace squall {

/// log2 P' steps each way over P' = the largest power of two <= P, sending (P'-1)/P' of the
/// data each way like the ring but in log P' steps. With r = P - P' > 0, the first 2r ranks
/// pair up: each even one folds its data into the odd one beside it before, and gets the
/// result back after (Thakur, Rabenseifner and Gropp 2005, section 4.2). An allreduce
/// schedule only: broadcast, reduce-scatter and allgather use the communicator's defaults.
struct halving_doubling_topology {
  static constexpr std::string_view name = "halving_doubling";
  /// Its allreduce schedule suits per-hop requantization (algorithm/detail/requantize.hpp).
  static constexpr bool per_hop_schedule = true;

  schedule allreduce_schedule(int rank, int size, std::size_t /*bytes*/) const {
    schedule s{.name = name};
    const int pow2 = static_cast<int>(std::bit_floor(static_cast<unsigned>(size)));
    const int extra = size - pow2;
    // fold: even ranks below 2*extra send everything to the odd rank after them, and sit out.
    if (rank < 2 * extra) {
      if (rank % 2 == 0) {
        s.steps.push_back(send_step(rank + 1, whole_buffer));
        s.steps.push_back(recv_step(rank + 1, whole_buffer, step_action::copy));
        s.steps.back().new_phase = true;  // every piece goes out before the result comes back
        return s;
      }
      s.steps.push_back(recv_step(rank - 1, whole_buffer, step_action::reduce));
    }
    const int v = rank < 2 * extra ? rank / 2 : rank - extra;
    auto real = [extra](int u) { return u < extra ? 2 * u + 1 : u + extra; };
    const auto parts = static_cast<std::size_t>(pow2);
    // halving: at distance d keep the half of the current range on v's side of bit d, send
    // the other half to v^d and reduce the half v^d sends back. v ends with block v.
    std::size_t first = 0;
    std::size_t count = parts;
    for (int d = pow2 / 2; d >= 1; d /= 2) {
      const std::size_t half = count / 2;
      const bool upper = (v & d) != 0;
      const block_range keep{.first = upper ? first + half : first, .count = half, .parts = parts};
      const block_range give{.first = upper ? first : first + half, .count = half, .parts = parts};
      s.steps.push_back({.send_to = real(v ^ d),
                         .send = give,
                         .recv_from = real(v ^ d),
                         .recv = keep,
                         .action = step_action::reduce});
      first = keep.first;
      count = half;
    }
    // doubling: at distance d send the range held so far to v^d, copy in its range.
    for (int d = 1; d < pow2; d *= 2) {
      const bool upper = (v & d) != 0;
      const block_range mine{.first = first, .count = count, .parts = parts};
      const block_range theirs{
          .first = upper ? first - count : first + count, .count = count, .parts = parts};
      s.steps.push_back({.send_to = real(v ^ d),
                         .send = mine,
                         .recv_from = real(v ^ d),
                         .recv = theirs,
                         .action = step_action::copy});
      first = upper ? first - count : first;
      count *= 2;
    }
    // unfold: give the folded rank the result.
    if (rank < 2 * extra) {
      s.steps.push_back(send_step(rank - 1, whole_buffer));
      s.steps.back().new_phase = true;
    }
    return s;
  }
};

}  // namespace squall
