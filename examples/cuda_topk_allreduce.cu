// SPDX-License-Identifier: Apache-2.0
// A device gradient averaged with top-k (1%) and error feedback over CUDA IPC (issue 21,
// item 5): each of P processes started by squall-run keeps its gradient in GPU memory, and
// the communicator's policies say how it moves (cuda_ipc_transport, bootstrapped over the
// shared-memory job), along which schedule (ring) and compressed how (top-k with error
// feedback), with every kernel on the rank's CUDA stream. Beside it, the same gradients go
// through a dense allreduce; rank 0 prints, step by step, the bytes each sent and how far the
// running sum of the compressed results is from the dense one (error feedback carries what
// top-k left out into later steps, so the gap stays bounded instead of growing).
//
//   squall-run -n 2 squall-cuda-topk
#include <squall/algorithm/communicator.hpp>
#include <squall/compress/error_feedback.hpp>
#include <squall/compress/sparsify.hpp>
#include <squall/cuda.cuh>
#include <squall/topology/ring.hpp>
#include <squall/transport/cuda_ipc.cuh>
#include <squall/transport/shm.hpp>

#include <cmath>
#include <cstdio>
#include <vector>

namespace {

// Rank r's gradient at step t: smooth in i, different per rank and step.
std::vector<float> gradient(int r, int t, std::size_t n) {
  std::vector<float> g(n);
  for (std::size_t i = 0; i < n; ++i) {
    g[i] = std::sin(0.001f * static_cast<float>(i) * static_cast<float>(r + 1) +
                    static_cast<float>(t)) /
           static_cast<float>(1 + i % 97);
  }
  return g;
}

// Five steps of both allreduces on `gpu` (its stream outlives this function's communicators).
void run(const squall::cuda_backend& gpu) {
  using squall::cuda_backend;
  using squall::cuda_ipc_transport;
  using squall::shm_transport;
  const cudaStream_t stream = gpu.stream;

  squall::shm_job job = squall::shm_job::from_environment();

  using topk_ef = squall::error_feedback<squall::topk_compressor>;
  squall::communicator<cuda_ipc_transport, squall::ring_topology, topk_ef, cuda_backend> sparse(
      cuda_ipc_transport(shm_transport(job), gpu), {}, topk_ef{{.ratio = 0.01}}, {}, {}, gpu);
  job.name += "-dense";
  squall::communicator<cuda_ipc_transport, squall::ring_topology, squall::identity_compressor,
                       cuda_backend>
      dense(cuda_ipc_transport(shm_transport(job), gpu), {}, {}, {}, gpu);

  const std::size_t n = std::size_t{1} << 22;  // 16 MiB of float
  float* grad = nullptr;
  float* reference = nullptr;
  SQUALL_CUDA_CHECK(cudaMalloc(&grad, n * sizeof(float)));
  SQUALL_CUDA_CHECK(cudaMalloc(&reference, n * sizeof(float)));
  auto state = sparse.make_state<float>(n);
  std::vector<double> sum_sparse(n, 0.0);
  std::vector<double> sum_dense(n, 0.0);
  std::vector<float> host(n);
  for (int t = 0; t < 5; ++t) {
    const std::vector<float> g = gradient(sparse.rank(), t, n);
    SQUALL_CUDA_CHECK(
        cudaMemcpyAsync(grad, g.data(), n * sizeof(float), cudaMemcpyHostToDevice, stream));
    SQUALL_CUDA_CHECK(
        cudaMemcpyAsync(reference, g.data(), n * sizeof(float), cudaMemcpyHostToDevice, stream));
    sparse.allreduce(squall::device_view<float>(grad, n), state, squall::avg_op{});
    const auto sparse_bytes = sparse.last_transfer().bytes_sent;
    dense.allreduce(squall::device_view<float>(reference, n), squall::avg_op{});
    const auto dense_bytes = dense.last_transfer().bytes_sent;
    SQUALL_CUDA_CHECK(cudaMemcpy(host.data(), grad, n * sizeof(float), cudaMemcpyDeviceToHost));
    for (std::size_t i = 0; i < n; ++i) sum_sparse[i] += host[i];
    SQUALL_CUDA_CHECK(
        cudaMemcpy(host.data(), reference, n * sizeof(float), cudaMemcpyDeviceToHost));
    double gap = 0;
    double norm = 0;
    for (std::size_t i = 0; i < n; ++i) {
      sum_dense[i] += host[i];
      gap += (sum_sparse[i] - sum_dense[i]) * (sum_sparse[i] - sum_dense[i]);
      norm += sum_dense[i] * sum_dense[i];
    }
    if (sparse.rank() == 0) {
      std::printf(
          "step %d: %d ranks, top-k 1%% + error feedback sent %llu bytes, dense %llu "
          "(%.1fx less); running sums differ by %.3f of the dense one's norm\n",
          t, sparse.size(), static_cast<unsigned long long>(sparse_bytes),
          static_cast<unsigned long long>(dense_bytes),
          static_cast<double>(dense_bytes) / static_cast<double>(sparse_bytes),
          std::sqrt(gap / norm));
    }
  }
  cudaFree(grad);
  cudaFree(reference);
}

}  // namespace

int main() {
  using squall::cuda_backend;
  try {
    std::setvbuf(stdout, nullptr, _IOLBF, 0);  // each line out at once, also if a peer fails
    cudaStream_t stream = nullptr;
    SQUALL_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    run(cuda_backend(0, stream));
    // the communicators, which use the stream until their transports close, are gone
    SQUALL_CUDA_CHECK(cudaStreamDestroy(stream));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "squall-cuda-topk: %s\n", e.what());
    return 1;
  }
  return 0;
}