// SPDX-License-Identifier: Apache-2.0
#pragma once
/// Everything a host-only user needs; compiles with g++ on a machine without MPI or CUDA.
/// MPI users add <squall/transport/mpi.hpp>; nvcc users include <squall/cuda.cuh> instead.

#include <squall/algorithm/communicator.hpp>
#include <squall/algorithm/detail/executor.hpp>
#include <squall/algorithm/detail/gtopk.hpp>
#include <squall/backend/host.hpp>
#include <squall/compress/by_name.hpp>
#include <squall/compress/cast.hpp>
#include <squall/compress/chain.hpp>
#include <squall/compress/error_feedback.hpp>
#include <squall/compress/homomorphic.hpp>
#include <squall/compress/linear_body.hpp>
#include <squall/compress/none.hpp>
#include <squall/compress/payload.hpp>
#include <squall/compress/quantize.hpp>
#include <squall/compress/sketch.hpp>
#include <squall/compress/sparsify.hpp>
#include <squall/compress/state.hpp>
#include <squall/compress/traits.hpp>
#include <squall/concepts.hpp>
#include <squall/core/buffer.hpp>
#include <squall/core/completion.hpp>
#include <squall/core/config.hpp>
#include <squall/core/error.hpp>
#include <squall/core/float8.hpp>
#include <squall/core/ops.hpp>
#include <squall/core/options.hpp>
#include <squall/core/random.hpp>
#include <squall/core/types.hpp>
#include <squall/kernels/host/quantize.hpp>
#include <squall/kernels/host/reduce.hpp>
#include <squall/kernels/host/select.hpp>
#include <squall/kernels/host/sketch.hpp>
#include <squall/topology/automatic.hpp>
#include <squall/topology/direct.hpp>
#include <squall/topology/halving_doubling.hpp>
#include <squall/topology/hierarchical.hpp>
#include <squall/topology/ring.hpp>
#include <squall/topology/schedule.hpp>
#include <squall/topology/tree.hpp>
#include <squall/transport/inproc.hpp>
#include <squall/transport/launch.hpp>
#include <squall/transport/shm.hpp>
#include <squall/tuning/tuning.hpp>
#include <squall/version.hpp>
