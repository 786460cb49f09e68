// SPDX-License-Identifier: Apache-2.0
#pragma once
/// `compression_traits<C>`: what the algorithm layer asks of a compressor at compile time.

#include <squall/concepts.hpp>

namespace squall {

/// Compile-time facts about compressor `C`, derived from its declarations.
template <compressor C>
struct compression_traits {
  /// Which allreduce algorithm the payloads need.
  static constexpr aggregation_class aggregation = C::aggregation;
  /// Payloads add (C(a) + C(b) = C(a + b)), so topologies reduce them directly.
  static constexpr bool linear = C::aggregation == aggregation_class::linear;
  /// Every rank's payload has the same size for the same count, so the size exchange is
  /// skipped (GRACE's `tensors_size_are_same`). True if `C` says so.
  static constexpr bool fixed_size = [] {
    if constexpr (requires { C::fixed_size; }) {
      return static_cast<bool>(C::fixed_size);
    } else {
      return false;
    }
  }();
};

}  // namespace squall
