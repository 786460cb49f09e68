// SPDX-License-Identifier: Apache-2.0
#pragma once
// The OFP8 formats' values by the specification's formula, and a run in both x86 floating-point
// modes: the references of the fp8 conversion and decode tests.

#include <cmath>
#include <cstdint>
#include <limits>

#if defined(__SSE__)
#include <xmmintrin.h>  // the floating-point modes
#endif

namespace squall::test {

/// The value of `code` of `Format` (`squall::detail::e4m3_format` or `e5m2_format`) by the OFP8
/// specification, in double: NaN for NaN codes, infinity for E5M2's infinities.
template <class Format>
double float8_reference_value(std::uint8_t code) {
  constexpr int m = Format::man_bits;
  constexpr int e = Format::exp_bits;
  constexpr int bias = Format::bias;
  const double sign = (code & 0x80) != 0 ? -1.0 : 1.0;
  const int exponent = (code >> m) & ((1 << e) - 1);
  const int fraction = code & ((1 << m) - 1);
  if constexpr (e == 4) {
    if (exponent == 15 && fraction == 7) return std::numeric_limits<double>::quiet_NaN();
  } else {
    if (exponent == 31) {
      return fraction == 0 ? sign * std::numeric_limits<double>::infinity()
                           : std::numeric_limits<double>::quiet_NaN();
    }
  }
  if (exponent == 0) return sign * std::ldexp(fraction, 1 - bias - m);
  return sign * std::ldexp(1.0 + std::ldexp(fraction, -m), exponent - bias);
}

/// `check` with the default floating-point modes, then (on x86) with denormals-are-zero and
/// flush-to-zero set, which must not change an 8-bit float's decode: it reads and makes no
/// subnormal float.
template <class F>
void in_both_float_modes(F&& check) {
  check();
#if defined(__SSE__)
  const unsigned mode = _mm_getcsr();
  _mm_setcsr(mode | 0x8040u);  // flush-to-zero (bit 15), denormals-are-zero (bit 6)
  check();
  _mm_setcsr(mode);
#endif
}

}  // namespace squall::test
