// SPDX-License-Identifier: Apache-2.0
#pragma once
/// The sketching compressors, both linear (payloads of the same seed and step add):
///
/// `count_sketch_compressor<Rows, Cols>`: the count sketch of Charikar, Chen and
/// Farach-Colton ("Finding frequent items in data streams", ICALP 2002) as SketchSGD uses it
/// for gradients (Ivkin, Rothchild, Ullah, Braverman, Stoica, Arora, "Communication-efficient
/// distributed SGD with sketching", NeurIPS 2019). Payload (little-endian):
///
///   offset 0   the 16-byte header (kind 11, parameter = Rows, count)
///   offset 16  u64 seed        offset 24  u64 step
///   offset 32  u32 rows        offset 36  u32 cols
///   offset 40  Rows x Cols values of T, row-major (the sketch; this is the part that adds)
///
/// 40 + Rows Cols sizeof(T) bytes whatever the count: (320 + 8 sizeof(T) Rows Cols) / count
/// bits per element.
///
/// `powersgd_compressor`: one power iteration of PowerSGD (Vogels, Karimireddy, Jaggi,
/// "PowerSGD: Practical Low-Rank Gradient Compression for Distributed Optimization",
/// NeurIPS 2019) on the m x c row-major view M of the gradient. Payload:
///
///   offset 0   the 16-byte header (kind 12, parameter = rank r, count)
///   offset 16  u64 m           offset 24  u64 c
///   offset 32  P, m x r values of T, row-major (orthonormal columns)
///   then       Q = M^T P, c x r values of T, row-major
///
/// 32 + (m + c) r sizeof(T) bytes: (256 + 8 sizeof(T) (m + c) r) / count bits per element.

#include <squall/backend/array.hpp>
#include <squall/compress/payload.hpp>
#include <squall/concepts.hpp>
#include <squall/core/buffer.hpp>
#include <squall/core/error.hpp>
#include <squall/core/random.hpp>
#include <squall/core/types.hpp>
#include <squall/detail/bytes.hpp>
#include <squall/kernels/host/reduce.hpp>
#include <squall/kernels/host/sketch.hpp>

#include <algorithm>  // fill
#include <bit>        // has_single_bit
#include <cmath>      // isfinite, sqrt
#include <concepts>   // same_as
#include <cstddef>    // byte, size_t
#include <cstdint>    // uint64_t, uintptr_t
#include <cstring>    // memcpy
#include <limits>
#include <string>
#include <string_view>
#include <vector>

namespace squall {

namespace detail {}  // namespace detail

// ---- count sketch ----------------------------------------------------------------------------

/// Count-sketch compression (Charikar et al. 2002; SketchSGD, Ivkin et al. 2019): encode
/// adds s_r(i) g_i to bucket h_r(i) of each of `Rows` rows of `Cols` counters; decode
/// estimates every g_i as the median over rows of s_r(i) S[r][h_r(i)] and keeps the
/// `heavy_hitters` largest estimates in magnitude. The hashes (kernels/host/sketch.hpp:
/// multiply-add-shift, pairwise independent for indices below 2^(64 - log2 Cols)) come from
/// Philox keyed by
/// (seed, step, shared_rank), the same on every rank, so the sketches of one step add:
/// sketch(a) + sketch(b) = sketch(a + b) up to rounding. Sums are accumulated in `T` (float
/// for float gradients): the rounding error of a bucket, about sqrt(n / Cols) eps ||g|| for
/// n elements, is far below the sketch's own error ||g|| / sqrt(Cols), so double
/// accumulation would double the payload and the cache footprint for nothing.
///
/// Recovery (Charikar et al. Lemma 3 with Chebyshev): one row's estimate errs by at least
/// eps ||g|| / 2 with probability at most 4 / (eps^2 Cols); the median errs only if at least
/// ceil(Rows / 2) rows do, so with p = 4 / (eps^2 Cols) < 1 the failure probability per
/// coordinate is at most sum_{j >= ceil(Rows/2)} C(Rows, j) p^j (1 - p)^(Rows - j).
///
/// NaN / Inf: with `check_finite` false a NaN (or +Inf and -Inf meeting in one bucket) makes
/// its Rows buckets NaN, so every estimate that shares one of them decodes as NaN (and ranks
/// above every number in the heavy-hitter selection); an Inf makes its buckets infinite. No
/// float is ever converted to an integer, so there is no undefined behaviour.
template <std::size_t Rows, std::size_t Cols>
struct count_sketch_compressor {
  static_assert(Rows >= 1 && Rows % 2 == 1, "count_sketch_compressor: Rows must be odd and >= 1");
  static_assert(std::has_single_bit(Cols), "count_sketch_compressor: Cols must be a power of two");
  static_assert(Cols <= (std::size_t{1} << 31), "count_sketch_compressor: Cols at most 2^31");
  static_assert(Rows <= 65535, "count_sketch_compressor: Rows must fit the header's u16");

