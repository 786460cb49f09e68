// SPDX-License-Identifier: Apache-2.0
#pragma once
/// `automatic_topology`: picks ring, tree, direct or halving-doubling per call from a cost
/// model of each schedule, the message size and the rank count.

#include <squall/core/error.hpp>
#include <squall/core/link_costs.hpp>
#include <squall/topology/direct.hpp>
#include <squall/topology/halving_doubling.hpp>
#include <squall/topology/ring.hpp>
#include <squall/topology/schedule.hpp>
#include <squall/topology/tree.hpp>

#include <algorithm>  // any_of, find, min
#include <array>
#include <bit>  // bit_width, has_single_bit
#include <charconv>
#include <cmath>    // isfinite
#include <cstddef>  // size_t
#include <fstream>
#include <iterator>  // begin, end
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <system_error>  // errc
#include <type_traits>
#include <vector>

namespace squall {

/// One measurement: an allreduce of `bytes` took `seconds` (the slowest rank, best of a few).
struct cost_point {
  std::size_t bytes = 0;
  double seconds = 0;
  friend constexpr bool operator==(const cost_point&, const cost_point&) = default;
};

/// The cost model behind `automatic_topology`.
///
/// Unmeasured (the default: nothing to run, a communicator starts at once), it is the textbook
/// alpha-beta-gamma model with `link`'s coefficients, which the communicator takes from its
/// transport (`Transport::costs`, core/link_costs.hpp) unless set. For n bytes on P ranks
/// (lg = ceil(log2 P)):
///   ring             2(P-1) alpha + 2(P-1)/P n beta + (P-1)/P n gamma
///   tree             2 lg alpha   + 2 n beta        + n gamma            (pipelined halves)
///   direct           2 a alpha    + 2(P-1)/P n beta + (P-1)/P n gamma    (a = 1 when the
///                    transport reaches all peers at once, P-1 on a one-port link)
///   halving_doubling 2 lg alpha   + 2(P-1)/P n beta + (P-1)/P n gamma, plus 2 alpha + 2 n beta
///                    + n gamma for the fold when P is not a power of two.
/// Measured (`communicator::calibrate`, or `load` of a saved one), each schedule gets its own
/// alpha and beta per size band: the line through the two measurements around n, extended
/// past the last. Measured lines win where copies, not links, decide (shared memory's caches),
/// which no textbook coefficient knows; they hold for the rank count they were taken on.
struct cost_model {
  static constexpr std::size_t candidates = 4;
  static constexpr std::array<std::string_view, candidates> names = {
      ring_topology::name, tree_topology::name, direct_topology::name,
      halving_doubling_topology::name};

  /// The formulas' coefficients; empty: the communicator sets its transport's `costs`.
  std::optional<link_costs> link{};
  /// Per candidate, ascending in bytes; all empty: use the formulas.
  std::array<std::vector<cost_point>, candidates> measured{};
  /// The rank count `measured` was taken on (a communicator of another size refuses it).
  int ranks = 0;
  /// The candidate (an index into `names`) every call runs, whatever the prediction; empty:
  /// the cheapest. `of_name` sets it from a schedule's name (libsquall_mpi's
  /// SQUALL_MPI_TOPOLOGY). Not saved by `to_text`.
  std::optional<std::size_t> only{};

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
    const link_costs k = link.value_or(link_costs{});
    const double p = size;
    const double lg = static_cast<double>(std::bit_width(static_cast<unsigned>(size - 1)));
    const double share = (p - 1) / p;
    const double moved = 2 * share * n * k.beta + share * n * k.gamma;
    switch (c) {
      case 0:
        return 2 * (p - 1) * k.alpha + moved;
      case 1:
        return 2 * lg * k.alpha + 2 * n * k.beta + n * k.gamma;
      case 2:
        return 2 * (k.all_peers_at_once ? 1.0 : p - 1) * k.alpha + moved;
      default: {
        const bool pow2 = std::has_single_bit(static_cast<unsigned>(size));
        return 2 * lg * k.alpha + moved + (pow2 ? 0.0 : 2 * k.alpha + 2 * n * k.beta + n * k.gamma);
      }
    }
  }

