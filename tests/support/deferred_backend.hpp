// SPDX-License-Identifier: Apache-2.0
#pragma once
// A test-only backend whose kernels run late, as a GPU stream's do: each kernel call is queued
// and runs only at the backend's `synchronize()`, and an output that is not also an input
// is poisoned (all bits set: NaN, -1) at the call. An algorithm that reads a kernel's result,
// sends it, or reuses its source before an ordering point then gets a wrong answer, which the
// collective tests, run on this backend as on host_backend, catch against their references.
// Its buffers are host memory: `deferred_backend` says so (any host transport carries
// them), `deferred_device_backend` claims device memory (see below).
//
// Deferred: the kernels the algorithms call between their ordering points (reduce, copy,
// finalize, fill, the error-feedback subtraction, the vote); `wait_mark` (an ordering point
// for part of the queue, as a CUDA event) runs those queued before its mark. Eager: the
// compressors' kernels (encode and decode steps, selection, the sketch, PowerSGD's algebra) and
// gTop-k's set kernels, which run the queue first and then at once, as on CUDA, where each of them
// reads a size or a check back to the host and so waits for the stream; their results are complete
// when they return. Scratch from `allocate_scratch` starts poisoned.

#include <squall/backend/host.hpp>
#include <squall/concepts.hpp>
#include <squall/core/buffer.hpp>
#include <squall/core/ops.hpp>
#include <squall/core/random.hpp>
#include <squall/core/types.hpp>
#include <squall/kernels/host/homomorphic.hpp>
#include <squall/kernels/host/quantize.hpp>
#include <squall/kernels/host/reduce.hpp>
#include <squall/kernels/host/select.hpp>
#include <squall/kernels/host/sketch.hpp>
#include <squall/kernels/host/sparse_merge.hpp>

#include <concepts>  // same_as
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <functional>
#include <initializer_list>
#include <memory>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

// SQUALL_TEST_DEFERRED=0 (the asan preset) leaves out the suites' reruns on the deferred
// backends: they check the algorithms' ordering points, which the ci preset's build checks,
// and under AddressSanitizer they tripled the largest test file's compile time (365 s).
#ifndef SQUALL_TEST_DEFERRED
#define SQUALL_TEST_DEFERRED 1
#endif

namespace squall::test {

/// Whether the suites rerun on the deferred backends (SQUALL_TEST_DEFERRED).
inline constexpr bool with_deferred = SQUALL_TEST_DEFERRED != 0;

/// A byte range a kernel reads or writes.
struct byte_range {
  const std::byte* begin = nullptr;
  const std::byte* end = nullptr;
  template <class T, class M>
  byte_range(buffer_view<T, M> v)  // NOLINT(google-explicit-constructor): views convert
      : begin(reinterpret_cast<const std::byte*>(v.data())), end(begin + v.size_bytes()) {}
  bool overlaps(const byte_range& o) const {
    return begin != end && o.begin != o.end && begin < o.end && o.begin < end;
  }
};

/// `M` is the memory it claims: host_memory (`deferred_backend`), or device_memory
/// (`deferred_device_backend`), whose buffers are host memory all the same but whose type a
/// host transport does not carry, so the communicator stages through host memory as it does
/// for the CUDA backend, and a missing ordering point around the staging copies shows up.
template <class M>
class basic_deferred_backend {
 public:
  using memory_space = M;
  static constexpr std::string_view name =
      std::same_as<M, host_memory> ? "deferred" : "deferred-device";

