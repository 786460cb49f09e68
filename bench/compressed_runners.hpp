// SPDX-License-Identifier: Apache-2.0
// squall-bench's compressed allreduce runners: `--compressor` names to compressor policies,
// and one communicator<Transport, Topology, C> per (topology, compressor) with the caller-owned
// compression state of its tensor. Included by compressed_runners_*.cpp, which instantiate
// the factory for a few topologies each (so the build compiles them in parallel).
#pragma once

#include <squall/squall.hpp>
#if SQUALL_BENCH_WITH_MPI
#include <squall/transport/mpi.hpp>
#endif

#include <cstdlib>  // strtod
#include <cstring>  // memcpy
#include <memory>
#include <string>
#include <utility>

#include "squall_bench.hpp"

namespace squall_bench {
namespace detail {

/// `spec`'s parameter as a positive number, `fallback` if it has none.
inline double parameter_of(const compressor_spec& spec, double fallback) {
  if (spec.parameter.empty()) return fallback;
  char* end = nullptr;
  const double v = std::strtod(spec.parameter.c_str(), &end);
  if (end == spec.parameter.c_str() || *end != '\0' || !(v > 0)) {
    usage("--compressor " + spec.text + ": '" + spec.parameter + "' is not a positive number");
  }
  return v;
}

template <class Transport, class Topology, class C>
struct compressed_runner final : runner_base<float> {
  compressed_runner(const std::string& topology, Transport transport, C c, const job& j,
                    const squall::options& opts, const squall::collective_tuning& tuning)
      : comm(std::move(transport), Topology{}, std::move(c), opts, tuning),
        state(comm.template make_state<float>(0)),
        j_(j) {
    this->name = topology;
  }

  // out = in, then the compressed sum in place; the state carries over between calls (the
  // residual and Q of a training loop), and is made anew when the count changes.
  void call(std::vector<float>& in, std::vector<float>& out, std::size_t count) override {
    if (state.count() != count) reset(count);
    std::memcpy(out.data(), in.data(), count * sizeof(float));
    comm.allreduce(squall::host_view<float>(out.data(), count), state);
  }
  std::string label(std::size_t bytes) const override { return comm.schedule_for(bytes); }
  double across(double v, bool sum) override { return across_ranks(comm, j_, v, sum); }
  void barrier() override { comm.transport().barrier().wait(); }
  std::size_t block_offset(std::size_t count) const override { return comm.block_offset(count); }
  std::uint64_t bytes_sent() const override { return comm.last_transfer().bytes_sent; }
  void reset(std::size_t count) override { state = comm.template make_state<float>(count); }

  squall::communicator<Transport, Topology, C> comm;
  squall::compression_state<C, float> state;
  const job& j_;
};

template <class Transport, class Topology, class C>
std::unique_ptr<runner_base<float>> runner_for(const compressor_spec& spec, C c,
                                               const std::string& topology, Transport transport,
                                               const job& j, const squall::options& opts,
                                               const squall::collective_tuning& tuning) {
  if (spec.error_feedback) {
    using E = squall::error_feedback<C>;
    return std::make_unique<compressed_runner<Transport, Topology, E>>(
        topology, std::move(transport), E{std::move(c)}, j, opts, tuning);
  }
  return std::make_unique<compressed_runner<Transport, Topology, C>>(topology, std::move(transport),
                                                                      std::move(c), j, opts, tuning);
}

}  // namespace detail

template <class Transport, class Topology>
std::unique_ptr<runner_base<float>> make_compressed_runner(const compressor_spec& spec,
                                                           const std::string& topology,
                                                           Transport transport, const settings& s,
                                                           const job& j,
                                                           const squall::options& opts,
                                                           const squall::collective_tuning& tuning) {
  (void)s;
  auto make = [&](auto c) {
    return detail::runner_for<Transport, Topology>(spec, std::move(c), topology, std::move(transport), j,
                                                   opts, tuning);
  };
  const std::string& n = spec.name;
  const std::string& p = spec.parameter;
  if (n == "cast") {
    if (p == "fp16" || p == "float16") return make(squall::cast_compressor<squall::float16>{});
    if (p.empty() || p == "bf16" || p == "bfloat16") return make(squall::cast_compressor<squall::bfloat16>{});
    usage("--compressor " + spec.text + ": cast takes fp16 or bf16");
  }
  if (n == "int8") return make(squall::int8_compressor{});
  if (n == "sign") return make(squall::sign_compressor{});
  if (n == "sign_vote") return make(squall::sign_vote_compressor{});
  if (n == "terngrad") return make(squall::terngrad_compressor{});
  if (n == "qsgd") {
    if (p.empty() || p == "4") return make(squall::qsgd_compressor<4>{});
    if (p == "16") return make(squall::qsgd_compressor<16>{});
    if (p == "127") return make(squall::qsgd_compressor<127>{});
    usage("--compressor " + spec.text + ": qsgd takes 4, 16 or 127 levels");
  }
  if (n == "topk" || n == "topk_sampled") {
    squall::topk_compressor c;
    c.ratio = detail::parameter_of(spec, 0.01);
    if (n == "topk_sampled") c.method = squall::topk_method::sampled_threshold;
    return make(c);
  }
  if (n == "randomk") {
    squall::randomk_compressor c;
    c.ratio = detail::parameter_of(spec, 0.01);
    return make(c);
  }
  if (n == "threshold") {
    squall::threshold_compressor c;
    c.tau = detail::parameter_of(spec, 0.01);
    return make(c);
  }
  if (n == "count_sketch") return make(squall::count_sketch_compressor<3, 65536>{});
  if (n == "powersgd") {
    squall::powersgd_compressor c;
    c.rank = static_cast<std::size_t>(detail::parameter_of(spec, 4));
    return make(c);
  }
  return nullptr;
}

}  // namespace squall_bench

/// Instantiates the factory for `Topology` over shm_transport (and mpi_transport when built);
/// used at global scope.
#define SQUALL_BENCH_COMPRESSED_WITH(Transport, Topology)                                       \
  template std::unique_ptr<squall_bench::runner_base<float>>                                    \
  squall_bench::make_compressed_runner<Transport, Topology>(                                    \
      const squall_bench::compressor_spec&, const std::string&, Transport,                      \
      const squall_bench::settings&, const squall_bench::job&, const squall::options&,          \
      const squall::collective_tuning&);
#if SQUALL_BENCH_WITH_MPI
#define SQUALL_BENCH_COMPRESSED_FOR(Topology)                       \
  SQUALL_BENCH_COMPRESSED_WITH(squall::shm_transport, Topology)     \
  SQUALL_BENCH_COMPRESSED_WITH(squall::mpi_transport, Topology)
#else
#define SQUALL_BENCH_COMPRESSED_FOR(Topology) SQUALL_BENCH_COMPRESSED_WITH(squall::shm_transport, Topology)
#endif
