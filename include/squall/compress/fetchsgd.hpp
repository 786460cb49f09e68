// SPDX-License-Identifier: Apache-2.0
#pragma once
/// `fetchsgd_compressor<Rows, Cols>`: FetchSGD (Rothchild, Panda, Ullah, Ivkin, Stoica,
/// Braverman, Gonzalez, Arora, "FetchSGD: Communication-Efficient Federated Learning with
/// Sketching", ICML 2020): a count sketch whose momentum and error feedback live in sketch
/// space, after the sum, where the sketch is still linear.
///
/// Every rank sends the count sketch S(g_r) of its gradient, hashed with the same functions at
/// every step (the seed's step 0), and the topology sums the sketches (a linear compressor).
/// Then every rank, on the same summed sketch S, runs the same step on the tensor's state
/// (`fetchsgd_state`: two Rows x Cols sketches, momentum S_u and error S_e):
///
///   S_u = rho S_u + S;  S_e += S_u;        (momentum, then error, in sketch space)
///   delta = the k largest of U(S_e);       (in magnitude; U: the median estimates)
///   S_u = S_e = 0 at delta's buckets;      (the update leaves the sketches)
///
/// and the allreduce returns delta. Because the sketch is linear, S_u and S_e are the sketches
/// of the momentum and error a single machine would keep of the summed gradient, so error
/// feedback works through a sketch that plain count sketch + error feedback (a residual per
/// rank, re-sketched with new hashes every step) cannot: that diverges (docs/performance.md).
///
/// Departures from the paper's Algorithm 1, each recorded in docs/design.md:
/// - the learning rate is not folded into S_e (S_e += S_u, not += lr S_u): delta is in gradient
///   units, applied as w -= lr delta, like every other compressor's result; with a constant
///   learning rate the two are the same, with a schedule the error is applied at the current
///   rate (as squall's `error_feedback` does);
/// - the update leaves the sketches by zeroing the buckets of its support in both S_u and S_e
///   (the momentum masking of DGC, as the FetchSGD authors' code does), not by S_e -= S(delta):
///   zeroing is independent of the order of a parallel scatter, so every rank and backend
///   keeps the same bits; the subtraction would not be on a GPU, whose sketch adds atomically;
/// - no second round for the exact values of the k coordinates: delta is the estimates.
///
/// Wire format: exactly `count_sketch_compressor<Rows, Cols>`'s payload (kind 11) with step 0.
/// The sums are in the op's units before its finalize (avg divides delta by P after), so every
/// call on one state should use the same op.

#include <squall/backend/array.hpp>
#include <squall/backend/host.hpp>
#include <squall/compress/payload.hpp>
#include <squall/compress/sketch.hpp>
#include <squall/concepts.hpp>
#include <squall/core/buffer.hpp>
#include <squall/core/error.hpp>
#include <squall/core/random.hpp>
#include <squall/core/types.hpp>
#include <squall/detail/bytes.hpp>

#include <cstddef>  // byte, size_t
#include <cstdint>
#include <cstring>  // memcpy
#include <string>
#include <string_view>
#include <vector>

namespace squall {

/// FetchSGD's state for one tensor, owned by the caller: the momentum and error sketches
/// (Rows x Cols each, row-major, zero at the start), in `Backend`'s memory. Saved and restored
/// as checked bytes.
template <real_gradient T, std::size_t Rows, std::size_t Cols, class Backend = host_backend>
class fetchsgd_state {
 public:
  using backend_type = Backend;
  using memory_space = typename Backend::memory_space;
  static constexpr std::size_t entries = Rows * Cols;

  explicit fetchsgd_state(const Backend& b = {}) : sketches_(b, 2 * entries) {}

  /// S_u, the momentum sketch.
  buffer_view<T, memory_space> momentum() { return sketches_.view().subview(0, entries); }
  buffer_view<const T, memory_space> momentum() const {
    return sketches_.view().subview(0, entries);
  }
  /// S_e, the error sketch.
  buffer_view<T, memory_space> error() { return sketches_.view().subview(entries, entries); }
  buffer_view<const T, memory_space> error() const {
    return sketches_.view().subview(entries, entries);
  }

