// SPDX-License-Identifier: Apache-2.0
// Averages four "gradients" held in bfloat16 with the host kernels, the way a collective does
// it: pairwise combines in float, one rounding per combine, then avg's finalize step.
// Prints the largest error against the same mean computed in double.
#include <squall/squall.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>

int main() {
  constexpr std::size_t count = 1 << 20;
  constexpr int ranks = 4;
  std::vector<std::vector<squall::bfloat16>> grads(ranks, std::vector<squall::bfloat16>(count));
  for (int r = 0; r < ranks; ++r) {
    for (std::size_t i = 0; i < count; ++i) {
      grads[r][i] = squall::bfloat16(static_cast<float>((i % 64) + r) / 4.0f);  // exact
    }
  }
  const squall::host_backend host;
  auto& total = grads[0];
  for (int r = 1; r < ranks; ++r) {
    squall::kernels::reduce_into(host, squall::avg_op{}, squall::host_view<squall::bfloat16>(total),
                                 squall::host_view<const squall::bfloat16>(grads[r]));
  }
  squall::kernels::finalize(host, squall::avg_op{}, squall::host_view<squall::bfloat16>(total),
                            ranks);
  double max_error = 0;
  for (std::size_t i = 0; i < count; ++i) {
    double mean = 0;
    for (int r = 0; r < ranks; ++r) mean += static_cast<double>((i % 64) + r) / 4.0;
    mean /= ranks;
    max_error =
        std::max(max_error, std::fabs(static_cast<double>(static_cast<float>(total[i])) - mean));
  }
  std::printf("mean of %d gradients: max error %g over %zu bfloat16 elements\n", ranks, max_error,
              count);
  return max_error == 0 ? 0 : 1;
}
