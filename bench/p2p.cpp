// SPDX-License-Identifier: Apache-2.0
// squall-p2p: point-to-point latency and bandwidth, osu_latency / osu_bw style, of
// shm_transport beside the MPI library's own path between the same two processes, in one run.
//
//   mpirun -n 2 squall-p2p [--iterations N] [--mpi-only]
//
// Latency: half the round trip of a ping-pong, averaged over N iterations after warm-up.
// Bandwidth: rank 0 sends a window of 64 messages back to back, rank 1 answers with one byte
// once all arrived; bytes / time. Both transports run on the same two ranks, alternating per
// size, so the machine's noise hits them alike. shm_transport joins through the variables
// mpiexec sets (shm_job::from_environment). --mpi-only measures MPI alone: between two hosts
// (scripts/cluster.sh), where it checks that the links' shaping limits MPI's traffic.
#include <squall/transport/shm.hpp>

#include <mpi.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

namespace {

using clock_type = std::chrono::steady_clock;
constexpr int window = 64;

double seconds(clock_type::time_point start) {
  return std::chrono::duration<double>(clock_type::now() - start).count();
}

struct mpi_side {
  int rank;
  void send(const std::byte* data, std::size_t bytes) const {
    MPI_Send(data, static_cast<int>(bytes), MPI_BYTE, 1 - rank, 0, MPI_COMM_WORLD);
  }
  void recv(std::byte* data, std::size_t bytes) const {
    MPI_Recv(data, static_cast<int>(bytes), MPI_BYTE, 1 - rank, 0, MPI_COMM_WORLD,
             MPI_STATUS_IGNORE);
  }
  void send_window(const std::byte* data, std::size_t bytes) const {
    std::vector<MPI_Request> requests(window);
    for (auto& r : requests) {
      MPI_Isend(data, static_cast<int>(bytes), MPI_BYTE, 1, 1, MPI_COMM_WORLD, &r);
    }
    MPI_Waitall(window, requests.data(), MPI_STATUSES_IGNORE);
  }
  void recv_window(std::byte* data, std::size_t bytes) const {
    std::vector<MPI_Request> requests(window);
    for (auto& r : requests) {
      MPI_Irecv(data, static_cast<int>(bytes), MPI_BYTE, 0, 1, MPI_COMM_WORLD, &r);
    }
    MPI_Waitall(window, requests.data(), MPI_STATUSES_IGNORE);
  }
};

struct shm_side {
  squall::shm_transport* t;
  void send(const std::byte* data, std::size_t bytes) const {
    t->send(1 - t->rank(), {data, bytes}).wait();
  }
  void recv(std::byte* data, std::size_t bytes) const {
    t->recv(1 - t->rank(), {data, bytes}).wait();
  }
  void send_window(const std::byte* data, std::size_t bytes) const {
    std::vector<squall::shm_completion> pending;
    for (int i = 0; i < window; ++i) pending.push_back(t->send(1, {data, bytes}));
    for (auto& c : pending) c.wait();
  }
  void recv_window(std::byte* data, std::size_t bytes) const {
    std::vector<squall::shm_completion> pending;
    for (int i = 0; i < window; ++i) pending.push_back(t->recv(0, {data, bytes}));
    for (auto& c : pending) c.wait();
  }
};

template <class Side>
double latency_us(const Side& side, int rank, std::vector<std::byte>& buf, std::size_t bytes,
                  int iterations) {
  for (int warm = 0; warm < 2; ++warm) {
    const auto start = clock_type::now();
    for (int i = 0; i < (warm == 0 ? iterations / 10 + 1 : iterations); ++i) {
      if (rank == 0) {
        side.send(buf.data(), bytes);
        side.recv(buf.data(), bytes);
      } else {
        side.recv(buf.data(), bytes);
        side.send(buf.data(), bytes);
      }
    }
    if (warm == 1) return seconds(start) / iterations / 2 * 1e6;
  }
  return 0;
}

template <class Side>
double bandwidth_gbs(const Side& side, int rank, std::vector<std::byte>& buf, std::size_t bytes,
                     int rounds) {
  std::byte ack{};
  double best = 0;
  for (int round = 0; round < rounds + 1; ++round) {
    const auto start = clock_type::now();
    if (rank == 0) {
      side.send_window(buf.data(), bytes);
      side.recv(&ack, 1);
    } else {
      side.recv_window(buf.data(), bytes);
      side.send(&ack, 1);
    }
    const double gbs = static_cast<double>(bytes) * window / seconds(start) / 1e9;
    if (round > 0 && gbs > best) best = gbs;  // round 0 warms up
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0;
  int size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  int iterations = 2000;
  bool mpi_only = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--iterations") == 0 && i + 1 < argc)
      iterations = std::atoi(argv[++i]);
    else if (std::strcmp(argv[i], "--mpi-only") == 0)
      mpi_only = true;
  }
  if (size != 2) {
    if (rank == 0) std::fprintf(stderr, "squall-p2p: run with exactly 2 ranks (mpirun -n 2)\n");
    MPI_Finalize();
    return 2;
  }
  int status = 0;
  try {
    std::optional<squall::shm_transport> transport;  // from the launcher's local-rank variables
    if (!mpi_only) transport.emplace();
    const shm_side shm{transport ? &*transport : nullptr};
    const mpi_side mpi{rank};
    const std::size_t sizes[] = {8, 4096, 65536, std::size_t{1} << 20, std::size_t{64} << 20};
    std::vector<std::byte> buf(std::size_t{64} << 20, std::byte{1});
    if (rank == 0) {
      if (mpi_only) {
        std::printf("%10s %12s %12s %12s\n", "bytes", "mpi_lat_us", "mpi_bw_GBs", "mpi_bw_Gbits");
      } else {
        std::printf("%10s %12s %12s %8s %12s %12s %8s\n", "bytes", "shm_lat_us", "mpi_lat_us",
                    "lat_x", "shm_bw_GBs", "mpi_bw_GBs", "bw_x");
      }
    }
    for (const std::size_t bytes : sizes) {
      const int iters =
          bytes >= (std::size_t{1} << 20) ? std::max(10, iterations / 100) : iterations;
      const int rounds = bytes >= (std::size_t{16} << 20) ? 3 : 10;
      MPI_Barrier(MPI_COMM_WORLD);
      const double mpi_lat = latency_us(mpi, rank, buf, bytes, iters);
      const double shm_lat = mpi_only ? 0 : latency_us(shm, rank, buf, bytes, iters);
      MPI_Barrier(MPI_COMM_WORLD);
      const std::size_t window_bytes = bytes >= (std::size_t{64} << 20) ? bytes / 8 : bytes;
      const double mpi_bw = bandwidth_gbs(mpi, rank, buf, window_bytes, rounds);
      const double shm_bw = mpi_only ? 0 : bandwidth_gbs(shm, rank, buf, window_bytes, rounds);
      if (rank == 0 && mpi_only) {
        std::printf("%10zu %12.2f %12.3f %12.3f\n", bytes, mpi_lat, mpi_bw, mpi_bw * 8);
        std::fflush(stdout);
      } else if (rank == 0) {
        std::printf("%10zu %12.2f %12.2f %8.2f %12.2f %12.2f %8.2f\n", bytes, shm_lat, mpi_lat,
                    shm_lat / mpi_lat, shm_bw, mpi_bw, shm_bw / mpi_bw);
        std::fflush(stdout);
      }
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "squall-p2p rank %d: %s\n", rank, e.what());
    status = 1;
  }
  MPI_Finalize();
  return status;
}