  static constexpr std::string_view name = "count_sketch";
  static constexpr aggregation_set aggregations{aggregation::linear, aggregation::gather,
                                                aggregation::two_round};
  static constexpr bool fixed_size = true;
  static constexpr payload_kind kind = payload_kind::count_sketch;
  static constexpr std::size_t rows = Rows;
  static constexpr std::size_t cols = Cols;
  /// Bytes before the sketch values: header, seed, step, rows, cols.
  static constexpr std::size_t body_offset = payload_header::bytes + 24;

  /// Keys the hashes, with the encode's step; every rank must use the same seed.
  std::uint64_t seed = 0;
  /// k, the coordinates decode keeps (the largest estimates); 0 means Cols / 4 (at least 1):
  /// a sketch a few times wider than the heavy hitters read from it, so that bucket noise
  /// does not crowd them out of the k largest estimates.
  std::size_t heavy_hitters = 0;
  /// When true, encode throws `invalid_argument` naming the first non-finite element.
  bool check_finite = false;

  /// 40 + Rows x Cols x sizeof(element) bytes, for any count. Throws `invalid_argument` for an
  /// element type other than float or double.
  std::size_t max_payload_bytes(dtype type, std::size_t /*count*/) const {
    if (type != dtype::float32 && type != dtype::float64) {
      throw invalid_argument({.operation = name}, "elements of " + std::string(to_string(type)) +
                                                      " (float32 or float64 only)");
    }
    return body_offset + Rows * Cols * size_of(type);
  }

  /// The k that decode keeps: `heavy_hitters`, or max(1, Cols / 4) when it is 0.
  std::size_t kept() const {
    return heavy_hitters != 0 ? heavy_hitters : (Cols >= 4 ? Cols / 4 : std::size_t{1});
  }

  /// Writes the sketch of `in` for draw step `stream.step` (its rank is ignored: the hashes
  /// use `shared_rank`); returns the payload's size. Throws `invalid_argument` if `payload`
  /// is too small, or (with `check_finite`) on a non-finite element.
  template <class B, real_gradient T>
  std::size_t encode(const B& backend, buffer_view<const T, typename B::memory_space> in,
                     buffer_view<std::byte, typename B::memory_space> payload,
                     random_stream stream = {}) const {
    const std::size_t size = max_payload_bytes(dtype_of<T>, in.count());
    detail::require_room(name, payload.count(), size);
    if (check_finite) require_finite(backend, name, in);
    // header, seed, step, rows, cols: built on the host, stored into the payload
    std::byte head[body_offset] = {};
    write_payload_header({.kind = kind,
                          .type = dtype_of<T>,
                          .parameter = static_cast<std::uint16_t>(Rows),
                          .count = in.count()},
                         head);
    std::byte* body = head + payload_header::bytes;
    const std::uint64_t step = stream.step;
    const std::uint32_t r32 = static_cast<std::uint32_t>(Rows);
    const std::uint32_t c32 = static_cast<std::uint32_t>(Cols);
    std::memcpy(body, &seed, 8);
    std::memcpy(body + 8, &step, 8);
    std::memcpy(body + 16, &r32, 4);
    std::memcpy(body + 20, &c32, 4);
    store_bytes(backend, payload.data(), head, body_offset);
    kernels::sketch_row_hash hash[Rows];
    for (std::size_t r = 0; r < Rows; ++r) {
      hash[r] = kernels::make_sketch_row_hash(seed, {step, shared_rank}, r);
    }
    using M = typename B::memory_space;
    std::byte* values = payload.data() + body_offset;
    if (reinterpret_cast<std::uintptr_t>(values) % alignof(T) == 0) {
      T* sketch = reinterpret_cast<T*>(values);  // accumulate in place
      fill_zero(backend, buffer_view<T, M>(sketch, Rows * Cols));
      accumulate(backend, in, hash, sketch);
    } else {
      auto sketch = allocate_scratch<T>(backend, Rows * Cols);
      const buffer_view<T, M> view(sketch.data(), Rows * Cols);
      fill_zero(backend, view);
      accumulate(backend, in, hash, sketch.data());
      copy(backend, buffer_view<std::byte, M>(values, Rows * Cols * sizeof(T)),
           detail::as_bytes(view));
    }
    return size;
  }

