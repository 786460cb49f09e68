// SPDX-License-Identifier: Apache-2.0
// squall-bench: collectives in the manner of nccl-tests, squall's schedules beside the MPI
// library's own collective on the same data in the same run.
//
//   squall-bench [-n P] [--op allreduce|allgather|reduce_scatter|broadcast]
//                [--topology all|ring|tree|direct|halving_doubling|hierarchical|automatic[,..]]
//                [--transport shm|mpi] [--dtype float|double|int32|int64|float16|bfloat16]
//                [-b 4K] [-e 256M] [-f 4] [--iters N] [--warmup N] [--chunk BYTES]
//                [--peer-memory BYTES] [--window-copy BYTES|auto] [--non-temporal BYTES]
//                [--whole-reduce BYTES]
//                [--no-check] [--registered] [--fresh] [--calibrate] [--csv FILE] [--json FILE]
//                [--compressor none|cast:bf16|topk:0.01+ef|qsgd:4|powersgd:4|...[,..]]
//                [--aggregation automatic|linear|low_rank|per_hop|gtopk|gather|two_round]
//                [--link-rate 1gbit]
//
// --chunk, --peer-memory, --window-copy, --non-temporal and --whole-reduce override
// collective_tuning's chunk_bytes, peer_memory_bytes, window_copy_bytes, non_temporal_bytes
// and whole_reduce_bytes (0: never). `--window-copy auto` keeps window_copy_bytes and has
// each dense communicator measure where its allreduce copies through the windows
// (`communicator::calibrate_windows`, 3 ranks or more on shm), printed once per topology.
// --registered (shm, dense): each communicator's input and output are registered memory
// (shm_transport::allocate, every rank maps them: plain loads and stores between ranks,
// issue 22), not the heap; the time to allocate, map and first touch them is printed once,
// with the kernel's huge-page setting for shared memory (transparent_hugepage/shmem_enabled)
// and how many MiB of the two buffers it backed with huge pages (the fewest of any rank).
// --fresh (dense): before every call, warm-up and timed, squall's and MPI's alike, every rank
// copies its input afresh from a private copy (values that change every call, three sets in
// turn, the last call's those the result check expects), so each call finds new values just
// written, in the writer's cache, as a training step's new gradients are; without it a call
// re-reads the input the last call read, which a peer may still hold in its own cache. The copy's
// time is in both columns.
//
// Every dense row also gives the machine's limit for it: `traffic`, the bytes a rank must
// read and write at least (allreduce 2n: its block of every input, its reduced block into
// every output; reduce_scatter and allgather n + n/P; broadcast 2n), `copy_us`, the time of
// every rank copying traffic / 2 bytes at once measured just before the row's size (the same
// memory moved by memcpy), and `%copy` = copy_us / time_us.
// --calibrate measures automatic's cost model before its rows (communicator::calibrate, 4 KiB
// to 16 MiB); without it automatic predicts from the transport's link costs, as a
// communicator does by default. The model used is printed ("# automatic model").
//
// --compressor runs the compressed allreduce (float only) of each listed compressor on each
// topology, beside the dense one ("none", always run) in the same run, on near-Gaussian
// inputs: each row then gives the most bytes any rank sent in one call (wire_bytes), the
// dense allreduce's bytes over these (compression ratio) and ||result - exact|| / ||exact||
// of a first call from a fresh state (rel_error), in place of #wrong. --aggregation sets
// collective_tuning::aggregation of every compressor without its own @aggregation (one that
// the compressor does not allow is refused, naming it). A compressed row also splits its time
// into encode, transfer and decode (communicator::last_split; the ranks' mean).
//
// --link-rate R (bits per second each way, tc's units: 100mbit, 1gbit, 10gbit; or a plain
// number) adds to every row the wire-time bound, the most bytes any rank sent or received
// in one call over R, and the fraction of it reached (bound / time): for one rank per host
// on links of rate R (scripts/cluster.sh).
//
// It starts its own P ranks: when MPI is built it re-runs itself under mpiexec (so the same
// processes can time MPI's collective), else it forks them (squall::launch) and the MPI
// columns stay empty. Under mpiexec already (`mpiexec -n 4 squall-bench --transport mpi`) it
// uses the ranks it was given. Each row: size, count, type, topology, time, algbw = size /
// time, busbw = algbw x 2(P-1)/P (allreduce), (P-1)/P (allgather, reduce_scatter), 1
// (broadcast), #wrong against the exact reference, and MPI's time and busbw with the speedup
// (MPI time / squall time). Times are the slowest rank's mean over the iterations.
#include <squall/algorithm/communicator.hpp>
#include <squall/kernels/host/copy.hpp>
#include <squall/topology/automatic.hpp>
#include <squall/topology/direct.hpp>
#include <squall/topology/halving_doubling.hpp>
#include <squall/topology/hierarchical.hpp>
#include <squall/topology/ring.hpp>
#include <squall/topology/tree.hpp>
#include <squall/transport/launch.hpp>
#include <squall/transport/shm.hpp>
#include <squall/version.hpp>
#if SQUALL_BENCH_WITH_MPI
#include <squall/transport/mpi.hpp>

#include <mpi.h>
#endif

#include <algorithm>
#include <array>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <string>
#include <tuple>
#include <unistd.h>
#include <vector>

#include "link_rate.hpp"
#include "squall_bench.hpp"

namespace squall_bench {

const std::vector<std::string> all_topologies = {
    "ring", "tree", "direct", "halving_doubling", "hierarchical", "automatic"};

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(
      stderr,
      "squall-bench: %s\nusage: squall-bench [-n P] [--op allreduce|allgather|"
      "reduce_scatter|broadcast] [--topology all|ring|tree|direct|halving_doubling|"
      "hierarchical|automatic[,...]] [--transport shm|mpi] [--dtype float|double|int32|"
      "int64|float16|bfloat16] [-b 4K] [-e 256M] [-f 4] [--iters N] [--warmup N] "
      "[--chunk BYTES] [--peer-memory BYTES] [--window-copy BYTES|auto] [--non-temporal BYTES] "
      "[--whole-reduce BYTES] "
      "[--no-check] [--registered] [--fresh] "
      "[--calibrate] "
      "[--csv FILE] [--json FILE] "
      "[--compressor NAME[:PARAMETER][+ef][@ALGORITHM][,...]] (%s) "
      "[--aggregation automatic|linear|low_rank|per_hop|gtopk|gather|two_round] [--link-rate "
      "1gbit]\n",
      why.c_str(), squall::compressor_usage().c_str());
  std::exit(2);
}

}  // namespace squall_bench

