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

#include <concepts>  // convertible_to
#include <cstddef>   // size_t
#include <cstdint>   // int32_t

namespace squall::detail::dispatch {

using kernels::allocate_scratch;
using kernels::copy;
using kernels::fill_zero;
using kernels::finalize;
using kernels::reduce;
using kernels::reduce_into;
using kernels::subtract_into;
using kernels::vote_add;
using kernels::vote_finish;

/// The kernels the collectives call, each with elements `float` and `sum_op` standing
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

template <class B>
concept has_fill_zero = requires(const B& b, buffer_view<std::byte, typename B::memory_space> d) {
  fill_zero(b, d);
};
template <class B>
concept has_subtract_into = requires(const B& b, buffer_view<float, typename B::memory_space> dst,
                                     buffer_view<const float, typename B::memory_space> src) {
  subtract_into(b, dst, src);
};
template <class B>
concept has_vote = requires(const B& b, buffer_view<std::int32_t, typename B::memory_space> votes,
                            buffer_view<float, typename B::memory_space> sums,
                            buffer_view<const float, typename B::memory_space> x) {
  vote_add(b, votes, sums, x, true);
  vote_finish(b, buffer_view<const std::int32_t, typename B::memory_space>(votes), sums);
};
/// The copies between the backend's memory and the host's, for backends whose memory a
/// host transport cannot carry (the staging step, algorithm/dense.hpp).
template <class B>
concept has_staging_copies =
    requires(const B& b, buffer_view<std::byte, typename B::memory_space> mine,
             buffer_view<const std::byte, typename B::memory_space> mine_const,
             buffer_view<std::byte, host_memory> host,
             buffer_view<const std::byte, host_memory> host_const) {
  copy(b, host, mine_const);
  copy(b, mine, host_const);
};
/// Optional, for the staging step: page-locked host memory (`allocate_pinned_host(b, bytes)`,
/// an owning buffer with `data()` and `size()`), which the backend's copies read and write
/// fastest and without blocking.
template <class B>
concept has_pinned_host = requires(const B& b) {
  { allocate_pinned_host(b, std::size_t{1}).data() } -> std::convertible_to<std::byte*>;
};
/// Optional, for the staging step: a mark after the work enqueued so far (`record_mark(b)`)
/// and a wait for the work before it alone (`wait_mark(b, mark)`), so that the staged
/// allreduce reduces one piece while the backend still copies the next.
template <class B>
concept has_marks = requires(const B& b) {
  wait_mark(b, record_mark(b));
};
template <class B>
concept has_allocate_scratch = requires(const B& b) {
  { allocate_scratch<std::byte>(b, std::size_t{1}).data() } -> std::convertible_to<std::byte*>;
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
/// `dst = src` on backend `b` between its memory and the host's (the staging step).
template <class B, class T, class To, class From>
void copy_across_on(const B& b, buffer_view<T, To> dst, buffer_view<const T, From> src) {
  copy(b, dst, src);
}
/// Op's last step (avg: divide by `contributions`) on backend `b`.
template <class B, class Op, class T, class M>
void finalize_on(const B& b, Op op, buffer_view<T, M> data, std::size_t contributions) {
  finalize(b, op, data, contributions);
}

/// `dst` = all zero bytes on backend `b`.
template <class B, class T, class M>
void fill_zero_on(const B& b, buffer_view<T, M> dst) {
  fill_zero(b, dst);
}
/// `dst -= src` on backend `b` (error feedback's residual update).
template <class B, class T, class M>
void subtract_into_on(const B& b, buffer_view<T, M> dst, buffer_view<const T, M> src) {
  subtract_into(b, dst, src);
}
/// One rank's step of a majority vote on backend `b` (kernels/host/reduce.hpp).
template <class B, class T, class M>
void vote_add_on(const B& b, buffer_view<std::int32_t, M> votes, buffer_view<T, M> sums,
                 buffer_view<const T, M> x, bool first) {
  vote_add(b, votes, sums, x, first);
}
/// The vote's signed sums, in place, on backend `b`.
template <class B, class T, class M>
void vote_finish_on(const B& b, buffer_view<const std::int32_t, M> votes, buffer_view<T, M> sums) {
  vote_finish(b, votes, sums);
}
/// Scratch for `count` elements of `T` in backend `b`'s memory (an owning object whose
/// `data()` is the address).
template <class T, class B>
auto allocate_on(const B& b, std::size_t count) {
  return allocate_scratch<T>(b, count);
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
  static_assert(detail::dispatch::has_fill_zero<B>,
                "squall: the Backend has no kernel fill_zero(backend, dst)");
  static_assert(detail::dispatch::has_subtract_into<B>,
                "squall: the Backend has no kernel subtract_into(backend, dst, src)");
  static_assert(detail::dispatch::has_vote<B>,
                "squall: the Backend has no kernels vote_add(backend, votes, sums, x, first) "
                "and vote_finish(backend, votes, sums)");
  static_assert(detail::dispatch::has_allocate_scratch<B>,
                "squall: the Backend has no allocate_scratch<T>(backend, count) whose result "
                "has data()");
  return true;
}

}  // namespace squall