  /// Writes every coordinate's median estimate to `out` (no selection). Throws
  /// `invalid_argument` if `payload` is not a count sketch of `out.count()` elements of `T`
  /// with Rows rows and Cols columns and exactly its size.
  template <class B, real_gradient T>
  void estimate(const B& backend, buffer_view<const std::byte, typename B::memory_space> payload,
                buffer_view<T, typename B::memory_space> out) const {
    using M = typename B::memory_space;
    kernels::sketch_row_hash hash[Rows];
    payload_hashes<T>(backend, payload, out.count(), hash);
    // the sketch values copied: the payload need not be aligned for T
    auto sketch = allocate_scratch<T>(backend, Rows * Cols);
    copy(backend, detail::as_writable_bytes(buffer_view<T, M>(sketch.data(), Rows * Cols)),
         payload.subview(body_offset, Rows * Cols * sizeof(T)));
    count_sketch_estimate<Rows, Cols>(backend, sketch.data(), hash, out);
  }

  /// Decodes SketchSGD style: the median estimates, then only the `kept()` largest in
  /// magnitude (ties to the lower index; NaN ranks highest), zero elsewhere. Throws as
  /// `estimate` does.
  template <class B, real_gradient T>
  void decode(const B& backend, buffer_view<const std::byte, typename B::memory_space> payload,
              buffer_view<T, typename B::memory_space> out) const {
    estimate(backend, payload, out);
    keep_largest_magnitudes(backend, out, kept());
  }

  /// Validates `payload` as a count sketch of `count` elements of `T` with Rows rows and Cols
  /// columns and exactly its size (its fixed fields copied to the host), and sets `hash` to
  /// the row hashes its seed and step give. Throws `invalid_argument` naming the first field
  /// that is wrong.
  template <class T, class B>
  static void payload_hashes(const B& backend,
                             buffer_view<const std::byte, typename B::memory_space> payload,
                             std::size_t count, kernels::sketch_row_hash (&hash)[Rows]) {
    std::byte head[body_offset] = {};
    load_bytes(backend, head, payload.data(),
               payload.count() < body_offset ? payload.count() : body_offset);
    const payload_header h =
        read_payload_header(name, head, payload.count(), kind, dtype_of<T>, count);
    const error_context where{.operation = name};
    if (h.parameter != Rows) {
      throw invalid_argument(where, "header's parameter " + std::to_string(h.parameter) +
                                        " is not the sketch's " + std::to_string(Rows) + " rows");
    }
    if (payload.count() < body_offset) {
      throw invalid_argument(where, "payload of " + std::to_string(payload.count()) +
                                        " bytes has no room for seed, step, rows and cols");
    }
    const std::byte* body = head + payload_header::bytes;
    std::uint64_t seed = 0;
    std::uint64_t step = 0;
    std::uint32_t r32 = 0;
    std::uint32_t c32 = 0;
    std::memcpy(&seed, body, 8);
    std::memcpy(&step, body + 8, 8);
    std::memcpy(&r32, body + 16, 4);
    std::memcpy(&c32, body + 20, 4);
    if (r32 != Rows || c32 != Cols) {
      throw invalid_argument(where, "a sketch of " + std::to_string(r32) + " x " +
                                        std::to_string(c32) + " decoded as " +
                                        std::to_string(Rows) + " x " + std::to_string(Cols));
    }
    const std::size_t size = body_offset + Rows * Cols * sizeof(T);
    if (payload.count() != size) {
      throw invalid_argument(where, "payload of " + std::to_string(payload.count()) +
                                        " bytes where the sketch takes " + std::to_string(size));
    }
    for (std::size_t r = 0; r < Rows; ++r) {
      hash[r] = kernels::make_sketch_row_hash(seed, {step, shared_rank}, r);
    }
  }