namespace {

using namespace squall_bench;

/// The setting in brackets of /sys/kernel/mm/transparent_hugepage/shmem_enabled ("never",
/// "advise", ...): whether the kernel gives registered memory (memfd) the huge pages squall
/// asks for; "unknown" where the file cannot be read.
std::string shmem_huge_pages() {
  std::FILE* f = std::fopen("/sys/kernel/mm/transparent_hugepage/shmem_enabled", "r");
  if (f == nullptr) return "unknown";
  char line[256] = {};
  const bool read = std::fgets(line, sizeof line, f) != nullptr;
  std::fclose(f);
  const char* open = read ? std::strchr(line, '[') : nullptr;
  const char* close = open != nullptr ? std::strchr(open, ']') : nullptr;
  return close != nullptr ? std::string(open + 1, close) : "unknown";
}

/// Kilobytes of this process's mapping that holds `address` mapped by huge pages
/// (ShmemPmdMapped in /proc/self/smaps), or -1 where smaps does not say.
long huge_kb_at(const void* address) {
  std::FILE* f = std::fopen("/proc/self/smaps", "r");
  if (f == nullptr) return -1;
  const auto at = reinterpret_cast<std::uintptr_t>(address);
  char line[512];
  bool inside = false;
  long kb = -1;
  while (std::fgets(line, sizeof line, f) != nullptr) {
    unsigned long start = 0;
    unsigned long end = 0;
    if (std::sscanf(line, "%lx-%lx ", &start, &end) == 2) {  // a mapping's first line
      if (inside) break;  // the next mapping's header: the one holding `address` had no line
      inside = start <= at && at < end;
      continue;
    }
    if (inside && std::sscanf(line, "ShmemPmdMapped: %ld kB", &kb) == 1) break;
  }
  std::fclose(f);
  return inside ? kb : -1;
}

compressor_spec parse_compressor(const std::string& text) {
  try {
    return squall::parse_compressor(text);
  } catch (const squall::invalid_argument& e) {
    usage(e.what());
  }
}

std::size_t parse_size(const std::string& text) {
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  std::size_t scale = 1;
  const std::string unit(end);
  if (unit == "K" || unit == "k")
    scale = std::size_t{1} << 10;
  else if (unit == "M" || unit == "m")
    scale = std::size_t{1} << 20;
  else if (unit == "G" || unit == "g")
    scale = std::size_t{1} << 30;
  else if (!unit.empty())
    usage("bad size '" + text + "'");
  if (end == text.c_str() || !(v >= 0)) usage("bad size '" + text + "'");
  return static_cast<std::size_t>(v * static_cast<double>(scale));
}

settings parse(int argc, char** argv) {
  settings s;
  std::string topology = "all";
  std::string compressors;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage(a + " needs a value");
      return argv[++i];
    };
    if (a == "-n" || a == "--ranks")
      s.ranks = std::atoi(value().c_str());
    else if (a == "--op")
      s.op = value();
    else if (a == "--topology" || a == "-t")
      topology = value();
    else if (a == "--transport")
      s.transport = value();
    else if (a == "--dtype" || a == "-d")
      s.dtype = value();
    else if (a == "-b" || a == "--minbytes")
      s.min_bytes = parse_size(value());
    else if (a == "-e" || a == "--maxbytes")
      s.max_bytes = parse_size(value());
    else if (a == "-f" || a == "--stepfactor")
      s.factor = parse_size(value());
    else if (a == "--iters")
      s.iters = std::atoi(value().c_str());
    else if (a == "--warmup")
      s.warmup = std::atoi(value().c_str());
    else if (a == "--chunk")
      s.chunk = parse_size(value());
    else if (a == "--peer-memory")
      s.peer_memory = parse_size(value());
    else if (a == "--window-copy") {
      const std::string v = value();
      s.window_copy =
          v == "auto" ? settings::window_copy_auto : static_cast<long long>(parse_size(v));
    } else if (a == "--whole-reduce")
      s.whole_reduce = static_cast<long long>(parse_size(value()));
    else if (a == "--non-temporal")
      s.non_temporal = static_cast<long long>(parse_size(value()));
    else if (a == "--no-check")
      s.check = false;
    else if (a == "--registered")
      s.registered = true;
    else if (a == "--fresh")
      s.fresh = true;
    else if (a == "--calibrate")
      s.calibrate = true;
    else if (a == "--link-rate") {
      const std::string rate = value();
      s.link_bits = link_rate_bits(rate, true);
      if (s.link_bits == 0) usage("bad link rate '" + rate + "' (e.g. 100mbit, 1gbit, 10gbit)");
    } else if (a == "--csv")
      s.csv = value();
    else if (a == "--json")
      s.json = value();
    else if (a == "--compressor" || a == "-c")
      compressors = value();
    else if (a == "--aggregation") {
      const std::string v = value();
      try {
        s.aggregation = squall::parse_compressor("topk@" + v).aggregation.value();
      } catch (const squall::invalid_argument&) {
        usage("unknown aggregation '" + v +
              "' (automatic, linear, low_rank, per_hop, gtopk, gather, two_round)");
      }
    } else if (a == "-h" || a == "--help")
      usage("help");
    else
      usage("unknown argument '" + a + "'");
  }
  if (topology == "all") {
    s.topologies = all_topologies;
  } else {
    std::size_t at = 0;
    while (at <= topology.size()) {
      const std::size_t comma = std::min(topology.find(',', at), topology.size());
      const std::string name = topology.substr(at, comma - at);
      if (std::find(all_topologies.begin(), all_topologies.end(), name) == all_topologies.end()) {
        usage("unknown topology '" + name + "'");
      }
      s.topologies.push_back(name);
      at = comma + 1;
    }
  }
  if (!compressors.empty()) {
    // the dense allreduce first: the baseline of every compressed row
    s.compressors.push_back(parse_compressor("none"));
    std::size_t at = 0;
    while (at <= compressors.size()) {
      const std::size_t comma = std::min(compressors.find(',', at), compressors.size());
      const compressor_spec spec = parse_compressor(compressors.substr(at, comma - at));
      if (!spec.dense()) s.compressors.push_back(spec);
      at = comma + 1;
    }
    if (s.op != "allreduce") usage("--compressor needs --op allreduce");
    if (s.dtype != "float") usage("--compressor needs --dtype float");
  }
  if (s.op != "allreduce" && s.op != "allgather" && s.op != "reduce_scatter" &&
      s.op != "broadcast") {
    usage("unknown op '" + s.op + "'");
  }
  if (s.transport != "shm" && s.transport != "mpi")
    usage("unknown transport '" + s.transport + "'");
  if (s.factor < 2) usage("-f must be at least 2");
  if (s.registered && (s.transport != "shm" || s.compressed()))
    usage("--registered runs the dense collectives on --transport shm");
  if (s.min_bytes == 0 || s.min_bytes > s.max_bytes) usage("need 0 < -b <= -e");
