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
#include <cuda_bf16.h>  // __nv_bfloat16
#include <cuda_fp16.h>  // __half
#include <cuda/std/bit>  // bit_cast
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
  const std::uint64_t bits =
      to_exponent <= 0 ? rounded
                       : (static_cast<std::uint64_t>(to_exponent) << tm) + rounded -
                             (std::uint64_t{1} << tm);
  if (bits >= to_inf) return sign | to_inf;
  return sign | static_cast<std::uint32_t>(bits);
}

/// The exact binary32 bits of a value in the narrower format `From` (binary16 or bfloat16).
template <class From>
SQUALL_HOST_DEVICE constexpr std::uint32_t widen_to_binary32(std::uint32_t x) noexcept {
  constexpr int fm = From::man_bits;
  constexpr std::uint32_t man_mask = (std::uint32_t{1} << fm) - 1;
  constexpr std::uint32_t exp_max = (std::uint32_t{1} << From::exp_bits) - 1;
  const std::uint32_t sign = ((x >> (From::total_bits - 1)) & 1u) << 31;
  const std::uint32_t exponent = (x >> fm) & exp_max;
  std::uint32_t fraction = x & man_mask;
  if (exponent == exp_max) return sign | 0x7f800000u | (fraction << (23 - fm));
  if (exponent == 0) {
    if (fraction == 0) return sign;
    if constexpr (From::bias == binary32_format::bias) {
      return sign | (fraction << (23 - fm));  // same exponent range: stays subnormal
    } else {
      int unbiased = 1 - From::bias;  // normalise: binary32 has the range to hold it
      while ((fraction & (std::uint32_t{1} << fm)) == 0) {
        fraction <<= 1;
        --unbiased;
      }
      return sign | (static_cast<std::uint32_t>(unbiased + 127) << 23) |
             ((fraction & man_mask) << (23 - fm));
    }
  }
  return sign | ((exponent - From::bias + 127) << 23) | (fraction << (23 - fm));
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
  SQUALL_HOST_DEVICE static constexpr std::uint16_t round_float(float value) noexcept {
    return static_cast<std::uint16_t>(round_to_nearest_even<Format, binary32_format>(
        detail::bit_cast<std::uint32_t>(value)));
  }
  SQUALL_HOST_DEVICE static constexpr std::uint16_t round_double(double value) noexcept {
    return static_cast<std::uint16_t>(round_to_nearest_even<Format, binary64_format>(
        detail::bit_cast<std::uint64_t>(value)));
  }
  SQUALL_HOST_DEVICE constexpr float widen() const noexcept {
    return detail::bit_cast<float>(widen_to_binary32<Format>(bits_));
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
    bits_ = round_float(value);
#endif
  }
  SQUALL_HOST_DEVICE explicit float16(double value) noexcept { bits_ = round_double(value); }
  template <class I>
    requires std::is_integral_v<I>
  SQUALL_HOST_DEVICE explicit float16(I value) noexcept
      : float16(static_cast<double>(value)) {}
  SQUALL_HOST_DEVICE operator float() const noexcept {
#if defined(__CUDA_ARCH__)
    return __half2float(__ushort_as_half(bits_));
#else
    return widen();
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
  SQUALL_HOST_DEVICE explicit bfloat16(float value) noexcept { bits_ = round_float(value); }
  SQUALL_HOST_DEVICE explicit bfloat16(double value) noexcept { bits_ = round_double(value); }
  template <class I>
    requires std::is_integral_v<I>
  SQUALL_HOST_DEVICE explicit bfloat16(I value) noexcept
      : bfloat16(static_cast<double>(value)) {}
  SQUALL_HOST_DEVICE operator float() const noexcept { return widen(); }
#if defined(__CUDACC__)
  SQUALL_HOST_DEVICE bfloat16(__nv_bfloat16 value) noexcept {
    bits_ = __bfloat16_as_ushort(value);
  }
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
template <class T> struct dtype_traits;
template <> struct dtype_traits<float> { static constexpr dtype value = dtype::float32; };
template <> struct dtype_traits<double> { static constexpr dtype value = dtype::float64; };
template <> struct dtype_traits<std::int32_t> { static constexpr dtype value = dtype::int32; };
template <> struct dtype_traits<std::int64_t> { static constexpr dtype value = dtype::int64; };
template <> struct dtype_traits<float16> { static constexpr dtype value = dtype::float16; };
template <> struct dtype_traits<bfloat16> { static constexpr dtype value = dtype::bfloat16; };
}  // namespace detail

/// An element type squall reduces: float, double, int32, int64, float16, bfloat16.
template <class T>
concept element = requires { detail::dtype_traits<T>::value; };

/// The `dtype` tag of an element type.
template <element T>
inline constexpr dtype dtype_of = detail::dtype_traits<T>::value;

/// The name of a dtype ("float32", "bfloat16"), as squall-bench and error messages print it.
constexpr std::string_view to_string(dtype type) noexcept {
  switch (type) {
    case dtype::float32: return "float32";
    case dtype::float64: return "float64";
    case dtype::int32: return "int32";
    case dtype::int64: return "int64";
    case dtype::float16: return "float16";
    case dtype::bfloat16: return "bfloat16";
  }
  return "unknown";
}

/// The size in bytes of one element of `type` (0 for a value outside the enum).
constexpr std::size_t size_of(dtype type) noexcept {
  switch (type) {
    case dtype::float64:
    case dtype::int64: return 8;
    case dtype::float32:
    case dtype::int32: return 4;
    case dtype::float16:
    case dtype::bfloat16: return 2;
  }
  return 0;
}

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
