// SPDX-License-Identifier: Apache-2.0
#pragma once
/// Reduction ops as `SQUALL_HOST_DEVICE` functors: the one definition of the per-element math,
/// called by the host kernels and the CUDA kernels alike.
///
/// Semantics every backend shares:
/// - Values are combined in `accumulator_of<T>` (float for float16 and bfloat16) and rounded
///   back to `T` once per combine.
/// - Integer sums wrap modulo 2^N (two's complement), as MPI implementations do; there is no
///   undefined behaviour on overflow.
/// - min and max propagate NaN: if either operand is NaN the result is NaN, so a NaN in one
///   rank's gradient is never silently dropped.
/// - avg is sum followed by `finalize`, a division by the number of contributions (integer
///   division, truncating toward zero, for integer types).

#include <squall/core/config.hpp>
#include <squall/core/types.hpp>

#include <concepts>  // same_as
#include <cstddef>   // size_t
#include <string_view>
#include <type_traits>

namespace squall {
namespace detail {

template <class A>
SQUALL_HOST_DEVICE constexpr bool is_nan(A a) noexcept {
  if constexpr (std::is_floating_point_v<A>) {
    return a != a;
  } else {
    return false;
  }
}

}  // namespace detail

/// a + b; integer sums wrap.
struct sum_op {
  static constexpr std::string_view name = "sum";
  template <class A>
  SQUALL_HOST_DEVICE constexpr A operator()(A a, A b) const noexcept {
    if constexpr (std::is_integral_v<A>) {
      using U = std::make_unsigned_t<A>;
      return static_cast<A>(static_cast<U>(static_cast<U>(a) + static_cast<U>(b)));
    } else {
      return a + b;
    }
  }
};

/// The mean over ranks: combines as `sum_op`, then `finalize` divides by the rank count.
struct avg_op : sum_op {
  static constexpr std::string_view name = "avg";
  /// The sum of `contributions` values turned into their mean.
  template <class A>
  SQUALL_HOST_DEVICE constexpr A finalize(A total, std::size_t contributions) const noexcept {
    return static_cast<A>(total / static_cast<A>(contributions));
  }
};

/// The smaller of a and b; NaN if either is NaN.
struct min_op {
  static constexpr std::string_view name = "min";
  template <class A>
  SQUALL_HOST_DEVICE constexpr A operator()(A a, A b) const noexcept {
    // Both tests unconditionally (`|`, not `||`): one select, which loops vectorize.
    return ((b < a) | detail::is_nan(b)) ? b : a;
  }
};

/// The larger of a and b; NaN if either is NaN.
struct max_op {
  static constexpr std::string_view name = "max";
  template <class A>
  SQUALL_HOST_DEVICE constexpr A operator()(A a, A b) const noexcept {
    return ((a < b) | detail::is_nan(b)) ? b : a;
  }
};

/// An op that reduces elements of type `T`: it combines two accumulators into one and has a
/// name for messages and benchmarks.
template <class Op, class T>
concept reduction_op = element<T> && std::default_initializable<Op> &&
    requires(const Op& op, accumulator_of<T> a) {
  /// combine two partial results, in the accumulator type
  { op(a, a) } -> std::same_as<accumulator_of<T>>;
  /// "sum", "avg", "min", "max": names the op in errors and output
  { Op::name } -> std::convertible_to<std::string_view>;
};

/// Ops that need a last step once every contribution is in (avg divides by their number).
template <class Op, class T>
concept finalizing_op = reduction_op<Op, T> &&
    requires(const Op& op, accumulator_of<T> a, std::size_t n) {
  { op.finalize(a, n) } -> std::same_as<accumulator_of<T>>;
};

/// `T` widened to its accumulator type (exact).
template <element T>
SQUALL_HOST_DEVICE SQUALL_FORCEINLINE accumulator_of<T> to_accumulator(T value) noexcept {
  return static_cast<accumulator_of<T>>(value);
}

/// An accumulator rounded back to `T` (to nearest even for the 16-bit types).
template <element T>
SQUALL_HOST_DEVICE SQUALL_FORCEINLINE T from_accumulator(accumulator_of<T> value) noexcept {
  return static_cast<T>(value);
}

/// `op(a, b)` on two elements, through the accumulator type: the per-element step of every
/// reduce kernel.
template <element T, reduction_op<T> Op>
SQUALL_HOST_DEVICE SQUALL_FORCEINLINE T combine(const Op& op, T a, T b) noexcept {
  return from_accumulator<T>(op(to_accumulator(a), to_accumulator(b)));
}

}  // namespace squall
