// SPDX-License-Identifier: Apache-2.0
#pragma once
/// The 8-bit floating-point wire types of the OCP 8-bit Floating Point Specification (OFP8,
/// 2023), as NVIDIA Hopper, NCCL 2.24+ and Transformer Engine use them (issue 17):
///   `float8_e4m3`: 4 exponent bits (bias 7), 3 fraction bits; no infinities, one NaN per sign
///                  (S.1111.111); largest 448, smallest normal 2^-6, subnormal step 2^-9.
///   `float8_e5m2`: 5 exponent bits (bias 15), 2 fraction bits, IEEE-like with infinities and
///                  NaNs; largest finite 57344, smallest normal 2^-14, subnormal step 2^-16.
/// They are wire types, not `element`s: nothing is reduced in 8 bits. Conversion from float
/// rounds to nearest, ties to even, and saturates: a finite value or an infinity beyond the
/// largest finite value becomes it, with its sign (the "SATFINITE" conversion of CUDA's
/// `__nv_cvt_float_to_fp8`, which gradient scaling relies on); a NaN stays a NaN. `stochastic`
/// rounds up with probability equal to the fraction of a step dropped, from 32 random bits.
/// Conversion to float is exact.

#include <squall/core/config.hpp>
#include <squall/core/types.hpp>

#include <cstdint>
#include <type_traits>