  /// The state as bytes: u32 magic "SQFS", u32 version 1 | dtype << 8, u32 rows, u32 cols,
  /// then S_u's and S_e's Rows x Cols values of T.
  std::vector<std::byte> save() const {
    std::vector<std::byte> out(header_bytes + 2 * entries * sizeof(T));
    const std::uint32_t fields[4] = {
        save_magic, 1u | (static_cast<std::uint32_t>(dtype_of<T>) << 8),
        static_cast<std::uint32_t>(Rows), static_cast<std::uint32_t>(Cols)};
    std::memcpy(out.data(), fields, header_bytes);
    sketches_.save_to(out.data() + header_bytes);  // 16 bytes in: aligned (operator new)
    return out;
  }

  /// A state on backend `b` from `save()`'s bytes; throws `invalid_argument` unless they are
  /// a saved FetchSGD state of `T` with these Rows and Cols and exactly its size.
  static fetchsgd_state restore(host_view<const std::byte> bytes, const Backend& b = {}) {
    const error_context where{.operation = "fetchsgd_state restore"};
    if (bytes.count() < header_bytes) {
      throw invalid_argument(where, std::to_string(bytes.count()) + " bytes, fewer than 16");
    }
    std::uint32_t fields[4] = {};
    std::memcpy(fields, bytes.data(), header_bytes);
    if (fields[0] != save_magic) throw invalid_argument(where, "not a saved FetchSGD state");
    if ((fields[1] & 0xff) != 1 || (fields[1] >> 16) != 0) {
      throw invalid_argument(where, "version " + std::to_string(fields[1] & 0xff) +
                                        " is not 1, or reserved bytes are set");
    }
    const auto type = static_cast<dtype>((fields[1] >> 8) & 0xff);
    if (type != dtype_of<T>) {
      throw invalid_argument(where, "a state of " + std::string(to_string(type)) + " restored as " +
                                        std::string(to_string(dtype_of<T>)));
    }
    if (fields[2] != Rows || fields[3] != Cols) {
      throw invalid_argument(where, "sketches of " + std::to_string(fields[2]) + " x " +
                                        std::to_string(fields[3]) + " restored as " +
                                        std::to_string(Rows) + " x " + std::to_string(Cols));
    }
    if (bytes.count() != header_bytes + 2 * entries * sizeof(T)) {
      throw invalid_argument(where, std::to_string(bytes.count()) + " bytes for two sketches of " +
                                        std::to_string(entries) + " values");
    }
    fetchsgd_state s(b);
    s.sketches_.load_from(bytes.data() + header_bytes);
    return s;
  }

 private:
  static constexpr std::uint32_t save_magic = 0x53465153;  // "SQFS"
  static constexpr std::size_t header_bytes = 16;
  detail::backend_array<T, Backend> sketches_;
};

/// FetchSGD (see the file comment): count sketches of Rows x Cols summed by the topology,
/// momentum and error kept in sketch space by `fetchsgd_state`, the k largest estimates
/// applied. Runtime parameters: `seed` (the hashes, the same on every rank and every step),
/// `heavy_hitters` (k; 0 means Cols / 4), `momentum` (rho, in [0, 1)) and `check_finite`.
///
/// The stateless `decode` is the first step of a fresh state: the k largest estimates of the
/// payload's sketch, as `count_sketch_compressor::decode`.
template <std::size_t Rows, std::size_t Cols>
struct fetchsgd_compressor {
  using sketch_type = count_sketch_compressor<Rows, Cols>;
  static constexpr std::string_view name = "fetchsgd";
  /// Only linear: the step runs on the sum of the sketches, which gathering would not give.
  static constexpr aggregation_set aggregations{aggregation::linear};
  static constexpr bool fixed_size = true;
  static constexpr payload_kind kind = payload_kind::count_sketch;
  static constexpr std::size_t rows = Rows;
  static constexpr std::size_t cols = Cols;

  std::uint64_t seed = 0;
  /// k, the coordinates each step applies; 0 means Cols / 4 (at least 1).
  std::size_t heavy_hitters = 0;
  /// rho, the momentum kept in sketch space (0 for none); in [0, 1).
  double momentum = 0.9;
  /// When true, encode throws `invalid_argument` naming the first non-finite element.
  bool check_finite = false;

  /// The count sketch every step encodes with.
  sketch_type sketch() const {
    return {.seed = seed, .heavy_hitters = heavy_hitters, .check_finite = check_finite};
  }

  std::size_t max_payload_bytes(dtype type, std::size_t count) const {
    return sketch().max_payload_bytes(type, count);
  }

