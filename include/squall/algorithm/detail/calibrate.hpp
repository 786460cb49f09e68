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
#include <squall/tuning/tuning.hpp>

#include <algorithm>  // min, max, clamp
#include <chrono>
#include <cstddef>
#include <type_traits>  // remove_cvref_t
#include <vector>

namespace squall::detail {

/// Candidate `c` of the cost model's allreduce schedule for `bytes` on rank `r` of `p`.
inline schedule candidate_schedule(std::size_t c, int r, int p, std::size_t bytes) {
  switch (c) {
    case 0:
      return ring_topology{}.allreduce_schedule(r, p, bytes);
    case 1:
      return tree_topology{}.allreduce_schedule(r, p, bytes);
    case 2:
      return direct_topology{}.allreduce_schedule(r, p, bytes);
    default:
      return halving_doubling_topology{}.allreduce_schedule(r, p, bytes);
  }
}

/// One out-of-place float sum through schedule `s`, as allreduce runs it, complete.
template <class Dense, class Reducer>
void run_sum(Dense& dense, const schedule& s, const Reducer& reducer, const float* in, float* out,
             std::size_t count) {
  dense.run_allreduce(s, in, out, count, reducer);
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
  const auto reducer = make_reducer<float, sum_op>(dense.backend());
  std::vector<schedule> schedules(candidates);  // built outside the timed calls
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    const std::size_t count = sizes[i] / sizeof(float);
    const int calls =
        static_cast<int>(std::clamp<std::size_t>((std::size_t{4} << 20) / sizes[i], 2, 128));
    for (std::size_t c = 0; c < candidates; ++c) {
      schedules[c] = candidate_schedule(c, dense.rank(), dense.size(), sizes[i]);
    }
    for (int trial = 0; trial < 5; ++trial) {
      for (std::size_t c = 0; c < candidates; ++c) {
        run_sum(dense, schedules[c], reducer, input, buffer, count);  // warm
        dense.transport().barrier().wait();
        const auto start = std::chrono::steady_clock::now();
        for (int call = 0; call < calls; ++call) {
          run_sum(dense, schedules[c], reducer, input, buffer, count);
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

/// The bound of `sizes` whose paths cost least: every size up to it through the windows,
/// the rest through the peers' memory, each size's time taken relative to its faster path
/// so that each size counts alike (a step fitted to the measurements, so one noisy size
/// does not move it). 0 when the peers' memory wins; the smaller bound on a tie.
inline std::size_t window_bound_of(const window_calibration& m) {
  std::size_t best_bound = 0;
  double best_cost = 1e300;
  for (std::size_t b = 0; b <= m.sizes.size(); ++b) {  // b sizes through the windows
    double cost = 0;
    for (std::size_t i = 0; i < m.sizes.size(); ++i) {
      const double fastest = std::min(m.windows_seconds[i], m.peers_seconds[i]);
      cost += (i < b ? m.windows_seconds[i] : m.peers_seconds[i]) / fastest;
    }
    if (cost < best_cost) {
      best_cost = cost;
      best_bound = b == 0 ? 0 : m.sizes[b - 1];
    }
  }
  return best_bound;
}

// `calibrate_windows`' measurement, into `m`: sizes, the slowest rank's times, the bound (set).
template <class Core>
void measure_windows(Core& core, window_calibration& m) {
  const auto began = std::chrono::steady_clock::now();
  const std::size_t half = window_data_bytes(core.transport()) / 2;
  for (std::size_t b = std::max<std::size_t>(core.tuning().peer_memory_bytes, 4096); b <= half;
       b *= 2) {
    m.sizes.push_back(b);
  }
  const std::size_t top = half / 64 * 64;  // a whole half window (2 MiB less 128 bytes)
  if (top > m.sizes.back()) m.sizes.push_back(top);
  using backend_type = std::remove_cvref_t<decltype(core.backend())>;
  scratch_bytes<backend_type> buffers;
  const std::size_t floats = m.sizes.back() / sizeof(float);
  const auto both = buffers.template elements<float>(core.backend(), 2 * floats);
  dispatch::fill_zero_on(core.backend(), both);  // zero: no sum meets a NaN
  core.backend().synchronize();
  const float* input = both.data();
  float* output = both.data() + floats;
  const int r = core.rank();
  const int p = core.size();
  const std::size_t n = m.sizes.size();
  std::vector<double> mine(2 * n, 1e30);  // windows at i, peers at n + i
  const auto reducer = make_reducer<float, sum_op>(core.backend());
  for (std::size_t i = 0; i < n; ++i) {
    const std::size_t bytes = m.sizes[i];
    const std::size_t count = bytes / sizeof(float);
    const schedule s = direct_topology{}.allreduce_schedule(r, p, bytes);
    const int calls =
        static_cast<int>(std::clamp<std::size_t>((std::size_t{1} << 20) / bytes, 2, 16));
    for (int trial = 0; trial < 5; ++trial) {
      for (int path = 0; path < 2; ++path) {
        core.set_allreduce_window_copy_bytes(path == 0 ? bytes : 0);
        run_sum(core, s, reducer, input, output, count);  // warm
        core.transport().barrier().wait();
        const auto start = std::chrono::steady_clock::now();
        for (int call = 0; call < calls; ++call) run_sum(core, s, reducer, input, output, count);
        const double took =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / calls;
        double& best = mine[static_cast<std::size_t>(path) * n + i];
        best = std::min(best, took);
      }
    }
  }
  std::vector<double> all(mine.size() * static_cast<std::size_t>(p));
  core.exchange(mine.data(), mine.size() * sizeof(double), all.data());
  m.windows_seconds.assign(n, 0);
  m.peers_seconds.assign(n, 0);
  for (int q = 0; q < p; ++q) {
    const double* theirs = all.data() + static_cast<std::size_t>(q) * mine.size();
    for (std::size_t i = 0; i < n; ++i) {
      m.windows_seconds[i] = std::max(m.windows_seconds[i], theirs[i]);
      m.peers_seconds[i] = std::max(m.peers_seconds[i], theirs[n + i]);
    }
  }
  m.bound = window_bound_of(m);
  core.set_allreduce_window_copy_bytes(m.bound);
  m.measured = true;
  m.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count();
}

/// Measures the allreduce of float sums through the windows and through the peers' memory
/// on the ranks of `core` (a collective call: every rank calls it between the same two
/// collectives) at `peer_memory_bytes`, doubling, and a whole half window, out of place, the
/// best of 5 trials of calls back to back (1 MiB worth, 2 to 16 a trial, the two paths
/// alternating), the slowest rank's time; sets the bound `window_bound_of` chooses, the
/// same on every rank (the times are exchanged). Where there is no choice
/// (`allreduce_window_choice`), measures nothing and returns the bound in effect.
template <class Core>
window_calibration calibrate_windows(Core& core) {
  window_calibration m;
  m.bound = core.allreduce_window_bound();
  using transport_type = std::remove_cvref_t<decltype(core.transport())>;
  if constexpr (direct_transport<transport_type>) {
    if (!core.allreduce_window_choice()) return m;
    const std::size_t saved = core.tuning().allreduce_window_copy_bytes;
    try {
      measure_windows(core, m);
    } catch (...) {
      core.set_allreduce_window_copy_bytes(saved);  // as it was
      throw;
    }
  }
  return m;
}

}  // namespace squall::detail
