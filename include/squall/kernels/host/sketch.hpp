// SPDX-License-Identifier: Apache-2.0
#pragma once
/// Host kernels of the sketching compressors (compress/sketch.hpp): count-sketch hashing,
/// accumulation, median estimates and heavy-hitter selection; PowerSGD's products M Q,
/// M^T P, P Q^T and the Gram-Schmidt orthogonalization. These are the reference semantics;
/// a CUDA twin (kernels/cuda/sketch.cuh) takes the same arguments and shares the
/// `SQUALL_HOST_DEVICE` hashing below, so both backends put every element in the same bucket.

#include <squall/backend/host.hpp>
#include <squall/core/buffer.hpp>
#include <squall/core/config.hpp>
#include <squall/core/random.hpp>
#include <squall/kernels/host/select.hpp>

#include <algorithm>  // min, fill, heap functions
#include <bit>        // bit_cast, countr_zero, rotr
#include <cmath>      // fabs, isnan, sqrt
#include <cstddef>    // size_t
#include <cstdint>
#include <limits>
#include <type_traits>  // conditional_t
#include <vector>

namespace squall::kernels {

// ---- count sketch: hashing ----------------------------------------------------------------

/// The hash function of one count-sketch row: w(i) = (a i + b) mod 2^64, whose top l + 1
/// bits (l = log2(columns)) give the sign s(i) (the top bit: 0 for +1, 1 for -1) and the
/// bucket h(i) (the l bits below it). This is Dietzfelbinger's multiply-add-shift ("Universal
/// hashing and k-wise independent random variables via integer arithmetic without primes", STACS
/// 1996, the strongly universal form of the multiply-shift scheme of Dietzfelbinger, Hagerup,
/// Katajainen and Penttonen, J. Algorithms 1997): with a, b uniform in [0, 2^64), the top
/// M = l + 1 bits are strongly universal (pairwise independent and uniform over 2^M values)
/// for indices i < 2^(65 - M) = 2^(64 - l), i.e. below 2^48 for 65536 columns. So (h(i),
/// s(i)) is uniform, h(i) and s(i) are independent of each other, and both are pairwise
/// independent across indices: exactly what the count-sketch variance bound needs
/// (Charikar, Chen, Farach-Colton 2002: E[s(i) s(j)] = 0 and Pr[h(i) = h(j)] = 1 / columns
/// for i != j give Var[s(i) S[h(i)]] = sum_{j != i} g_j^2 / columns). One multiply-add per
/// row and element, no branch; evaluated incrementally (w(i + 1) = w(i) + a) in the loops.
struct sketch_row_hash {
  std::uint64_t multiplier = 0;  ///< a
  std::uint64_t offset = 0;      ///< b
};

/// Row `row`'s hash function for the draw stream (seed, stream): Philox block `row`. Call it
/// with `stream.rank = shared_rank` so that every rank hashes alike.
SQUALL_HOST_DEVICE inline sketch_row_hash make_sketch_row_hash(std::uint64_t seed,
                                                               random_stream stream,
                                                               std::uint64_t row) {
  const philox_block x = philox(seed, stream, row);
  return {static_cast<std::uint64_t>(x.word[0]) | (static_cast<std::uint64_t>(x.word[1]) << 32),
          static_cast<std::uint64_t>(x.word[2]) | (static_cast<std::uint64_t>(x.word[3]) << 32)};
}

/// The top `bits` bits (0 <= bits <= 63) of `w`: `(w >> 1) >> (63 - bits)` is defined for
/// every such `bits`, 0 included (where it is 0), so there is no branch.
SQUALL_HOST_DEVICE inline std::uint64_t top_bits(std::uint64_t w, unsigned bits) {
  return (w >> 1) >> (63 - bits);
}

/// Element `i`'s hash word w(i) = a i + b mod 2^64.
SQUALL_HOST_DEVICE inline std::uint64_t sketch_word(const sketch_row_hash& h, std::uint64_t i) {
  return h.multiplier * i + h.offset;
}

/// The bucket in [0, 2^bits) of hash word `w`: bits 62 down to 63 - bits.
SQUALL_HOST_DEVICE inline std::uint64_t sketch_bucket(std::uint64_t w, unsigned bits) {
  return top_bits(w << 1, bits);
}

/// The sign bit of hash word `w` (its top bit): 0 for +1, 1 for -1.
SQUALL_HOST_DEVICE inline std::uint32_t sketch_sign_bit(std::uint64_t w) {
  return static_cast<std::uint32_t>(w >> 63);
}

/// `x` times +1 (sign bit 0) or -1 (sign bit 1): exact, NaN stays NaN.
template <class T>
SQUALL_HOST_DEVICE inline T apply_sign(T x, std::uint32_t sign_bit) {
  return x * (T(1) - T(2) * static_cast<T>(static_cast<std::int32_t>(sign_bit)));
}

namespace detail {

/// Elements hashed per block of the estimate loop (Rows x 256 x 12 bytes stay in L1).
inline constexpr std::size_t sketch_block = 256;

/// Buckets and signs (as +-1 of `T`) of `n` elements starting at `first`, for one row; the
/// hash word advances by `a` per element (the numbers `sketch_word` gives), an induction g++
/// vectorizes.
template <class T>
SQUALL_HOST_CLONES void sketch_hash_block(std::size_t n, std::uint64_t first, sketch_row_hash h,
                                          unsigned bits, std::uint32_t* SQUALL_RESTRICT bucket,
                                          T* SQUALL_RESTRICT sign) {
  std::uint64_t w = sketch_word(h, first);
  for (std::size_t j = 0; j < n; ++j) {
    bucket[j] = static_cast<std::uint32_t>(sketch_bucket(w, bits));
    sign[j] = apply_sign(T(1), sketch_sign_bit(w));
    w += h.multiplier;
  }
}

/// The median of N (odd) values, branch-free: an odd-even transposition sorting network of
/// min / max (N rounds), which g++ vectorizes across elements. NaN if any value is NaN (then
/// the sum, which is NaN, is returned): a NaN bucket poisons the estimate rather than landing
/// at an order-dependent place in the network.
template <class T, std::size_t N>
SQUALL_HOST_DEVICE inline T median_of(T (&x)[N]) {
  bool nan = false;
  T sum = T(0);
  for (std::size_t a = 0; a < N; ++a) {
    nan = nan | (x[a] != x[a]);
    sum += x[a];
  }
  for (std::size_t round = 0; round < N; ++round) {
    for (std::size_t a = round % 2; a + 1 < N; a += 2) {
      // two separate comparisons, so each maps to one minss / maxss and g++ does not turn
      // the pair into an (unpredictable) swap branch
      const T lo = x[a + 1] < x[a] ? x[a + 1] : x[a];
      const T hi = x[a] < x[a + 1] ? x[a + 1] : x[a];
      x[a] = lo;
      x[a + 1] = hi;
    }
  }
  return nan ? sum : x[N / 2];
}

/// out[j] = median over rows of sign[r][j] sketch[r][bucket[r][j]], for j < n.
template <std::size_t Rows, std::size_t Cols, class T>
SQUALL_HOST_CLONES void sketch_medians(const T* SQUALL_RESTRICT sketch,
                                       const std::uint32_t (&bucket)[Rows][sketch_block],
                                       const T (&sign)[Rows][sketch_block], std::size_t n,
                                       T* SQUALL_RESTRICT out) {
  for (std::size_t j = 0; j < n; ++j) {
    T x[Rows];
    for (std::size_t r = 0; r < Rows; ++r) x[r] = sign[r][j] * sketch[r * Cols + bucket[r][j]];
    out[j] = median_of(x);
  }
}

}  // namespace detail

/// Adds the count sketch of `in` to `sketch` (Rows x Cols, row-major): for every element i
/// and row r, sketch[r][h_r(i)] += s_r(i) in[i], accumulated in `T`. `hash` holds the Rows
/// rows' hash functions.
///
/// One pass, rows inner: each element is read once, and its Rows read-modify-writes go to a
/// sketch (Rows x Cols x sizeof(T) bytes) that stays in L1/L2. The scatter cannot be
/// vectorized (buckets collide) and bounds the loop; the hashing is one add, two rotates, two
/// ands and an xor per row (the sign flips the float's sign bit; the rotates are BMI2 `rorx`
/// in the x86-64-v3 clone), branch-free, so it runs in the scatter's idle ALU slots.
/// Measured (Xeon VM, one core, 16 Mi floats, <3, 65536>): this fused loop encodes at
/// 1.2-1.6 GB/s, about 19-24% of memcpy in the same run; a vectorized hash-then-scatter split
/// over 256-element blocks at 0.8 GB/s.
template <std::size_t Rows, std::size_t Cols, class T>
SQUALL_HOST_CLONES void count_sketch_accumulate(const host_backend& /*backend*/,
                                                host_view<const T> in,
                                                const sketch_row_hash (&hash)[Rows],
                                                T* SQUALL_RESTRICT sketch) {
  constexpr unsigned bits = static_cast<unsigned>(std::countr_zero(Cols));
  using word = std::conditional_t<sizeof(T) == 4, std::uint32_t, std::uint64_t>;
  constexpr unsigned word_bits = 8 * sizeof(T);
  constexpr word sign_mask = word(1) << (word_bits - 1);
  std::uint64_t w[Rows];
  for (std::size_t r = 0; r < Rows; ++r) w[r] = hash[r].offset;  // w(0) = b
  const T* SQUALL_RESTRICT data = in.data();
  for (std::size_t i = 0; i < in.count(); ++i) {
    const word x = std::bit_cast<word>(data[i]);
    for (std::size_t r = 0; r < Rows; ++r) {
      // = sketch_bucket(w, bits): bits 62 .. 63 - bits rotated down to the bottom
      const std::size_t bucket = static_cast<std::size_t>(std::rotr(w[r], 63 - bits) & (Cols - 1));
      // w's top bit (the sign) moved onto the element's sign bit: x times s_r(i)
      const word flip = static_cast<word>(std::rotr(w[r], 64 - word_bits)) & sign_mask;
      sketch[r * Cols + bucket] += std::bit_cast<T>(static_cast<word>(x ^ flip));
      w[r] += hash[r].multiplier;
    }
  }
}

/// Writes every element's count-sketch estimate to `out`: the median over rows of
/// s_r(i) sketch[r][h_r(i)] (NaN where any of its buckets is NaN).
template <std::size_t Rows, std::size_t Cols, class T>
void count_sketch_estimate(const host_backend& /*backend*/, const T* sketch,
                           const sketch_row_hash (&hash)[Rows], host_view<T> out) {
  constexpr unsigned bits = static_cast<unsigned>(std::countr_zero(Cols));
  constexpr std::size_t block = detail::sketch_block;
  alignas(64) std::uint32_t bucket[Rows][block];
  alignas(64) T sign[Rows][block];
  for (std::size_t first = 0; first < out.count(); first += block) {
    const std::size_t n = std::min(block, out.count() - first);
    for (std::size_t r = 0; r < Rows; ++r) {
      detail::sketch_hash_block(n, first, hash[r], bits, bucket[r], sign[r]);
    }
    detail::sketch_medians<Rows, Cols>(sketch, bucket, sign, n, out.data() + first);
  }
}

/// FetchSGD's momentum and error in sketch space, entry by entry of two Rows x Cols sketches
/// (Rothchild et al., ICML 2020, Algorithm 1): momentum = rho momentum + sum, then error +=
/// momentum. Each entry is rounded after the product and after each sum (no fused
/// multiply-add: the baseline x86-64 has none, and the CUDA twin uses `__fmul_rn` /
/// `__fadd_rn`), so every backend and every rank computes the same bits.
template <real_gradient T>
void sketch_momentum_step(const host_backend& /*backend*/, host_view<T> momentum,
                          host_view<T> error, host_view<const T> sum, T rho) {
  T* SQUALL_RESTRICT u = momentum.data();
  T* SQUALL_RESTRICT e = error.data();
  const T* SQUALL_RESTRICT s = sum.data();
  for (std::size_t j = 0; j < sum.count(); ++j) {
    const T scaled = rho * u[j];
    u[j] = scaled + s[j];
    e[j] += u[j];
  }
}

/// Zeroes, in both `a` and `b` (Rows x Cols sketches, row-major), the Rows buckets h_r(i) of
/// every element i where `values[i]` is not zero: FetchSGD's reset of momentum and error at
/// the support of the update it applied (its sketch's non-zero entries). Writing zero is
/// independent of order, so a parallel twin gives the same bits.
template <std::size_t Rows, std::size_t Cols, real_gradient T>
void count_sketch_zero_support(const host_backend& /*backend*/, host_view<const T> values,
                               const sketch_row_hash (&hash)[Rows], T* a, T* b) {
  constexpr unsigned bits = static_cast<unsigned>(std::countr_zero(Cols));
  for (std::size_t i = 0; i < values.count(); ++i) {
    if (values[i] == T(0)) continue;
    for (std::size_t r = 0; r < Rows; ++r) {
      const std::size_t at =
          r * Cols + static_cast<std::size_t>(sketch_bucket(sketch_word(hash[r], i), bits));
      a[at] = T(0);
      b[at] = T(0);
    }
  }
}

/// Keeps the `k` entries of `values` largest in magnitude and writes zero elsewhere: top-k's
/// own selection (`select_topk`, kernels/host/select.hpp), so the same order (NaN above every
/// number) and the same tie rule (lower index first).
template <real_gradient T>
void keep_largest_magnitudes(const host_backend& backend, host_view<T> values, std::size_t k) {
  const std::size_t count = values.count();
  if (k >= count) return;
  if (k == 0) {
    std::fill(values.data(), values.data() + count, T(0));
    return;
  }
  std::vector<std::uint64_t> indices(k);
  std::vector<T> kept(k);
  const std::size_t n = select_topk<std::uint64_t>(backend, host_view<const T>(values), k,
                                                   reinterpret_cast<std::byte*>(indices.data()),
                                                   reinterpret_cast<std::byte*>(kept.data()));
  std::fill(values.data(), values.data() + count, T(0));
  for (std::size_t e = 0; e < n; ++e) values[static_cast<std::size_t>(indices[e])] = kept[e];
}

// ---- PowerSGD: products of the m x c view --------------------------------------------------

namespace detail {

/// sum_j a[j] b[j] in double, with eight partial sums g++ vectorizes without fast-math.
template <class T>
SQUALL_NO_TRAPPING_MATH SQUALL_HOST_CLONES double dot_to_double(const T* SQUALL_RESTRICT a,
                                                                const double* SQUALL_RESTRICT b,
                                                                std::size_t n) {
  double part[8] = {};
  std::size_t j = 0;
  for (; j + 8 <= n; j += 8) {
    for (std::size_t l = 0; l < 8; ++l) part[l] += static_cast<double>(a[j + l]) * b[j + l];
  }
  for (; j < n; ++j) part[0] += static_cast<double>(a[j]) * b[j];
  return ((part[0] + part[1]) + (part[2] + part[3])) + ((part[4] + part[5]) + (part[6] + part[7]));
}

/// acc[j] += x a[j], in double.
template <class T>
SQUALL_NO_TRAPPING_MATH SQUALL_HOST_CLONES void axpy_to_double(double x, const T* SQUALL_RESTRICT a,
                                                               double* SQUALL_RESTRICT acc,
                                                               std::size_t n) {
  for (std::size_t j = 0; j < n; ++j) acc[j] += x * static_cast<double>(a[j]);
}

/// Elements of row `i` of the m x c view of `count` elements (the rest is zero padding).
inline std::size_t row_length(std::size_t i, std::size_t columns, std::size_t count) {
  const std::size_t start = i * columns;
  return start >= count ? 0 : std::min(columns, count - start);
}

/// The c x r matrix `q` (row-major) transposed into r x c doubles.
template <class T>
std::vector<double> transpose_to_double(const T* q, std::size_t columns, std::size_t rank) {
  std::vector<double> t(columns * rank);
  for (std::size_t j = 0; j < columns; ++j) {
    for (std::size_t k = 0; k < rank; ++k)
      t[k * columns + j] = static_cast<double>(q[j * rank + k]);
  }
  return t;
}

}  // namespace detail

/// P = M Q for the m x c row-major view M of `in` (zero-padded), Q c x r and P m x r
/// (row-major); sums in double, rounded once to `T`. Sizes are the caller's to check.
template <class T>
void powersgd_multiply(const host_backend& /*backend*/, host_view<const T> in, std::size_t rows,
                       std::size_t columns, std::size_t rank, const T* q, T* p) {
  const std::vector<double> qt = detail::transpose_to_double(q, columns, rank);
  for (std::size_t i = 0; i < rows; ++i) {
    const std::size_t len = detail::row_length(i, columns, in.count());
    for (std::size_t k = 0; k < rank; ++k) {
      p[i * rank + k] = static_cast<T>(
          len == 0 ? 0.0
                   : detail::dot_to_double(in.data() + i * columns, qt.data() + k * columns, len));
    }
  }
}

/// Q = M^T P for the m x c view M of `in`, P m x r and Q c x r (row-major); sums in double.
template <class T>
void powersgd_multiply_transposed(const host_backend& /*backend*/, host_view<const T> in,
                                  std::size_t rows, std::size_t columns, std::size_t rank,
                                  const T* p, T* q) {
  std::vector<double> acc(columns * rank, 0.0);  // r x c
  for (std::size_t i = 0; i < rows; ++i) {
    const std::size_t len = detail::row_length(i, columns, in.count());
    if (len == 0) break;
    for (std::size_t k = 0; k < rank; ++k) {
      detail::axpy_to_double(static_cast<double>(p[i * rank + k]), in.data() + i * columns,
                             acc.data() + k * columns, len);
    }
  }
  for (std::size_t j = 0; j < columns; ++j) {
    for (std::size_t k = 0; k < rank; ++k) q[j * rank + k] = static_cast<T>(acc[k * columns + j]);
  }
}

/// The relative remaining norm at or below which a column counts as dependent.
inline constexpr double dependent_tolerance = 1e-10;

/// Orthonormalizes the r columns of the m x r row-major matrix `p` in place: Gram-Schmidt in
/// double, each column projected out twice against the earlier ones ("twice is enough",
/// Giraud et al. 2005), then normalized. A column that is zero, or numerically dependent on
/// the earlier ones (its remaining norm at most `dependent_tolerance` = 1e-10 of its norm
/// before projection: with r > m, or M of rank < r, where normalizing the rounding noise
/// would give a column that is not orthogonal), is set to zero instead; so P P^T stays a
/// projector and no NaN comes from a zero column. NaN or infinite inputs are not repaired
/// (they propagate to every later column).
template <class T>
void powersgd_orthogonalize(const host_backend& /*backend*/, T* p, std::size_t rows,
                            std::size_t rank) {
  std::vector<double> col(rows * rank);  // column-major copy
  for (std::size_t i = 0; i < rows; ++i) {
    for (std::size_t k = 0; k < rank; ++k) col[k * rows + i] = static_cast<double>(p[i * rank + k]);
  }
  for (std::size_t k = 0; k < rank; ++k) {
    double* v = col.data() + k * rows;
    const double before = std::sqrt(detail::dot_to_double(v, v, rows));
    for (int pass = 0; pass < 2; ++pass) {
      for (std::size_t e = 0; e < k; ++e) {
        const double* u = col.data() + e * rows;
        const double d = detail::dot_to_double(v, u, rows);
        for (std::size_t i = 0; i < rows; ++i) v[i] -= d * u[i];
      }
    }
    const double norm = std::sqrt(detail::dot_to_double(v, v, rows));
    if (norm > dependent_tolerance * before && norm <= std::numeric_limits<double>::max()) {
      for (std::size_t i = 0; i < rows; ++i) v[i] /= norm;
    } else if (!(norm != norm)) {  // zero, dependent or overflowing: zero, no NaN
      std::fill(v, v + rows, 0.0);
    }
  }
  for (std::size_t i = 0; i < rows; ++i) {
    for (std::size_t k = 0; k < rank; ++k) p[i * rank + k] = static_cast<T>(col[k * rows + i]);
  }
}

/// out = P Q^T (m x c, row-major) truncated to out.count() elements; sums in double.
template <class T>
void powersgd_decompress(const host_backend& /*backend*/, const T* p, const T* q, std::size_t rows,
                         std::size_t columns, std::size_t rank, host_view<T> out) {
  const std::vector<double> qt = detail::transpose_to_double(q, columns, rank);
  std::vector<double> row(columns);
  for (std::size_t i = 0; i < rows; ++i) {
    const std::size_t len = detail::row_length(i, columns, out.count());
    if (len == 0) break;
    std::fill(row.begin(), row.begin() + static_cast<std::ptrdiff_t>(len), 0.0);
    for (std::size_t k = 0; k < rank; ++k) {
      const double pik = static_cast<double>(p[i * rank + k]);
      const double* qk = qt.data() + k * columns;
      for (std::size_t j = 0; j < len; ++j) row[j] += pik * qk[j];
    }
    T* dst = out.data() + i * columns;
    for (std::size_t j = 0; j < len; ++j) dst[j] = static_cast<T>(row[j]);
  }
}

/// Q's initial entries: uniform in [-1, 1) from Philox word e of the stream (seed, stream),
/// e = j r + k for entry (j, k) of the c x r matrix.
template <class T>
void powersgd_random_factor(const host_backend& /*backend*/, std::uint64_t seed,
                            random_stream stream, T* q, std::size_t entries) {
  for (std::size_t e = 0; e < entries; e += 4) {
    const philox_block x = philox(seed, stream, e / 4);
    for (std::size_t l = 0; l < 4 && e + l < entries; ++l) {
      q[e + l] = static_cast<T>(2.0 * unit_interval(x.word[l]) - 1.0);
    }
  }
}

}  // namespace squall::kernels
