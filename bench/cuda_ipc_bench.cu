// SPDX-License-Identifier: Apache-2.0
// The dense allreduce of float device buffers between the processes of one host (issue 21's
// figure): cuda_ipc_transport (ring in pieces of 4, 16 and 64 MiB (its default); direct)
// beside the same collective staged through host memory over shm_transport (ring in one piece,
// ring and direct in 4 MiB pieces whose copies overlap the allreduce; and, the bound of those,
// the allreduce of host buffers over shm on the host), and beside the
// device-to-device copy bandwidth of the GPU (a cudaMemcpy of the same bytes, timed on rank 0 alone
// before the collectives). Run under squall-run:
//
//   squall-run -n 4 squall_cuda_ipc_bench [--max-mib 256]
//
// Each line is the median over the iterations of rank 0's time from a barrier to the end of
// one allreduce (in place, every rank's own buffer), and the NCCL-style bus bandwidth
// 2 (P - 1) / P x bytes / time. With several processes on one GPU every rank's copies and
// reductions share that GPU's memory: the copy bandwidth is the ceiling for all of them.
// Built only where nvcc is, outside `all`; run on a GPU by scripts/gpu-check.sh.

#include <squall/algorithm/communicator.hpp>
#include <squall/cuda.cuh>
#include <squall/topology/direct.hpp>
#include <squall/topology/ring.hpp>
#include <squall/transport/cuda_ipc.cuh>
#include <squall/transport/shm.hpp>

#include <algorithm>
#include <chrono>
#include <concepts>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

namespace {

using squall::cuda_backend;
using clock_type = std::chrono::steady_clock;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

int iterations_for(std::size_t bytes) {
  return bytes <= (std::size_t{8} << 20) ? 30 : bytes <= (std::size_t{64} << 20) ? 12 : 6;
}

// Seconds of one cudaMemcpy device to device of `bytes` (median).
double copy_seconds(std::size_t bytes) {
  void* a = nullptr;
  void* b = nullptr;
  SQUALL_CUDA_CHECK(cudaMalloc(&a, bytes));
  SQUALL_CUDA_CHECK(cudaMalloc(&b, bytes));
  SQUALL_CUDA_CHECK(cudaMemset(a, 1, bytes));
  std::vector<double> t;
  for (int i = 0; i < iterations_for(bytes) + 2; ++i) {
    const auto start = clock_type::now();
    SQUALL_CUDA_CHECK(cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice));
    SQUALL_CUDA_CHECK(cudaDeviceSynchronize());
    if (i >= 2) t.push_back(std::chrono::duration<double>(clock_type::now() - start).count());
  }
  cudaFree(a);
  cudaFree(b);
  return median(t);
}

// Microseconds per (4-byte memset + stream synchronize) on rank 0, over 300 of them: the cost
// of one small piece of device work and the wait for it, which every step of a collective
// pays at least once.
double small_op_us() {
  void* word = nullptr;
  SQUALL_CUDA_CHECK(cudaMalloc(&word, 4));
  const int n = 300;
  const auto start = clock_type::now();
  for (int i = 0; i < n; ++i) {
    SQUALL_CUDA_CHECK(cudaMemsetAsync(word, i, 4, nullptr));
    SQUALL_CUDA_CHECK(cudaStreamSynchronize(nullptr));
  }
  const double us = std::chrono::duration<double, std::micro>(clock_type::now() - start).count();
  cudaFree(word);
  return us / n;
}

template <class F>
double us_per_call(int n, F&& f) {
  const auto start = clock_type::now();
  for (int i = 0; i < n; ++i) f();
  return std::chrono::duration<double, std::micro>(clock_type::now() - start).count() / n;
}

