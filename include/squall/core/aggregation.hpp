// SPDX-License-Identifier: Apache-2.0
#pragma once
/// `aggregation`: how a compressed allreduce sums the ranks' payloads, and `aggregation_set`,
/// the ones a compressor allows.

#include <array>
#include <cstddef>  // size_t
#include <cstdint>  // uint8_t
#include <initializer_list>
#include <iterator>  // size
#include <string>
#include <string_view>

namespace squall {

/// How a compressed allreduce sums the ranks' payloads: one vocabulary for what a compressor
/// allows (`C::aggregations`), what `collective_tuning::aggregation` asks for, and what the
/// communicator runs (`communicator::aggregation()`, carried in the call signature).
enum class aggregation : std::uint8_t {
  automatic = 0,  ///< (a request) the compressor's first allowed one the topology runs
  linear,         ///< C(a) + C(b) = C(a + b): payload bodies summed by the topology's schedule
  low_rank,       ///< PowerSGD's two sums of small factors through the topology's schedule
  per_hop,        ///< decode, add, re-encode at each hop of the topology's schedule (CGX)
  gtopk,          ///< sparse sets merged pairwise up a tree keeping the k largest (gTop-k)
  gather,         ///< every payload gathered, decoded and summed (a majority vote for sign_vote)
  two_round,      ///< a sketch summed to find k coordinates, then their exact values summed
};

/// "automatic", "linear", "low_rank", "per_hop", "gtopk", "gather", "two_round".
constexpr std::string_view to_string(aggregation a) {
  constexpr std::string_view names[] = {"automatic", "linear", "low_rank", "per_hop",
                                        "gtopk",     "gather", "two_round"};
  const auto i = static_cast<std::size_t>(a);
  return i < std::size(names) ? names[i] : std::string_view("?");
}

/// The aggregations a compressor's payloads allow, in its order of preference:
/// `static constexpr aggregation_set aggregations{aggregation::per_hop, aggregation::gather};`
class aggregation_set {
 public:
  constexpr aggregation_set(std::initializer_list<aggregation> list) {
    for (aggregation a : list) {
      if (size_ < items_.size() && !contains(a)) items_[size_++] = a;
    }
  }
  constexpr bool contains(aggregation a) const {
    for (std::size_t i = 0; i < size_; ++i) {
      if (items_[i] == a) return true;
    }
    return false;
  }
  constexpr std::size_t size() const { return size_; }
  constexpr aggregation operator[](std::size_t i) const { return items_[i]; }
  /// "per_hop, gather"
  std::string names() const {
    std::string text;
    for (std::size_t i = 0; i < size_; ++i) {
      if (i != 0) text += ", ";
      text += to_string(items_[i]);
    }
    return text;
  }

 private:
  std::array<aggregation, 7> items_{};
  std::size_t size_ = 0;
};

}  // namespace squall