#if !SQUALL_BENCH_WITH_MPI
  if (s.transport == "mpi") usage("--transport mpi needs squall built with MPI");
#endif
  return s;
}

// Inputs: small integers, so every summation order is exact (nccl-tests' trick) and #wrong
// counts real errors.
template <class T>
T input_value(int rank, std::size_t i) {
  const int v = static_cast<int>((static_cast<std::size_t>(rank) * 31u + i * 7u) % 9u) - 4;
  return static_cast<T>(static_cast<float>(v));
}
template <class T>
double as_double(T v) {
  return static_cast<double>(static_cast<float>(v));
}

// --fresh: rewrites the `count` elements at `data` before each of `calls` calls (nothing when
// off), with new values every call, as a training step's gradients are: in turn what they held
// at construction and two sets of neighbouring values (each element's first byte XOR 1 and
// XOR 2: its lowest mantissa bits, or an integer's lowest, finite where the first was). Three
// sets, so that no call finds the values of the call before or of the one before that (the
// windows' two halves alternate); the last call's are the construction's, which the result
// check expects. The three sets are three copies of the input per rank, held beside it.
template <class T>
class refresher {
 public:
  refresher(bool on, T* data, std::size_t count, long calls) : data_(data), left_(calls) {
    if (!on) return;
    for (unsigned char flip = 0; flip < 3; ++flip) {
      sets_[flip].assign(data, data + count);
      for (T& v : sets_[flip]) reinterpret_cast<unsigned char*>(&v)[0] ^= flip;
    }
  }
  void operator()() {
    const std::vector<T>& from = sets_[static_cast<std::size_t>(--left_ % 3)];
    squall::kernels::copy_bytes(data_, from.data(), from.size() * sizeof(T));
  }

 private:
  T* data_;
  std::array<std::vector<T>, 3> sets_;
  long left_;  // calls still to come, this one included
};

#if SQUALL_BENCH_WITH_MPI
template <class T>
MPI_Datatype mpi_type() {
  if constexpr (std::is_same_v<T, float>)
    return MPI_FLOAT;
  else if constexpr (std::is_same_v<T, double>)
    return MPI_DOUBLE;
  else if constexpr (std::is_same_v<T, std::int32_t>)
    return MPI_INT32_T;
  else if constexpr (std::is_same_v<T, std::int64_t>)
    return MPI_INT64_T;
  else
    return MPI_DATATYPE_NULL;  // 16-bit types: MPI has none; no comparison
}
#endif

template <class Transport, class Topology, class T>
struct runner final : runner_base<T> {
  runner(std::string topology, Transport transport, const settings& s, const job& j,
         const squall::options& opts, const squall::collective_tuning& tuning, std::size_t in_count,
         std::size_t out_count)
      : comm(std::move(transport), Topology{}, opts, tuning), s_(s), j_(j) {
    this->name = std::move(topology);
    if constexpr (std::is_same_v<Transport, squall::shm_transport>) {
      if (s.registered) {
        // the hidden cost of registration: allocating and mapping (every rank's files in
        // every rank), then the first touch of every page here (what a first call pays)
        const auto start = clock_type::now();
        in_ = comm.transport().template allocate<T>(in_count);
        out_ = comm.transport().template allocate<T>(out_count);
        const auto mapped = clock_type::now();
        std::fill(in_.begin(), in_.end(), T{});
        std::fill(out_.begin(), out_.end(), T{});
        const auto touched = clock_type::now();
        const auto ms = [&](auto from, auto to) {
          return across(std::chrono::duration<double>(to - from).count(), false) * 1e3;
        };
        const double map_ms = ms(start, mapped);
        const double touch_ms = ms(mapped, touched);
        // huge pages the kernel gave the two buffers here, the least of any rank (the max of
        // the negated counts); -1 where a rank cannot tell, which that least then is
        const long in_kb = huge_kb_at(in_.data());
        const long out_kb = huge_kb_at(out_.data());
        const long mine = in_kb < 0 || out_kb < 0 ? -1 : in_kb + out_kb;
        const double huge_kb = -across(-static_cast<double>(mine), false);
        if (j.rank == 0 && this->name == s.topologies.front()) {
          std::printf(
              "# registered: input %zu and output %zu bytes per rank, allocated and mapped by "
              "every rank in %.1f ms, first touch of their pages %.1f ms (slowest rank); huge "
              "pages on shared memory: %s, ",
              in_count * sizeof(T), out_count * sizeof(T), map_ms, touch_ms,
              shmem_huge_pages().c_str());
          if (huge_kb < 0) {
            std::printf("how many they got unknown\n");
          } else {
            std::printf("%.0f MiB of them (the fewest of any rank)\n", huge_kb / 1024);
          }
        }
      }
    }
  }

  T* own_input() override { return in_.data(); }
  T* own_output() override { return out_.data(); }

  void call(std::vector<T>& in_vector, std::vector<T>& out_vector, std::size_t count) override {
    const int p = j_.size;
    T* in = in_.size() != 0 ? in_.data() : in_vector.data();
    T* out = out_.size() != 0 ? out_.data() : out_vector.data();
    if (s_.op == "allreduce") {
      comm.allreduce(squall::host_view<const T>(in, count), squall::host_view<T>(out, count));
    } else if (s_.op == "allgather") {
      comm.allgather(squall::host_view<const T>(in, count),
                     squall::host_view<T>(out, count * static_cast<std::size_t>(p)));
    } else if (s_.op == "reduce_scatter") {
      comm.reduce_scatter(squall::host_view<const T>(in, count),
                          squall::host_view<T>(out, comm.block_count(count)));
    } else {
      comm.broadcast(squall::host_view<T>(in, count), 0);
    }
  }
  std::string label(std::size_t bytes) const override {
    if (s_.op == "allreduce") return comm.schedule_for(bytes);
    return this->name;
  }
  double across(double v, bool sum) override { return across_ranks(comm, j_, v, sum); }
  void barrier() override { comm.transport().barrier().wait(); }
  std::size_t block_offset(std::size_t count) const override { return comm.block_offset(count); }
  squall::transfer_stats moved() const override { return comm.last_transfer(); }

  squall::communicator<Transport, Topology> comm;
  const settings& s_;
  const job& j_;
  squall::registered_buffer<T> in_;  // --registered: the input and output
  squall::registered_buffer<T> out_;
};

template <class Transport>
class bench {
 public:
  bench(const settings& s, const job& j) : s_(s), j_(j) {}

  template <class T>
  std::vector<row> run();

