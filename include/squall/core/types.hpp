// SPDX-License-Identifier: Apache-2.0
#pragma once
/// Element types: the 16-bit `float16` and `bfloat16` (round-to-nearest-even from float and
/// double, exact to float), and the `dtype` traits that name every element type squall reduces.

#include <squall/core/config.hpp>

#include <cstddef>  // size_t
#include <cstdint>
#include <string_view>
#include <type_traits>

#if defined(__CUDACC__)
#include <cuda/std/bit>  // bit_cast
#include <cuda_bf16.h>   // __nv_bfloat16
#include <cuda_fp16.h>   // __half
#else
#include <bit>  // bit_cast
#endif

namespace squall {
namespace detail {

/// An IEEE-754 style binary format: sign, `ExpBits` of biased exponent, `ManBits` of fraction.
template <int ExpBits, int ManBits>
struct binary_format {
  static constexpr int exp_bits = ExpBits;
  static constexpr int man_bits = ManBits;
  static constexpr int bias = (1 << (ExpBits - 1)) - 1;
  static constexpr int total_bits = 1 + ExpBits + ManBits;
};
using binary16_format = binary_format<5, 10>;
using bfloat16_format = binary_format<8, 7>;
using binary32_format = binary_format<8, 23>;
using binary64_format = binary_format<11, 52>;

template <class To, class From>
SQUALL_HOST_DEVICE constexpr To bit_cast(const From& from) noexcept {
#if defined(__CUDACC__)
  return ::cuda::std::bit_cast<To>(from);
#else
  return std::bit_cast<To>(from);
#endif
}

/// Rounds the value whose `From`-format bits are `x` to the narrower format `To`, to nearest,
/// ties to even. Overflow gives infinity, underflow a subnormal or zero, NaN stays a NaN
/// (quieted, keeping the top payload bits). Written once for float and double sources.
template <class To, class From>
SQUALL_HOST_DEVICE constexpr std::uint32_t round_to_nearest_even(std::uint64_t x) noexcept {
  constexpr int fm = From::man_bits;
  constexpr int tm = To::man_bits;
  constexpr std::uint64_t from_sign = std::uint64_t{1} << (From::total_bits - 1);
  constexpr std::uint64_t from_exp = ((std::uint64_t{1} << From::exp_bits) - 1) << fm;
  constexpr std::uint64_t from_man = (std::uint64_t{1} << fm) - 1;
  constexpr std::uint32_t to_inf = ((std::uint32_t{1} << To::exp_bits) - 1) << tm;
  const std::uint32_t sign = (x & from_sign) != 0 ? std::uint32_t{1} << (To::total_bits - 1) : 0;
  const std::uint64_t magnitude = x & ~from_sign;
  if ((magnitude & from_exp) == from_exp) {  // infinity or NaN
    const std::uint64_t payload = magnitude & from_man;
    if (payload == 0) return sign | to_inf;
    return sign | to_inf | (std::uint32_t{1} << (tm - 1)) |
           static_cast<std::uint32_t>(payload >> (fm - tm));
  }
  if (magnitude == 0) return sign;
  // value = significand * 2^(exponent - bias - fm), with the implicit bit for normals.
  int exponent = static_cast<int>(magnitude >> fm);
  std::uint64_t significand = magnitude & from_man;
  if (exponent == 0) {
    exponent = 1;
  } else {
    significand |= std::uint64_t{1} << fm;
  }
  const int to_exponent = exponent - From::bias + To::bias;  // biased, if the result is normal
  if (to_exponent >= (1 << To::exp_bits) - 1) return sign | to_inf;
  const int shift = (fm - tm) + (to_exponent <= 0 ? 1 - to_exponent : 0);
  if (shift > fm + 1) return sign;  // below half the smallest subnormal: rounds to zero
  const std::uint64_t kept = significand >> shift;
  const std::uint64_t rest = significand & ((std::uint64_t{1} << shift) - 1);
  const std::uint64_t half = std::uint64_t{1} << (shift - 1);
  const std::uint64_t rounded = kept + ((rest > half || (rest == half && (kept & 1) != 0)) ? 1 : 0);
  // A carry out of the fraction moves into the exponent field, which is the right answer.
  const std::uint64_t bits = to_exponent <= 0 ? rounded
                                              : (static_cast<std::uint64_t>(to_exponent) << tm) +
                                                    rounded - (std::uint64_t{1} << tm);
  if (bits >= to_inf) return sign | to_inf;
  return sign | static_cast<std::uint32_t>(bits);
}

/// `if_true` where `condition`, else `if_false`, as bit masks: no control flow for the
/// vectorizer to give up on (a ternary over floating-point results is not if-converted).
SQUALL_HOST_DEVICE constexpr std::uint32_t select_bits(bool condition, std::uint32_t if_true,
                                                       std::uint32_t if_false) noexcept {
  const std::uint32_t mask = 0u - static_cast<std::uint32_t>(condition);
  return (if_true & mask) | (if_false & ~mask);
}

/// binary32 -> binary16, to nearest even, without branches (selects only, so g++ vectorizes
/// loops over it). Normal results: rebias the exponent and round at bit 13 by adding
/// 0xfff plus the lowest kept bit. Subnormal results: adding 0.5f makes the float adder round
/// to a multiple of 2^-24, the binary16 subnormal step. NaN keeps its sign and top payload
/// bits, quieted, as `round_to_nearest_even` does. Needs round-to-nearest float addition.
SQUALL_HOST_DEVICE constexpr std::uint16_t binary32_to_binary16(float value) noexcept {
  const std::uint32_t bits = detail::bit_cast<std::uint32_t>(value);
  const std::uint32_t sign = (bits >> 16) & 0x8000u;
  const std::uint32_t magnitude = bits & 0x7fffffffu;
  const std::uint32_t normal = (magnitude + 0xc8000fffu + ((magnitude >> 13) & 1u)) >> 13;
  const std::uint32_t subnormal =
      detail::bit_cast<std::uint32_t>(detail::bit_cast<float>(magnitude) + 0.5f) - 0x3f000000u;
  const std::uint32_t special =
      select_bits(magnitude > 0x7f800000u, 0x7e00u | ((magnitude >> 13) & 0x1ffu), 0x7c00u);
  std::uint32_t out = select_bits(magnitude < 0x38800000u, subnormal, normal);  // below 2^-14
  out = select_bits(magnitude >= 0x47800000u, special, out);  // 2^16 and up, Inf, NaN
  return static_cast<std::uint16_t>(sign | out);
}

/// binary16 -> binary32, exactly, without branches. Subnormals are rebuilt as
/// (2^-14 + m 2^-24) - 2^-14, which float subtraction computes exactly.
SQUALL_HOST_DEVICE constexpr float binary16_to_binary32(std::uint16_t half) noexcept {
  const std::uint32_t sign = static_cast<std::uint32_t>(half & 0x8000u) << 16;
  const std::uint32_t rest = static_cast<std::uint32_t>(half & 0x7fffu) << 13;
  const std::uint32_t exponent = half & 0x7c00u;
  const std::uint32_t normal = rest + 0x38000000u;
  const std::uint32_t special = rest | 0x7f800000u;
  const std::uint32_t subnormal = detail::bit_cast<std::uint32_t>(
      detail::bit_cast<float>(rest + 0x38800000u) - detail::bit_cast<float>(0x38800000u));
  std::uint32_t out = select_bits(exponent == 0, subnormal, normal);
  out = select_bits(exponent == 0x7c00u, special, out);
  return detail::bit_cast<float>(sign | out);
}

/// binary32 -> bfloat16, to nearest even, without branches; NaN keeps its sign and top
/// payload bits, quieted.
SQUALL_HOST_DEVICE constexpr std::uint16_t binary32_to_bfloat16(float value) noexcept {
  const std::uint32_t bits = detail::bit_cast<std::uint32_t>(value);
  const std::uint32_t rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;
  const std::uint32_t nan = (bits >> 16) | 0x40u;
  return static_cast<std::uint16_t>(select_bits((bits & 0x7fffffffu) > 0x7f800000u, nan, rounded));
}

/// What `float16` and `bfloat16` share: 16 bits, conversions, and the bit accessors.
template <class Derived, class Format>
class float16_base {
 public:
  /// The value's 16 bits.
  SQUALL_HOST_DEVICE constexpr std::uint16_t bits() const noexcept { return bits_; }
  /// The value whose bits are `bits`.
  SQUALL_HOST_DEVICE static constexpr Derived from_bits(std::uint16_t bits) noexcept {
    Derived d;
    d.bits_ = bits;
    return d;
  }