 private:
  template <class B, class T>
  static void accumulate(const B& backend, buffer_view<const T, typename B::memory_space> in,
                         const kernels::sketch_row_hash (&hash)[Rows], T* sketch) {
    count_sketch_accumulate<Rows, Cols>(backend, in, hash, sketch);
  }
};
static_assert(compressor<count_sketch_compressor<1, 1>>);
static_assert(compressor<count_sketch_compressor<5, 65536>>);

// ---- PowerSGD --------------------------------------------------------------------------------

/// The 2-D view PowerSGD compresses: m rows of c columns, row-major, the last row's tail
/// zero-padded (m c >= count > (m - 1) c; m = 0 for count 0).
struct powersgd_shape {
  std::size_t rows = 0;     ///< m
  std::size_t columns = 0;  ///< c

  /// The view of `count` elements in rows of `columns`: m = ceil(count / c) (0 for count 0).
  static powersgd_shape of(std::size_t count, std::size_t columns) {
    return {columns == 0 ? 0 : count / columns + (count % columns != 0), columns};
  }
  /// Whether this is a view of `count` elements: m = ceil(count / c), and c > 0 unless
  /// count is 0.
  bool covers(std::size_t count) const {
    return columns == 0 ? rows == 0 && count == 0 : rows == of(count, columns).rows;
  }
};

/// PowerSGD's state for one tensor, owned by the caller: Q (c x r, row-major), warm-started
/// across steps (each encode stores its new Q here), in `Backend`'s memory. Saved and
/// restored as checked bytes.
template <real_gradient T, class Backend = host_backend>
class powersgd_state {
 public:
  using backend_type = Backend;
  using memory_space = typename Backend::memory_space;

  /// A state for an m x c view and rank r, Q drawn uniform in [-1, 1) from Philox keyed by
  /// (`seed`, step 0, shared_rank), the same on every rank (on backend `b`; complete when
  /// it returns).
  powersgd_state(powersgd_shape shape, std::size_t rank, std::uint64_t seed, const Backend& b = {})
      : shape_(shape), rank_(rank), q_(b, checked_entries(shape.columns, rank)) {
    powersgd_random_factor(b, seed, {0, shared_rank}, q_.view().data(), q_.count());
    b.synchronize();
  }

  std::size_t rows() const { return shape_.rows; }
  std::size_t columns() const { return shape_.columns; }
  std::size_t rank() const { return rank_; }
  powersgd_shape shape() const { return shape_; }
  /// Q, c x r row-major.
  buffer_view<const T, memory_space> q() const { return q_.view(); }
  buffer_view<T, memory_space> q() { return q_.view(); }

  /// The state as bytes: u32 magic "SQPS", u32 version 1 | dtype << 8, u64 m, u64 c, u64 r,
  /// then Q's c r values of T.
  std::vector<std::byte> save() const {
    std::vector<std::byte> out(header_bytes + q_.count() * sizeof(T));
    const std::uint32_t magic = save_magic;
    const std::uint32_t head = 1u | (static_cast<std::uint32_t>(dtype_of<T>) << 8);
    const std::uint64_t fields[3] = {shape_.rows, shape_.columns, rank_};
    std::memcpy(out.data(), &magic, 4);
    std::memcpy(out.data() + 4, &head, 4);
    std::memcpy(out.data() + 8, fields, 24);
    q_.save_to(out.data() + header_bytes);  // 32 bytes in: aligned (operator new)
    return out;
  }

  /// A state on backend `b` from `save()`'s bytes; throws `invalid_argument` unless they are
  /// a saved PowerSGD state of `T` (magic, version, dtype) whose size matches c x r.
  static powersgd_state restore(host_view<const std::byte> bytes, const Backend& b = {}) {
    const error_context where{.operation = "powersgd_state restore"};
    if (bytes.count() < header_bytes) {
      throw invalid_argument(where, std::to_string(bytes.count()) + " bytes, fewer than 32");
    }
    std::uint32_t magic = 0;
    std::uint32_t head = 0;
    std::uint64_t fields[3] = {};
    std::memcpy(&magic, bytes.data(), 4);
    std::memcpy(&head, bytes.data() + 4, 4);
    std::memcpy(fields, bytes.data() + 8, 24);
    if (magic != save_magic) throw invalid_argument(where, "not a saved PowerSGD state");
    if ((head & 0xff) != 1) {
      throw invalid_argument(where, "version " + std::to_string(head & 0xff) + " is not 1");
    }
    if ((head >> 16) != 0) throw invalid_argument(where, "reserved bytes are not 0");
    if (static_cast<dtype>((head >> 8) & 0xff) != dtype_of<T>) {
      throw invalid_argument(
          where, "a state of " + std::string(to_string(static_cast<dtype>((head >> 8) & 0xff))) +
                     " restored as " + std::string(to_string(dtype_of<T>)));
    }
    const std::uint64_t m = fields[0];
    const std::uint64_t c = fields[1];
    const std::uint64_t r = fields[2];
    const std::size_t room = (bytes.count() - header_bytes) / sizeof(T);
    if (r == 0 || r > 65535 || (c != 0 && r > room / c) ||
        bytes.count() != header_bytes + c * r * sizeof(T)) {
      throw invalid_argument(where, std::to_string(bytes.count()) + " bytes for Q of " +
                                        std::to_string(c) + " x " + std::to_string(r));
    }
    if (c == 0 ? m != 0 : m > std::numeric_limits<std::size_t>::max() / c) {
      throw invalid_argument(where, "a view of " + std::to_string(m) + " x " + std::to_string(c));
    }
    powersgd_state s(powersgd_shape{static_cast<std::size_t>(m), static_cast<std::size_t>(c)},
                     static_cast<std::size_t>(r), 0, b);
    s.q_.load_from(bytes.data() + header_bytes);
    return s;
  }

