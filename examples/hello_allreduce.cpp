// SPDX-License-Identifier: Apache-2.0
// The README's first allreduce, timed: each of P processes started by squall-run joins the
// shared-memory job, builds a communicator with the default topology (automatic) and averages
// a 4 MiB gradient. Rank 0 prints the slowest rank's times (joining the job, which waits for
// the last process to start; building the communicator; the first allreduce) and checks the
// mean against the exact one. Exits 1 on a wrong mean.
//
//   squall-run -n 4 squall-hello
#include <squall/squall.hpp>

#include <chrono>
#include <cstdio>
#include <vector>

int main() {
  using clock = std::chrono::steady_clock;
  const auto ms = [](clock::duration d) {
    return std::chrono::duration<double, std::milli>(d).count();
  };
  const auto start = clock::now();
  squall::shm_transport transport;  // job, rank and size from squall-run's variables
  const auto joined = clock::now();
  squall::communicator<squall::shm_transport> comm{std::move(transport)};
  const auto built = clock::now();
  std::vector<float> grad(std::size_t{1} << 20, static_cast<float>(comm.rank() + 1));
  comm.allreduce(squall::host_view<float>(grad), squall::avg_op{});
  const auto reduced = clock::now();

  std::vector<double> took = {ms(joined - start), ms(built - joined), ms(reduced - built)};
  comm.allreduce(squall::host_view<double>(took), squall::max_op{});
  const float mean = static_cast<float>(comm.size() + 1) / 2.0f;  // of 1..P, exact in float
  std::size_t wrong = 0;
  for (float g : grad) wrong += g != mean;
  if (comm.rank() == 0) {
    std::printf(
        "hello: %d ranks; slowest rank: join %.1f ms, communicator %.2f ms, first allreduce "
        "(4 MiB, %s) %.2f ms; mean %g, %zu wrong\n",
        comm.size(), took[0], took[1], comm.schedule_for(grad.size() * sizeof(float)).c_str(),
        took[2], static_cast<double>(mean), wrong);
  }
  return wrong == 0 ? 0 : 1;
}
