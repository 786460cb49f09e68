// SPDX-License-Identifier: Apache-2.0
#pragma once
/// The backend's kernel dispatch: how the algorithm layer reaches a kernel without naming a
/// backend. Each `detail::dispatch` function makes an unqualified call, so it finds the
/// kernels of `squall::kernels` (host; CUDA where included first) and, by argument-dependent
/// lookup, those a backend declares in its own namespace (the tests' deferred backend).
/// `check_backend_kernels<B>()` names a missing kernel in one line.

#include <squall/backend/host.hpp>
#include <squall/concepts.hpp>
#include <squall/core/buffer.hpp>
#include <squall/core/ops.hpp>
#include <squall/kernels/host/reduce.hpp>

#include <cstddef>  // size_t

namespace squall::detail::dispatch {

using kernels::copy;
using kernels::finalize;
using kernels::reduce;
using kernels::reduce_into;

/// The kernels the dense collectives call, each with elements `float` and `sum_op` standing
/// for every element type and op.
template <class B>
concept has_reduce_into = requires(const B& b, buffer_view<float, typename B::memory_space> dst,
                                   buffer_view<const float, typename B::memory_space> src) {
  reduce_into(b, sum_op{}, dst, src);
};
template <class B>
concept has_reduce = requires(const B& b, buffer_view<float, typename B::memory_space> dst,
                              buffer_view<const float, typename B::memory_space> src) {
  reduce(b, sum_op{}, dst, src, src);
};
template <class B>
concept has_copy = requires(const B& b, buffer_view<std::byte, typename B::memory_space> dst,
                            buffer_view<const std::byte, typename B::memory_space> src) {
  copy(b, dst, src);
};
template <class B>
concept has_finalize = requires(const B& b, buffer_view<float, typename B::memory_space> data) {
  finalize(b, avg_op{}, data, std::size_t{2});
};

/// `dst = dst op src` on backend `b`.
template <class B, class Op, class T, class M>
void reduce_into_on(const B& b, Op op, buffer_view<T, M> dst, buffer_view<const T, M> src) {
  reduce_into(b, op, dst, src);
}
/// `dst = x op y` on backend `b`.
template <class B, class Op, class T, class M>
void reduce_on(const B& b, Op op, buffer_view<T, M> dst, buffer_view<const T, M> x,
               buffer_view<const T, M> y) {
  reduce(b, op, dst, x, y);
}
/// `dst = src` on backend `b` (overlap allowed).
template <class B, class T, class M>
void copy_on(const B& b, buffer_view<T, M> dst, buffer_view<const T, M> src) {
  copy(b, dst, src);
}
/// Op's last step (avg: divide by `contributions`) on backend `b`.
template <class B, class Op, class T, class M>
void finalize_on(const B& b, Op op, buffer_view<T, M> data, std::size_t contributions) {
  finalize(b, op, data, contributions);
}

}  // namespace squall::detail::dispatch

namespace squall {

/// Asserts that backend `B` has every kernel the collectives call, one clause at a time (a
/// missing one is named in one line); returns true.
template <class B>
consteval bool check_backend_kernels() {
  static_assert(detail::dispatch::has_reduce_into<B>,
                "squall: the Backend has no kernel reduce_into(backend, op, dst, src)");
  static_assert(detail::dispatch::has_reduce<B>,
                "squall: the Backend has no kernel reduce(backend, op, dst, a, b)");
  static_assert(detail::dispatch::has_copy<B>,
                "squall: the Backend has no kernel copy(backend, dst, src)");
  static_assert(detail::dispatch::has_finalize<B>,
                "squall: the Backend has no kernel finalize(backend, op, data, contributions)");
  return true;
}

}  // namespace squall