  /// A fresh state (zero sketches) for tensors of `count` elements of `T`, on backend `b`.
  /// Throws `invalid_argument` for a momentum outside [0, 1).
  template <real_gradient T, class B = host_backend>
  fetchsgd_state<T, Rows, Cols, B> make_state(std::size_t /*count*/, const B& b = {}) const {
    check_momentum();
    return fetchsgd_state<T, Rows, Cols, B>(b);
  }

  /// Writes the count sketch of `in` with the hashes of step 0 (whatever `stream` says, so
  /// that sketches of different steps share buckets); returns the payload's size.
  template <class B, real_gradient T>
  std::size_t encode(const B& backend, buffer_view<const T, typename B::memory_space> in,
                     buffer_view<std::byte, typename B::memory_space> payload,
                     random_stream /*stream*/ = {}) const {
    return sketch().encode(backend, in, payload, random_stream{.step = 0, .rank = shared_rank});
  }

  /// The first step of a fresh state: the k largest estimates of the payload's sketch.
  template <class B, real_gradient T>
  void decode(const B& backend, buffer_view<const std::byte, typename B::memory_space> payload,
              buffer_view<T, typename B::memory_space> out) const {
    require_step_zero<T>(backend, payload, out.count());
    sketch().decode(backend, payload, out);
  }

  /// One FetchSGD step on `state` with the summed sketch in `payload` (see the file comment):
  /// writes delta, the k largest estimates of the error sketch, to `out`. Throws
  /// `invalid_argument` if the payload is not a step-0 count sketch of `out.count()` elements
  /// of `T` with this seed, Rows and Cols, or the momentum is outside [0, 1); the state is then
  /// unchanged.
  template <class B, real_gradient T, class S>
  void decode(const B& backend, fetchsgd_state<T, Rows, Cols, S>& state,
              buffer_view<const std::byte, typename B::memory_space> payload,
              buffer_view<T, typename B::memory_space> out) const {
    static_assert(std::same_as<typename S::memory_space, typename B::memory_space>,
                  "squall: a fetchsgd_state in another backend's memory");
    using M = typename B::memory_space;
    check_momentum();
    kernels::sketch_row_hash hash[Rows];
    require_step_zero<T>(backend, payload, out.count(), &hash);
    // the summed sketch copied out: the payload need not be aligned for T
    auto sum = allocate_scratch<T>(backend, Rows * Cols);
    const buffer_view<T, M> s(sum.data(), Rows * Cols);
    copy(backend, detail::as_writable_bytes(s),
         payload.subview(sketch_type::body_offset, Rows * Cols * sizeof(T)));
    sketch_momentum_step(backend, state.momentum(), state.error(), buffer_view<const T, M>(s),
                         static_cast<T>(momentum));
    count_sketch_estimate<Rows, Cols>(backend, state.error().data(), hash, out);
    keep_largest_magnitudes(backend, out, sketch().kept());
    count_sketch_zero_support<Rows, Cols>(backend, buffer_view<const T, M>(out), hash,
                                          state.momentum().data(), state.error().data());
  }

 private:
  void check_momentum() const {
    if (!(momentum >= 0 && momentum < 1)) {
      throw invalid_argument({.operation = name},
                             "momentum " + std::to_string(momentum) + " is not in [0, 1)");
    }
  }

  // Checks that `payload` is this compressor's (a count sketch of `count` elements, this seed,
  // step 0); the row hashes into `*hash` where given.
  template <class T, class B>
  void require_step_zero(const B& backend,
                         buffer_view<const std::byte, typename B::memory_space> payload,
                         std::size_t count,
                         kernels::sketch_row_hash (*hash)[Rows] = nullptr) const {
    kernels::sketch_row_hash read[Rows];
    sketch_type::template payload_hashes<T>(backend, payload, count, read);
    for (std::size_t r = 0; r < Rows; ++r) {
      const kernels::sketch_row_hash own = kernels::make_sketch_row_hash(seed, {0, shared_rank}, r);
      if (read[r].multiplier != own.multiplier || read[r].offset != own.offset) {
        throw invalid_argument({.operation = name},
                               "a sketch hashed with another seed or step (FetchSGD hashes every "
                               "step with step 0 of its seed " +
                                   std::to_string(seed) + ")");
      }
      if (hash != nullptr) (*hash)[r] = own;
    }
  }
};
static_assert(compressor<fetchsgd_compressor<3, 64>>);

}  // namespace squall
