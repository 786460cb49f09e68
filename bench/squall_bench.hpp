// SPDX-License-Identifier: Apache-2.0
// What squall-bench's translation units share: the settings, what one rank sees of the job,
// a result row, the runner interface (one communicator per topology and compressor), the
// inputs, and the factory of the compressed runners (bench/compressed_runners.cpp).
#pragma once

#include <squall/algorithm/communicator.hpp>
#include <squall/compress/by_name.hpp>
#include <squall/core/options.hpp>
#include <squall/tuning/tuning.hpp>
#if SQUALL_BENCH_WITH_MPI
#include <mpi.h>
#endif

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace squall_bench {

using clock_type = std::chrono::steady_clock;

/// One `--compressor` entry: "name[:parameter][+ef][@aggregation]"
/// (squall/compress/by_name.hpp); "none" is the dense allreduce. The aggregation (e.g. gtopk,
/// per_hop, gather) overrides --aggregation for this entry, so several run side by side.
using compressor_spec = squall::compressor_choice;

struct settings {
  int ranks = 0;
  std::string op = "allreduce";
  std::vector<std::string> topologies;
  std::vector<compressor_spec> compressors;  ///< empty: the dense collectives only
  squall::aggregation aggregation = squall::aggregation::automatic;
  std::string transport = "shm";
  std::string dtype = "float";
  std::size_t min_bytes = std::size_t{4} << 10;
  std::size_t max_bytes = std::size_t{256} << 20;
  std::size_t factor = 4;
  int iters = 0;  // 0: from the size
  int warmup = 2;
  std::size_t chunk = 0;                             // 0: the default collective_tuning
  std::size_t peer_memory = 0;                       // 0: the default collective_tuning
  long long window_copy = -1;                        // < 0: the default collective_tuning
  static constexpr long long window_copy_auto = -2;  // --window-copy auto: calibrate_windows
  long long whole_reduce = -1;                       // < 0: the default collective_tuning
  long long non_temporal = -1;                       // < 0: the default collective_tuning
  bool check = true;
  bool registered = false;  // --registered: shm buffers every rank maps (issue 22)
  bool fresh = false;       // --fresh: every rank rewrites its input before every call
  bool calibrate = false;   // automatic: measure its model first (communicator::calibrate)
  double link_bits = 0;     // --link-rate: bits per second each way of a rank's link; 0: none
  std::string csv;
  std::string json;
  bool compressed() const { return !compressors.empty(); }
};

/// Prints why and the usage line, exits with 2.
[[noreturn]] void usage(const std::string& why);

/// What one rank sees of the job.
struct job {
  int rank = 0;
  int size = 1;
  bool mpi = false;           // MPI is initialised: time MPI's collective, reduce times with it
  std::string shm_name;       // the base name of the shm jobs
  std::uint64_t shm_key = 0;  // their job key (shm_job::key)
};

struct row {
  std::string topology;
  std::string compressor = "none";
  std::size_t bytes = 0;
  std::size_t count = 0;
  double time_us = 0;
  double algbw = 0;
  double busbw = 0;
  long wrong = 0;
  double traffic = -1;  // bytes a rank reads and writes at least (dense rows); < 0: none
  double copy_us = -1;  // every rank copying traffic / 2 bytes at once, in the same run
  double mpi_us = -1;   // < 0: none
  double mpi_busbw = 0;
  // compressed runs (--compressor): the most any rank sent in one call, the dense
  // allreduce's bytes over these (same topology and size), and ||result - exact|| / ||exact||
  double wire_bytes = -1;  // < 0: not measured
  double compression_ratio = -1;
  double rel_error = -1;
  // with --link-rate: the wire-time bound, the most bytes any rank sent or received in one
  // call over the link's rate
  double bound_us = -1;
  // compressed runs: communicator::last_split, the ranks' mean over the timed calls
  double encode_us = -1;
  double transfer_us = -1;
  double decode_us = -1;
};

/// One communicator (one topology, one compressor) and what the benchmark asks of it.
template <class T>
struct runner_base {
  std::string name;
  virtual ~runner_base() = default;
  virtual void call(std::vector<T>& in, std::vector<T>& out, std::size_t count) = 0;
  /// The runner's own input and output (registered memory, --registered), which `call` uses
  /// in place of `in` and `out`; null: it uses theirs.
  virtual T* own_input() { return nullptr; }
  virtual T* own_output() { return nullptr; }
  /// "ring", or "automatic:<chosen>"
  virtual std::string label(std::size_t bytes) const = 0;
  /// The slowest rank's value (max) or the sum over ranks.
  virtual double across(double v, bool sum) = 0;
  virtual void barrier() = 0;
  virtual std::size_t block_offset(std::size_t count) const = 0;
  /// The bytes this rank sent and received in its last call.
  virtual squall::transfer_stats moved() const = 0;
  /// Where a compressed runner's last call spent its time (zeros for a dense one).
  virtual squall::phase_split split() const { return {}; }
  /// Forgets what the calls so far left behind (a compressed runner's state: error-feedback
  /// residual, PowerSGD's Q, the step), so the next call starts as a first one.
  virtual void reset(std::size_t count) { (void)count; }
};

/// The slowest rank's value (max) or the sum over ranks: through MPI when it is initialised,
/// else through `comm`'s own dense allreduce.
template <class Communicator>
double across_ranks(Communicator& comm, const job& j, double v, bool sum) {
#if SQUALL_BENCH_WITH_MPI
  if (j.mpi) {
    double out = 0;
    MPI_Allreduce(&v, &out, 1, MPI_DOUBLE, sum ? MPI_SUM : MPI_MAX, MPI_COMM_WORLD);
    return out;
  }
#else
  (void)j;
#endif
  if (sum)
    comm.allreduce(squall::host_view<double>(&v, 1), squall::sum_op{});
  else
    comm.allreduce(squall::host_view<double>(&v, 1), squall::max_op{});
  return v;
}

/// The gradient-like input of the compressed runs: element i of rank r, a sum of four
/// uniform draws of a hash of (r, i), scaled to mean 0 and variance 1 (near-Gaussian,
/// different on every rank, and cheap to recompute for the exact reference).
inline float gradient_value(int rank, std::size_t i) {
  std::uint64_t x = (static_cast<std::uint64_t>(rank) << 40) ^ static_cast<std::uint64_t>(i);
  x += 0x9e3779b97f4a7c15ull;  // splitmix64's finalizer
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  x ^= x >> 31;
  const double u =
      static_cast<double>((x & 0xffff) + ((x >> 16) & 0xffff) + ((x >> 32) & 0xffff) + (x >> 48)) /
          65536.0 -
      2.0;                                            // mean 0, variance 4 / 12
  return static_cast<float>(u * 1.7320508075688772);  // variance 1
}

/// A compressed allreduce runner for `spec` over `Topology`; throws `squall::invalid_argument`
/// for a parameter the compressor cannot take. Defined in
/// bench/compressed_runners.cpp for shm_transport (and mpi_transport when built) and every
/// topology.
template <class Transport, class Topology>
std::unique_ptr<runner_base<float>> make_compressed_runner(const compressor_spec& spec,
                                                           const std::string& topology,
                                                           Transport transport, const settings& s,
                                                           const job& j,
                                                           const squall::options& opts,
                                                           const squall::collective_tuning& tuning);

}  // namespace squall_bench
