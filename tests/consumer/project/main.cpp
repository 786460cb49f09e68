// SPDX-License-Identifier: Apache-2.0
// Uses the installed (or added) squall: a host reduction and the version; exits 0 on success.
#include <squall/squall.hpp>

#include <cstdio>
#include <vector>

int main() {
  std::vector<float> a = {1, 2, 3};
  const std::vector<float> b = {10, 20, 30};
  squall::kernels::reduce_into(squall::host_backend{}, squall::sum_op{},
                               squall::host_view<float>(a), squall::host_view<const float>(b));
  const bool ok = a[0] == 11 && a[1] == 22 && a[2] == 33 && squall::version >= 100;
  std::printf("squall %d: %s\n", squall::version, ok ? "ok" : "wrong");
  return ok ? 0 : 1;
}