// Where a message's time goes, on ranks 0 and 1 (over `control`): an 88-byte round trip
// through shared memory, the driver calls a send makes (pointer attributes, handle export),
// the device guard every poll takes, and an 8-byte copy out of the peer's memory (IPC) and out
// of this process's own, each until its event completes.
void latency_breakdown(squall::shm_transport& control) {
  const int me = control.rank();
  if (me > 1 || control.size() < 2) {  // the two barriers of ranks 0 and 1
    control.barrier().wait();
    control.barrier().wait();
    return;
  }
  const int other = 1 - me;
  std::byte word[88] = {};
  const double shm_rtt = us_per_call(500, [&] {
    if (me == 0) {
      control.send(other, {word, sizeof word}).wait();
      control.recv(other, {word, sizeof word}).wait();
    } else {
      control.recv(other, {word, sizeof word}).wait();
      control.send(other, {word, sizeof word}).wait();
    }
  });
  void* mine = nullptr;
  void* local = nullptr;
  SQUALL_CUDA_CHECK(cudaMalloc(&mine, 1 << 20));
  SQUALL_CUDA_CHECK(cudaMalloc(&local, 1 << 20));
  cudaIpcMemHandle_t h{};
  const double attributes =
      us_per_call(200, [&] { (void)squall::detail::cuda_ipc::exportable(mine); });
  const double get_handle =
      us_per_call(200, [&] { SQUALL_CUDA_CHECK(cudaIpcGetMemHandle(&h, mine)); });
  const double guard = us_per_call(2000, [] { const squall::detail::device_guard g(0); });
  cudaIpcMemHandle_t theirs{};
  auto sent = control.send(other, {reinterpret_cast<const std::byte*>(&h), sizeof h});
  control.recv(other, {reinterpret_cast<std::byte*>(&theirs), sizeof theirs}).wait();
  sent.wait();
  void* peer = nullptr;
  SQUALL_CUDA_CHECK(cudaIpcOpenMemHandle(&peer, theirs, cudaIpcMemLazyEnablePeerAccess));
  cudaEvent_t e = nullptr;
  SQUALL_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  const auto copy_from = [&](const void* from) {
    return us_per_call(300, [&] {
      SQUALL_CUDA_CHECK(cudaMemcpyAsync(local, from, 8, cudaMemcpyDefault, nullptr));
      SQUALL_CUDA_CHECK(cudaEventRecord(e, nullptr));
      while (cudaEventQuery(e) == cudaErrorNotReady) {
      }
    });
  };
  const double ipc_copy = copy_from(peer);
  const double own_copy = copy_from(mine);
  control.barrier().wait();
  SQUALL_CUDA_CHECK(cudaIpcCloseMemHandle(peer));
  cudaEventDestroy(e);
  cudaFree(mine);
  cudaFree(local);
  if (me == 0) {
    std::printf(
        "per call, us: shm 88-byte round trip %.1f; pointer attributes %.2f; "
        "cudaIpcGetMemHandle %.2f; device guard %.2f; 8-byte copy + event from the "
        "peer's memory %.1f, from this process's %.1f\n",
        shm_rtt, attributes, get_handle, guard, ipc_copy, own_copy);
  }
  control.barrier().wait();
}

squall::shm_job job(const std::string& suffix) {
  squall::shm_job j = squall::shm_job::from_environment();
  j.name += suffix;
  return j;
}

// Rank 0's median seconds of one allreduce of `bytes` on `comm` (device buffers; host
// buffers where the communicator's backend is the host's).
template <class Comm>
double allreduce_seconds(Comm& comm, std::size_t bytes) {
  constexpr bool on_host =
      std::same_as<std::decay_t<decltype(comm.backend())>, squall::host_backend>;
  const std::size_t count = bytes / sizeof(float);
  std::vector<float> init(count, 1.0f / static_cast<float>(comm.size()));
  float* data = init.data();
  if constexpr (!on_host) {
    SQUALL_CUDA_CHECK(cudaMalloc(&data, bytes));
    SQUALL_CUDA_CHECK(cudaMemcpy(data, init.data(), bytes, cudaMemcpyHostToDevice));
  }
  std::vector<double> t;
  for (int i = 0; i < iterations_for(bytes) + 2; ++i) {
    comm.barrier();
    const auto start = clock_type::now();
    comm.allreduce(typename Comm::template view<float>(data, count));
    if (i >= 2) t.push_back(std::chrono::duration<double>(clock_type::now() - start).count());
  }
  if constexpr (!on_host) cudaFree(data);
  return median(t);
}

