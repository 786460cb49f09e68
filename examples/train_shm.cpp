// SPDX-License-Identifier: Apache-2.0
// train_fashion_mnist's runs on forked ranks joined by the shared-memory transport.
#include "fashion_mnist/train.hpp"

namespace fashion_mnist {

int train_over_shm(const settings& s, const dataset& data, std::size_t train_count,
                   std::size_t test_count) {
  int status = 0;
  for (const auto& choice : s.compressors) {
    const squall::launch_result result = squall::launch(s.ranks, [&](const squall::shm_job& job) {
      const auto make = [&](std::string_view part) {
        return squall::shm_transport(
            squall::shm_job{job.name + "-" + std::string(part), job.rank, job.size, job.key});
      };
      const rank_of_job<squall::shm_transport, decltype(make)> me{job.rank, job.size, make};
      return squall::visit_compressor(choice, [&](auto c) {
        return train(me, std::move(c), choice, s, data, train_count, test_count);
      });
    });
    if (!result.ok()) {
      std::fprintf(stderr, "train_fashion_mnist: %s: rank %d failed (status %d)\n",
                   choice.text.c_str(), result.failed_rank, result.exit_code());
      status = result.exit_code();
    }
  }
  return status;
}

}  // namespace fashion_mnist
