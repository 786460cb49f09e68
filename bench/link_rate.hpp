// SPDX-License-Identifier: Apache-2.0
// A link rate as tc writes it, for squall-bench --link-rate and squall-scale-model --rate.
#pragma once

#include <cstdlib>  // strtod
#include <string>

namespace squall_bench {

/// Bits per second of `text`: a positive number with tc's unit (kbit, mbit, gbit; 1000-based)
/// or, where `bare` allows it, none; 0 for anything else.
inline double link_rate_bits(const std::string& text, bool bare) {
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  const std::string unit(end);
  const double scale = unit == "gbit"         ? 1e9
                       : unit == "mbit"       ? 1e6
                       : unit == "kbit"       ? 1e3
                       : unit.empty() && bare ? 1
                                              : 0;
  if (end == text.c_str() || scale == 0 || !(v > 0)) return 0;
  return v * scale;
}

}  // namespace squall_bench
