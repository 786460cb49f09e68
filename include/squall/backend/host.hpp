// SPDX-License-Identifier: Apache-2.0
#pragma once
/// `host_backend`: kernels run on the calling CPU thread, over host memory.

#include <squall/concepts.hpp>
#include <squall/core/buffer.hpp>

#include <string_view>

namespace squall {
namespace kernels {
/// An empty base of every backend. It makes `squall::kernels` an associated namespace of the
/// backend types, so generic code calls kernels unqualified (`reduce_into(backend, ...)`) and
/// argument-dependent lookup finds the overload for the backend at instantiation, including
/// the CUDA ones declared after the generic code.
struct kernel_dispatch {};
}  // namespace kernels

/// The CPU backend: portable loops that g++ -O3 vectorizes (kernels/host/). Stateless, so it
/// is passed by value; every kernel has finished when its call returns.
struct host_backend : kernels::kernel_dispatch {
  using memory_space = host_memory;
  static constexpr std::string_view name = "host";
  /// Host kernels are synchronous: nothing to wait for.
  void synchronize() const noexcept {}
};
static_assert(backend<host_backend>);

}  // namespace squall
