// SPDX-License-Identifier: Apache-2.0
#pragma once
// Deterministic test data and the serial double-precision references the tests compare with.

#include <squall/core/ops.hpp>
#include <squall/core/types.hpp>

#include <bit>  // bit_cast
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <random>
#include <string_view>
#include <type_traits>
#include <vector>

namespace squall::test {

/// Element types every kernel test runs over (doctest TEST_CASE_TEMPLATE lists).
#define SQUALL_TEST_ELEMENT_TYPES \
  float, double, std::int32_t, std::int64_t, squall::float16, squall::bfloat16

/// A rank's input at one step of a multi-step run: `input(rank, step)`. A type, not a template
/// parameter, so that a runner is instantiated once per policy set, not once per call site's
/// lambda (that halved the compressed suites' compile time); never deduced (type_identity), so
/// a lambda converts at the call.
template <class T>
using step_input = std::type_identity_t<std::function<std::vector<T>(int rank, int step)>>;

/// `count` values of `T` from a seeded generator: integers in [-1000, 1000]; floating values
/// are multiples of 1/128 in [-8, 8] (of 1/16 for the 16-bit types), exact in `T`.
template <class T>
std::vector<T> random_values(std::size_t count, std::uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::vector<T> out(count);
  if constexpr (std::is_integral_v<T>) {
    std::uniform_int_distribution<int> dist(-1000, 1000);
    for (auto& v : out) v = static_cast<T>(dist(gen));
  } else {
    constexpr int steps = sizeof(T) == 2 ? 16 : 128;
    std::uniform_int_distribution<int> dist(-8 * steps, 8 * steps);
    for (auto& v : out) v = static_cast<T>(static_cast<double>(dist(gen)) / steps);
  }
  return out;
}

/// `count` draws of a normal distribution (mean 0, `sigma`) from a seeded generator, rounded
/// to `T` (the 16-bit types through float): gradient-like values for the compressor tests.
template <class T>
std::vector<T> normal_values(std::size_t count, std::uint64_t seed, double sigma = 1.0) {
  std::mt19937_64 gen(seed);
  std::normal_distribution<double> normal(0.0, sigma);
  std::vector<T> out(count);
  for (auto& v : out) {
    if constexpr (std::is_same_v<T, float16> || std::is_same_v<T, bfloat16>) {
      v = T(static_cast<float>(normal(gen)));
    } else {
      v = static_cast<T>(normal(gen));
    }
  }
  return out;
}

/// The value as a double (exact for every element type).
template <class T>
double as_double(T value) {
  if constexpr (std::is_same_v<T, float16> || std::is_same_v<T, bfloat16>) {
    return static_cast<double>(static_cast<float>(value));
  } else {
    return static_cast<double>(value);
  }
}

/// The bits of a value, for bitwise comparisons (NaN == NaN with the same payload).
template <class T>
auto bits_of(T value) {
  if constexpr (std::is_same_v<T, float16> || std::is_same_v<T, bfloat16>) {
    return value.bits();
  } else if constexpr (sizeof(T) == 8) {
    return std::bit_cast<std::uint64_t>(value);
  } else {
    return std::bit_cast<std::uint32_t>(value);
  }
}

}  // namespace squall::test