  /// Runs every queued kernel, in order.
  void synchronize() const {
    std::deque<std::function<void()>> work;
    work.swap(state_->queue);
    state_->reads.clear();
    state_->ran += work.size();
    for (auto& kernel : work) kernel();
    ++state_->synchronized;
  }
  /// A mark after the kernels queued so far (a CUDA event recorded on the stream).
  std::size_t record_mark() const { return state_->ran + state_->queue.size(); }
  /// Runs the queued kernels up to `mark` and leaves the later ones queued (a wait for the
  /// event). What they read stays counted as read until `synchronize()`: fewer outputs
  /// poisoned, never a wrong one.
  void wait_mark(std::size_t mark) const {
    while (state_->ran < mark) {
      const std::function<void()> kernel = std::move(state_->queue.front());
      state_->queue.pop_front();
      ++state_->ran;
      kernel();
    }
  }
  /// Queues `kernel`, which reads `reads` and overwrites `writes` without reading them, until
  /// the next `synchronize()`. Each of `writes` is poisoned now unless a queued kernel (this
  /// one included) still reads it, as a stream's later kernel would leave it for the earlier.
  void enqueue(std::function<void()> kernel, std::initializer_list<byte_range> reads,
               std::initializer_list<byte_range> writes = {}) const {
    for (const byte_range& w : writes) {
      bool read = false;
      for (const byte_range& r : state_->reads) read = read || r.overlaps(w);
      for (const byte_range& r : reads) read = read || r.overlaps(w);
      if (!read && w.begin != w.end) {
        std::memset(const_cast<std::byte*>(w.begin), 0xff,
                    static_cast<std::size_t>(w.end - w.begin));
      }
    }
    state_->reads.insert(state_->reads.end(), reads.begin(), reads.end());
    state_->queue.push_back(std::move(kernel));
  }
  /// Kernels queued and not yet run.
  std::size_t pending() const { return state_->queue.size(); }
  /// How many times `synchronize()` ran.
  std::size_t synchronizations() const { return state_->synchronized; }

 private:
  struct state {
    std::deque<std::function<void()>> queue;
    std::size_t ran = 0;            // kernels run, ever
    std::vector<byte_range> reads;  // what the queued kernels read
    std::size_t synchronized = 0;
  };
  // copies of one backend (the communicator's, the reducer's view of it) share one queue
  std::shared_ptr<state> state_ = std::make_shared<state>();
};

using deferred_backend = basic_deferred_backend<host_memory>;
using deferred_device_backend = basic_deferred_backend<device_memory>;

// The kernels, found by argument-dependent lookup on the backend (backend/dispatch.hpp); each
// queues the host kernel (on the "device" variant's views as well: its memory is the host's).

/// Marks in the queue (the staged allreduce's pieces wait for their copies).
template <class M>
std::size_t record_mark(const basic_deferred_backend<M>& b) {
  return b.record_mark();
}
template <class M>
void wait_mark(const basic_deferred_backend<M>& b, std::size_t mark) {
  b.wait_mark(mark);
}

/// `v` as a host view (the same bytes).
template <class T, class M>
host_view<T> on_host(buffer_view<T, M> v) {
  return {v.data(), v.count()};
}

template <element T, reduction_op<T> Op, class M>
void reduce_into(const basic_deferred_backend<M>& b, Op op, buffer_view<T, M> dst,
                 buffer_view<const std::type_identity_t<T>, M> src) {
  b.enqueue([=] { kernels::reduce_into(host_backend{}, op, on_host(dst), on_host(src)); },
            {dst, src});
}

template <element T, reduction_op<T> Op, class M>
void reduce(const basic_deferred_backend<M>& b, Op op, buffer_view<T, M> dst,
            buffer_view<const std::type_identity_t<T>, M> x,
            buffer_view<const std::type_identity_t<T>, M> y) {
  b.enqueue([=] { kernels::reduce(host_backend{}, op, on_host(dst), on_host(x), on_host(y)); },
            {x, y}, {dst});
}

/// Within the backend's memory, and (the staging step of the device variant) between it and
/// the host's.
template <class T, class M, class To, class From>
requires std::is_trivially_copyable_v<T>
void copy(const basic_deferred_backend<M>& b, buffer_view<T, To> dst,
          buffer_view<const std::type_identity_t<T>, From> src) {
  static_assert(std::same_as<To, M> || std::same_as<From, M>,
                "a copy touches the backend's memory");
  b.enqueue([=] { kernels::copy(host_backend{}, on_host(dst), on_host(src)); }, {src}, {dst});
}

template <element T, reduction_op<T> Op, class M>
void finalize(const basic_deferred_backend<M>& b, Op op, buffer_view<T, M> data,
              std::size_t contributions) {
  b.enqueue([=] { kernels::finalize(host_backend{}, op, on_host(data), contributions); }, {data});
}

template <class T, class M>
requires std::is_trivially_copyable_v<T>
void fill_zero(const basic_deferred_backend<M>& b, buffer_view<T, M> dst) {
  b.enqueue([=] { kernels::fill_zero(host_backend{}, on_host(dst)); }, {}, {dst});
}

template <element T, class M>
void subtract_into(const basic_deferred_backend<M>& b, buffer_view<T, M> dst,
                   buffer_view<const std::type_identity_t<T>, M> src) {
  b.enqueue([=] { kernels::subtract_into(host_backend{}, on_host(dst), on_host(src)); },
            {dst, src});
}

template <class T, class M>
requires std::is_floating_point_v<T>
void vote_add(const basic_deferred_backend<M>& b, buffer_view<std::int32_t, M> votes,
              buffer_view<T, M> sums, buffer_view<const std::type_identity_t<T>, M> x, bool first) {
  const auto run = [=] {
    kernels::vote_add(host_backend{}, on_host(votes), on_host(sums), on_host(x), first);
  };
  if (first) {
    b.enqueue(run, {x}, {votes, sums});
  } else {
    b.enqueue(run, {x, votes, sums});
  }
}

template <class T, class M>
requires std::is_floating_point_v<T>
void vote_finish(const basic_deferred_backend<M>& b, buffer_view<const std::int32_t, M> votes,
                 buffer_view<T, M> sums) {
  b.enqueue([=] { kernels::vote_finish(host_backend{}, on_host(votes), on_host(sums)); },
            {votes, sums});
}

/// Scratch from the deferred backend: allocated at once and poisoned; freed only after the
/// kernels queued before its release have run (as `cudaFreeAsync` is stream-ordered).
template <class T, class M>
class deferred_scratch {
 public:
  deferred_scratch(const basic_deferred_backend<M>& b, std::size_t count)
      : backend_(b), storage_(std::make_shared<std::vector<T>>(count)) {
    if (count != 0) std::memset(static_cast<void*>(storage_->data()), 0xff, count * sizeof(T));
  }
  deferred_scratch(deferred_scratch&&) noexcept = default;
  deferred_scratch& operator=(deferred_scratch&&) noexcept = default;
  ~deferred_scratch() {
    if (storage_) backend_.enqueue([keep = storage_] {}, {});
  }
  T* data() const { return storage_->data(); }
  std::size_t size() const { return storage_->size(); }

