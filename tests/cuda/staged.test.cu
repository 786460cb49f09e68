// SPDX-License-Identifier: Apache-2.0
// The dense collectives on the CUDA backend over a host transport (threads over
// inproc_transport, one device): device buffers staged through host memory (dense.hpp's staged
// core; the allreduce in 4 KiB pieces too), each result copied back and compared with the
// serial double reference, bitwise. The
// compressed allreduce staged the same way (encode and decode on the device, payloads through
// host memory; state in device memory) against the same run on host_backend, bitwise: the
// compressors used are the device kernels' deterministic twins (error_feedback.test.cu), and
// both runs are told the aggregation, since the host's automatic choice for int8 is per_hop,
// which does not stage.

#include <squall/algorithm/communicator.hpp>
#include <squall/compress/cast.hpp>
#include <squall/compress/error_feedback.hpp>
#include <squall/compress/homomorphic.hpp>
#include <squall/compress/quantize.hpp>
#include <squall/compress/sketch.hpp>
#include <squall/compress/sparsify.hpp>
#include <squall/cuda.cuh>
#include <squall/topology/direct.hpp>
#include <squall/topology/ring.hpp>
#include <squall/transport/inproc.hpp>

#include <doctest/doctest.h>

#include <cstddef>
#include <cstring>
#include <string>
#include <vector>

#include "../support/cuda_device.cuh"
#include "../support/device_collectives.cuh"
#include "../support/thread_ranks.hpp"
#include "../support/topologies.hpp"

namespace test = squall::test;
using squall::cuda_backend;
using squall::inproc_transport;

namespace {

template <class Topology>
void staged_collectives(int p, const squall::collective_tuning& tuning = {}) {
  test::run_ranks(p, [p, &tuning](inproc_transport& t) {
    squall::communicator<inproc_transport, Topology, squall::identity_compressor, cuda_backend>
        comm(std::move(t), test::make_topology<Topology>(p), {}, tuning, cuda_backend(0, nullptr));
    test::findings f;
    test::check_device_collectives(comm, f);
    INFO(f.text());
    CHECK(f.ok());
  });
}

// What one rank saw of `steps` compressed allreduces: each result and the saved state.
struct compressed_record {
  std::vector<std::vector<float>> out;
  std::vector<std::byte> saved;
};

template <class Backend, class C>
std::vector<compressed_record> run_compressed(int p, const C& c, squall::aggregation how,
                                              std::size_t count, const Backend& backend,
                                              bool exact) {
  std::vector<compressed_record> records(static_cast<std::size_t>(p));
  squall::collective_tuning tuning;
  tuning.aggregation = how;
  test::run_ranks(p, [&](inproc_transport& t) {
    squall::communicator<inproc_transport, squall::ring_topology, C, Backend> comm(
        std::move(t), {}, c, {}, tuning, backend);
    const int r = comm.rank();
    auto state = comm.template make_state<float>(count);
    for (int step = 0; step < 3; ++step) {
      std::vector<float> values = test::exact_input<float>(r + step, count);
      if (!exact) {
        for (float& v : values) v /= 7;
      }
      if constexpr (std::same_as<Backend, cuda_backend>) {
        test::device_vector<float> data(values);
        comm.allreduce(data.view(), state);
        values = data.to_host();
      } else {
        comm.allreduce(squall::host_view<float>(values), state);
      }
      records[static_cast<std::size_t>(r)].out.push_back(values);
    }
    records[static_cast<std::size_t>(r)].saved = state.save();
  });
  return records;
}

template <class C>
void staged_compressed(int p, const C& c, squall::aggregation how, bool exact = false) {
  CAPTURE(squall::compressor_label<C>());
  CAPTURE(std::string(squall::to_string(how)));
  for (const std::size_t count : {std::size_t{1}, std::size_t{1009}, std::size_t{1} << 18}) {
    CAPTURE(count);
    const auto host = run_compressed(p, c, how, count, squall::host_backend{}, exact);
    const auto device = run_compressed(p, c, how, count, cuda_backend(0, nullptr), exact);
    for (std::size_t r = 0; r < host.size(); ++r) {
      CAPTURE(r);
      for (std::size_t s = 0; s < host[r].out.size(); ++s) {
        CAPTURE(s);
        REQUIRE(device[r].out[s].size() == host[r].out[s].size());
        CHECK(std::memcmp(device[r].out[s].data(), host[r].out[s].data(), count * sizeof(float)) ==
              0);
      }
      CHECK(device[r].saved == host[r].saved);
    }
  }
}

}  // namespace

TEST_SUITE("cuda") {
  TEST_CASE(
      "the compressed allreduce on device buffers over a host transport, staged, is the "
      "host's" *
      doctest::skip(test::no_cuda_device())) {
    for (const int p : {1, 2, 3}) {
      CAPTURE(p);
      // linear (cast), gather (int8 and topk with error feedback; per_hop does not stage)
      staged_compressed(p, squall::error_feedback<squall::cast_compressor<squall::bfloat16>>{},
                        squall::aggregation::linear);
      staged_compressed(p, squall::int8_compressor{}, squall::aggregation::gather);
      staged_compressed(p, squall::error_feedback<squall::topk_compressor>{{.ratio = 0.01}},
                        squall::aggregation::gather);
      // hq's integer words summed by the topology; unclipped, so the scale is the exact max
      // |y| on both backends (a clipped range's rms may differ in its last bits)
      staged_compressed(p, squall::homomorphic_compressor{.clip = 0}, squall::aggregation::linear);
      // count sketch's two rounds (the device adds buckets atomically: integer inputs, so
      // every order gives the host's sums and the same k coordinates)
      staged_compressed(p, squall::error_feedback<squall::count_sketch_compressor<3, 256>>{},
                        squall::aggregation::two_round, true);
    }
  }

  TEST_CASE("the dense collectives on device buffers over a host transport, staged" *
            doctest::skip(test::no_cuda_device())) {
    for (const int p : {1, 2, 3}) {
      CAPTURE(p);
      staged_collectives<squall::ring_topology>(p);
      staged_collectives<squall::direct_topology>(p);
      // the allreduce in 1,025 pieces of 4 KiB, each copy waited for by its own event
      staged_collectives<squall::direct_topology>(p, {.staging_chunk_bytes = 4096});
    }
  }
}