 private:
  static constexpr std::uint32_t save_magic = 0x53505153;  // "SQPS"
  static constexpr std::size_t header_bytes = 32;

  static std::size_t checked_entries(std::size_t columns, std::size_t rank) {
    if (rank == 0 || rank > 65535 ||
        (columns != 0 && rank > std::numeric_limits<std::size_t>::max() / sizeof(T) / columns)) {
      throw invalid_argument({.operation = "powersgd_state"},
                             "rank " + std::to_string(rank) + " for " + std::to_string(columns) +
                                 " columns (rank must be in 1..65535)");
    }
    return columns * rank;
  }

  powersgd_shape shape_;
  std::size_t rank_;
  detail::backend_array<T, Backend> q_;
};

/// PowerSGD compression (Vogels, Karimireddy, Jaggi, NeurIPS 2019): the gradient as an m x c
/// matrix M is sent as rank-r factors P (m x r, orthonormal columns) and Q = M^T P (c x r),
/// decoded as P Q^T, the projection of M onto span(P). One power iteration per step, warm
/// started from the previous step's Q (the caller's `powersgd_state`). Exact for M of rank
/// <= r. Linear in the factors: a collective sums P across ranks before orthogonalizing it
/// and sums Q after, in two rounds, from the public pieces `multiply`, `orthogonalize`,
/// `multiply_transposed` and `decompress`; `encode` / `decode` are the one-rank composition.
///
/// NaN / Inf: a non-finite element makes every entry of P it touches non-finite, and
/// Gram-Schmidt spreads it through P, so the whole decoded tensor is generally NaN; never
/// undefined behaviour. `check_finite` is not offered: the low-rank product has no partial
/// answer to keep.
struct powersgd_compressor {
  static constexpr std::string_view name = "powersgd";
  static constexpr aggregation_set aggregations{aggregation::low_rank};
  static constexpr bool fixed_size = true;
  static constexpr payload_kind kind = payload_kind::powersgd;
  /// Bytes before P: header, m, c.
  static constexpr std::size_t body_offset = payload_header::bytes + 16;

  /// r, the rank of the factors (1..65535; it travels as the header's u16 parameter).
  std::size_t rank = 4;
  /// c, the 2-D view's column count; 0 means ceil(sqrt(count)).
  std::size_t columns = 0;
  /// Keys the random Q of a new state and of the stateless encode; the same on every rank.
  std::uint64_t seed = 0;

  /// The m x c view of `count` elements: c = `columns` or ceil(sqrt(count)), m = ceil(count /
  /// c) (0 when c is 0).
  powersgd_shape shape(std::size_t count) const {
    std::size_t c = columns;
    if (c == 0 && count != 0) {
      // floor(sqrt(count)) exactly (c > count / c is c * c > count without overflow), then up
      c = static_cast<std::size_t>(std::sqrt(static_cast<double>(count)));
      while (c > count / c) --c;
      while (c + 1 <= count / (c + 1)) ++c;
      if (count / c != c || count % c != 0) ++c;
    }
    return {c == 0 ? 0 : (count + c - 1) / c, c};
  }

