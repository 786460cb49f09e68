// SPDX-License-Identifier: Apache-2.0
#pragma once
/// `automatic_topology`: picks ring, tree, direct or halving-doubling per call from a cost
/// model of each schedule, the message size and the rank count.

#include <squall/topology/direct.hpp>
#include <squall/topology/halving_doubling.hpp>
#include <squall/topology/ring.hpp>
#include <squall/topology/schedule.hpp>
#include <squall/topology/tree.hpp>

#include <array>
#include <bit>      // bit_width
#include <cstddef>  // size_t
#include <string_view>
#include <vector>

namespace squall {

/// One measurement: an allreduce of `bytes` took `seconds` (the slowest rank, best of a few).
struct cost_point {
  std::size_t bytes = 0;
  double seconds = 0;
};

/// The cost model behind `automatic_topology`.
///
/// Uncalibrated, it is the textbook alpha-beta-gamma model (alpha: latency of a message,
/// beta: seconds per byte moved, gamma: seconds per byte reduced), with these coefficients
/// for n bytes on P ranks (lg = ceil(log2 P)):
///   ring             2(P-1) alpha + 2(P-1)/P n beta + (P-1)/P n gamma
///   tree             2 lg alpha   + 2 n beta        + n gamma            (pipelined halves)
///   direct           2 alpha      + 2(P-1)/P n beta + (P-1)/P n gamma    (all peers at once)
///   halving_doubling 2 lg alpha   + 2(P-1)/P n beta + (P-1)/P n gamma, plus 2 alpha + 2 n beta
///                    + n gamma for the fold when P is not a power of two.
/// Calibrated (the communicator measures each schedule once, on its own ranks, at sizes 4 KiB
/// to 16 MiB in steps of 4), each schedule gets its own alpha and beta per size band: the
/// line through the two measurements around n, extended past the last. Measured constants
/// win on shared memory, where copies, not links, decide, and no textbook coefficient knows
/// how a schedule's copies fall in the caches.
struct cost_model {
  static constexpr std::size_t candidates = 4;
  static constexpr std::array<std::string_view, candidates> names = {
      ring_topology::name, tree_topology::name, direct_topology::name,
      halving_doubling_topology::name};

  double alpha = 2e-6;
  double beta = 1.0 / 8e9;
  double gamma = 1.0 / 16e9;
  /// Per candidate, ascending in bytes; all empty: use the formulas.
  std::array<std::vector<cost_point>, candidates> measured{};

  bool calibrated() const {
    for (const auto& m : measured) {
      if (m.size() < 2) return false;
    }
    return true;
  }

  /// Predicted seconds of candidate `c` for `bytes` on `size` ranks.
  double predict(std::size_t c, std::size_t bytes, int size) const {
    const double n = static_cast<double>(bytes);
    if (calibrated()) return interpolate(measured[c], n);
    const double p = size;
    const double lg = static_cast<double>(std::bit_width(static_cast<unsigned>(size - 1)));
    const double share = (p - 1) / p;
    switch (c) {
      case 0: return 2 * (p - 1) * alpha + 2 * share * n * beta + share * n * gamma;
      case 1: return 2 * lg * alpha + 2 * n * beta + n * gamma;
      case 2: return 2 * alpha + 2 * share * n * beta + share * n * gamma;
      default: {
        const bool pow2 = std::has_single_bit(static_cast<unsigned>(size));
        return 2 * lg * alpha + 2 * share * n * beta + share * n * gamma +
               (pow2 ? 0.0 : 2 * alpha + 2 * n * beta + n * gamma);
      }
    }
  }

  /// The candidate with the least predicted time (the first on a tie).
  std::size_t choose(std::size_t bytes, int size) const {
    std::size_t best = 0;
    for (std::size_t c = 1; c < candidates; ++c) {
      if (predict(c, bytes, size) < predict(best, bytes, size)) best = c;
    }
    return best;
  }

 private:
  static double interpolate(const std::vector<cost_point>& m, double n) {
    std::size_t i = 0;
    while (i + 2 < m.size() && static_cast<double>(m[i + 1].bytes) < n) ++i;
    const double n0 = static_cast<double>(m[i].bytes);
    const double n1 = static_cast<double>(m[i + 1].bytes);
    const double slope = n1 > n0 ? (m[i + 1].seconds - m[i].seconds) / (n1 - n0) : 0.0;
    const double t = m[i].seconds + slope * (n - n0);
    return t > 0 ? t : m[i].seconds;
  }
};

/// Picks the schedule per call: `cost_model::choose(bytes, size)`. Every rank must hold the
/// same model (the communicator's calibration agrees on the slowest rank's times), so every
/// rank picks the same schedule. `allreduce_schedule(...).name` says which was chosen.
struct automatic_topology {
  static constexpr std::string_view name = "automatic";
  /// Set it (`model.measured`, or `alpha`/`beta`/`gamma` with measured left empty... see
  /// `cost_model`) to skip the communicator's calibration.
  cost_model model{};
  /// The largest allreduce the calibration times (it runs 4 KiB, 16 KiB, ... up to this).
  std::size_t calibrate_up_to = std::size_t{16} << 20;

  schedule allreduce_schedule(int rank, int size, std::size_t bytes) const {
    switch (model.choose(bytes, size)) {
      case 0: return ring_topology{}.allreduce_schedule(rank, size, bytes);
      case 1: return tree_topology{}.allreduce_schedule(rank, size, bytes);
      case 2: return direct_topology{}.allreduce_schedule(rank, size, bytes);
      default: return halving_doubling_topology{}.allreduce_schedule(rank, size, bytes);
    }
  }
  /// The name of the schedule an allreduce of `bytes` on `size` ranks runs.
  std::string_view choice(std::size_t bytes, int size) const {
    return cost_model::names[model.choose(bytes, size)];
  }
};

}  // namespace squall