namespace squall {
namespace detail {

/// The layout `round_to_nearest_even` rounds to for an 8-bit format: `man_bits` and `bias` of
/// the format, and an exponent field wide enough that no float overflows it (the caller
/// saturates), `total_bits` counted without the sign (the caller adds it at bit 7).
template <int ManBits, int Bias>
struct float8_rounding {
  static constexpr int exp_bits = 8;
  static constexpr int man_bits = ManBits;
  static constexpr int bias = Bias;
  static constexpr int total_bits = 1 + exp_bits + man_bits;
};

/// What distinguishes the two formats: fraction bits, bias, the largest finite magnitude's
/// bits, and the NaN the conversions produce (its magnitude bits); and what the conversions
/// and the host kernels derive from them.
template <int ManBits, int Bias, std::uint8_t MaxFinite, std::uint8_t QuietNan>
struct float8_format {
  static constexpr int man_bits = ManBits;
  static constexpr int exp_bits = 7 - ManBits;
  static constexpr int bias = Bias;
  static constexpr std::uint8_t max_finite = MaxFinite;
  static constexpr std::uint8_t quiet_nan = QuietNan;
  using rounding = float8_rounding<ManBits, Bias>;
  /// float's exponent bias less the format's, in float's exponent field: what a normal code's
  /// bits moved to float's places gain (and a float's bits lose on the way to a code)
  static constexpr std::uint32_t rebias = static_cast<std::uint32_t>(127 - Bias) << 23;
  /// the float bits of the format's smallest normal value, 2^(1 - bias)
  static constexpr std::uint32_t smallest_normal = static_cast<std::uint32_t>(128 - Bias) << 23;
  /// the magnitude bits of E5M2's infinity, S.11111.00 (E4M3 has none: no 7-bit magnitude)
  static constexpr std::uint32_t infinity_code = 7 - ManBits == 5 ? 0x7cu : 0x100u;
};
using e4m3_format = float8_format<3, 7, 0x7e, 0x7f>;
using e5m2_format = float8_format<2, 15, 0x7b, 0x7e>;

/// float -> 8 bits of `Format`, to nearest even, saturating; NaN -> the format's quiet NaN
/// with the input's sign. Through `round_to_nearest_even` (the reference form; branches).
template <class Format>
SQUALL_HOST_DEVICE constexpr std::uint8_t float_to_float8_reference(float value) noexcept {
  const std::uint32_t bits = detail::bit_cast<std::uint32_t>(value);
  const auto sign = static_cast<std::uint8_t>((bits >> 24) & 0x80u);
  const std::uint32_t magnitude = bits & 0x7fffffffu;
  if (magnitude > 0x7f800000u) return static_cast<std::uint8_t>(sign | Format::quiet_nan);
  const std::uint32_t rounded =
      round_to_nearest_even<typename Format::rounding, binary32_format>(magnitude);
  const std::uint32_t kept = rounded > Format::max_finite ? Format::max_finite : rounded;
  return static_cast<std::uint8_t>(sign | kept);
}

/// The same conversion without branches (selects and a min only, so g++ vectorizes loops
/// over it), as `binary32_to_binary16` does: normal results rebias the exponent and round at
/// bit 23 - m by adding half a step less one plus the lowest kept bit (a carry moves into the
/// exponent, which is right); subnormal results come from the float adder, adding a power of
/// two whose ulp is the format's subnormal step (2^14 for E4M3, 2^7 for E5M2), which rounds to
/// nearest even. Then saturation to the largest finite code, and NaN. Needs round-to-nearest
/// float addition. Equal to `float_to_float8_reference` for every float (tests/unit).
template <class Format>
SQUALL_HOST_DEVICE SQUALL_FORCEINLINE constexpr std::uint8_t float_to_float8(float value) noexcept {
  constexpr int shift = 23 - Format::man_bits;
  constexpr std::uint32_t rebias = Format::rebias;
  constexpr std::uint32_t smallest_normal = Format::smallest_normal;
  constexpr std::uint32_t adder_bits =
      static_cast<std::uint32_t>(127 + 24 - Format::bias - Format::man_bits) << 23;
  const std::uint32_t bits = detail::bit_cast<std::uint32_t>(value);
  const std::uint32_t sign = (bits >> 24) & 0x80u;
  const std::uint32_t magnitude = bits & 0x7fffffffu;
  const std::uint32_t normal =
      (magnitude - rebias + ((1u << (shift - 1)) - 1u) + ((magnitude >> shift) & 1u)) >> shift;
  const std::uint32_t subnormal =
      detail::bit_cast<std::uint32_t>(detail::bit_cast<float>(magnitude) +
                                      detail::bit_cast<float>(adder_bits)) -
      adder_bits;
  std::uint32_t out = select_bits(magnitude < smallest_normal, subnormal, normal);
  out = out < Format::max_finite ? out : Format::max_finite;
  out = select_bits(magnitude > 0x7f800000u, Format::quiet_nan, out);
  return static_cast<std::uint8_t>(sign | out);
}

/// 8 bits of `Format` -> float, exactly: NaN for the format's NaNs, infinity for e5m2's.
/// Without branches (selects only, so g++ vectorizes loops over it): a normal code's exponent
/// and fraction moved to float's places and the exponent rebiased; a subnormal code's fraction
/// times the subnormal step 2^(1 - bias - m). Both are exact and neither reads or makes a float
/// subnormal, so the flush-to-zero and denormals-are-zero modes do not change the result.
template <class Format>
SQUALL_HOST_DEVICE SQUALL_FORCEINLINE constexpr float float8_to_float(std::uint8_t code) noexcept {
  constexpr int m = Format::man_bits;
  constexpr float unit =
      detail::bit_cast<float>(static_cast<std::uint32_t>(127 + 1 - Format::bias - m) << 23);
  const std::uint32_t magnitude = code & 0x7fu;
  const std::uint32_t normal = (magnitude << (23 - m)) + Format::rebias;
  const std::uint32_t subnormal =
      detail::bit_cast<std::uint32_t>(static_cast<float>(magnitude) * unit);
  std::uint32_t out = select_bits(magnitude < (1u << m), subnormal, normal);
  const std::uint32_t special =
      select_bits(magnitude == Format::infinity_code, 0x7f800000u, 0x7fc00000u);
  out = select_bits(magnitude > Format::max_finite, special, out);
  return detail::bit_cast<float>((static_cast<std::uint32_t>(code & 0x80u) << 24) | out);
}

/// The format's largest finite value (448 for E4M3, 57344 for E5M2), an integer.
template <class Format>
inline constexpr std::uint32_t float8_max =
    static_cast<std::uint32_t>(float8_to_float<Format>(Format::max_finite));

/// The format of a quantizer's `float8` field: 1 E4M3, 2 E5M2.
template <unsigned Id>
using float8_format_of = std::conditional_t<Id == 1, e4m3_format, e5m2_format>;

/// float -> 8 bits of `Format`, rounding stochastically: up with probability (dropped part /
/// one step), decided by `random` (32 uniform bits); unbiased in expectation below the largest
/// finite value; saturating; NaN as `float_to_float8`. The reference form (branches, the
/// neighbours decoded); `float_to_float8_stochastic` is the same function without branches.
template <class Format>
SQUALL_HOST_DEVICE constexpr std::uint8_t float_to_float8_stochastic_reference(
    float value, std::uint32_t random) noexcept {
  const std::uint32_t bits = detail::bit_cast<std::uint32_t>(value);
  const auto sign = static_cast<std::uint8_t>((bits >> 24) & 0x80u);
  const std::uint32_t magnitude = bits & 0x7fffffffu;
  if (magnitude > 0x7f800000u) return static_cast<std::uint8_t>(sign | Format::quiet_nan);
  // The representable neighbours below and above |value|: truncate toward zero in float
  // arithmetic by trying the nearest code and stepping down if it rounded up.
  std::uint32_t lower = float_to_float8<Format>(detail::bit_cast<float>(magnitude));
  const float magnitude_value = detail::bit_cast<float>(magnitude);
  if (float8_to_float<Format>(static_cast<std::uint8_t>(lower)) > magnitude_value) --lower;
  if (lower >= Format::max_finite) return static_cast<std::uint8_t>(sign | Format::max_finite);
  const float below = float8_to_float<Format>(static_cast<std::uint8_t>(lower));
  const float above = float8_to_float<Format>(static_cast<std::uint8_t>(lower + 1));
  // up when random / 2^32 < (|value| - below) / (above - below); the difference is exact
  const float fraction = (magnitude_value - below) / (above - below);
  const float threshold = static_cast<float>(random) * 0x1p-32f;
  return static_cast<std::uint8_t>(sign | (threshold < fraction ? lower + 1 : lower));
}

/// `float_to_float8_stochastic_reference` without branches, so that a loop of it vectorizes:
/// the code below |value| by truncation (a normal value's float fraction cut to the format's
/// bits; a subnormal one's multiple of the subnormal step), the dropped part over one step (a
/// power of two, so the quotient is exact), then up when the random fraction is below it. Equal
/// to the reference for every float and random word (tests/unit/float8.test.cpp).
template <class Format>
SQUALL_HOST_DEVICE SQUALL_FORCEINLINE constexpr std::uint8_t float_to_float8_stochastic(
    float value, std::uint32_t random) noexcept {
  constexpr int m = Format::man_bits;
  constexpr int shift = 23 - m;
  constexpr std::uint32_t rebias = Format::rebias;
  constexpr std::uint32_t smallest_normal = Format::smallest_normal;
  // one over the subnormal step 2^(1 - bias - m)
  constexpr float per_step_sub = static_cast<float>(1u << (Format::bias - 1 + m));
  const std::uint32_t bits = detail::bit_cast<std::uint32_t>(value);
  const std::uint32_t sign = (bits >> 24) & 0x80u;
  const std::uint32_t magnitude = bits & 0x7fffffffu;
  const float magnitude_value = detail::bit_cast<float>(magnitude);
  const bool normal = magnitude >= smallest_normal;
  // normal: the format's code is the float's bits rebiased, the fraction cut; the dropped
  // part over the step 2^(e - m) is the cut bits over 2^shift
  const std::uint32_t normal_code = (magnitude - rebias) >> shift;
  const float normal_fraction =
      static_cast<float>(static_cast<std::int32_t>(magnitude & ((1u << shift) - 1u))) *
      (1.0f / static_cast<float>(1u << shift));
  // subnormal: value / step is exact (a power of two); its integer part is the code
  // (selects on bits, not ternaries over floats, which g++ does not if-convert)
  const float scaled = detail::bit_cast<float>(
      select_bits(normal, 0u, detail::bit_cast<std::uint32_t>(magnitude_value * per_step_sub)));
  const auto sub_code = static_cast<std::int32_t>(scaled);  // below 2^m
  const float sub_fraction = scaled - static_cast<float>(sub_code);
  const std::uint32_t lower =
      select_bits(normal, normal_code, static_cast<std::uint32_t>(sub_code));
  const float fraction =
      detail::bit_cast<float>(select_bits(normal, detail::bit_cast<std::uint32_t>(normal_fraction),
                                          detail::bit_cast<std::uint32_t>(sub_fraction)));
  const float threshold = static_cast<float>(random) * 0x1p-32f;
  const std::uint32_t up = threshold < fraction ? 1u : 0u;
  // at or above the largest finite code (or an infinity): the largest finite, never up
  const bool saturated = lower >= Format::max_finite;
  std::uint32_t out = select_bits(saturated, Format::max_finite, lower + up);
  out = select_bits(magnitude > 0x7f800000u, Format::quiet_nan, out);
  return static_cast<std::uint8_t>(sign | out);
}

/// What `float8_e4m3` and `float8_e5m2` share: 8 bits and the conversions.
template <class Derived, class Format>
class float8_base {
 public:
  using format = Format;
  float8_base() = default;
  /// The value's 8 bits.
  SQUALL_HOST_DEVICE constexpr std::uint8_t bits() const noexcept { return bits_; }
  /// The value whose bits are `bits`.
  SQUALL_HOST_DEVICE static constexpr Derived from_bits(std::uint8_t bits) noexcept {
    Derived d;
    d.bits_ = bits;
    return d;
  }
  /// `value` rounded stochastically with the 32 random bits `random`.
  SQUALL_HOST_DEVICE static constexpr Derived stochastic(float value,
                                                         std::uint32_t random) noexcept {
    return from_bits(float_to_float8_stochastic<Format>(value, random));
  }
  SQUALL_HOST_DEVICE constexpr operator float() const noexcept {
    return float8_to_float<Format>(bits_);
  }