 private:
  basic_deferred_backend<M> backend_;
  std::shared_ptr<std::vector<T>> storage_;
};

template <class T, class M>
deferred_scratch<T, M> allocate_scratch(const basic_deferred_backend<M>& b, std::size_t count) {
  return deferred_scratch<T, M>(b, count);
}

/// An eager kernel's argument as the host kernel takes it: a view (of either claimed
/// memory) as a host view of the same bytes, anything else as it is.
template <class A>
decltype(auto) host_arg(A&& a) {
  if constexpr (requires { on_host(a); }) {
    return on_host(a);
  } else {
    return std::forward<A>(a);
  }
}

// The eager kernels: the queue runs first, then the host kernel.
#define SQUALL_TEST_EAGER_KERNEL(name)                                     \
  template <class M, class... A>                                           \
  decltype(auto) name(const basic_deferred_backend<M>& b, A&&... a) {      \
    b.synchronize();                                                       \
    return kernels::name(host_backend{}, host_arg(std::forward<A>(a))...); \
  }
SQUALL_TEST_EAGER_KERNEL(store_bytes)
SQUALL_TEST_EAGER_KERNEL(load_bytes)
SQUALL_TEST_EAGER_KERNEL(convert)
SQUALL_TEST_EAGER_KERNEL(count_at_least)
SQUALL_TEST_EAGER_KERNEL(first_non_finite)
SQUALL_TEST_EAGER_KERNEL(require_finite)
SQUALL_TEST_EAGER_KERNEL(sampled_cut)
SQUALL_TEST_EAGER_KERNEL(keep_largest_magnitudes)
SQUALL_TEST_EAGER_KERNEL(randomk_indices)
SQUALL_TEST_EAGER_KERNEL(randomk_gather)
SQUALL_TEST_EAGER_KERNEL(randomk_scatter)
SQUALL_TEST_EAGER_KERNEL(powersgd_multiply)
SQUALL_TEST_EAGER_KERNEL(powersgd_multiply_transposed)
SQUALL_TEST_EAGER_KERNEL(powersgd_orthogonalize)
SQUALL_TEST_EAGER_KERNEL(powersgd_decompress)
SQUALL_TEST_EAGER_KERNEL(hq_range)
SQUALL_TEST_EAGER_KERNEL(hq_encode)
SQUALL_TEST_EAGER_KERNEL(hq_decode)
SQUALL_TEST_EAGER_KERNEL(sketch_momentum_step)
#undef SQUALL_TEST_EAGER_KERNEL

// ... and those called with explicit template arguments.
#define SQUALL_TEST_EAGER_KERNEL_OF(head, name, args)                            \
  template <head, class M, class... A>                                           \
  decltype(auto) name(const basic_deferred_backend<M>& b, A&&... a) {            \
    b.synchronize();                                                             \
    return kernels::name<args>(host_backend{}, host_arg(std::forward<A>(a))...); \
  }
SQUALL_TEST_EAGER_KERNEL_OF(kernels::quantize_scheme Q, quantize, Q)
SQUALL_TEST_EAGER_KERNEL_OF(kernels::quantize_scheme Q, dequantize, Q)
SQUALL_TEST_EAGER_KERNEL_OF(class Index, select_topk, Index)
SQUALL_TEST_EAGER_KERNEL_OF(class Index, write_selected, Index)
SQUALL_TEST_EAGER_KERNEL_OF(class Index, sparse_index_fault, Index)
SQUALL_TEST_EAGER_KERNEL_OF(class Index, scatter_sparse, Index)
SQUALL_TEST_EAGER_KERNEL_OF(class Index, gather_sparse, Index)
SQUALL_TEST_EAGER_KERNEL_OF(class Index, scatter_add_sparse, Index)
SQUALL_TEST_EAGER_KERNEL_OF(class Index, scatter_subtract_sparse, Index)
SQUALL_TEST_EAGER_KERNEL_OF(class Index, sparse_union, Index)
SQUALL_TEST_EAGER_KERNEL_OF(class Index, sparse_keep_largest, Index)
SQUALL_TEST_EAGER_KERNEL_OF(class Index, sparse_add_back, Index)
#undef SQUALL_TEST_EAGER_KERNEL_OF

// (a braced stream argument cannot go through a forwarding pack)
template <class T, class M>
void powersgd_random_factor(const basic_deferred_backend<M>& b, std::uint64_t seed,
                            random_stream stream, T* out, std::size_t count) {
  b.synchronize();
  kernels::powersgd_random_factor(host_backend{}, seed, stream, out, count);
}

template <std::size_t Rows, std::size_t Cols, class M, class... A>
void count_sketch_accumulate(const basic_deferred_backend<M>& b, A&&... a) {
  b.synchronize();
  kernels::count_sketch_accumulate<Rows, Cols>(host_backend{}, host_arg(std::forward<A>(a))...);
}
template <std::size_t Rows, std::size_t Cols, class M, class... A>
void count_sketch_estimate(const basic_deferred_backend<M>& b, A&&... a) {
  b.synchronize();
  kernels::count_sketch_estimate<Rows, Cols>(host_backend{}, host_arg(std::forward<A>(a))...);
}
template <std::size_t Rows, std::size_t Cols, class M, class... A>
void count_sketch_zero_support(const basic_deferred_backend<M>& b, A&&... a) {
  b.synchronize();
  kernels::count_sketch_zero_support<Rows, Cols>(host_backend{}, host_arg(std::forward<A>(a))...);
}

static_assert(backend<deferred_backend>);
static_assert(backend<deferred_device_backend>);

}  // namespace squall::test