  /// A fresh state for tensors of `count` elements of `T`, in backend `b`'s memory.
  template <real_gradient T, class B = host_backend>
  powersgd_state<T, B> make_state(std::size_t count, const B& b = {}) const {
    check_rank();
    return powersgd_state<T, B>(shape(count), rank, seed, b);
  }

  /// A fresh state that views tensors of `count` elements as `view` instead of shape(count):
  /// a layer's own matrix (a weight of shape (out, in, ...) as out x (in ...): torch's
  /// PowerSGD hook's view), whose low-rank structure the square view mixes up. Every call
  /// with the state then uses that view (the factors' sizes carry it). Throws
  /// `invalid_argument` unless view.covers(count).
  template <real_gradient T, class B = host_backend>
  powersgd_state<T, B> make_state(std::size_t count, powersgd_shape view, const B& b = {}) const {
    check_rank();
    if (!view.covers(count)) {
      throw invalid_argument({.operation = name}, "a " + std::to_string(view.rows) + " x " +
                                                      std::to_string(view.columns) + " view of " +
                                                      std::to_string(count) +
                                                      " elements (rows must be ceil(" +
                                                      std::to_string(count) + " / columns))");
    }
    return powersgd_state<T, B>(view, rank, seed, b);
  }

  /// 32 + (m + c) r sizeof(element) bytes for the default view, shape(count); throws
  /// `invalid_argument` for a rank outside 1..65535, an element type other than float or
  /// double, or on overflow.
  std::size_t max_payload_bytes(dtype type, std::size_t count) const {
    return payload_bytes(type, shape(count));
  }

  /// 32 + (m + c) r sizeof(element) bytes for the view `s` (a state's `shape()`).
  std::size_t payload_bytes(dtype type, powersgd_shape s) const {
    check_rank();
    if (type != dtype::float32 && type != dtype::float64) {
      throw invalid_argument({.operation = name}, "elements of " + std::string(to_string(type)) +
                                                      " (float32 or float64 only)");
    }
    const std::size_t limit = std::numeric_limits<std::size_t>::max();
    const std::size_t bytes = size_of(type);
    if (s.rows > limit - s.columns || (s.rows + s.columns) > (limit - body_offset) / bytes / rank) {
      throw invalid_argument({.operation = name}, "payload size of a " + std::to_string(s.rows) +
                                                      " x " + std::to_string(s.columns) +
                                                      " view overflows");
    }
    return body_offset + (s.rows + s.columns) * rank * bytes;
  }

  // ---- the pieces (a collective sums P after `multiply` and Q after `multiply_transposed`)
  // The view is the factors': c = Q's count / r, m = P's count / r (shape(count) for a state
  // of the default view, a state's own view otherwise), and must cover the tensor.

  /// P = M Q: `in` viewed as m x c, Q c x r, P m x r, row-major. Throws `invalid_argument`
  /// if a size disagrees.
  template <class B, real_gradient T>
  void multiply(const B& backend, buffer_view<const T, typename B::memory_space> in,
                buffer_view<const T, typename B::memory_space> q,
                buffer_view<T, typename B::memory_space> p) const {
    const powersgd_shape s = checked_shape(in.count(), q.count(), p.count());
    powersgd_multiply(backend, in, s.rows, s.columns, rank, q.data(), p.data());
  }

  /// Orthonormalizes P's r columns in place (Gram-Schmidt in double; a zero column stays
  /// zero, no NaN). Throws `invalid_argument` unless p.count() is a multiple of r.
  template <class B, real_gradient T>
  void orthogonalize(const B& backend, buffer_view<T, typename B::memory_space> p) const {
    check_rank();
    if (p.count() % rank != 0) {
      throw invalid_argument({.operation = name}, "P of " + std::to_string(p.count()) +
                                                      " elements for rank " + std::to_string(rank));
    }
    powersgd_orthogonalize(backend, p.data(), p.count() / rank, rank);
  }

  /// Q = M^T P, with M the m x c view of `in`. Throws `invalid_argument` if a size disagrees.
  template <class B, real_gradient T>
  void multiply_transposed(const B& backend, buffer_view<const T, typename B::memory_space> in,
                           buffer_view<const T, typename B::memory_space> p,
                           buffer_view<T, typename B::memory_space> q) const {
    const powersgd_shape s = checked_shape(in.count(), q.count(), p.count());
    powersgd_multiply_transposed(backend, in, s.rows, s.columns, rank, p.data(), q.data());
  }

