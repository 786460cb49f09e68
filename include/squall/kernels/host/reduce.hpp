// SPDX-License-Identifier: Apache-2.0
#pragma once
/// Host elementwise kernels: reduce-into, reduce of two inputs, copy, finalize, fill, the
/// error-feedback subtraction and the majority vote's two steps. These are
/// the reference semantics; kernels/cuda/reduce.cuh is their twin with the same signatures.
/// The loops are plain indexed loops over restrict pointers, which g++ -O3 vectorizes for
/// float, double, int32 and int64 (tests/unit/vectorize checks it from the compiler's report).

#include <squall/backend/host.hpp>
#include <squall/core/buffer.hpp>
#include <squall/core/error.hpp>
#include <squall/core/ops.hpp>
#include <squall/kernels/host/convert.hpp>
#include <squall/kernels/host/copy.hpp>

#include <algorithm>  // min
#include <cstddef>    // size_t
#include <cstdint>    // uintptr_t
#include <cstring>    // memmove, memset
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

namespace squall::kernels {
namespace detail {

inline void require_same_count(std::string_view operation, std::size_t a, std::size_t b) {
  if (a != b) {
    throw invalid_argument({.operation = operation}, "element counts differ: " + std::to_string(a) +
                                                         " and " + std::to_string(b));
  }
}

/// True if the two element ranges share memory without being the same range.
template <class T>
bool partially_overlap(const T* a, const T* b, std::size_t count) {
  if (a == b || count == 0) return false;
  const auto lo = reinterpret_cast<std::uintptr_t>(a < b ? a : b);
  const auto hi = reinterpret_cast<std::uintptr_t>(a < b ? b : a);
  return hi - lo < count * sizeof(T);
}

template <class T, class Op>
SQUALL_HOST_CLONES void reduce_distinct_loop(T* SQUALL_RESTRICT dst, const T* SQUALL_RESTRICT a,
                                             const T* SQUALL_RESTRICT b, std::size_t count, Op op) {
  for (std::size_t i = 0; i < count; ++i) dst[i] = combine<T>(op, a[i], b[i]);
}

template <class T, class Op>
SQUALL_HOST_CLONES void reduce_into_loop(T* SQUALL_RESTRICT dst, const T* SQUALL_RESTRICT src,
                                         std::size_t count, Op op) {
  for (std::size_t i = 0; i < count; ++i) dst[i] = combine<T>(op, dst[i], src[i]);
}

/// `a - b` in the accumulator type, rounded to `T`; integers wrap (no overflow UB).
template <element T>
SQUALL_HOST_DEVICE SQUALL_FORCEINLINE T difference(T a, T b) noexcept {
  if constexpr (std::is_integral_v<T>) {
    using U = std::make_unsigned_t<T>;
    return static_cast<T>(static_cast<U>(static_cast<U>(a) - static_cast<U>(b)));
  } else {
    return from_accumulator<T>(to_accumulator(a) - to_accumulator(b));
  }
}

/// Elements per block of the 16-bit loops: two float blocks of 8 KiB stay in L1.
inline constexpr std::size_t block_16bit = 2048;

/// The float part of the 16-bit loops: `a[i] = op(a[i], b[i])`, vectorized.
template <class Op>
SQUALL_HOST_CLONES void combine_floats(float* SQUALL_RESTRICT a, const float* SQUALL_RESTRICT b,
                                       std::size_t count, Op op) {
  for (std::size_t i = 0; i < count; ++i) a[i] = op(a[i], b[i]);
}

/// `dst[i] = op(a[i], b[i])`; `dst` may be exactly `a` or `b` (or both), no other overlap.
/// 16-bit types go through float blocks (widen both, combine, narrow): the same rounding as
/// `combine<T>` element by element, at vector speed.
template <class T, class Op>
SQUALL_HOST_CLONES void reduce_loop(T* dst, const T* a, const T* b, std::size_t count, Op op) {
  if constexpr (float16_like<T>) {
    float left[block_16bit];
    float right[block_16bit];
    for (std::size_t base = 0; base < count; base += block_16bit) {
      const std::size_t n = count - base < block_16bit ? count - base : block_16bit;
      widen(a + base, left, n);
      widen(b + base, right, n);
      combine_floats(left, right, n, op);
      narrow(left, dst + base, n);
    }
  } else if (dst == a && a == b) {
    for (std::size_t i = 0; i < count; ++i) dst[i] = combine<T>(op, dst[i], dst[i]);
  } else if (dst == a) {
    reduce_into_loop(dst, b, count, op);
  } else if (dst == b) {
    for (std::size_t i = 0; i < count; ++i) dst[i] = combine<T>(op, a[i], dst[i]);
  } else {
    reduce_distinct_loop(dst, a, b, count, op);
  }
}

// The fused folds of `reduce_many`: two, three or four inputs into a distinct `dst`, or one to
// three more into `dst` in place, each element's steps in the order of the inputs.
template <class T, class Op>
SQUALL_HOST_CLONES void fold3_loop(T* SQUALL_RESTRICT dst, const T* SQUALL_RESTRICT a,
                                   const T* SQUALL_RESTRICT b, const T* SQUALL_RESTRICT c,
                                   std::size_t count, Op op) {
  for (std::size_t i = 0; i < count; ++i) {
    dst[i] = combine<T>(op, combine<T>(op, a[i], b[i]), c[i]);
  }
}
template <class T, class Op>
SQUALL_HOST_CLONES void fold4_loop(T* SQUALL_RESTRICT dst, const T* SQUALL_RESTRICT a,
                                   const T* SQUALL_RESTRICT b, const T* SQUALL_RESTRICT c,
                                   const T* SQUALL_RESTRICT d, std::size_t count, Op op) {
  for (std::size_t i = 0; i < count; ++i) {
    dst[i] = combine<T>(op, combine<T>(op, combine<T>(op, a[i], b[i]), c[i]), d[i]);
  }
}
template <class T, class Op>
SQUALL_HOST_CLONES void fold_into2_loop(T* SQUALL_RESTRICT dst, const T* SQUALL_RESTRICT a,
                                        const T* SQUALL_RESTRICT b, std::size_t count, Op op) {
  for (std::size_t i = 0; i < count; ++i) {
    dst[i] = combine<T>(op, combine<T>(op, dst[i], a[i]), b[i]);
  }
}
template <class T, class Op>
SQUALL_HOST_CLONES void fold_into3_loop(T* SQUALL_RESTRICT dst, const T* SQUALL_RESTRICT a,
                                        const T* SQUALL_RESTRICT b, const T* SQUALL_RESTRICT c,
                                        std::size_t count, Op op) {
  for (std::size_t i = 0; i < count; ++i) {
    dst[i] = combine<T>(op, combine<T>(op, combine<T>(op, dst[i], a[i]), b[i]), c[i]);
  }
}

}  // namespace detail

/// `dst[i] = op(...op(op(srcs[0][i], srcs[1][i]), srcs[2][i])..., srcs[k-1][i])` for every i,
/// the inputs in their order, each step rounded to `T` as `reduce` rounds it: the bits of
/// `reduce(dst, srcs[0], srcs[1])` followed by `reduce_into(dst, srcs[j])` for j = 2, ..., k - 1,
/// in one pass over memory for up to four inputs (three more per further pass) where that chain
/// makes k - 1 (16-bit types: that chain). Every input holds `dst.count()` elements. `srcs[0]`
/// may be `dst` itself (in place); an input that partially overlaps `dst`, a later input that is
/// `dst`, or no input throws `invalid_argument`.
template <element T, reduction_op<T> Op>
void reduce_many(const host_backend&, Op op, host_view<T> dst,
                 std::span<const std::type_identity_t<T>* const> srcs) {
  const std::size_t k = srcs.size();
  const std::size_t n = dst.count();
  T* const d = dst.data();
  if (k == 0) throw invalid_argument({.operation = "reduce_many"}, "no input");
  for (std::size_t j = 0; j < k; ++j) {
    if (detail::partially_overlap<T>(d, srcs[j], n) || (j > 0 && srcs[j] == d && n != 0)) {
      throw invalid_argument({.operation = "reduce_many"},
                             "input " + std::to_string(j) + " overlaps dst");
    }
  }
  if (n == 0) return;
  if (k == 1) {
    if (d != srcs[0]) copy_bytes(d, srcs[0], n * sizeof(T));
    return;
  }
  if constexpr (float16_like<T>) {  // the chain: each step narrows to 16 bits in blocks
    detail::reduce_loop(d, srcs[0], srcs[1], n, op);
    for (std::size_t j = 2; j < k; ++j) detail::reduce_loop(d, d, srcs[j], n, op);
  } else {
    std::size_t j = 1;  // the inputs folded into d so far (in place: the first)
    if (d != srcs[0]) {
      if (k == 2) {
        detail::reduce_distinct_loop(d, srcs[0], srcs[1], n, op);
      } else if (k == 3) {
        detail::fold3_loop(d, srcs[0], srcs[1], srcs[2], n, op);
      } else {
        detail::fold4_loop(d, srcs[0], srcs[1], srcs[2], srcs[3], n, op);
      }
      j = std::min<std::size_t>(k, 4);
    }
    while (j < k) {
      if (k - j >= 3) {
        detail::fold_into3_loop(d, srcs[j], srcs[j + 1], srcs[j + 2], n, op);
        j += 3;
      } else if (k - j == 2) {
        detail::fold_into2_loop(d, srcs[j], srcs[j + 1], n, op);
        j += 2;
      } else {
        detail::reduce_into_loop(d, srcs[j], n, op);
        j += 1;
      }
    }
  }
}

/// `dst[i] = op(a[i], b[i])` for every i. `dst` may be `a` or `b` (or both); any other
/// overlap, or a count mismatch, throws `invalid_argument`.
template <element T, reduction_op<T> Op>
void reduce(const host_backend&, Op op, host_view<T> dst,
            host_view<const std::type_identity_t<T>> a,
            host_view<const std::type_identity_t<T>> b) {
  detail::require_same_count("reduce", dst.count(), a.count());
  detail::require_same_count("reduce", dst.count(), b.count());
  if (detail::partially_overlap<T>(dst.data(), a.data(), dst.count()) ||
      detail::partially_overlap<T>(dst.data(), b.data(), dst.count())) {
    throw invalid_argument({.operation = "reduce"}, "dst partially overlaps an input");
  }
  detail::reduce_loop(dst.data(), a.data(), b.data(), dst.count(), op);
}

/// `dst[i] = op(dst[i], src[i])` for every i. `src` may be `dst` itself; any other overlap,
/// or a count mismatch, throws `invalid_argument`.
template <element T, reduction_op<T> Op>
void reduce_into(const host_backend& backend, Op op, host_view<T> dst,
                 host_view<const std::type_identity_t<T>> src) {
  reduce(backend, op, dst, dst, src);
}

/// `dst[i] = src[i]` for any trivially copyable `T` (elements or bytes); overlapping ranges
/// are allowed (memmove semantics).
template <class T>
requires std::is_trivially_copyable_v<T>
void copy(const host_backend&, host_view<T> dst, host_view<const std::type_identity_t<T>> src) {
  detail::require_same_count("copy", dst.count(), src.count());
  if (dst.empty() || dst.data() == src.data()) return;
  if (detail::partially_overlap<T>(dst.data(), src.data(), dst.count())) {
    std::memmove(dst.data(), src.data(), dst.size_bytes());
  } else {
    copy_bytes(dst.data(), src.data(), dst.size_bytes());
  }
}

/// Copies `size` bytes from host memory `src` into the backend's memory at `dst` (a payload's
/// header); the host source may be reused when the call returns.
inline void store_bytes(const host_backend&, std::byte* dst, const void* src, std::size_t size) {
  if (size != 0) std::memcpy(dst, src, size);
}

/// Copies `size` bytes from the backend's memory at `src` into host memory `dst` (a payload's
/// header, to validate it on the host); complete when the call returns.
inline void load_bytes(const host_backend&, void* dst, const std::byte* src, std::size_t size) {
  if (size != 0) std::memcpy(dst, src, size);
}

/// `dst[i] = dst[i] - src[i]` for every i, in the accumulator type and rounded to `T` once
/// (integers wrap, as `sum_op` does): error feedback's residual update. `src` may be `dst`;
/// a count mismatch throws `invalid_argument`.
template <element T>
void subtract_into(const host_backend&, host_view<T> dst,
                   host_view<const std::type_identity_t<T>> src) {
  detail::require_same_count("subtract_into", dst.count(), src.count());
  T* d = dst.data();
  const T* s = src.data();
  for (std::size_t i = 0; i < dst.count(); ++i) d[i] = detail::difference(d[i], s[i]);
}

/// Sets every element's bytes to zero (+0 for the floating-point types).
template <class T>
requires std::is_trivially_copyable_v<T>
void fill_zero(const host_backend&, host_view<T> dst) {
  if (!dst.empty()) std::memset(static_cast<void*>(dst.data()), 0, dst.size_bytes());
}

/// One step of a majority vote (signSGD with majority vote), over rank q's decoded values
/// `x`: `votes[i] += sign(x[i])` and `sums[i] += |x[i]|`, or, with `first`, both set to those.
/// `sums` may not be `x`; a count mismatch throws `invalid_argument`.
template <class T>
requires std::is_floating_point_v<T>
void vote_add(const host_backend&, host_view<std::int32_t> votes, host_view<T> sums,
              host_view<const std::type_identity_t<T>> x, bool first) {
  detail::require_same_count("vote_add", votes.count(), x.count());
  detail::require_same_count("vote_add", sums.count(), x.count());
  std::int32_t* SQUALL_RESTRICT v = votes.data();
  T* SQUALL_RESTRICT s = sums.data();
  const T* SQUALL_RESTRICT in = x.data();
  for (std::size_t i = 0; i < x.count(); ++i) {
    const T value = in[i];
    const std::int32_t sign =
        static_cast<std::int32_t>(value > T(0)) - static_cast<std::int32_t>(value < T(0));
    const T magnitude = value < T(0) ? -value : value;
    v[i] = first ? sign : v[i] + sign;
    s[i] = first ? magnitude : s[i] + magnitude;
  }
}

/// The vote's result: `sums[i]` where the votes are positive, `-sums[i]` where negative, and
/// `0 x sums[i]` on a tie (0, or NaN for a NaN sum), in place.
template <class T>
requires std::is_floating_point_v<T>
void vote_finish(const host_backend&, host_view<const std::int32_t> votes, host_view<T> sums) {
  detail::require_same_count("vote_finish", votes.count(), sums.count());
  const std::int32_t* SQUALL_RESTRICT v = votes.data();
  T* SQUALL_RESTRICT s = sums.data();
  for (std::size_t i = 0; i < sums.count(); ++i) {
    s[i] = v[i] > 0 ? s[i] : v[i] < 0 ? -s[i] : T(0) * s[i];
  }
}

/// Scratch for `count` elements of `T` in the backend's memory, freed with the returned object
/// (its contents are unspecified; `data()` is its address). For the host, a `std::vector`.
template <class T>
std::vector<T> allocate_scratch(const host_backend&, std::size_t count) {
  return std::vector<T>(count);
}

/// Applies `op.finalize` to every element (avg: divide by `contributions`); a no-op for ops
/// without a finalize step. Throws `invalid_argument` if `contributions` is 0.
template <element T, reduction_op<T> Op>
void finalize(const host_backend&, Op op, host_view<T> dst, std::size_t contributions) {
  if constexpr (finalizing_op<Op, T>) {
    if (contributions == 0) {
      throw invalid_argument({.operation = "finalize"}, "zero contributions");
    }
    T* SQUALL_RESTRICT d = dst.data();
    for (std::size_t i = 0; i < dst.count(); ++i) {
      d[i] = from_accumulator<T>(op.finalize(to_accumulator(d[i]), contributions));
    }
  }
}

}  // namespace squall::kernels
