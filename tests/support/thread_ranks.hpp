// SPDX-License-Identifier: Apache-2.0
#pragma once
// Runs a test body once per rank, each rank a thread over `inproc_transport` (Gloo's spawn).

#include <squall/core/options.hpp>
#include <squall/transport/inproc.hpp>

#include <cstddef>
#include <exception>  // exception_ptr, current_exception, rethrow_exception
#include <mutex>
#include <thread>  // jthread
#include <vector>

namespace squall::test {

/// Runs `body(inproc_transport&)` on `size` threads, rank r on the r-th, over one
/// `inproc_world(size, opts, window_bytes)`; joins them all, then rethrows on the calling thread
/// the first exception any rank threw (first in time: later ones are usually its echoes, such
/// as the `peer_failure` of a rank that waited for the one that threw).
///
/// doctest assertions inside `body` are fine; decisions to skip or fail a test belong on the
/// calling thread. Each rank's transport is destroyed as its thread ends, after its exception,
/// if any, was recorded, so that peers waiting for it fail with `peer_failure` at once.
template <class F>
void run_ranks(int size, F&& body, const options& opts = {}, std::size_t window_bytes = 0) {
  inproc_world world(size, opts, window_bytes);
  std::mutex first_mutex;
  std::exception_ptr first;
  const auto record = [&](std::exception_ptr error) {
    const std::lock_guard lock(first_mutex);
    if (!first) first = std::move(error);
  };
  {
    std::vector<std::jthread> threads;
    threads.reserve(static_cast<std::size_t>(size));
    for (int rank = 0; rank < size; ++rank) {
      threads.emplace_back([&, rank] {
        try {
          inproc_transport transport = world.transport(rank);
          try {
            body(transport);
          } catch (...) {
            record(std::current_exception());
          }
        } catch (...) {
          record(std::current_exception());
        }
      });
    }
  }  // the jthreads join here
  if (first) std::rethrow_exception(first);
}

}  // namespace squall::test