template <class Transport, class Topology, class Backend = cuda_backend>
void run(const char* label, Transport transport, std::size_t chunk, std::size_t max_bytes,
         const std::vector<double>& copy,
         std::size_t staging = squall::collective_tuning{}.staging_chunk_bytes) {
  squall::collective_tuning tuning;
  tuning.chunk_bytes = chunk;
  tuning.staging_chunk_bytes = staging;
  squall::communicator<Transport, Topology, squall::identity_compressor, Backend> comm(
      std::move(transport), {}, {}, tuning, Backend{});  // cuda_backend{}: device 0, stream 0
  const int p = comm.size();
  std::size_t k = 0;
  for (std::size_t bytes = std::size_t{1} << 20; bytes <= max_bytes; bytes *= 4, ++k) {
    const double s = allreduce_seconds(comm, bytes);
    const double busbw = 2.0 * (p - 1) / p * static_cast<double>(bytes) / s / 1e9;
    const double copy_rate = 2.0 * static_cast<double>(bytes) / copy[k] / 1e9;
    if (comm.rank() == 0) {
      std::printf("%-28s P=%d %7.0f MiB %9.1f us  busbw %7.1f GB/s  copy %7.1f GB/s  %.2fx\n",
                  label, p, static_cast<double>(bytes) / (1 << 20), s * 1e6, busbw, copy_rate,
                  busbw / copy_rate);
      std::fflush(stdout);
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::size_t max_mib = 256;
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], "--max-mib") == 0) max_mib = std::strtoull(argv[i + 1], nullptr, 10);
  }
  const std::size_t max_bytes = max_mib << 20;
  try {
    const squall::shm_job me = squall::shm_job::from_environment();
    // the copy rate, rank 0 alone (the others wait at the first communicator's barrier)
    std::vector<double> copy;
    for (std::size_t bytes = std::size_t{1} << 20; bytes <= max_bytes; bytes *= 4) {
      copy.push_back(me.rank == 0 ? copy_seconds(bytes) : 1.0);
    }
    const auto ipc = [](const char* suffix) {
      return squall::cuda_ipc_transport(squall::shm_transport(job(suffix)),
                                        cuda_backend(0, nullptr));
    };
    // What sharing one GPU between processes costs (each process is a context of its own,
    // time-sliced): a small device operation and its wait on rank 0 alone, then on every rank
    // at once; and one message's round trip between ranks 0 and 1.
    {
      squall::shm_transport control(job("-l"));
      latency_breakdown(control);
    }
    {
      squall::cuda_ipc_transport t = ipc("-p");
      const double alone = me.rank == 0 ? small_op_us() : 0.0;
      t.barrier().wait();
      const double together = small_op_us();
      t.barrier().wait();
      for (const std::size_t bytes : {std::size_t{8}, std::size_t{1} << 20}) {
        void* buffer = nullptr;
        SQUALL_CUDA_CHECK(cudaMalloc(&buffer, bytes));
        const squall::device_view<std::byte> b(static_cast<std::byte*>(buffer), bytes);
        const int n = 200;
        double us = 0;
        if (me.rank <= 1 && t.size() > 1) {
          const int other = 1 - me.rank;
          const auto start = clock_type::now();
          for (int i = 0; i < n + 10; ++i) {
            if (i == 10)
              us = -std::chrono::duration<double, std::micro>(clock_type::now() - start).count();
            if (me.rank == 0) {
              t.send(other, b).wait();
              t.recv(other, b).wait();
            } else {
              t.recv(other, b).wait();
              t.send(other, b).wait();
            }
          }
          us += std::chrono::duration<double, std::micro>(clock_type::now() - start).count();
        }
        t.barrier().wait();
        cudaFree(buffer);
        if (me.rank == 0) {
          std::printf("round trip rank 0 <-> 1 of %zu bytes: %.1f us\n", bytes, us / n);
        }
      }
      if (me.rank == 0) {
        std::printf(
            "4-byte memset + synchronize: %.1f us alone, %.1f us with %d processes on "
            "the GPU\n",
            alone, together, t.size());
        std::fflush(stdout);
      }
    }
    const std::size_t mib = std::size_t{1} << 20;
    run<squall::cuda_ipc_transport, squall::ring_topology>("cuda_ipc ring 4 MiB", ipc("-r4"),
                                                           4 * mib, max_bytes, copy);
    run<squall::cuda_ipc_transport, squall::ring_topology>("cuda_ipc ring 16 MiB", ipc("-r16"),
                                                           16 * mib, max_bytes, copy);
    run<squall::cuda_ipc_transport, squall::ring_topology>("cuda_ipc ring 64 MiB", ipc("-r64"),
                                                           64 * mib, max_bytes, copy);
    run<squall::cuda_ipc_transport, squall::direct_topology>("cuda_ipc direct 16 MiB", ipc("-d16"),
                                                             16 * mib, max_bytes, copy);
    // staged through page-locked host memory: the whole buffer each way, then in 4 MiB pieces
    // whose copies overlap the allreduce of the others (collective_tuning::staging_chunk_bytes)
    run<squall::shm_transport, squall::ring_topology>(
        "shm staged ring, 1 piece", squall::shm_transport(job("-s1")), mib / 4, max_bytes, copy, 0);
    run<squall::shm_transport, squall::ring_topology>("shm staged ring, 4 MiB pieces",
                                                      squall::shm_transport(job("-s")), mib / 4,
                                                      max_bytes, copy);
    run<squall::shm_transport, squall::direct_topology>("shm staged direct, 4 MiB pieces",
                                                        squall::shm_transport(job("-sd")), mib / 4,
                                                        max_bytes, copy);
    // what the staged ones are bound by: the same allreduce of host buffers on the host
    run<squall::shm_transport, squall::ring_topology, squall::host_backend>(
        "shm host buffers, ring", squall::shm_transport(job("-hr")), mib / 4, max_bytes, copy);
    run<squall::shm_transport, squall::direct_topology, squall::host_backend>(
        "shm host buffers, direct", squall::shm_transport(job("-hd")), mib / 4, max_bytes, copy);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "squall_cuda_ipc_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