  /// out = P Q^T truncated to out.count() elements (the decompressed gradient). Throws
  /// `invalid_argument` if a size disagrees.
  template <class B, real_gradient T>
  void decompress(const B& backend, buffer_view<const T, typename B::memory_space> p,
                  buffer_view<const T, typename B::memory_space> q,
                  buffer_view<T, typename B::memory_space> out) const {
    const powersgd_shape s = checked_shape(out.count(), q.count(), p.count());
    powersgd_decompress(backend, p.data(), q.data(), s.rows, s.columns, rank, out);
  }

  // ---- one-rank encode / decode

  /// One power iteration, warm-started: P = M Q_state, orthogonalize P, Q = M^T P, in the
  /// state's view; stores Q in `state` and writes header, m, c, P, Q to `payload`
  /// (`payload_bytes(type, state.shape())`); returns the payload's size. Throws
  /// `invalid_argument` if `state` is not a view of in.count() elements at this rank, or
  /// `payload` is small.
  template <class B, real_gradient T, class S>
  std::size_t encode(const B& backend, powersgd_state<T, S>& state,
                     buffer_view<const T, typename B::memory_space> in,
                     buffer_view<std::byte, typename B::memory_space> payload) const {
    if (!state.shape().covers(in.count()) || state.rank() != rank) {
      throw invalid_argument({.operation = name}, "state for " + std::to_string(state.rows()) +
                                                      " x " + std::to_string(state.columns()) +
                                                      " rank " + std::to_string(state.rank()) +
                                                      " used for " + std::to_string(in.count()) +
                                                      " elements at rank " + std::to_string(rank));
    }
    using M = typename B::memory_space;
    static_assert(std::same_as<typename S::memory_space, M> ||
                      std::same_as<typename S::memory_space, host_memory>,
                  "squall: a powersgd_state in another backend's memory");
    if constexpr (std::same_as<typename S::memory_space, M>) {
      return iterate(backend, in, state.shape(), state.q(), payload);
    } else {
      // a host state with a device backend: Q goes through backend scratch and comes back
      const std::size_t n = state.q().count();
      auto q = allocate_scratch<T>(backend, n);
      store_bytes(backend, reinterpret_cast<std::byte*>(q.data()), state.q().data(), n * sizeof(T));
      const std::size_t written =
          iterate(backend, in, state.shape(), buffer_view<T, M>(q.data(), n), payload);
      load_bytes(backend, state.q().data(), reinterpret_cast<const std::byte*>(q.data()),
                 n * sizeof(T));
      return written;
    }
  }

  /// The stateless encode (the `compressor_for` signature): Q drawn uniform in [-1, 1) from
  /// Philox keyed by (seed, stream.step, shared_rank), then one power iteration as above.
  template <class B, real_gradient T>
  std::size_t encode(const B& backend, buffer_view<const T, typename B::memory_space> in,
                     buffer_view<std::byte, typename B::memory_space> payload,
                     random_stream stream = {}) const {
    check_rank();
    const powersgd_shape s = shape(in.count());
    const std::size_t n = s.columns * rank;
    auto q = allocate_scratch<T>(backend, n);
    powersgd_random_factor(backend, seed, {stream.step, shared_rank}, q.data(), n);
    return iterate(backend, in, s, buffer_view<T, typename B::memory_space>(q.data(), n), payload);
  }