 private:
  Transport make_transport(const std::string& topology) {
#if SQUALL_BENCH_WITH_MPI
    if constexpr (std::is_same_v<Transport, squall::mpi_transport>) {
      (void)topology;
      return squall::mpi_transport(MPI_COMM_WORLD);
    } else
#endif
    {
      return squall::shm_transport(
          squall::shm_job{j_.shm_name + "-" + topology, j_.rank, j_.size, j_.shm_key});
    }
  }

  int iterations(std::size_t bytes) const {
    if (s_.iters > 0) return s_.iters;
    const double target = 256.0 * (1 << 20);  // about 256 MiB moved per measurement
    return static_cast<int>(std::clamp(target / static_cast<double>(bytes), 5.0, 1000.0));
  }

  template <class T>
  long count_wrong(const T* in, const T* out, std::size_t count, std::size_t offset) {
    const int p = j_.size;
    long wrong = 0;
    if (s_.op == "allreduce" || s_.op == "reduce_scatter") {
      const std::size_t n = s_.op == "allreduce"
                                ? count
                                : squall::detail::split_range(count, static_cast<std::size_t>(p),
                                                              static_cast<std::size_t>(j_.rank))
                                      .count;
      for (std::size_t i = 0; i < n; ++i) {
        double want = 0;
        for (int r = 0; r < p; ++r) want += as_double(input_value<T>(r, i + offset));
        wrong += as_double(out[i]) != want ? 1 : 0;
      }
    } else if (s_.op == "allgather") {
      for (int r = 0; r < p; ++r) {
        for (std::size_t i = 0; i < count; ++i) {
          wrong += as_double(out[static_cast<std::size_t>(r) * count + i]) !=
                           as_double(input_value<T>(r, i))
                       ? 1
                       : 0;
        }
      }
    } else {
      for (std::size_t i = 0; i < count; ++i)
        wrong += as_double(in[i]) != as_double(input_value<T>(0, i)) ? 1 : 0;
    }
    return wrong;
  }

