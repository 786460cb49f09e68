// SPDX-License-Identifier: Apache-2.0
#pragma once
/// `error_feedback<C>`: residual memory around any compressor (Seide et al. 2014, 1-bit SGD;
/// Karimireddy et al. 2019, EF-SignSGD): residual += g; send C(residual);
/// residual -= decode(C(residual)). What is not sent now is sent later, so the sum of what
/// was sent plus the residual always equals the sum of the gradients.
///
/// The residual belongs to one tensor and to the caller: `error_feedback_state<T>`, passed to
/// every `encode`, and saved / restored as bytes with a checked header (checkpoints).

#include <squall/backend/array.hpp>
#include <squall/backend/host.hpp>
#include <squall/compress/payload.hpp>
#include <squall/compress/traits.hpp>
#include <squall/concepts.hpp>
#include <squall/core/buffer.hpp>
#include <squall/core/error.hpp>
#include <squall/core/ops.hpp>
#include <squall/core/random.hpp>
#include <squall/core/types.hpp>
#include <squall/kernels/host/reduce.hpp>

#include <concepts>  // same_as
#include <cstddef>   // byte, size_t
#include <cstdint>
#include <cstring>  // memcpy
#include <string>
#include <string_view>
#include <vector>

namespace squall {

/// The residual of one tensor of `count` elements of `T` (zero at the start), in `Backend`'s
/// memory (a device residual with the CUDA backend).
template <element T, class Backend = host_backend>
class error_feedback_state {
 public:
  using backend_type = Backend;
  using memory_space = typename Backend::memory_space;

  explicit error_feedback_state(std::size_t count, const Backend& b = {}) : residual_(b, count) {}

  std::size_t count() const { return residual_.count(); }
  buffer_view<const T, memory_space> residual() const { return residual_.view(); }
  buffer_view<T, memory_space> residual() { return residual_.view(); }

  /// The residual as bytes: a 16-byte header (magic, version 1, dtype, count), then the values.
  std::vector<std::byte> save() const {
    const std::size_t n = residual_.count();
    std::vector<std::byte> out(16 + n * sizeof(T));
    const std::uint32_t magic = save_magic;
    const std::uint32_t head = 1u | (static_cast<std::uint32_t>(dtype_of<T>) << 8);
    const std::uint64_t count = n;
    std::memcpy(out.data(), &magic, 4);
    std::memcpy(out.data() + 4, &head, 4);
    std::memcpy(out.data() + 8, &count, 8);
    residual_.save_to(out.data() + 16);  // 16-byte aligned (operator new)
    return out;
  }

  /// A state on backend `b` from `save()`'s bytes; throws `invalid_argument` unless they are
  /// a saved state of `T` whose size matches its count.
  static error_feedback_state restore(host_view<const std::byte> bytes, const Backend& b = {}) {
    const error_context where{.operation = "error_feedback_state restore"};
    if (bytes.count() < 16) throw invalid_argument(where, "fewer than 16 bytes");
    std::uint32_t magic = 0;
    std::uint32_t head = 0;
    std::uint64_t n = 0;
    std::memcpy(&magic, bytes.data(), 4);
    std::memcpy(&head, bytes.data() + 4, 4);
    std::memcpy(&n, bytes.data() + 8, 8);
    if (magic != save_magic) throw invalid_argument(where, "not a saved error-feedback state");
    if ((head & 0xff) != 1)
      throw invalid_argument(where, "version " + std::to_string(head & 0xff) + " is not 1");
    if (static_cast<dtype>((head >> 8) & 0xff) != dtype_of<T>) {
      throw invalid_argument(
          where, "a state of " + std::string(to_string(static_cast<dtype>((head >> 8) & 0xff))) +
                     " restored as " + std::string(to_string(dtype_of<T>)));
    }
    if (n > (bytes.count() - 16) / sizeof(T) || bytes.count() != 16 + n * sizeof(T)) {
      throw invalid_argument(
          where, std::to_string(bytes.count()) + " bytes for " + std::to_string(n) + " elements");
    }
    error_feedback_state s(static_cast<std::size_t>(n), b);
    s.residual_.load_from(bytes.data() + 16);
    return s;
  }

 private:
  static constexpr std::uint32_t save_magic = 0x46455153;  // "SQEF"
  detail::backend_array<T, Backend> residual_;
};

/// Wraps compressor `C` with error feedback; same payloads, same aggregations.
template <compressor C>
struct error_feedback {
  static constexpr std::string_view name = "error_feedback";
  static constexpr aggregation_set aggregations = C::aggregations;
  static constexpr bool majority_vote = compression_traits<C>::majority_vote;
  C inner{};

  std::size_t max_payload_bytes(dtype type, std::size_t count) const {
    return inner.max_payload_bytes(type, count);
  }

