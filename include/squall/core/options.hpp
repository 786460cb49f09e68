// SPDX-License-Identifier: Apache-2.0
#pragma once
/// Run-time settings of a communicator: the deadline of every wait, and the mismatch check.

#include <squall/core/error.hpp>

#include <chrono>
#include <cmath>    // isfinite
#include <cstdlib>  // getenv, strtod
#include <optional>
#include <string>
#include <string_view>

namespace squall {

/// The deadline of any wait when neither the communicator nor the environment sets one.
inline constexpr std::chrono::seconds default_deadline{300};

/// The environment variable that overrides `default_deadline`, in seconds (decimals allowed).
inline constexpr const char* timeout_env_var = "SQUALL_TIMEOUT_S";

/// The longest deadline accepted, so that `steady_clock::now() + deadline` never overflows.
inline constexpr std::chrono::seconds max_deadline{1'000'000'000};

/// Parses a deadline given in seconds ("300", "0.25"); throws `invalid_argument` naming
/// `source` unless the text is a whole finite number in `(0, max_deadline]`.
inline std::chrono::nanoseconds parse_deadline_seconds(std::string_view text,
                                                       std::string_view source) {
  const std::string copy(text);
  char* end = nullptr;
  const double seconds = copy.empty() ? 0.0 : std::strtod(copy.c_str(), &end);
  const bool whole = !copy.empty() && end == copy.c_str() + copy.size();
  if (!whole || !std::isfinite(seconds) || seconds <= 0.0 ||
      seconds > static_cast<double>(max_deadline.count())) {
    throw invalid_argument(
        {.operation = "options"},
        std::string(source) + "='" + copy + "' is not a number of seconds in (0, 1e9]");
  }
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
      std::chrono::duration<double>(seconds));
}

/// The settings a communicator is built with. A default-constructed `options` takes its
/// deadline from `SQUALL_TIMEOUT_S`, else `default_deadline`; setting `deadline` overrides both.
struct options {
  /// How long any single wait may last before it throws `timeout_error`.
  std::optional<std::chrono::nanoseconds> deadline = {};
  /// Whether each collective first checks, cheaply, that every rank called the same
  /// collective with the same count, element type and op (`mismatch_error` if not).
  bool check_mismatch = true;
  /// Whether each compressed allreduce and allgather first checks every rank's input for NaN
  /// and infinity: if any rank has one, every rank throws `invalid_argument` naming that rank
  /// and element before anything is encoded or sent, so no payload, sum or error-feedback
  /// residual takes it in. Costs a pass over the input and a 8-byte exchange per call.
  bool check_finite = false;

  /// The deadline in force: `deadline` if set, else the environment, else 300 s.
  /// Throws `invalid_argument` for a non-positive or unparsable value.
  std::chrono::nanoseconds resolved_deadline() const {
    if (deadline) {
      if (deadline->count() <= 0 || *deadline > max_deadline) {
        throw invalid_argument({.operation = "options"},
                               "deadline must be positive and at most 1e9 s");
      }
      return *deadline;
    }
    if (const char* text = std::getenv(timeout_env_var)) {
      return parse_deadline_seconds(text, timeout_env_var);
    }
    return default_deadline;
  }
};

}  // namespace squall