  template <class T>
  double time_mpi(std::vector<T>& in, std::vector<T>& out, std::size_t count, int iters) {
#if SQUALL_BENCH_WITH_MPI
    const MPI_Datatype type = mpi_type<T>();
    const int p = j_.size;
    if (!j_.mpi || type == MPI_DATATYPE_NULL || count * static_cast<std::size_t>(p) > INT_MAX)
      return -1;
    const int n = static_cast<int>(count);
    std::vector<int> counts(static_cast<std::size_t>(p));
    for (int r = 0; r < p; ++r) {
      counts[static_cast<std::size_t>(r)] =
          static_cast<int>(squall::detail::split_range(count, static_cast<std::size_t>(p),
                                                       static_cast<std::size_t>(r))
                               .count);
    }
    auto once = [&] {
      if (s_.op == "allreduce")
        MPI_Allreduce(in.data(), out.data(), n, type, MPI_SUM, MPI_COMM_WORLD);
      else if (s_.op == "allgather")
        MPI_Allgather(in.data(), n, type, out.data(), n, type, MPI_COMM_WORLD);
      else if (s_.op == "reduce_scatter")
        MPI_Reduce_scatter(in.data(), out.data(), counts.data(), type, MPI_SUM, MPI_COMM_WORLD);
      else
        MPI_Bcast(in.data(), n, type, 0, MPI_COMM_WORLD);
    };
    refresher<T> fresh(s_.fresh, in.data(), count, static_cast<long>(s_.warmup) + iters);
    for (int w = 0; w < s_.warmup; ++w) {
      fresh();
      once();
    }
    MPI_Barrier(MPI_COMM_WORLD);
    const auto start = clock_type::now();
    for (int it = 0; it < iters; ++it) {
      fresh();
      once();
    }
    double t = std::chrono::duration<double>(clock_type::now() - start).count() / iters;
    double slowest = 0;
    MPI_Allreduce(&t, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    return slowest * 1e6;
#else
    (void)in, (void)out, (void)count, (void)iters;
    return -1;
#endif
  }

  template <class Topology, class T>
  std::unique_ptr<runner_base<T>> make_runner(const std::string& name, const compressor_spec& spec,
                                              std::size_t index);

  template <class T>
  row measure(runner_base<T>& r, const compressor_spec& spec, std::size_t bytes, std::vector<T>& in,
              std::vector<T>& out, double mpi_us, double copy_us, const std::vector<row>& earlier);

  // The bytes a rank of the dense collective of `bytes` must read and write at least (the
  // one-shot through peer memory moves exactly these): see the file's comment.
  double traffic(std::size_t bytes) const {
    const double n = static_cast<double>(bytes);
    const double p = j_.size;
    if (j_.size == 1) return 0;
    if (s_.op == "allreduce" || s_.op == "broadcast") return 2 * n;
    return n + n / p;
  }

  // Every rank copies `bytes` at once (after a barrier), `iters` times: the slowest rank's
  // mean time of one copy, in microseconds. `sync` gives the barrier and the maximum.
  template <class T>
  double time_copy(std::size_t bytes, int iters, runner_base<T>& sync) {
    if (bytes == 0) return 0;
    constexpr std::size_t page = 4096;
    if (copy_from_.size() < bytes + page) {
      copy_from_.assign(bytes + page, std::byte{1});
      copy_to_.assign(bytes + page, std::byte{2});
    }
    // both page-aligned: glibc's memcpy on AMD Zen (rep movsb) runs 10-20x slower where the
    // destination lies just above the source modulo 4 KiB, as two heap vectors can
    const auto aligned = [](std::vector<std::byte>& v) {
      const auto at = reinterpret_cast<std::uintptr_t>(v.data());
      return v.data() + ((page - at % page) % page);
    };
    std::byte* const from = aligned(copy_from_);
    std::byte* const to = aligned(copy_to_);
    std::memcpy(to, from, bytes);  // warm, as the rows' warm-up
    sync.barrier();
    const auto start = clock_type::now();
    for (int it = 0; it < iters; ++it) {
      std::memcpy(to, from, bytes);
      // the copy is not optimised away: the next one reads what this one wrote
      from[static_cast<std::size_t>(it) % bytes] = to[bytes - 1];
    }
    const double mine = std::chrono::duration<double>(clock_type::now() - start).count() / iters;
    return sync.across(mine, false) * 1e6;
  }

  // A compressed row's first call from a fresh state: rel_error against the exact sum (in
  // double) of every rank's input, wire bytes, and whether every rank got the same bits.
  template <class T>
  void first_call(runner_base<T>& run, std::vector<T>& in, std::vector<T>& out, std::size_t count,
                  row& r);

  const settings& s_;
  const job& j_;
  std::vector<std::byte> copy_from_;  // time_copy's buffers
  std::vector<std::byte> copy_to_;
};

double bus_factor(const std::string& op, int p) {
  if (op == "allreduce") return 2.0 * (p - 1) / p;
  if (op == "broadcast") return 1.0;
  return static_cast<double>(p - 1) / p;
}

std::size_t count_for(const settings& s, std::size_t bytes, std::size_t element, int p) {
  return s.op == "allgather" ? bytes / element / static_cast<std::size_t>(p) : bytes / element;
}

template <class Transport>
template <class Topology, class T>
std::unique_ptr<runner_base<T>> bench<Transport>::make_runner(const std::string& name,
                                                              const compressor_spec& spec,
                                                              std::size_t index) {
  squall::options opts;
  opts.check_mismatch = s_.check;
  squall::collective_tuning tuning;
  if (s_.chunk != 0) tuning.chunk_bytes = s_.chunk;
  if (s_.peer_memory != 0) tuning.peer_memory_bytes = s_.peer_memory;
  if (s_.window_copy >= 0) tuning.window_copy_bytes = static_cast<std::size_t>(s_.window_copy);
  if (s_.whole_reduce >= 0) {
    tuning.whole_reduce_bytes = static_cast<std::size_t>(s_.whole_reduce);
  }
  if (s_.non_temporal >= 0) tuning.non_temporal_bytes = static_cast<std::size_t>(s_.non_temporal);
  tuning.aggregation = s_.aggregation;
  tuning = spec.tuned(tuning);
  // one shm job per communicator: the topology, and the compressor's place in the list
  const std::string job_name = index == 0 ? name : name + "-c" + std::to_string(index);
  if constexpr (std::is_same_v<T, float>) {
    if (!spec.dense()) {
      try {
        return make_compressed_runner<Transport, Topology>(spec, name, make_transport(job_name), s_,
                                                           j_, opts, tuning);
      } catch (const squall::invalid_argument& e) {
        usage(e.what());
      }
    }
  }
  const std::size_t most = count_for(s_, s_.max_bytes, sizeof(T), j_.size);
  const std::size_t out_count =
      s_.op == "allgather" ? most * static_cast<std::size_t>(j_.size) : most;
  auto r = std::make_unique<runner<Transport, Topology, T>>(
      name, make_transport(job_name), s_, j_, opts, tuning, std::max<std::size_t>(most, 1),
      std::max<std::size_t>(out_count, 1));
  if (s_.window_copy == settings::window_copy_auto) {
    const squall::window_calibration m = r->comm.calibrate_windows();
    if (j_.rank == 0 && m.measured) {
      std::printf(
          "# windows calibrated (%s) in %.1f ms, allreduce us through the windows / the "
          "peers' memory:",
          name.c_str(), m.seconds * 1e3);
      for (std::size_t i = 0; i < m.sizes.size(); ++i) {
        std::printf(" %zu %.1f/%.1f", m.sizes[i], m.windows_seconds[i] * 1e6,
                    m.peers_seconds[i] * 1e6);
      }
      std::printf("; windows up to %zu bytes\n", m.bound);
    }
  }
  if constexpr (std::is_same_v<Topology, squall::hierarchical_topology<>>) {
    // the nodes the communicator found (host names, or SQUALL_RANKS_PER_NODE)
    const std::vector<int>& node_of = r->comm.topology().node_of;
    if (j_.rank == 0 && index == 0) {
      std::vector<int> distinct = node_of;
      std::sort(distinct.begin(), distinct.end());
      const auto nodes = std::unique(distinct.begin(), distinct.end()) - distinct.begin();
      std::printf("# hierarchical: %d nodes, node of each rank:", static_cast<int>(nodes));
      for (const int n : node_of) std::printf(" %d", n);
      std::printf("\n");
    }
  }
  if constexpr (std::is_same_v<Topology, squall::automatic_topology>) {
    // The model automatic chooses from: each candidate's measured time per size, or the
    // transport's link costs.
    if (s_.calibrate) r->comm.calibrate();
    if (j_.rank == 0) {
      const squall::cost_model& m = r->comm.topology().model;
      if (!m.calibrated()) {
        const squall::link_costs k = m.link.value_or(squall::link_costs{});
        std::printf(
            "# automatic model: the transport's link costs, alpha %.2fus, %.2f GB/s moved, "
            "%.2f GB/s reduced, %s (--calibrate measures it)\n",
            k.alpha * 1e6, 1e-9 / k.beta, 1e-9 / k.gamma,
            k.all_peers_at_once ? "all peers at once" : "one port");
      }
      for (std::size_t c = 0; c < squall::cost_model::candidates && m.calibrated(); ++c) {
        std::printf("# automatic model, %-16s", std::string(squall::cost_model::names[c]).c_str());
        for (const auto& point : m.measured[c])
          std::printf(" %zu:%.1fus", point.bytes, point.seconds * 1e6);
        std::printf("\n");
      }
    }
  }
  return r;
}

template <class Transport>
template <class T>
void bench<Transport>::first_call(runner_base<T>& run, std::vector<T>& in, std::vector<T>& out,
                                  std::size_t count, row& r) {
  const int p = j_.size;
  run.reset(count);
  run.call(in, out, count);
  r.wire_bytes = run.across(static_cast<double>(run.moved().bytes_sent), false);
  // every rank hashes its result; rank 0 alone (all hold the same bits, checked below)
  // recomputes the exact sum
  double error = 0;
  double norm = 0;
  std::uint64_t hash = 0x9e3779b97f4a7c15ull;
  for (std::size_t i = 0; i < count; ++i) {
    const double got = as_double(out[i]);
    if (j_.rank == 0) {
      double exact = 0;
      for (int q = 0; q < p; ++q) exact += static_cast<double>(gradient_value(q, i));
      error += (got - exact) * (got - exact);
      norm += exact * exact;
    }
    std::uint64_t bits = 0;
    const float f = static_cast<float>(got);
    std::memcpy(&bits, &f, sizeof f);
    hash = (hash ^ bits) * 0x100000001b3ull;
  }
  r.rel_error = run.across(norm > 0 ? std::sqrt(error / norm) : std::sqrt(error), false);
  // every rank the same bits: the largest and the smallest hash (its 52 low bits) agree
  const double h = static_cast<double>(hash & ((std::uint64_t{1} << 52) - 1));
  r.wrong = run.across(h, false) != -run.across(-h, false) ? 1 : 0;
}

template <class Transport>
template <class T>
row bench<Transport>::measure(runner_base<T>& run, const compressor_spec& spec, std::size_t bytes,
                              std::vector<T>& in, std::vector<T>& out, double mpi_us,
                              double copy_us, const std::vector<row>& earlier) {
  const int p = j_.size;
  const std::size_t count = count_for(s_, bytes, sizeof(T), p);
  const int iters = iterations(bytes);
  row r;
  r.compressor = spec.text;
  if (s_.compressed()) {
    for (std::size_t i = 0; i < count; ++i) in[i] = static_cast<T>(gradient_value(j_.rank, i));
    first_call(run, in, out, count, r);
  } else {
    T* const fill = run.own_input() != nullptr ? run.own_input() : in.data();
    for (std::size_t i = 0; i < count; ++i) fill[i] = input_value<T>(j_.rank, i);
  }
  refresher<T> fresh(s_.fresh && !s_.compressed(),
                     run.own_input() != nullptr ? run.own_input() : in.data(), count,
                     static_cast<long>(s_.warmup) + iters);
  for (int w = 0; w < s_.warmup; ++w) {
    fresh();
    run.call(in, out, count);
  }
  run.barrier();
  squall::phase_split spent;
  const auto start = clock_type::now();
  for (int it = 0; it < iters; ++it) {
    fresh();
    run.call(in, out, count);
    const squall::phase_split last = run.split();
    spent.encode += last.encode;
    spent.transfer += last.transfer;
    spent.decode += last.decode;
  }
  const double mine = std::chrono::duration<double>(clock_type::now() - start).count() / iters;
  const double t = run.across(mine, false);
  const squall::transfer_stats moved = run.moved();
  if (!s_.compressed()) {
    const std::size_t offset = s_.op == "reduce_scatter" ? run.block_offset(count) : 0;
    const T* const got_in = run.own_input() != nullptr ? run.own_input() : in.data();
    const T* const got_out = run.own_output() != nullptr ? run.own_output() : out.data();
    r.wrong = static_cast<long>(
        run.across(static_cast<double>(count_wrong(got_in, got_out, count, offset)), true));
    r.wire_bytes = run.across(static_cast<double>(moved.bytes_sent), false);
  } else if (!spec.dense()) {
    const double per_call_us = 1e6 / iters / p;  // the ranks' mean of the per-call mean
    r.encode_us = run.across(spent.encode, true) * per_call_us;
    r.transfer_us = run.across(spent.transfer, true) * per_call_us;
    r.decode_us = run.across(spent.decode, true) * per_call_us;
  }
  if (s_.link_bits > 0) {
    const double most =
        run.across(static_cast<double>(std::max(moved.bytes_sent, moved.bytes_received)), false);
    r.bound_us = most * 8 / s_.link_bits * 1e6;
  }
  r.topology = run.label(count * sizeof(T));
  r.bytes = bytes;
  r.count = count;
  r.time_us = t * 1e6;
  r.algbw = static_cast<double>(bytes) / t / 1e9;
  r.busbw = r.algbw * bus_factor(s_.op, p);
  r.mpi_us = mpi_us;
  if (!s_.compressed() && copy_us >= 0) {
    r.traffic = traffic(bytes);
    r.copy_us = copy_us;
  }
  if (r.mpi_us > 0)
    r.mpi_busbw = static_cast<double>(bytes) / (r.mpi_us * 1e-6) / 1e9 * bus_factor(s_.op, p);
  for (const row& dense : earlier) {
    if (s_.compressed() && dense.compressor == "none" && dense.topology == r.topology &&
        dense.bytes == r.bytes && r.wire_bytes > 0) {
      r.compression_ratio = dense.wire_bytes / r.wire_bytes;
    }
  }
  if (spec.dense()) r.compression_ratio = 1;
  if (j_.rank == 0) {
    if (s_.compressed()) {
      std::printf("%12zu %12zu %16s %28s %11.1f %8.2f %8.2f %10.3g %13.0f %8.1f %6ld", r.bytes,
                  r.count, r.compressor.c_str(), r.topology.c_str(), r.time_us, r.algbw, r.busbw,
                  r.rel_error, r.wire_bytes, r.compression_ratio, r.wrong);
    } else {
      std::printf("%12zu %12zu %9s %28s %11.1f %8.2f %8.2f %7ld", r.bytes, r.count,
                  s_.dtype.c_str(), r.topology.c_str(), r.time_us, r.algbw, r.busbw, r.wrong);
    }
    if (r.mpi_us > 0)
      std::printf(" %11.1f %9.2f %8.2f", r.mpi_us, r.mpi_busbw, r.mpi_us / r.time_us);
    else
      std::printf(" %11s %9s %8s", "-", "-", "-");
    if (r.traffic >= 0)
      std::printf(" %12.0f %9.1f %6.1f", r.traffic, r.copy_us, 100 * r.copy_us / r.time_us);
    if (s_.link_bits > 0) std::printf(" %11.1f %7.1f", r.bound_us, 100 * r.bound_us / r.time_us);
    if (r.encode_us >= 0)
      std::printf(" %10.1f %10.1f %10.1f", r.encode_us, r.transfer_us, r.decode_us);
    else if (s_.compressed())
      std::printf(" %10s %10s %10s", "-", "-", "-");
    std::printf("\n");
    std::fflush(stdout);
  }
  return r;
}

template <class Transport>
template <class T>
std::vector<row> bench<Transport>::run() {
  const int p = j_.size;
  std::vector<std::size_t> sizes;
  for (std::size_t b = s_.min_bytes; b <= s_.max_bytes; b *= s_.factor) sizes.push_back(b);
  const std::size_t most = count_for(s_, s_.max_bytes, sizeof(T), p);
  std::vector<T> in(std::max<std::size_t>(most, 1));
  std::vector<T> out(
      std::max<std::size_t>(s_.op == "allgather" ? most * static_cast<std::size_t>(p) : most, 1));
  // Every (compressor, topology) pair, the dense ones first (the compressed rows' baseline).
  const std::vector<compressor_spec> specs =
      s_.compressed() ? s_.compressors : std::vector<compressor_spec>{parse_compressor("none")};
  std::vector<std::unique_ptr<runner_base<T>>> runners;
  std::vector<const compressor_spec*> spec_of;
  for (std::size_t c = 0; c < specs.size(); ++c) {
    for (const std::string& name : s_.topologies) {
      const compressor_spec& spec = specs[c];
      if (name == "ring")
        runners.push_back(make_runner<squall::ring_topology, T>(name, spec, c));
      else if (name == "tree")
        runners.push_back(make_runner<squall::tree_topology, T>(name, spec, c));
      else if (name == "direct")
        runners.push_back(make_runner<squall::direct_topology, T>(name, spec, c));
      else if (name == "halving_doubling")
        runners.push_back(make_runner<squall::halving_doubling_topology, T>(name, spec, c));
      else if (name == "hierarchical")
        runners.push_back(make_runner<squall::hierarchical_topology<>, T>(name, spec, c));
      else
        runners.push_back(make_runner<squall::automatic_topology, T>(name, spec, c));
      spec_of.push_back(&spec);
    }
  }
  if (j_.rank == 0) {
    if (s_.compressed()) {
      std::printf("# %10s %12s %16s %28s %11s %8s %8s %10s %13s %8s %6s %11s %9s %8s", "size",
                  "count", "compressor", "topology", "time_us", "algbw", "busbw", "rel_err",
                  "wire_bytes", "ratio", "#wrong", "mpi_us", "mpi_busbw", "speedup");
    } else {
      std::printf("# %10s %12s %9s %28s %11s %8s %8s %7s %11s %9s %8s %12s %9s %6s", "size",
                  "count", "type", "topology", "time_us", "algbw", "busbw", "#wrong", "mpi_us",
                  "mpi_busbw", "speedup", "traffic", "copy_us", "%copy");
    }
    if (s_.link_bits > 0) std::printf(" %11s %7s", "bound_us", "%bound");
    if (s_.compressed()) std::printf(" %10s %10s %10s", "encode_us", "xfer_us", "decode_us");
    std::printf("\n");
    if (s_.link_bits > 0) {
      std::printf(
          "# link rate %.3g Gbit/s each way: bound_us = the most bytes a rank sent or "
          "received / rate\n",
          s_.link_bits / 1e9);
    }
    std::fflush(stdout);
  }
  std::vector<row> rows;
  for (const std::size_t bytes : sizes) {
    const std::size_t count = count_for(s_, bytes, sizeof(T), p);
    if (count == 0) continue;
    // MPI first, on the same inputs, then every topology.
    for (std::size_t i = 0; i < count; ++i) {
      in[i] =
          s_.compressed() ? static_cast<T>(gradient_value(j_.rank, i)) : input_value<T>(j_.rank, i);
    }
    const double mpi_us = time_mpi(in, out, count, iterations(bytes));
    // the machine's limit for this size: every rank copying half its traffic at once
    const double copy_us = s_.compressed() ? -1
                                           : time_copy(static_cast<std::size_t>(traffic(bytes) / 2),
                                                       iterations(bytes), *runners.front());
    for (std::size_t k = 0; k < runners.size(); ++k) {
      rows.push_back(measure(*runners[k], *spec_of[k], bytes, in, out, mpi_us, copy_us, rows));
    }
  }
  return rows;
}

// Memory bandwidth as the same processes see it: every rank copies a buffer at once.
double memcpy_gbs(const job& j, std::size_t bytes) {
  std::vector<char> a(bytes, 1);
  std::vector<char> b(bytes, 2);
  double best = 1e30;
  for (int i = 0; i < 4; ++i) {
#if SQUALL_BENCH_WITH_MPI
    if (j.mpi) MPI_Barrier(MPI_COMM_WORLD);
#endif
    const auto start = clock_type::now();
    std::memcpy(b.data(), a.data(), bytes);
    best = std::min(best, std::chrono::duration<double>(clock_type::now() - start).count());
  }
  double gbs = static_cast<double>(bytes) / best / 1e9;
#if SQUALL_BENCH_WITH_MPI
  if (j.mpi) {
    double least = 0;
    MPI_Allreduce(&gbs, &least, 1, MPI_DOUBLE, MPI_MIN, MPI_COMM_WORLD);
    gbs = least;
  }
#else
  (void)j;
#endif
  return gbs;
}

// A value of a compressed-run column, or empty where it was not measured.
std::string optional_number(double v, const char* format) {
  if (v < 0) return "";
  char text[64];
  std::snprintf(text, sizeof text, format, v);
  return text;
}

void write_files(const settings& s, const job& j, const std::vector<row>& rows) {
  if (!s.csv.empty()) {
    std::FILE* f = std::fopen(s.csv.c_str(), "w");
    if (f == nullptr) throw std::runtime_error("cannot write " + s.csv);
    std::fprintf(
        f,
        "op,transport,topology,compressor,dtype,ranks,size_bytes,count,time_us,algbw_gbs,"
        "busbw_gbs,wrong,mpi_time_us,mpi_busbw_gbs,speedup_vs_mpi,wire_bytes_per_rank,"
        "compression_ratio,rel_error,wire_bound_us,encode_us,transfer_us,decode_us,traffic_bytes,"
        "copy_us\n");
    for (const row& r : rows) {
      std::fprintf(f, "%s,%s,%s,%s,%s,%d,%zu,%zu,%.3f,%.4f,%.4f,%ld,", s.op.c_str(),
                   s.transport.c_str(), r.topology.c_str(), r.compressor.c_str(), s.dtype.c_str(),
                   j.size, r.bytes, r.count, r.time_us, r.algbw, r.busbw, r.wrong);
      if (r.mpi_us > 0)
        std::fprintf(f, "%.3f,%.4f,%.4f,", r.mpi_us, r.mpi_busbw, r.mpi_us / r.time_us);
      else
        std::fprintf(f, ",,,");
      std::fprintf(
          f, "%s,%s,%s,%s,%s,%s,%s,%s,%s\n", optional_number(r.wire_bytes, "%.0f").c_str(),
          optional_number(r.compression_ratio, "%.3f").c_str(),
          optional_number(r.rel_error, "%.6g").c_str(), optional_number(r.bound_us, "%.3f").c_str(),
          optional_number(r.encode_us, "%.3f").c_str(),
          optional_number(r.transfer_us, "%.3f").c_str(),
          optional_number(r.decode_us, "%.3f").c_str(), optional_number(r.traffic, "%.0f").c_str(),
          optional_number(r.copy_us, "%.3f").c_str());
    }
    std::fclose(f);
  }
  if (!s.json.empty()) {
    std::FILE* f = std::fopen(s.json.c_str(), "w");
    if (f == nullptr) throw std::runtime_error("cannot write " + s.json);
    std::fprintf(f,
                 "{\"op\": \"%s\", \"transport\": \"%s\", \"dtype\": \"%s\", "
                 "\"ranks\": %d, \"results\": [",
                 s.op.c_str(), s.transport.c_str(), s.dtype.c_str(), j.size);
    for (std::size_t i = 0; i < rows.size(); ++i) {
      const row& r = rows[i];
      auto or_null = [](double v, const char* format) {
        const std::string text = optional_number(v, format);
        return text.empty() ? std::string("null") : text;
      };
      std::fprintf(f,
                   "%s\n  {\"topology\": \"%s\", \"compressor\": \"%s\", \"size_bytes\": %zu, "
                   "\"count\": %zu, \"time_us\": %.3f, \"algbw_gbs\": %.4f, \"busbw_gbs\": %.4f, "
                   "\"wrong\": %ld, \"wire_bytes_per_rank\": %s, \"compression_ratio\": %s, "
                   "\"rel_error\": %s, \"wire_bound_us\": %s, \"encode_us\": %s, "
                   "\"transfer_us\": %s, \"decode_us\": %s, \"traffic_bytes\": %s, "
                   "\"copy_us\": %s, ",
                   i == 0 ? "" : ",", r.topology.c_str(), r.compressor.c_str(), r.bytes, r.count,
                   r.time_us, r.algbw, r.busbw, r.wrong, or_null(r.wire_bytes, "%.0f").c_str(),
                   or_null(r.compression_ratio, "%.3f").c_str(),
                   or_null(r.rel_error, "%.6g").c_str(), or_null(r.bound_us, "%.3f").c_str(),
                   or_null(r.encode_us, "%.3f").c_str(), or_null(r.transfer_us, "%.3f").c_str(),
                   or_null(r.decode_us, "%.3f").c_str(), or_null(r.traffic, "%.0f").c_str(),
                   or_null(r.copy_us, "%.3f").c_str());
      if (r.mpi_us > 0) {
        std::fprintf(f, "\"mpi_time_us\": %.3f, \"mpi_busbw_gbs\": %.4f, \"speedup_vs_mpi\": %.4f}",
                     r.mpi_us, r.mpi_busbw, r.mpi_us / r.time_us);
      } else {
        std::fprintf(f,
                     "\"mpi_time_us\": null, \"mpi_busbw_gbs\": null, \"speedup_vs_mpi\": null}");
      }
    }
    std::fprintf(f, "\n]}\n");
    std::fclose(f);
  }
}

template <class Transport>
int run_rank(const settings& s, const job& j) {
  bench<Transport> b(s, j);
  // out of every cache: 64 MiB to 256 MiB
  const double membw = memcpy_gbs(
      j, std::clamp<std::size_t>(s.max_bytes, std::size_t{64} << 20, std::size_t{256} << 20));
  if (j.rank == 0) {
    std::printf(
        "# squall-bench %d.%d.%d: op %s, transport %s, %d ranks, dtype %s, MPI comparison %s\n",
        SQUALL_VERSION_MAJOR, SQUALL_VERSION_MINOR, SQUALL_VERSION_PATCH, s.op.c_str(),
        s.transport.c_str(), j.size, s.dtype.c_str(), j.mpi ? "on" : "off (MPI not built)");
    std::printf("# memcpy bandwidth, every rank copying at once: %.2f GB/s per rank\n", membw);
    std::fflush(stdout);
  }
  std::vector<row> rows;
  if (s.dtype == "float")
    rows = b.template run<float>();
  else if (s.dtype == "double")
    rows = b.template run<double>();
  else if (s.dtype == "int32")
    rows = b.template run<std::int32_t>();
  else if (s.dtype == "int64")
    rows = b.template run<std::int64_t>();
  else if (s.dtype == "float16")
    rows = b.template run<squall::float16>();
  else if (s.dtype == "bfloat16")
    rows = b.template run<squall::bfloat16>();
  else
    usage("unknown dtype '" + s.dtype + "'");
  long wrong = 0;
  for (const row& r : rows) wrong += r.wrong;
  if (j.rank == 0) write_files(s, j, rows);
  return wrong == 0 ? 0 : 1;
}

bool under_launcher() {
  return std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr || std::getenv("PMI_SIZE") != nullptr ||
         std::getenv("SQUALL_BENCH_CHILD") != nullptr;
}

}  // namespace

