// SPDX-License-Identifier: Apache-2.0
// squall-bench's compressed allreduce runners: `--compressor` names to compressor policies
// (squall::visit_compressor), and one communicator<Transport, Topology, C> per (topology,
// compressor) with the caller-owned compression state of its tensor. Included by
// compressed_runners_shm.cpp and compressed_runners_mpi.cpp, one transport each (the build
// compiles them in parallel).
#pragma once

#include <squall/squall.hpp>
#if SQUALL_BENCH_WITH_MPI
#include <squall/transport/mpi.hpp>
#endif

#include <cstring>  // memcpy
#include <memory>
#include <string>
#include <type_traits>
#include <utility>

#include "squall_bench.hpp"

namespace squall_bench {
namespace detail {

template <class Transport, class Topology, class C>
struct compressed_runner final : runner_base<float> {
  compressed_runner(const std::string& topology, Transport transport, C c, const job& j,
                    const squall::options& opts, const squall::collective_tuning& tuning)
      : comm(std::move(transport), Topology{}, std::move(c), opts, tuning),
        state(comm.template make_state<float>(0)),
        j_(j) {
    this->name = topology;
    (void)comm.aggregation();  // an aggregation the compressor does not allow: refused here
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
  squall::transfer_stats moved() const override { return comm.last_transfer(); }
  squall::phase_split split() const override { return comm.last_split(); }
  void reset(std::size_t count) override { state = comm.template make_state<float>(count); }

  squall::communicator<Transport, Topology, C> comm;
  squall::compression_state<C, float> state;
  const job& j_;
};

}  // namespace detail

template <class Transport, class Topology>
std::unique_ptr<runner_base<float>> make_compressed_runner(
    const compressor_spec& spec, const std::string& topology, Transport transport,
    const settings& s, const job& j, const squall::options& opts,
    const squall::collective_tuning& tuning) {
  (void)s;
  return squall::visit_compressor(spec, [&](auto c) -> std::unique_ptr<runner_base<float>> {
    using C = decltype(c);
    if constexpr (std::is_same_v<C, squall::identity_compressor>) {
      return nullptr;  // the dense runs are not made here
    } else {
      return std::make_unique<detail::compressed_runner<Transport, Topology, C>>(
          topology, std::move(transport), std::move(c), j, opts, tuning);
    }
  });
}

}  // namespace squall_bench

/// Instantiates the factory for `Transport` over every topology squall-bench offers; used at
/// global scope, once per transport and translation unit: the compressed algorithms depend on
/// the transport but not the topology, so one TU per transport compiles each of them once.
#define SQUALL_BENCH_COMPRESSED_WITH(Transport, Topology)                              \
  template std::unique_ptr<squall_bench::runner_base<float>>                           \
  squall_bench::make_compressed_runner<Transport, Topology>(                           \
      const squall_bench::compressor_spec&, const std::string&, Transport,             \
      const squall_bench::settings&, const squall_bench::job&, const squall::options&, \
      const squall::collective_tuning&);
#define SQUALL_BENCH_COMPRESSED_OVER(Transport)                              \
  SQUALL_BENCH_COMPRESSED_WITH(Transport, squall::ring_topology)             \
  SQUALL_BENCH_COMPRESSED_WITH(Transport, squall::tree_topology)             \
  SQUALL_BENCH_COMPRESSED_WITH(Transport, squall::direct_topology)           \
  SQUALL_BENCH_COMPRESSED_WITH(Transport, squall::halving_doubling_topology) \
  SQUALL_BENCH_COMPRESSED_WITH(Transport, squall::hierarchical_topology<>)   \
  SQUALL_BENCH_COMPRESSED_WITH(Transport, squall::automatic_topology)
