// SPDX-License-Identifier: Apache-2.0
#pragma once
/// `link_costs`: what a transport's messages cost, the coefficients of the alpha-beta-gamma
/// model that `automatic_topology` predicts schedules with before (or without) measuring.

#include <concepts>  // convertible_to

namespace squall {

/// The textbook model of one message of n bytes: alpha + n beta to move it, n gamma to reduce
/// it. A transport states its own as `static constexpr link_costs costs` (documented figures
/// of the hardware it is meant for); one that does not gets these defaults.
struct link_costs {
  /// Seconds per message (latency).
  double alpha = 2e-6;
  /// Seconds per byte moved (1 / bandwidth).
  double beta = 1.0 / 8e9;
  /// Seconds per byte reduced (1 / reduction bandwidth).
  double gamma = 1.0 / 16e9;
  /// True where a rank reaches all its peers at once for the price of one message (the
  /// peer-memory paths of shared memory: a one-shot schedule pays one alpha); false for a
  /// one-port network, where a rank's messages go one after another.
  bool all_peers_at_once = false;
  friend constexpr bool operator==(const link_costs&, const link_costs&) = default;
};

/// `Transport::costs` where the transport states them, `link_costs{}` otherwise.
template <class Transport>
constexpr link_costs link_costs_of() {
  if constexpr (requires {
                  { Transport::costs } -> std::convertible_to<link_costs>;
                }) {
    return Transport::costs;
  } else {
    return link_costs{};
  }
}

}  // namespace squall
