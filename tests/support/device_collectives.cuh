// SPDX-License-Identifier: Apache-2.0
#pragma once
// The dense collectives on device buffers, checked on one rank against the serial double
// reference of the exact inputs (collective_checks.hpp), bitwise: written once for every
// communicator on cuda_backend, whatever its transport (threads staged, processes staged over
// shm or MPI, processes over CUDA IPC). Records what is wrong in `findings`, never asserts.
// And, for processes, the same collectives built over a transport and checked (`dense_over`),
// and the compressed allreduce on the device against host_backend in the same processes
// (`compressed_over`, `compressed_suite`).

#include <squall/algorithm/communicator.hpp>
#include <squall/compress/cast.hpp>
#include <squall/compress/error_feedback.hpp>
#include <squall/compress/quantize.hpp>
#include <squall/compress/sparsify.hpp>
#include <squall/core/ops.hpp>
#include <squall/cuda.cuh>
#include <squall/topology/ring.hpp>

#include <doctest/doctest.h>

#include <cstddef>
#include <cstring>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include "collective_checks.hpp"
#include "cuda_device.cuh"
#include "topologies.hpp"

namespace squall::test {

/// Allreduce (in place and not), reduce-scatter, allgather and broadcast from every root, of
/// `counts` floats on device buffers.
template <class Comm>
void check_device_collectives(Comm& comm, findings& f,
                              std::initializer_list<std::size_t> counts = {
                                  0, 1, 1009, (std::size_t{1} << 20) + 3}) {
  const int p = comm.size();
  const int r = comm.rank();
  const auto expect = [&f](const char* what, const std::vector<float>& got, auto want) {
    compare(f, what, got.data(), got.size(), 0, want);
  };
  for (const std::size_t count : counts) {
    const auto sum = [p](std::size_t i) { return reference_element<float, sum_op>(p, i); };
    device_vector<float> data(exact_input<float>(r, count));
    comm.allreduce(data.view());
    expect("allreduce in place", data.to_host(), sum);

    const device_vector<float> in(exact_input<float>(r, count));
    device_vector<float> out(std::vector<float>(count, -1.0f));
    comm.allreduce(in.view(), out.view());
    expect("allreduce", out.to_host(), sum);

    device_vector<float> block(std::vector<float>(comm.block_count(count), -1.0f));
    comm.reduce_scatter(in.view(), block.view());
    const std::size_t offset = comm.block_offset(count);
    expect("reduce_scatter", block.to_host(), [&](std::size_t i) { return sum(offset + i); });

    device_vector<float> all(std::vector<float>(count * static_cast<std::size_t>(p), -1.0f));
    comm.allgather(in.view(), all.view());
    expect("allgather", all.to_host(), [count](std::size_t j) {
      return exact_value<float>(static_cast<int>(j / count), j % count);
    });

    for (int root = 0; root < p; ++root) {
      device_vector<float> b(exact_input<float>(r == root ? root : root + 1, count));
      comm.broadcast(b.view(), root);
      expect("broadcast", b.to_host(),
             [root](std::size_t i) { return exact_value<float>(root, i); });
    }
  }
}

/// The dense collectives on cuda_backend over `transport` (a process's end of it), checked.
template <class Topology, class Transport>
void dense_over(Transport transport, const collective_tuning& tuning = {}) {
  CAPTURE(Topology::name);
  CAPTURE(tuning.staging_chunk_bytes);
  const int p = transport.size();
  communicator<Transport, Topology, identity_compressor, cuda_backend> comm(
      std::move(transport), make_topology<Topology>(p), {}, tuning, cuda_backend(0, nullptr));
  findings f;
  check_device_collectives(comm, f);
  INFO(f.text());
  CHECK(f.ok());
}

/// The compressed allreduce on the device over `make_device(name)`'s transport against
/// host_backend over `make_host(name)`'s, in this process, step by step: results and saved
/// state bitwise.
template <class MakeDevice, class MakeHost, class C>
void compressed_over(MakeDevice make_device, MakeHost make_host, const std::string& name,
                     const C& c, aggregation how) {
  CAPTURE(compressor_label<C>());
  CAPTURE(std::string(to_string(how)));
  collective_tuning tuning;
  tuning.aggregation = how;
  using device_transport = decltype(make_device(name));
  using host_transport = decltype(make_host(name));
  communicator<device_transport, ring_topology, C, cuda_backend> device(
      make_device(name), {}, c, {}, tuning, cuda_backend(0, nullptr));
  communicator<host_transport, ring_topology, C, host_backend> host(make_host(name), {}, c, {},
                                                                    tuning, host_backend{});
  const int r = host.rank();
  for (const std::size_t count : {std::size_t{1}, std::size_t{1009}, std::size_t{1} << 18}) {
    CAPTURE(count);
    auto on_device = device.template make_state<float>(count);
    auto on_host = host.template make_state<float>(count);
    for (int step = 0; step < 3; ++step) {
      CAPTURE(step);
      std::vector<float> values = exact_input<float>(r + step, count);
      for (float& v : values) v /= 7;
      device_vector<float> data(values);
      device.allreduce(data.view(), on_device);
      host.allreduce(host_view<float>(values), on_host);
      const std::vector<float> got = data.to_host();
      CHECK(std::memcmp(got.data(), values.data(), count * sizeof(float)) == 0);
    }
    CHECK(on_device.save() == on_host.save());
  }
}

/// compressed_over for cast<bfloat16> with error feedback (linear), int8 (gather) and top-k 1%
/// with error feedback (gather; per_hop does not stage).
template <class MakeDevice, class MakeHost>
void compressed_suite(MakeDevice make_device, MakeHost make_host) {
  compressed_over(make_device, make_host, "-cast", error_feedback<cast_compressor<bfloat16>>{},
                  aggregation::linear);
  compressed_over(make_device, make_host, "-int8", int8_compressor{}, aggregation::gather);
  compressed_over(make_device, make_host, "-topk", error_feedback<topk_compressor>{{.ratio = 0.01}},
                  aggregation::gather);
}

}  // namespace squall::test
