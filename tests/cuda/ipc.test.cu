// SPDX-License-Identifier: Apache-2.0
// Device buffers between processes (issue 21, items 2 and 3): cuda_ipc_transport's messages
// (exported allocations, pool memory and host memory through staging, the handle cache, a
// size mismatch on both sides), the dense collectives on cuda_backend over it and, staged,
// over shm_transport against the serial reference (bitwise), and the compressed allreduce on
// the device over both against the same run on host_backend over shm in the same processes
// (bitwise; over cuda_ipc also gtopk, per_hop and hq, which do not stage). Each case starts its
// ranks as processes: this test executable again, under squall-run (a process that has used CUDA
// cannot fork one that uses it too), told by SQUALL_CUDA_TEST_RANKS to run the case's rank body.

#include <squall/algorithm/communicator.hpp>
#include <squall/compress/cast.hpp>
#include <squall/compress/error_feedback.hpp>
#include <squall/compress/homomorphic.hpp>
#include <squall/compress/quantize.hpp>
#include <squall/compress/sparsify.hpp>
#include <squall/cuda.cuh>
#include <squall/topology/direct.hpp>
#include <squall/topology/halving_doubling.hpp>
#include <squall/topology/ring.hpp>
#include <squall/topology/tree.hpp>
#include <squall/transport/cuda_ipc.cuh>
#include <squall/transport/shm.hpp>

#include <doctest/doctest.h>
#include <sys/wait.h>

#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <unistd.h>
#include <vector>

#include "../support/cuda_device.cuh"
#include "../support/device_collectives.cuh"
#include "../support/topologies.hpp"

namespace test = squall::test;
using squall::cuda_backend;
using squall::cuda_ipc_transport;
using squall::shm_transport;

namespace {

bool in_rank() { return std::getenv("SQUALL_CUDA_TEST_RANKS") != nullptr; }

// squall-run: $SQUALL_RUN, else beside this executable, else where the build made it.
std::string squall_run() {
  if (const char* set = std::getenv("SQUALL_RUN")) return set;
  const auto self = std::filesystem::read_symlink("/proc/self/exe");
  const auto beside = self.parent_path() / "squall-run";
  if (std::filesystem::exists(beside)) return beside.string();
#ifdef SQUALL_RUN_PATH
  return SQUALL_RUN_PATH;
#else
  return "squall-run";
#endif
}

// Runs test case `name` of this executable on `p` processes; their exit status.
int run_processes(int p, const char* name) {
  const std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
  const std::string command = "SQUALL_CUDA_TEST_RANKS=1 '" + squall_run() + "' -n " +
                              std::to_string(p) + " '" + self +
                              "' --no-version=true '--test-case=" + name + "'";
  const int status = std::system(command.c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// This rank's job, its name with `suffix` (one shm job per transport).
squall::shm_job job(const std::string& suffix) {
  squall::shm_job j = squall::shm_job::from_environment();
  j.name += suffix;
  return j;
}

cuda_ipc_transport ipc(const std::string& suffix) {
  return cuda_ipc_transport(shm_transport(job(suffix)), cuda_backend(0, nullptr));
}

std::byte pattern(int rank, std::size_t i) {
  return static_cast<std::byte>((static_cast<std::size_t>(rank) * 31 + i * 7) & 0xff);
}

// Memory of one kind for the message test: exported (cudaMalloc), pool (stream-ordered, not
// exportable) or host.
enum class memory { exported, pool, host };

class message_buffer {
 public:
  message_buffer(memory kind, std::size_t bytes) : kind_(kind), bytes_(bytes) {
    if (kind == memory::host) {
      host_.resize(bytes + 1);
      data_ = host_.data();
    } else if (kind == memory::exported) {
      SQUALL_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&data_), bytes + 1));
    } else {
      data_ =
          static_cast<std::byte*>(squall::detail::allocate_device_scratch(0, bytes + 1, nullptr));
      SQUALL_CUDA_CHECK(cudaStreamSynchronize(nullptr));
    }
  }
  ~message_buffer() {
    if (kind_ == memory::exported) cudaFree(data_);
    if (kind_ == memory::pool) cudaFreeAsync(data_, nullptr);
  }
  message_buffer(const message_buffer&) = delete;
  message_buffer& operator=(const message_buffer&) = delete;

  void fill(const std::vector<std::byte>& v) {
    SQUALL_CUDA_CHECK(cudaMemcpy(data_, v.data(), v.size(), cudaMemcpyDefault));
  }
  std::vector<std::byte> read() const {
    std::vector<std::byte> v(bytes_);
    SQUALL_CUDA_CHECK(cudaMemcpy(v.data(), data_, bytes_, cudaMemcpyDefault));
    return v;
  }
  squall::device_view<std::byte> view() { return {data_, bytes_}; }

 private:
  memory kind_;
  std::size_t bytes_;
  std::byte* data_ = nullptr;
  std::vector<std::byte> host_;
};

// Receives into `dst` from `from` while sending `src` to `to` (the ring's pattern), to the end.
void shift(cuda_ipc_transport& t, int from, int to, message_buffer& src, message_buffer& dst) {
  auto received = t.recv(from, dst.view());
  auto sent = t.send(to, src.view());
  sent.wait();
  received.wait();
}

