// SPDX-License-Identifier: Apache-2.0
// Compiled by unit.vectorized with -O3 -fopt-info-vec-optimized (not linked), once per
// SQUALL_PROBE_TYPE x SQUALL_PROBE_OP, so each report belongs to one instantiation.
#include <squall/kernels/host/reduce.hpp>

#include <cstdint>

void probe(SQUALL_PROBE_TYPE* dst, const SQUALL_PROBE_TYPE* src, std::size_t count) {
  squall::kernels::reduce_into(squall::host_backend{}, squall::SQUALL_PROBE_OP{},
                               squall::host_view<SQUALL_PROBE_TYPE>(dst, count),
                               squall::host_view<const SQUALL_PROBE_TYPE>(src, count));
}
