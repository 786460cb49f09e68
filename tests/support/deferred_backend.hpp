// SPDX-License-Identifier: Apache-2.0
#pragma once
// A test-only backend whose kernels run late, as a GPU stream's do: each kernel call is queued
// and runs only at the backend's `synchronize()`, and an output that is not also an input
// is poisoned (all bits set: NaN, -1) at the call. An algorithm that reads a kernel's result,
// sends it, or reuses its source before an ordering point then gets a wrong answer, which the
// collective tests, run on this backend as on host_backend, catch against their references.
// Host memory, so any host transport carries its buffers.

#include <squall/backend/host.hpp>
#include <squall/concepts.hpp>
#include <squall/core/buffer.hpp>
#include <squall/core/ops.hpp>
#include <squall/core/types.hpp>
#include <squall/kernels/host/reduce.hpp>

#include <cstddef>
#include <cstring>
#include <functional>
#include <memory>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace squall::test {

class deferred_backend {
 public:
  using memory_space = host_memory;
  static constexpr std::string_view name = "deferred";

  /// Runs every queued kernel, in order.
  void synchronize() const {
    std::vector<std::function<void()>> work;
    work.swap(state_->queue);
    for (auto& kernel : work) kernel();
    ++state_->synchronized;
  }
  /// Queues `kernel` until the next `synchronize()`.
  void enqueue(std::function<void()> kernel) const { state_->queue.push_back(std::move(kernel)); }
  /// Kernels queued and not yet run.
  std::size_t pending() const { return state_->queue.size(); }
  /// How many times `synchronize()` ran.
  std::size_t synchronizations() const { return state_->synchronized; }

 private:
  struct state {
    std::vector<std::function<void()>> queue;
    std::size_t synchronized = 0;
  };
  // copies of one backend (the communicator's, the reducer's view of it) share one queue
  std::shared_ptr<state> state_ = std::make_shared<state>();
};

// (not `detail`: inside squall::test that name must keep meaning squall::detail)
namespace deferred_kernels {
template <class T>
void poison(host_view<T> out) {
  if (!out.empty()) std::memset(static_cast<void*>(out.data()), 0xff, out.size_bytes());
}
template <class T, class U>
bool disjoint(host_view<T> a, host_view<U> b) {
  const auto* x = reinterpret_cast<const std::byte*>(a.data());
  const auto* y = reinterpret_cast<const std::byte*>(b.data());
  return a.empty() || b.empty() || x + a.size_bytes() <= y || y + b.size_bytes() <= x;
}
}  // namespace deferred_kernels

// The kernels, found by argument-dependent lookup on the backend (backend/dispatch.hpp); each
// queues the host kernel.

template <element T, reduction_op<T> Op>
void reduce_into(const deferred_backend& b, Op op, host_view<T> dst,
                 host_view<const std::type_identity_t<T>> src) {
  b.enqueue([=] { kernels::reduce_into(host_backend{}, op, dst, src); });
}

template <element T, reduction_op<T> Op>
void reduce(const deferred_backend& b, Op op, host_view<T> dst,
            host_view<const std::type_identity_t<T>> x,
            host_view<const std::type_identity_t<T>> y) {
  if (deferred_kernels::disjoint(dst, x) && deferred_kernels::disjoint(dst, y))
    deferred_kernels::poison(dst);
  b.enqueue([=] { kernels::reduce(host_backend{}, op, dst, x, y); });
}

template <class T>
requires std::is_trivially_copyable_v<T>
void copy(const deferred_backend& b, host_view<T> dst,
          host_view<const std::type_identity_t<T>> src) {
  if (deferred_kernels::disjoint(dst, src)) deferred_kernels::poison(dst);
  b.enqueue([=] { kernels::copy(host_backend{}, dst, src); });
}

template <element T, reduction_op<T> Op>
void finalize(const deferred_backend& b, Op op, host_view<T> data, std::size_t contributions) {
  b.enqueue([=] { kernels::finalize(host_backend{}, op, data, contributions); });
}

static_assert(backend<deferred_backend>);

}  // namespace squall::test