int main(int argc, char** argv) {
  const settings s = parse(argc, argv);
  const int ranks =
      s.ranks > 0 ? s.ranks : static_cast<int>(std::clamp(sysconf(_SC_NPROCESSORS_ONLN), 2L, 8L));
#if SQUALL_BENCH_WITH_MPI
  if (!under_launcher()) {
    // Re-run under mpiexec, so the same processes time MPI's collective too.
    const char* env = std::getenv("SQUALL_MPIEXEC");
    const std::string mpiexec = env != nullptr && *env ? env : SQUALL_BENCH_MPIEXEC;
    std::vector<std::string> args = {mpiexec, "-n", std::to_string(ranks)};
    if (SQUALL_BENCH_OPEN_MPI) args.emplace_back("--oversubscribe");
    char self[4096] = {};
    const ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    args.emplace_back(n > 0 ? std::string(self, static_cast<std::size_t>(n))
                            : std::string(argv[0]));
    for (int i = 1; i < argc; ++i) args.emplace_back(argv[i]);
    std::vector<char*> cargs;
    for (auto& a : args) cargs.push_back(a.data());
    cargs.push_back(nullptr);
    setenv("SQUALL_BENCH_CHILD", "1", 1);
    setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 0);
    setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 0);
    std::fflush(nullptr);
    execvp(cargs[0], cargs.data());
    std::fprintf(stderr, "squall-bench: cannot run %s (%s); set SQUALL_MPIEXEC\n", mpiexec.c_str(),
                 std::strerror(errno));
    return 2;
  }
  MPI_Init(&argc, &argv);
  job j;
  MPI_Comm_rank(MPI_COMM_WORLD, &j.rank);
  MPI_Comm_size(MPI_COMM_WORLD, &j.size);
  j.mpi = true;
  int status = 0;
  try {
    if (s.transport == "mpi") {
      status = run_rank<squall::mpi_transport>(s, j);
    } else {
      // One job name for all ranks: rank 0's pid and time, broadcast.
      long long id[2] = {
          static_cast<long long>(getpid()),
          static_cast<long long>(clock_type::now().time_since_epoch().count() % 1000000007)};
      MPI_Bcast(id, 2, MPI_LONG_LONG, 0, MPI_COMM_WORLD);
      j.shm_name = "bench-" + std::to_string(id[0]) + "-" + std::to_string(id[1]);
      j.shm_key = squall::shm_job::key_of(j.shm_name);
      status = run_rank<squall::shm_transport>(s, j);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "squall-bench rank %d: %s\n", j.rank, e.what());
    MPI_Abort(MPI_COMM_WORLD, 3);
  }
  int worst = 0;
  MPI_Allreduce(&status, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return worst;
#else
  (void)under_launcher;
  const squall::launch_result result = squall::launch(ranks, [&](const squall::shm_job& me) {
    job j{.rank = me.rank, .size = me.size, .mpi = false, .shm_name = me.name, .shm_key = me.key};
    try {
      return run_rank<squall::shm_transport>(s, j);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "squall-bench rank %d: %s\n", j.rank, e.what());
      return 3;
    }
  });
  return result.ok() ? 0 : 1;
#endif
}