// How many bytes of `got` are not rank `rank`'s pattern.
std::size_t wrong_bytes(const std::vector<std::byte>& got, int rank) {
  std::size_t wrong = 0;
  for (std::size_t i = 0; i < got.size(); ++i) wrong += got[i] != pattern(rank, i) ? 1 : 0;
  return wrong;
}

void rank_messages() {
  cuda_ipc_transport t = ipc("-messages");
  const int p = t.size();
  const int r = t.rank();
  const int to = (r + 1) % p;
  const int from = (r + p - 1) % p;
  for (const memory kind : {memory::exported, memory::pool, memory::host}) {
    for (const std::size_t bytes :
         {std::size_t{0}, std::size_t{1}, std::size_t{4097}, std::size_t{3} << 20}) {
      CAPTURE(static_cast<int>(kind));
      CAPTURE(bytes);
      message_buffer src(kind, bytes);
      message_buffer dst(kind, bytes);
      std::vector<std::byte> mine(bytes);
      for (std::size_t i = 0; i < bytes; ++i) mine[i] = pattern(r, i);
      src.fill(mine);
      dst.fill(std::vector<std::byte>(bytes, std::byte{0xee}));
      shift(t, from, to, src, dst);
      CHECK(wrong_bytes(dst.read(), from) == 0);
    }
  }
  // pool and host memory went through staging buffers; exported memory did not
  CHECK(t.staging_buffers() >= 1);
  // one allocation sent three times is exported and opened once
  message_buffer src(memory::exported, 1 << 16);
  message_buffer dst(memory::exported, 1 << 16);
  std::size_t opened = 0;
  std::size_t exported = 0;
  for (int round = 0; round < 3; ++round) {
    shift(t, from, to, src, dst);
    if (round == 0) {
      opened = t.handles_opened();
      exported = t.handles_exported();
    }
  }
  CHECK(t.handles_opened() == opened);
  CHECK(t.handles_exported() == exported);
  // an allocation freed and made again (often at the same address, with another id) is read
  // anew, never through the old mapping
  for (int round = 0; round < 4; ++round) {
    CAPTURE(round);
    message_buffer fresh(memory::exported, 1 << 16);
    std::vector<std::byte> mine(1 << 16);
    for (std::size_t i = 0; i < mine.size(); ++i) mine[i] = pattern(r + round, i);
    fresh.fill(mine);
    shift(t, from, to, fresh, dst);
    CHECK(wrong_bytes(dst.read(), from + round) == 0);
  }
  CHECK_THROWS_AS((void)t.send(p, src.view()), squall::invalid_argument);
  CHECK_THROWS_AS((void)t.send(r, src.view()), squall::invalid_argument);
  t.barrier().wait();
  // a size mismatch fails both sides by name
  if (r == 0) {
    CHECK_THROWS_AS(t.send(1, {src.view().data(), 8}).wait(), squall::mismatch_error);
  } else if (r == 1) {
    CHECK_THROWS_AS(t.recv(0, {dst.view().data(), 16}).wait(), squall::mismatch_error);
  }
}

#define SQUALL_PROCESS_CASE(name, body)                    \
  TEST_CASE(name* doctest::skip(test::no_cuda_device())) { \
    if (in_rank()) {                                       \
      body();                                              \
      return;                                              \
    }                                                      \
    for (const int p : {1, 2, 3, 4}) {                     \
      CAPTURE(p);                                          \
      CHECK(run_processes(p, name) == 0);                  \
    }                                                      \
  }

}  // namespace

TEST_SUITE("cuda") {
  TEST_CASE("cuda_ipc_transport messages between processes" *
            doctest::skip(test::no_cuda_device())) {
    if (in_rank()) {
      rank_messages();
      return;
    }
    for (const int p : {2, 3, 4}) {
      CAPTURE(p);
      CHECK(run_processes(p, "cuda_ipc_transport messages between processes") == 0);
    }
  }

  SQUALL_PROCESS_CASE("dense collectives on device buffers between processes", [] {
    test::dense_over<squall::ring_topology>(ipc("-ring"));
    test::dense_over<squall::direct_topology>(ipc("-direct"));
    test::dense_over<squall::tree_topology>(ipc("-tree"));
    test::dense_over<squall::halving_doubling_topology>(ipc("-hd"));
    test::dense_over<squall::ring_topology>(shm_transport(job("-staged-ring")));
    test::dense_over<squall::direct_topology>(shm_transport(job("-staged-direct")));
  })

  SQUALL_PROCESS_CASE("compressed allreduce on device buffers between processes", [] {
    const auto host = [](const std::string& name) { return shm_transport(job(name + "-host")); };
    test::compressed_suite([](const std::string& name) { return ipc(name); }, host);
    test::compressed_suite(
        [](const std::string& name) { return shm_transport(job(name + "-staged")); }, host);
    // the aggregations that do not stage: over device memory only
    const auto device = [](const std::string& name) { return ipc(name); };
    test::compressed_over(device, host, "-gtopk",
                          squall::error_feedback<squall::topk_compressor>{{.ratio = 0.01}},
                          squall::aggregation::gtopk);
    test::compressed_over(device, host, "-perhop", squall::int8_compressor{},
                          squall::aggregation::per_hop);
    test::compressed_over(device, host, "-hq", squall::homomorphic_compressor{.clip = 0},
                          squall::aggregation::linear);
  })
}
