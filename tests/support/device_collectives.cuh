// SPDX-License-Identifier: Apache-2.0
#pragma once
// The dense collectives on device buffers, checked on one rank against the serial double
// reference of the exact inputs (collective_checks.hpp), bitwise: written once for every
// communicator on cuda_backend, whatever its transport (threads staged, processes staged over
// shm, processes over CUDA IPC). Records what is wrong in `findings`, never asserts.

#include <squall/core/ops.hpp>

#include <cstddef>
#include <initializer_list>
#include <vector>

#include "collective_checks.hpp"
#include "cuda_device.cuh"

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

}  // namespace squall::test
