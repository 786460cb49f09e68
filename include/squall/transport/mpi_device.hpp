// SPDX-License-Identifier: Apache-2.0
#pragma once
/// `device_mpi_transport<Backend>`: device buffers handed to MPI as they are, for an MPI that
/// takes device pointers (CUDA-aware: Open MPI built with CUDA or UCX, MPICH built with GPU
/// support, MVAPICH2-GDR, Cray MPICH). A communicator over it runs the topologies' schedules
/// on device memory, as over `cuda_ipc_transport`: the backend's kernels reduce on its stream,
/// and MPI moves the bytes between the devices (by GPUDirect RDMA or its own staging), so no
/// copy to host memory is squall's. Over `mpi_transport` the same device buffers are staged
/// through page-locked host memory instead (algorithm/dense.hpp), which is what an MPI without
/// device support needs; `mpi_cuda_aware()` says at run time which of the two this MPI allows.
///
/// Ordering: MPI knows nothing of a stream, so a send or a receive is posted only once the
/// work enqueued on the backend before it has finished (`Backend::synchronize()`): the bytes
/// sent are final, and a receive overwrites nothing a queued kernel still reads. Everything
/// else (pieces, tags, deadlines, failure) is `mpi_transport`'s.

#include <squall/concepts.hpp>
#include <squall/core/buffer.hpp>
#include <squall/core/error.hpp>
#include <squall/transport/mpi.hpp>

#include <mpi.h>
#if defined(OPEN_MPI) && OPEN_MPI && __has_include(<mpi-ext.h>)
#include <mpi-ext.h>  // MPIX_Query_cuda_support
#endif

#include <chrono>
#include <concepts>  // same_as
#include <cstdlib>   // getenv
#include <string>
#include <string_view>
#include <utility>  // move

namespace squall {

/// How this process's MPI library was asked whether it takes CUDA device pointers, and its
/// answer.
struct mpi_device_support {
  bool cuda = false;
  /// "SQUALL_MPI_CUDA_AWARE", "MPIX_Query_cuda_support", "MPIX_GPU_query_support" or "none"
  /// (this MPI has no query: taken as no).
  std::string_view source = "none";
};

/// Whether MPI takes CUDA device pointers, asked at run time (MPI must be initialized):
/// `SQUALL_MPI_CUDA_AWARE` (0 or 1) if set, for an MPI that takes them without saying so;
/// else Open MPI's `MPIX_Query_cuda_support()` (mpi-ext.h; the library's answer at run time,
/// not the header's `MPIX_CUDA_AWARE_SUPPORT`); else MPICH's
/// `MPIX_GPU_query_support(MPIX_GPU_SUPPORT_CUDA)` (MPICH 4); else no. Throws
/// `invalid_argument` for another value of the variable.
inline mpi_device_support query_mpi_device_support() {
  if (const char* set = std::getenv("SQUALL_MPI_CUDA_AWARE"); set != nullptr) {
    const std::string_view v(set);
    if (v != "0" && v != "1") {
      throw invalid_argument({.operation = "mpi_cuda_aware"},
                             "SQUALL_MPI_CUDA_AWARE=" + std::string(v) + " (0 or 1)");
    }
    return {v == "1", "SQUALL_MPI_CUDA_AWARE"};
  }
#if defined(OMPI_HAVE_MPI_EXT_CUDA) && OMPI_HAVE_MPI_EXT_CUDA
  return {MPIX_Query_cuda_support() == 1, "MPIX_Query_cuda_support"};
#elif defined(MPIX_GPU_SUPPORT_CUDA)
  int supported = 0;
  const bool asked = MPIX_GPU_query_support(MPIX_GPU_SUPPORT_CUDA, &supported) == MPI_SUCCESS;
  return {asked && supported != 0, "MPIX_GPU_query_support"};
#else
  return {};
#endif
}

/// `query_mpi_device_support().cuda`.
inline bool mpi_cuda_aware() { return query_mpi_device_support().cuda; }

namespace detail {

/// Whether MPI takes the buffers of `Backend`'s memory: for CUDA (`Backend::name` "cuda"),
/// `mpi_cuda_aware()`; a backend that claims device memory over host buffers (the test
/// suites' deferred one) needs nothing of MPI.
template <class Backend>
mpi_device_support mpi_takes_memory_of() {
  if constexpr (Backend::name == std::string_view("cuda")) {
    return query_mpi_device_support();
  } else {
    return {true, "host buffers"};
  }
}

}  // namespace detail

/// The messages of `mpi_transport` on the buffers of `Backend`'s memory, which MPI reads and
/// writes itself (see the top of this file).
template <backend Backend>
requires(!std::same_as<typename Backend::memory_space, host_memory>) class device_mpi_transport {
 public:
  using memory_space = typename Backend::memory_space;

  /// `mpi_transport`'s (a cluster network's until calibrated).
  static constexpr link_costs costs = mpi_transport::costs;

  /// Carries `inner`'s messages on `on`'s memory; `on` should be the communicator's backend
  /// (its device and stream), and must outlive the transport. Collective over `inner`'s
  /// ranks: they agree (`MPI_Allreduce`) that every rank's MPI takes the memory
  /// (`mpi_cuda_aware()` for CUDA), and all throw `invalid_argument` naming the first rank
  /// whose MPI does not.
  device_mpi_transport(mpi_transport inner, Backend on)
      : inner_(std::move(inner)), on_(std::move(on)) {
    const mpi_device_support mine = detail::mpi_takes_memory_of<Backend>();
    int lacking = mine.cuda ? inner_.size() : inner_.rank();
    const error_context where{.operation = "device_mpi_transport", .rank = inner_.rank()};
    SQUALL_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &lacking, 1, MPI_INT, MPI_MIN, inner_.comm()));
    if (lacking != inner_.size()) {
      throw invalid_argument(
          where, "the MPI of rank " + std::to_string(lacking) + " does not take " +
                     std::string(Backend::name) + " device pointers (" +
                     (lacking == inner_.rank() ? std::string(mine.source) + " says no"
                                               : std::string("its query says no")) +
                     "; SQUALL_MPI_CUDA_AWARE=1 if it does; mpi_transport stages them instead)");
    }
  }

  int rank() const noexcept { return inner_.rank(); }
  int size() const noexcept { return inner_.size(); }
  std::chrono::nanoseconds deadline() const noexcept { return inner_.deadline(); }
  /// The MPI transport the messages travel on.
  const mpi_transport& mpi() const noexcept { return inner_; }

  /// Starts sending `bytes` (device memory) to `peer` once the work enqueued on the backend
  /// has finished; `bytes` must stay valid and unchanged until the completion is done.
  [[nodiscard]] mpi_completion send(int peer, buffer_view<const std::byte, memory_space> bytes) {
    on_.synchronize();
    return inner_.send(peer, host_view<const std::byte>(bytes.data(), bytes.count()));
  }
  /// Starts receiving exactly `bytes.count()` bytes from `peer` into `bytes` (device memory)
  /// once the work enqueued on the backend has finished.
  [[nodiscard]] mpi_completion recv(int peer, buffer_view<std::byte, memory_space> bytes) {
    on_.synchronize();
    return inner_.recv(peer, host_view<std::byte>(bytes.data(), bytes.count()));
  }
  /// `mpi_transport::barrier`.
  [[nodiscard]] mpi_completion barrier() { return inner_.barrier(); }

 private:
  mpi_transport inner_;
  Backend on_;
};

}  // namespace squall