  /// The candidate with the least predicted time. On a tie the first in `names` order wins,
  /// except that direct comes first where the formulas say a rank reaches all peers at once
  /// (at P = 2 ring and direct tie; the one-shot reads the peer's memory without staging).
  std::size_t choose(std::size_t bytes, int size) const {
    if (only) return *only;
    const bool one_shot_first = !calibrated() && link && link->all_peers_at_once;
    std::size_t best = one_shot_first ? 2 : 0;
    for (std::size_t c = 0; c < candidates; ++c) {
      if (predict(c, bytes, size) < predict(best, bytes, size)) best = c;
    }
    return best;
  }

  /// The model as text, to keep a calibration for later runs (`save`):
  ///   squall cost model 1
  ///   ranks 4
  ///   link <alpha> <beta> <gamma> <all_peers_at_once 0|1>      (when set)
  ///   measured <schedule> <bytes>:<seconds> ...                (one line per candidate)
  std::string to_text() const {
    std::string text = "squall cost model 1\nranks " + std::to_string(ranks) + "\n";
    if (link) {
      text += "link " + number(link->alpha) + " " + number(link->beta) + " " + number(link->gamma) +
              (link->all_peers_at_once ? " 1\n" : " 0\n");
    }
    for (std::size_t c = 0; c < candidates; ++c) {
      if (measured[c].empty()) continue;
      text += "measured ";
      text += names[c];
      for (const cost_point& point : measured[c]) {
        text += " " + std::to_string(point.bytes) + ":" + number(point.seconds);
      }
      text += "\n";
    }
    return text;
  }

  /// The unmeasured model that always runs the schedule named `name` ("ring", "tree",
  /// "direct", "halving_doubling"), or the cheapest for "automatic"; `invalid_argument`
  /// naming the choices otherwise.
  static cost_model of_name(std::string_view name) {
    cost_model model;
    if (name == "automatic") return model;
    const auto* which = std::find(names.begin(), names.end(), name);
    if (which == names.end()) {
      throw invalid_argument({.operation = "cost_model"},
                             "unknown schedule '" + std::string(name) +
                                 "': automatic, ring, tree, direct or halving_doubling");
    }
    model.only = static_cast<std::size_t>(which - names.begin());
    return model;
  }

  /// Reads what `to_text` wrote; `invalid_argument` naming the line otherwise.
  static cost_model from_text(std::string_view text) {
    cost_model model;
    std::size_t line_number = 0;
    bool header = false;
    while (!text.empty()) {
      const std::size_t end = std::min(text.find('\n'), text.size());
      const std::string_view line = text.substr(0, end);
      text.remove_prefix(std::min(end + 1, text.size()));
      ++line_number;
      std::vector<std::string_view> words = split(line);
      if (words.empty()) continue;
      const auto bad = [&](std::string_view why) {
        return invalid_argument({.operation = "cost_model"}, "line " + std::to_string(line_number) +
                                                                 " (\"" + std::string(line) +
                                                                 "\"): " + std::string(why));
      };
      if (!header) {
        if (line != "squall cost model 1") throw bad("not a squall cost model (version 1)");
        header = true;
      } else if (words[0] == "ranks" && words.size() == 2) {
        model.ranks = static_cast<int>(parse<long>(words[1], bad));
        if (model.ranks < 0) throw bad("ranks must be >= 0");
      } else if (words[0] == "link" && words.size() == 5) {
        link_costs k;
        k.alpha = parse<double>(words[1], bad);
        k.beta = parse<double>(words[2], bad);
        k.gamma = parse<double>(words[3], bad);
        if (words[4] != "0" && words[4] != "1") throw bad("all_peers_at_once is 0 or 1");
        k.all_peers_at_once = words[4] == "1";
        model.link = k;
      } else if (words[0] == "measured" && words.size() >= 4) {
        const auto* which = std::find(names.begin(), names.end(), words[1]);
        if (which == names.end()) throw bad("unknown schedule");
        auto& points = model.measured[static_cast<std::size_t>(which - names.begin())];
        for (std::size_t w = 2; w < words.size(); ++w) {
          const std::size_t colon = words[w].find(':');
          if (colon == std::string_view::npos) throw bad("a point is <bytes>:<seconds>");
          const cost_point point{parse<std::size_t>(words[w].substr(0, colon), bad),
                                 parse<double>(words[w].substr(colon + 1), bad)};
          if (!points.empty() && point.bytes <= points.back().bytes) {
            throw bad("points must ascend in bytes");
          }
          points.push_back(point);
        }
      } else {
        throw bad("expected ranks, link or measured");
      }
    }
    if (!header) throw invalid_argument({.operation = "cost_model"}, "empty text");
    const bool any = std::any_of(model.measured.begin(), model.measured.end(),
                                 [](const auto& points) { return !points.empty(); });
    if (any && (!model.calibrated() || model.ranks < 1)) {
      throw invalid_argument({.operation = "cost_model"},
                             "a measured model needs ranks and two points for every schedule");
    }
    return model;
  }