 protected:
  SQUALL_HOST_DEVICE static constexpr std::uint16_t round_double(double value) noexcept {
    return static_cast<std::uint16_t>(
        round_to_nearest_even<Format, binary64_format>(detail::bit_cast<std::uint64_t>(value)));
  }

  std::uint16_t bits_;
};

}  // namespace detail

/// IEEE-754 binary16. Conversion from float and double rounds to nearest even; conversion to
/// float is exact and implicit, so arithmetic happens in float. On the device it has the
/// layout of `__half` and converts to and from it.
class float16 : public detail::float16_base<float16, detail::binary16_format> {
 public:
  using format = detail::binary16_format;
  float16() = default;
  SQUALL_HOST_DEVICE explicit float16(float value) noexcept {
#if defined(__CUDA_ARCH__)
    bits_ = __half_as_ushort(__float2half_rn(value));
#else
    bits_ = detail::binary32_to_binary16(value);
#endif
  }
  SQUALL_HOST_DEVICE explicit float16(double value) noexcept { bits_ = round_double(value); }
  template <class I>
  requires std::is_integral_v<I> SQUALL_HOST_DEVICE explicit float16(I value) noexcept
      : float16(static_cast<double>(value)) {}
  SQUALL_HOST_DEVICE operator float() const noexcept {
#if defined(__CUDA_ARCH__)
    return __half2float(__ushort_as_half(bits_));
#else
    return detail::binary16_to_binary32(bits_);
#endif
  }
#if defined(__CUDACC__)
  SQUALL_HOST_DEVICE float16(__half value) noexcept { bits_ = __half_as_ushort(value); }
  SQUALL_HOST_DEVICE explicit operator __half() const noexcept { return __ushort_as_half(bits_); }
#endif
};

/// bfloat16: the top half of a binary32 (8 exponent bits, 7 fraction bits). Conversion from
/// float and double rounds to nearest even; to float is exact. On the device it has the
/// layout of `__nv_bfloat16` and converts to and from it.
class bfloat16 : public detail::float16_base<bfloat16, detail::bfloat16_format> {
 public:
  using format = detail::bfloat16_format;
  bfloat16() = default;
  SQUALL_HOST_DEVICE explicit bfloat16(float value) noexcept {
    bits_ = detail::binary32_to_bfloat16(value);
  }
  SQUALL_HOST_DEVICE explicit bfloat16(double value) noexcept { bits_ = round_double(value); }
  template <class I>
  requires std::is_integral_v<I> SQUALL_HOST_DEVICE explicit bfloat16(I value) noexcept
      : bfloat16(static_cast<double>(value)) {}
  SQUALL_HOST_DEVICE operator float() const noexcept {
    return detail::bit_cast<float>(static_cast<std::uint32_t>(bits_) << 16);
  }
#if defined(__CUDACC__)
  SQUALL_HOST_DEVICE bfloat16(__nv_bfloat16 value) noexcept { bits_ = __bfloat16_as_ushort(value); }
  SQUALL_HOST_DEVICE explicit operator __nv_bfloat16() const noexcept {
    return __ushort_as_bfloat16(bits_);
  }
#endif
};

static_assert(sizeof(float16) == 2 && alignof(float16) == 2);
static_assert(sizeof(bfloat16) == 2 && alignof(bfloat16) == 2);
static_assert(std::is_trivially_copyable_v<float16> && std::is_trivially_copyable_v<bfloat16>);

/// The element types squall communicates and reduces.
enum class dtype : std::uint8_t { float32 = 1, float64, int32, int64, float16, bfloat16 };

namespace detail {
template <class T>
struct dtype_traits;
template <>
struct dtype_traits<float> {
  static constexpr dtype value = dtype::float32;
};
template <>
struct dtype_traits<double> {
  static constexpr dtype value = dtype::float64;
};
template <>
struct dtype_traits<std::int32_t> {
  static constexpr dtype value = dtype::int32;
};
template <>
struct dtype_traits<std::int64_t> {
  static constexpr dtype value = dtype::int64;
};
template <>
struct dtype_traits<float16> {
  static constexpr dtype value = dtype::float16;
};
template <>
struct dtype_traits<bfloat16> {
  static constexpr dtype value = dtype::bfloat16;
};
}  // namespace detail

/// An element type squall reduces: float, double, int32, int64, float16, bfloat16.
template <class T>
concept element = requires {
  detail::dtype_traits<T>::value;
};

/// The `dtype` tag of an element type.
template <element T>
inline constexpr dtype dtype_of = detail::dtype_traits<T>::value;

/// The name of a dtype ("float32", "bfloat16"), as squall-bench and error messages print it.
constexpr std::string_view to_string(dtype type) noexcept {
  switch (type) {
    case dtype::float32:
      return "float32";
    case dtype::float64:
      return "float64";
    case dtype::int32:
      return "int32";
    case dtype::int64:
      return "int64";
    case dtype::float16:
      return "float16";
    case dtype::bfloat16:
      return "bfloat16";
  }
  return "unknown";
}

/// The size in bytes of one element of `type` (0 for a value outside the enum).
constexpr std::size_t size_of(dtype type) noexcept {
  switch (type) {
    case dtype::float64:
    case dtype::int64:
      return 8;
    case dtype::float32:
    case dtype::int32:
      return 4;
    case dtype::float16:
    case dtype::bfloat16:
      return 2;
  }
  return 0;
}

/// float16 or bfloat16: the types that are reduced in float and converted in blocks.
/// Gradient elements the quantizing, sparsifying and sketching compressors take.
template <class T>
concept real_gradient = std::is_same_v<T, float> || std::is_same_v<T, double>;

template <class T>
concept float16_like = std::is_same_v<T, float16> || std::is_same_v<T, bfloat16>;

/// The type reductions of `T` compute in: float for the 16-bit types (one rounding per
/// combine instead of error growing in 11 or 8 bits), `T` itself otherwise.
template <class T>
struct accumulator {
  using type = T;
};
template <>
struct accumulator<float16> {
  using type = float;
};
template <>
struct accumulator<bfloat16> {
  using type = float;
};
template <class T>
using accumulator_of = typename accumulator<T>::type;

#if defined(__CUDACC__)
/// The CUDA type with the layout of `T`: `__half` for float16, `__nv_bfloat16` for bfloat16.
template <class T>
struct cuda_native {
  using type = T;
};
template <>
struct cuda_native<float16> {
  using type = __half;
};
template <>
struct cuda_native<bfloat16> {
  using type = __nv_bfloat16;
};
static_assert(sizeof(__half) == sizeof(float16) && sizeof(__nv_bfloat16) == sizeof(bfloat16));
#endif

}  // namespace squall
