// SPDX-License-Identifier: Apache-2.0
#pragma once
// Inputs and references for collective tests, shared by the thread-rank (inproc), the
// process (shm) and the MPI tests.
//
// `exact_input` builds what nccl-tests builds: small integers, so that every order of
// summation gives the same exact result in every element type (float16 and bfloat16 hold
// integers up to 256 exactly; 8 ranks of values in [-8, 8] stay within 64).

#include <squall/core/ops.hpp>
#include <squall/core/types.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string_view>
#include <vector>

namespace squall::test {

/// Element `i` of rank `rank`'s input: an integer in [-8, 8].
template <class T>
T exact_value(int rank, std::size_t i) {
  const auto v =
      static_cast<int>((static_cast<std::uint64_t>(rank) * 7919u + i * 13u + (i >> 7)) % 17u) - 8;
  return static_cast<T>(static_cast<float>(v));
}

template <class T>
std::vector<T> exact_input(int rank, std::size_t count) {
  std::vector<T> v(count);
  for (std::size_t i = 0; i < count; ++i) v[i] = exact_value<T>(rank, i);
  return v;
}

/// The reduction over `ranks` ranks of element i, in double (the serial reference).
template <class T, class Op>
double exact_reference(int ranks, std::size_t i) {
  double acc = static_cast<double>(static_cast<float>(exact_value<T>(0, i)));
  for (int r = 1; r < ranks; ++r) {
    const double x = static_cast<double>(static_cast<float>(exact_value<T>(r, i)));
    if constexpr (std::is_same_v<Op, min_op>) {
      acc = x < acc ? x : acc;
    } else if constexpr (std::is_same_v<Op, max_op>) {
      acc = x > acc ? x : acc;
    } else {
      acc += x;
    }
  }
  if constexpr (std::is_same_v<Op, avg_op>) {
    if constexpr (std::is_integral_v<T>) {
      return static_cast<double>(static_cast<std::int64_t>(acc) / ranks);
    } else {
      return acc / ranks;
    }
  }
  return acc;
}

/// The bound on |result - exact| for a sum of `ranks` terms whose magnitudes add to
/// `magnitude`, each partial sum rounded once in T (the reassociation bound (P-1) eps sum|x|).
template <class T>
double reassociation_bound(int ranks, double magnitude) {
  if constexpr (std::is_integral_v<T>) {
    return 0.0;
  } else {
    double eps = static_cast<double>(std::numeric_limits<float>::epsilon());
    if constexpr (std::is_same_v<T, double>) eps = std::numeric_limits<double>::epsilon();
    if constexpr (std::is_same_v<T, float16>) eps = 1.0 / 1024;
    if constexpr (std::is_same_v<T, bfloat16>) eps = 1.0 / 128;
    return (ranks - 1) * eps * magnitude + 1e-300;
  }
}

}  // namespace squall::test
