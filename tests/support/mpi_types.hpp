// SPDX-License-Identifier: Apache-2.0
#pragma once
// MPI's names for squall's element types and ops, for the oracle tests.

#include <squall/core/ops.hpp>

#include <mpi.h>

#include <cstdint>
#include <type_traits>

namespace squall::test {

template <class T>
MPI_Datatype mpi_type() {
  if constexpr (std::is_same_v<T, float>) return MPI_FLOAT;
  if constexpr (std::is_same_v<T, double>) return MPI_DOUBLE;
  if constexpr (std::is_same_v<T, std::int32_t>) return MPI_INT32_T;
  if constexpr (std::is_same_v<T, std::int64_t>) return MPI_INT64_T;
}

template <class Op>
MPI_Op mpi_op() {
  if constexpr (std::is_same_v<Op, squall::min_op>) return MPI_MIN;
  if constexpr (std::is_same_v<Op, squall::max_op>) return MPI_MAX;
  return MPI_SUM;
}

}  // namespace squall::test
