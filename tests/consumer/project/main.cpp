// SPDX-License-Identifier: Apache-2.0
// Uses the installed (or added) squall as an application would: a host reduction, a dense ring
// allreduce and a top-k + error feedback allreduce on two thread ranks (the compressor picked
// by name), each checked against the serial result. Exits 0 on success. Built at -O3 with
// warnings as errors in the find_package mode, so that squall's headers stay warning-free
// in an optimised user build.
#include <squall/compress/by_name.hpp>
#include <squall/compress/error_feedback.hpp>
#include <squall/compress/sparsify.hpp>
#include <squall/squall.hpp>

#include <cstdio>
#include <thread>
#include <vector>

namespace {

bool host_reduction_ok() {
  std::vector<float> a = {1, 2, 3};
  const std::vector<float> b = {10, 20, 30};
  squall::kernels::reduce_into(squall::host_backend{}, squall::sum_op{},
                               squall::host_view<float>(a), squall::host_view<const float>(b));
  return a[0] == 11 && a[1] == 22 && a[2] == 33;
}

/// Rank r's value at i: small integers, so every summation order gives the exact sum.
float value(int r, std::size_t i) { return static_cast<float>((i % 7) + 3 * r) - 4.0f; }

/// Dense and top-k allreduces on two thread ranks; true if both match the serial sum (top-k
/// with error feedback: the result plus the residual of every rank gives back the inputs).
bool allreduce_ok() {
  constexpr std::size_t count = 1000;
  constexpr int ranks = 2;
  const squall::compressor_choice choice = squall::parse_compressor("topk:0.25+ef");
  squall::inproc_world world(ranks);
  std::vector<std::vector<float>> dense(ranks), sparse(ranks), residual(ranks);
  {
    std::vector<std::jthread> threads;
    for (int r = 0; r < ranks; ++r) {
      threads.emplace_back([&, r] {
        auto& d = dense[static_cast<std::size_t>(r)];
        auto& s = sparse[static_cast<std::size_t>(r)];
        for (std::size_t i = 0; i < count; ++i) d.push_back(value(r, i));
        s = d;
        using topk_ef = squall::error_feedback<squall::topk_compressor>;
        squall::communicator<squall::inproc_transport, squall::ring_topology, topk_ef> comm(
            world.transport(r), {}, topk_ef{squall::topk_compressor{.ratio = 0.25}}, {},
            choice.tuned({}));
        comm.allreduce(squall::host_view<float>(d));
        auto state = comm.make_state<float>(count);
        comm.allreduce(squall::host_view<float>(s), state, squall::sum_op{});
        const auto e = state.residual().residual();
        residual[static_cast<std::size_t>(r)].assign(e.data(), e.data() + e.count());
      });
    }
  }
  for (std::size_t i = 0; i < count; ++i) {
    const float exact = value(0, i) + value(1, i);
    const float recovered = sparse[0][i] + residual[0][i] + residual[1][i];
    if (dense[0][i] != exact || dense[1][i] != exact || sparse[0][i] != sparse[1][i] ||
        recovered != exact) {
      std::printf("element %zu: dense %g %g, top-k %g + residuals = %g, exact %g\n", i,
                  double(dense[0][i]), double(dense[1][i]), double(sparse[0][i]), double(recovered),
                  double(exact));
      return false;
    }
  }
  return true;
}

}  // namespace

int main() {
  const bool ok = host_reduction_ok() && allreduce_ok() && squall::version >= 100 &&
                  !squall::compressor_usage().empty();
  std::printf("squall %d: %s\n", squall::version, ok ? "ok" : "wrong");
  return ok ? 0 : 1;
}
