// SPDX-License-Identifier: Apache-2.0
// Device buffers over mpi_transport (issue 21, item 3), ranks as processes under mpiexec: the
// dense collectives on cuda_backend over MPI (ring, direct, tree, halving-doubling), staged
// through host memory (the allreduce in pieces too), against the serial double reference
// (bitwise), and the compressed allreduce on the device over MPI against the same run on
// host_backend over MPI in the same processes (results and saved state bitwise). The MPI is not
// assumed CUDA-aware: device buffers are staged, whatever the MPI. Every rank uses device 0 (one
// GPU is what the device runs have). A failed check is reported, never REQUIREd, so all ranks keep
// making the same calls. Where the MPI takes device pointers (`mpi_cuda_aware()`), the dense
// collectives also run over `device_mpi_transport<cuda_backend>`, device pointers handed to MPI
// (else that case says so and checks nothing). Its own executable (squall_cuda_mpi_tests, main
// from tests/mpi/main.cpp).

#include <squall/topology/direct.hpp>
#include <squall/topology/halving_doubling.hpp>
#include <squall/topology/ring.hpp>
#include <squall/topology/tree.hpp>
#include <squall/transport/mpi.hpp>
#include <squall/transport/mpi_device.hpp>

#include <doctest/doctest.h>
#include <mpi.h>

#include <chrono>
#include <string>

#include "../support/cuda_device.cuh"
#include "../support/device_collectives.cuh"

namespace {

using namespace std::chrono_literals;
namespace test = squall::test;

squall::mpi_transport world() {
  return squall::mpi_transport(MPI_COMM_WORLD, squall::options{.deadline = 60s});
}

}  // namespace

TEST_SUITE("cuda_mpi") {
  TEST_CASE("dense collectives on device buffers over MPI, staged" *
            doctest::skip(test::no_cuda_device())) {
    test::dense_over<squall::ring_topology>(world());
    test::dense_over<squall::direct_topology>(world());
    test::dense_over<squall::tree_topology>(world());
    test::dense_over<squall::halving_doubling_topology>(world());
    // the staged allreduce in 1,025 pieces of 4 KiB, each copy waited for by its own event
    test::dense_over<squall::ring_topology>(world(), {.staging_chunk_bytes = 4096});
  }

  TEST_CASE("dense collectives on device buffers handed to a CUDA-aware MPI" *
            doctest::skip(test::no_cuda_device())) {
    const squall::mpi_device_support asked = squall::query_mpi_device_support();
    int everywhere = asked.cuda ? 1 : 0;
    MPI_Allreduce(MPI_IN_PLACE, &everywhere, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (everywhere == 0) {
      MESSAGE("this MPI does not take device pointers (" << asked.source << "): not run");
      return;
    }
    using direct = squall::device_mpi_transport<squall::cuda_backend>;
    const squall::cuda_backend gpu(0, nullptr);
    test::dense_over<squall::ring_topology>(direct(world(), gpu));
    test::dense_over<squall::direct_topology>(direct(world(), gpu));
    test::dense_over<squall::tree_topology>(direct(world(), gpu));
    test::dense_over<squall::halving_doubling_topology>(direct(world(), gpu));
  }

  TEST_CASE("compressed allreduce on device buffers over MPI, staged, is the host's" *
            doctest::skip(test::no_cuda_device())) {
    const auto make = [](const std::string&) { return world(); };
    test::compressed_suite(make, make);
  }
}
