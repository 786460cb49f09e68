// SPDX-License-Identifier: Apache-2.0
#pragma once
/// Calibration of `automatic_topology`'s cost model on the ranks at hand.

#include <squall/algorithm/detail/executor.hpp>
#include <squall/algorithm/detail/scratch.hpp>
#include <squall/backend/dispatch.hpp>
#include <squall/core/ops.hpp>
#include <squall/topology/automatic.hpp>
#include <squall/topology/direct.hpp>
#include <squall/topology/halving_doubling.hpp>
#include <squall/topology/ring.hpp>
#include <squall/topology/schedule.hpp>
#include <squall/topology/tree.hpp>

#include <algorithm>  // min, max, clamp
#include <chrono>
#include <cstddef>
#include <type_traits>  // remove_cvref_t
#include <vector>

namespace squall::detail {

/// One out-of-place float sum with candidate `c` of the cost model, as allreduce runs it.
template <class Dense>
void run_candidate(Dense& dense, std::size_t c, const float* in, float* out, std::size_t count) {
  const int r = dense.rank();
  const int p = dense.size();
  const std::size_t bytes = count * sizeof(float);
  schedule s;
  switch (c) {
    case 0:
      s = ring_topology{}.allreduce_schedule(r, p, bytes);
      break;
    case 1:
      s = tree_topology{}.allreduce_schedule(r, p, bytes);
      break;
    case 2:
      s = direct_topology{}.allreduce_schedule(r, p, bytes);
      break;
    default:
      s = halving_doubling_topology{}.allreduce_schedule(r, p, bytes);
  }
  dense.run_allreduce(s, in, out, count, make_reducer<float, sum_op>(dense.backend()));
  dense.backend().synchronize();
}

/// Measures every candidate of `model` on the ranks of `dense` (a collective call): float
/// sums of 4 KiB to `up_to` bytes in steps of 4, best of several runs, the slowest rank's
/// time.
template <class Dense>
void calibrate(Dense& dense, cost_model& model, std::size_t up_to) {
  const std::size_t top = std::max<std::size_t>(up_to, std::size_t{16} << 10);
  std::vector<std::size_t> sizes;
  for (std::size_t b = std::size_t{4} << 10; b <= top; b *= 4) sizes.push_back(b);
  // Out of place, as squall-bench and most training loops call it: schedules other than
  // the one-shot read pay the copy of the input into the output, and the model should see it.
  // in the backend's memory, as the collectives' buffers are; zero, so no sum meets a NaN
  using backend_type = std::remove_cvref_t<decltype(dense.backend())>;
  scratch_bytes<backend_type> buffers;
  const std::size_t floats = top / sizeof(float);
  const auto both = buffers.template elements<float>(dense.backend(), 2 * floats);
  dispatch::fill_zero_on(dense.backend(), both);
  dense.backend().synchronize();
  const float* input = both.data();
  float* buffer = both.data() + floats;
  const auto candidates = cost_model::candidates;
  std::vector<double> mine(candidates * sizes.size(), 1e30);
  // Sizes outer, candidates inner: whatever else the machine does at a moment hits every
  // candidate alike. Each trial times calls back to back, as a training loop makes them
  // (a single call right after a barrier flatters schedules that like starting in step):
  // 4 MiB worth of calls (2 to 128) per trial, the best of 5 trials counts.
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    const std::size_t count = sizes[i] / sizeof(float);
    const int calls =
        static_cast<int>(std::clamp<std::size_t>((std::size_t{4} << 20) / sizes[i], 2, 128));
    for (int trial = 0; trial < 5; ++trial) {
      for (std::size_t c = 0; c < candidates; ++c) {
        run_candidate(dense, c, input, buffer, count);  // warm
        dense.transport().barrier().wait();
        const auto start = std::chrono::steady_clock::now();
        for (int call = 0; call < calls; ++call) {
          run_candidate(dense, c, input, buffer, count);
        }
        const double took =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / calls;
        double& best = mine[c * sizes.size() + i];
        best = std::min(best, took);
      }
    }
  }
  std::vector<double> all(mine.size() * static_cast<std::size_t>(dense.size()));
  dense.exchange(mine.data(), mine.size() * sizeof(double), all.data());
  model.ranks = dense.size();
  for (std::size_t c = 0; c < candidates; ++c) {
    auto& points = model.measured[c];
    points.clear();
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      double slowest = 0;
      for (int q = 0; q < dense.size(); ++q) {
        slowest = std::max(slowest,
                           all[static_cast<std::size_t>(q) * mine.size() + c * sizes.size() + i]);
      }
      points.push_back({sizes[i], slowest});
    }
  }
}

}  // namespace squall::detail