  /// Writes P Q^T truncated to out.count(). Throws `invalid_argument` unless the payload is a
  /// PowerSGD payload of out.count() elements of `T` with this rank, an m x c view of them
  /// (the default view or a state's own), and exactly 32 + (m + c) r sizeof(T) bytes.
  template <class B, real_gradient T>
  void decode(const B& backend, buffer_view<const std::byte, typename B::memory_space> payload,
              buffer_view<T, typename B::memory_space> out) const {
    using M = typename B::memory_space;
    std::byte head[body_offset] = {};  // header, m, c: copied to the host and checked there
    load_bytes(backend, head, payload.data(),
               payload.count() < body_offset ? payload.count() : body_offset);
    const payload_header h =
        read_payload_header(name, head, payload.count(), kind, dtype_of<T>, out.count());
    const error_context where{.operation = name};
    if (h.parameter != rank) {
      throw invalid_argument(where, "payload of rank " + std::to_string(h.parameter) +
                                        " decoded with rank " + std::to_string(rank));
    }
    if (payload.count() < body_offset) {
      throw invalid_argument(where, "payload of " + std::to_string(payload.count()) +
                                        " bytes has no room for m and c");
    }
    std::uint64_t m = 0;
    std::uint64_t c = 0;
    std::memcpy(&m, head + payload_header::bytes, 8);
    std::memcpy(&c, head + payload_header::bytes + 8, 8);
    const powersgd_shape s{static_cast<std::size_t>(m), static_cast<std::size_t>(c)};
    if (!s.covers(out.count())) {
      throw invalid_argument(where, "a " + std::to_string(m) + " x " + std::to_string(c) +
                                        " view of " + std::to_string(out.count()) + " elements");
    }
    const std::size_t size = payload_bytes(dtype_of<T>, s);
    if (payload.count() != size) {
      throw invalid_argument(where, "payload of " + std::to_string(payload.count()) +
                                        " bytes where the factors take " + std::to_string(size));
    }
    // the factors copied out: the payload need not be aligned for T
    const std::size_t p_count = s.rows * rank;
    const std::size_t q_count = s.columns * rank;
    auto p = allocate_scratch<T>(backend, p_count);
    auto q = allocate_scratch<T>(backend, q_count);
    copy(backend, detail::as_writable_bytes(buffer_view<T, M>(p.data(), p_count)),
         payload.subview(body_offset, p_count * sizeof(T)));
    copy(backend, detail::as_writable_bytes(buffer_view<T, M>(q.data(), q_count)),
         payload.subview(body_offset + p_count * sizeof(T), q_count * sizeof(T)));
    powersgd_decompress(backend, p.data(), q.data(), s.rows, s.columns, rank, out);
  }

 private:
  void check_rank() const {
    if (rank == 0 || rank > 65535) {
      throw invalid_argument({.operation = name},
                             "rank " + std::to_string(rank) + " is not in 1..65535");
    }
  }

  // The factors' view (c = Q's count / r, m = P's count / r), checked to cover `count`.
  powersgd_shape checked_shape(std::size_t count, std::size_t q_count, std::size_t p_count) const {
    check_rank();
    const powersgd_shape s{p_count / rank, q_count / rank};
    if (q_count % rank != 0 || p_count % rank != 0 || !s.covers(count)) {
      throw invalid_argument({.operation = name}, "Q of " + std::to_string(q_count) + " and P of " +
                                                      std::to_string(p_count) +
                                                      " elements at rank " + std::to_string(rank) +
                                                      " are not factors of a view of " +
                                                      std::to_string(count) + " elements");
    }
    return s;
  }

  // P = M q; orthogonalize; Q = M^T P into `q` (the warm start); payload = header, m, c, P, Q.
  template <class B, class T>
  std::size_t iterate(const B& backend, buffer_view<const T, typename B::memory_space> in,
                      powersgd_shape s, buffer_view<T, typename B::memory_space> q,
                      buffer_view<std::byte, typename B::memory_space> payload) const {
    using M = typename B::memory_space;
    const std::size_t size = payload_bytes(dtype_of<T>, s);
    detail::require_room(name, payload.count(), size);
    const std::size_t p_count = s.rows * rank;
    auto p = allocate_scratch<T>(backend, p_count);
    powersgd_multiply(backend, in, s.rows, s.columns, rank, q.data(), p.data());
    powersgd_orthogonalize(backend, p.data(), s.rows, rank);
    powersgd_multiply_transposed(backend, in, s.rows, s.columns, rank, p.data(), q.data());
    std::byte head[body_offset] = {};  // header, m, c: built on the host, stored
    write_payload_header({.kind = kind,
                          .type = dtype_of<T>,
                          .parameter = static_cast<std::uint16_t>(rank),
                          .count = in.count()},
                         head);
    const std::uint64_t m = s.rows;
    const std::uint64_t c = s.columns;
    std::memcpy(head + payload_header::bytes, &m, 8);
    std::memcpy(head + payload_header::bytes + 8, &c, 8);
    store_bytes(backend, payload.data(), head, body_offset);
    const auto p_bytes = detail::as_bytes(buffer_view<const T, M>(p.data(), p_count));
    const auto q_bytes = detail::as_bytes(buffer_view<const T, M>(q));
    copy(backend, payload.subview(body_offset, p_bytes.count()), p_bytes);
    copy(backend, payload.subview(body_offset + p_bytes.count(), q_bytes.count()), q_bytes);
    return size;
  }
};
static_assert(compressor<powersgd_compressor>);

}  // namespace squall