  /// residual += in; writes C(residual) to `payload`; residual -= decode(payload). Returns the
  /// payload's size. `state.count()` must equal `in.count()` (`invalid_argument` otherwise);
  /// `scratch` holds `in.count()` elements (the decoded payload). `stream` goes to a stochastic
  /// `C`'s encode (its draws for this step and rank). A state in the backend's memory is
  /// used in place; a host state with a device backend is copied to device scratch and back
  /// on every call (make the state on the backend to avoid that).
  template <class B, element T, class S>
  std::size_t encode(const B& backend, error_feedback_state<T, S>& state,
                     buffer_view<const T, typename B::memory_space> in,
                     buffer_view<std::byte, typename B::memory_space> payload,
                     buffer_view<T, typename B::memory_space> scratch,
                     random_stream stream = {}) const {
    using M = typename B::memory_space;
    static_assert(std::same_as<typename S::memory_space, M> ||
                      std::same_as<typename S::memory_space, host_memory>,
                  "squall: an error_feedback_state in another backend's memory");
    if (state.count() != in.count() || scratch.count() != in.count()) {
      throw invalid_argument({.operation = name},
                             "state of " + std::to_string(state.count()) + " and scratch of " +
                                 std::to_string(scratch.count()) + " elements for a gradient of " +
                                 std::to_string(in.count()));
    }
    if constexpr (std::same_as<typename S::memory_space, M>) {
      return encode(backend, state.residual(), in, payload, scratch, stream);
    } else {
      const std::size_t n = in.count();
      auto r = allocate_scratch<T>(backend, n);
      store_bytes(backend, reinterpret_cast<std::byte*>(r.data()), state.residual().data(),
                  n * sizeof(T));
      const std::size_t written =
          encode(backend, buffer_view<T, M>(r.data(), n), in, payload, scratch, stream);
      load_bytes(backend, state.residual().data(), reinterpret_cast<const std::byte*>(r.data()),
                 n * sizeof(T));
      return written;
    }
  }

  /// The same step with the caller's residual as a view in the backend's memory (a device
  /// residual with `cuda_backend`): residual += in (`reduce_into` with `sum_op`); encode;
  /// residual -= decode (`subtract_into`; `C::decode_subtract` where it has one, which
  /// touches only what the payload holds: topk, threshold). `residual` and `scratch` hold
  /// `in.count()` elements
  /// (`invalid_argument` otherwise).
  template <class B, element T>
  std::size_t encode(const B& backend, buffer_view<T, typename B::memory_space> residual,
                     buffer_view<const T, typename B::memory_space> in,
                     buffer_view<std::byte, typename B::memory_space> payload,
                     buffer_view<T, typename B::memory_space> scratch,
                     random_stream stream = {}) const {
    using M = typename B::memory_space;
    return encode_through(
        backend, residual, in, scratch,
        [&](buffer_view<const T, M> r) -> std::size_t {
          if constexpr (requires { inner.encode(backend, r, payload, stream); }) {
            return inner.encode(backend, r, payload, stream);
          } else {
            return inner.encode(backend, r, payload);
          }
        },
        payload);
  }

  /// The step of `encode` with the inner compressor's encode given as `encode_inner(r)`
  /// (writing `payload` from the compensated residual `r`, returning its size): residual +=
  /// in; encode_inner; residual -= decode. The compressed algorithms use it for compressors
  /// whose ranks agree a range between the two (`range_agreeing`).
  template <class B, element T, class EncodeInner>
  std::size_t encode_through(const B& backend, buffer_view<T, typename B::memory_space> residual,
                             buffer_view<const T, typename B::memory_space> in,
                             buffer_view<T, typename B::memory_space> scratch,
                             EncodeInner&& encode_inner,
                             buffer_view<std::byte, typename B::memory_space> payload) const {
    using M = typename B::memory_space;
    if (residual.count() != in.count() || scratch.count() != in.count()) {
      throw invalid_argument({.operation = name},
                             "residual of " + std::to_string(residual.count()) +
                                 " and scratch of " + std::to_string(scratch.count()) +
                                 " elements for a gradient of " + std::to_string(in.count()));
    }
    reduce_into(backend, sum_op{}, residual, in);
    const std::size_t written = encode_inner(buffer_view<const T, M>(residual));
    const buffer_view<const std::byte, M> sent(payload.data(), written);
    if constexpr (requires { inner.decode_subtract(backend, sent, residual); }) {
      inner.decode_subtract(backend, sent, residual);  // sparse: only the k entries sent
    } else {
      inner.decode(backend, sent, scratch);
      subtract_into(backend, residual, buffer_view<const T, M>(scratch));
    }
    return written;
  }

  /// Decodes as `C` does.
  template <class B, element T>
  void decode(const B& backend, buffer_view<const std::byte, typename B::memory_space> payload,
              buffer_view<T, typename B::memory_space> out) const {
    inner.decode(backend, payload, out);
  }
  /// `out += decode(payload)`, where `C` has a `decode_add`.
  template <class B, element T>
  void decode_add(const B& backend, buffer_view<const std::byte, typename B::memory_space> payload,
                  buffer_view<T, typename B::memory_space> out) const requires requires {
    inner.decode_add(backend, payload, out);
  }
  { inner.decode_add(backend, payload, out); }
};

}  // namespace squall