 protected:
  std::uint8_t bits_;
};

}  // namespace detail

/// OFP8 E4M3 (bias 7, largest 448, no infinities): to nearest even and saturating from float,
/// exact to float.
class float8_e4m3 : public detail::float8_base<float8_e4m3, detail::e4m3_format> {
 public:
  float8_e4m3() = default;
  SQUALL_HOST_DEVICE constexpr explicit float8_e4m3(float value) noexcept {
    bits_ = detail::float_to_float8<format>(value);
  }
};

/// OFP8 E5M2 (bias 15, largest finite 57344, infinities and NaNs): to nearest even and
/// saturating from float, exact to float.
class float8_e5m2 : public detail::float8_base<float8_e5m2, detail::e5m2_format> {
 public:
  float8_e5m2() = default;
  SQUALL_HOST_DEVICE constexpr explicit float8_e5m2(float value) noexcept {
    bits_ = detail::float_to_float8<format>(value);
  }
};

static_assert(sizeof(float8_e4m3) == 1 && sizeof(float8_e5m2) == 1);
static_assert(detail::float8_max<detail::e4m3_format> == 448 &&
              detail::float8_max<detail::e5m2_format> == 57344);
static_assert(std::is_trivially_copyable_v<float8_e4m3> &&
              std::is_trivially_copyable_v<float8_e5m2>);

}  // namespace squall
