// SPDX-License-Identifier: Apache-2.0
// Must not compile: device memory handed to a host kernel. The memory space is in the type.
#include <squall/kernels/host/reduce.hpp>

void f(squall::device_view<float> dst, squall::device_view<const float> src) {
  squall::kernels::reduce_into(squall::host_backend{}, squall::sum_op{}, dst, src);
}