  /// Writes `to_text()` to `path`; `invalid_argument` if it cannot.
  void save(const std::string& path) const {
    std::ofstream file(path, std::ios::trunc);
    file << to_text();
    file.flush();
    if (!file) {
      throw invalid_argument({.operation = "cost_model save"}, "cannot write " + path);
    }
  }
  /// Reads a model `save` wrote; `invalid_argument` if the file is missing or malformed.
  static cost_model load(const std::string& path) {
    std::ifstream file(path);
    if (!file) throw invalid_argument({.operation = "cost_model load"}, "cannot read " + path);
    std::ostringstream text;
    text << file.rdbuf();
    return from_text(text.str());
  }

  friend bool operator==(const cost_model&, const cost_model&) = default;

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

  // Shortest text that reads back as the same double.
  static std::string number(double x) {
    char text[32];
    const auto end = std::to_chars(std::begin(text), std::end(text), x).ptr;
    return std::string(text, end);
  }

  static std::vector<std::string_view> split(std::string_view line) {
    std::vector<std::string_view> words;
    while (!line.empty()) {
      const std::size_t start = line.find_first_not_of(" \t\r");
      if (start == std::string_view::npos) break;
      line.remove_prefix(start);
      const std::size_t end = std::min(line.find_first_of(" \t\r"), line.size());
      words.push_back(line.substr(0, end));
      line.remove_prefix(end);
    }
    return words;
  }

  template <class Number, class Bad>
  static Number parse(std::string_view word, const Bad& bad) {
    Number value{};
    const auto [end, ec] = std::from_chars(word.data(), word.data() + word.size(), value);
    if (ec != std::errc{} || end != word.data() + word.size()) {
      throw bad("\"" + std::string(word) + "\" is not a number");
    }
    if constexpr (std::is_floating_point_v<Number>) {
      if (!std::isfinite(value) || value < 0) throw bad("a time or cost is finite and >= 0");
    }
    return value;
  }
};

/// Picks the schedule per call: `cost_model::choose(bytes, size)`. Every rank must hold the
/// same model (the communicator's calibration agrees on the slowest rank's times), so every
/// rank picks the same schedule. `allreduce_schedule(...).name` says which was chosen.
struct automatic_topology {
  static constexpr std::string_view name = "automatic";
  /// Every candidate's allreduce schedule suits per-hop requantization.
  static constexpr bool per_hop_schedule = true;
  /// The formulas with the transport's link costs unless set: `communicator::calibrate`
  /// measures it on the ranks at hand, `cost_model::load` reads a saved measurement.
  cost_model model{};

  schedule allreduce_schedule(int rank, int size, std::size_t bytes) const {
    switch (model.choose(bytes, size)) {
      case 0:
        return ring_topology{}.allreduce_schedule(rank, size, bytes);
      case 1:
        return tree_topology{}.allreduce_schedule(rank, size, bytes);
      case 2:
        return direct_topology{}.allreduce_schedule(rank, size, bytes);
      default:
        return halving_doubling_topology{}.allreduce_schedule(rank, size, bytes);
    }
  }
  /// The name of the schedule an allreduce of `bytes` on `size` ranks runs.
  std::string_view choice(std::size_t bytes, int size) const {
    return cost_model::names[model.choose(bytes, size)];
  }
};

}  // namespace squall
