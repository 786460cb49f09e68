// SPDX-License-Identifier: Apache-2.0
#pragma once
// What the binding's translation units share: the compressed communicators behind one
// interface, made per transport in a translation unit of their own (compressed_shm.cpp,
// compressed_mpi.cpp: every compressor's compressed allreduce is the bulk of the compile, so
// the two transports compile in parallel).
#include <squall/algorithm/request.hpp>
#include <squall/compress/by_name.hpp>
#include <squall/transport/shm.hpp>

#include <cstddef>
#include <cstdint>
#include <memory>

namespace squall::python {

/// A compression state for one float32 tensor, of any compressed communicator.
struct state_base {
  virtual ~state_base() = default;
  virtual std::size_t count() const = 0;
  virtual std::uint64_t step() const = 0;
};

/// A squall communicator with a compressor: the compressed allreduce of float32 data.
class compressed_base {
 public:
  virtual ~compressed_base() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  /// A state for a tensor of `n` elements; `columns` > 0 gives PowerSGD the view of rows of
  /// `columns` (a layer's own matrix; refused by the other compressors), 0 its default view.
  virtual std::unique_ptr<state_base> make_state(std::size_t n, std::size_t columns) = 0;
  /// Blocking (`now`: returns an empty request) or non-blocking, as dense_base's.
  virtual squall::request allreduce(float* data, std::size_t n, state_base& s, bool avg,
                                    bool now) = 0;
  virtual squall::request barrier(bool now) = 0;
  virtual std::uint64_t bytes_sent() const = 0;
};

/// The compressor `choice` names (not "none") over shared memory, job `job`.
std::unique_ptr<compressed_base> compressed_over_shm(const compressor_choice& choice,
                                                     const shm_job& job);
#if SQUALL_PYTHON_MPI
/// The same over MPI, on a duplicate of MPI_COMM_WORLD (MPI initialized).
std::unique_ptr<compressed_base> compressed_over_mpi(const compressor_choice& choice);
#endif

}  // namespace squall::python
