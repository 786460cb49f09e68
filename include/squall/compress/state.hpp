// SPDX-License-Identifier: Apache-2.0
#pragma once
/// `compression_state<C, T>`: what one tensor's compressed allreduce carries from call to
/// call, owned by the caller (DESIGN: "its state belongs to one tensor, is explicit"):
///
/// - the step, which keys the draws of stochastic compressors (`random_stream{step, rank}`)
///   and of the shared ones (randomk's indices, count_sketch's hashes); each compressed
///   collective advances it by one, so every rank must start from the same step;
/// - the residual (`error_feedback_state<T, Backend>`) when `C` is `error_feedback<Inner>`;
/// - the compressor's own state when `C` or `Inner` has a `make_state<T>(count)`
///   (`keeps_own_state`): PowerSGD's warm-started Q (`powersgd_state<T, Backend>`), FetchSGD's
///   momentum and error sketches (`fetchsgd_state<T, Rows, Cols, Backend>`).
///
/// Both live in `Backend`'s memory (the communicator's `make_state` makes them on its
/// backend: a device residual and Q with the CUDA backend). A compressor whose
/// `make_state<T>(count)` takes no backend keeps its state where it puts it (the host).
///
/// `save()` gives checked bytes (layout below) and `restore()` takes them back, refusing a
/// state of another compressor, element type or count, and bytes whose checksum does not
/// match (any single changed byte is caught: `detail::fnv1a64`).
///
/// Saved layout (little-endian):
///
///   offset 0   u32 magic "SQCS"       offset 4   u16 version 2
///   offset 6   u8  dtype of T         offset 7   u8  payload kind of the (inner) compressor
///   offset 8   u64 count              offset 16  u64 step
///   offset 24  48 bytes: the compressor's label (`compressor_label<C>()`), zero padded
///   offset 72  u64 residual bytes R (0 without error feedback), then R bytes of
///              `error_feedback_state<T>::save()`
///   then       u64 own-state bytes S (0 without), then S bytes of the compressor's own
///              state's `save()` (`powersgd_state<T>::save()`, `fetchsgd_state<...>::save()`)
///   last       u64 `detail::fnv1a64` of every byte before it
///
/// Version 1 (the same without the checksum) still restores: checkpoints made before the
/// checksum keep loading.

#include <squall/backend/host.hpp>
#include <squall/compress/error_feedback.hpp>
#include <squall/compress/payload.hpp>
#include <squall/compress/sketch.hpp>
#include <squall/compress/traits.hpp>
#include <squall/concepts.hpp>
#include <squall/core/buffer.hpp>
#include <squall/core/error.hpp>
#include <squall/core/random.hpp>
#include <squall/core/types.hpp>
#include <squall/detail/math.hpp>

#include <algorithm>  // min
#include <concepts>   // same_as
#include <cstddef>    // byte, size_t
#include <cstdint>
#include <cstring>  // memcpy, memcmp
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>  // declval
#include <vector>

namespace squall {

/// `Inner` when `C` is `error_feedback<Inner>`, else `C` itself.
template <class C>
struct inner_compressor {
  using type = C;
};
template <class C>
struct inner_compressor<error_feedback<C>> {
  using type = C;
};
template <class C>
using inner_compressor_t = typename inner_compressor<C>::type;

/// Whether `C` is an `error_feedback<Inner>`.
template <class C>
inline constexpr bool is_error_feedback = !std::same_as<inner_compressor_t<C>, C>;

/// Whether `C` (or its `Inner`) allows the low-rank aggregation (PowerSGD), whose allreduce
/// runs the power iteration across ranks and keeps Q in the state.
template <class C>
inline constexpr bool uses_low_rank =
    compression_traits<inner_compressor_t<C>>::aggregations.contains(aggregation::low_rank);

/// Whether `C` (or its `Inner`) keeps a state of its own per tensor (`make_state<T>(count)`):
/// PowerSGD's Q, FetchSGD's sketches. `compression_state` holds it.
template <class C>
inline constexpr bool keeps_own_state = requires(const inner_compressor_t<C>& c) {
  c.template make_state<float>(std::size_t{});
};

namespace detail {
/// A compressor's own state on backend `b`: `make_state<T>(count, b)` where the compressor
/// takes a backend (PowerSGD, FetchSGD), else `make_state<T>(count)`.
template <class T, class I, class B>
auto make_own_state(const I& inner, std::size_t count, const B& b) {
  if constexpr (requires { inner.template make_state<T>(count, b); }) {
    return inner.template make_state<T>(count, b);
  } else {
    return inner.template make_state<T>(count);
  }
}
}  // namespace detail

/// The state a compressor keeps per tensor on `Backend` (`Inner::make_state`).
template <class C, class T, class Backend = host_backend>
using own_state_t = decltype(detail::make_own_state<T>(
    std::declval<const inner_compressor_t<C>&>(), std::size_t{}, std::declval<const Backend&>()));

/// The compressor `c` wraps (`c.inner` for error feedback), or `c` itself.
template <class C>
const inner_compressor_t<C>& inner_of(const C& c) {
  if constexpr (is_error_feedback<C>) {
    return c.inner;
  } else {
    return c;
  }
}

namespace detail {
/// The compressor's own state `compression_state` keeps: `own_state_t`, or nothing.
template <class C, class T, class Backend, bool = keeps_own_state<C>>
struct own_state_slot {
  using type = own_state_t<C, T, Backend>;
};
template <class C, class T, class Backend>
struct own_state_slot<C, T, Backend, false> {
  struct type {};
};
}  // namespace detail

/// The name a saved state records for `C`: `C::name`, or "error_feedback<" + the inner
/// compressor's name + ">".
template <compressor C>
std::string compressor_label() {
  if constexpr (is_error_feedback<C>) {
    return "error_feedback<" + compressor_label<inner_compressor_t<C>>() + ">";
  } else {
    return std::string(C::name);
  }
}

/// The payload kind of `C` (of its inner compressor), or 0 for one without (identity).
template <compressor C>
constexpr std::uint8_t compressor_kind() {
  using I = inner_compressor_t<C>;
  if constexpr (requires { I::kind; }) {
    return static_cast<std::uint8_t>(I::kind);
  } else {
    return 0;
  }
}

/// The per-tensor state of a compressed collective with compressor `C` over `count` elements
/// of `T` (float or double), in `Backend`'s memory. See the file comment.
template <compressor C, real_gradient T, class Backend = host_backend>
class compression_state {
 public:
  using compressor_type = C;
  using value_type = T;
  using backend_type = Backend;
  /// The compressor's own state (`own_state_t<C, T, Backend>`; an empty type for others).
  using own_state_type = typename detail::own_state_slot<C, T, Backend>::type;

  /// A fresh state at step 0 on backend `b`: a zero residual, PowerSGD's Q drawn from the
  /// compressor's seed (the same on every rank), FetchSGD's zero sketches. Throws
  /// `invalid_argument` for a PowerSGD rank outside 1..65535 or a FetchSGD momentum outside
  /// [0, 1).
  compression_state(const C& c, std::size_t count, const Backend& b = {})
      : count_(count), backend_(b) {
    if constexpr (is_error_feedback<C>) residual_.emplace(count, b);
    if constexpr (keeps_own_state<C>) {
      own_.emplace(detail::make_own_state<T>(inner_of(c), count, b));
    }
  }
  /// A fresh state whose low-rank compressor (PowerSGD) views the tensor as `view` (a layer's
  /// own matrix) instead of its default near-square view. Throws `invalid_argument` unless
  /// view.covers(count).
  compression_state(const C& c, std::size_t count, powersgd_shape view,
                    const Backend& b = {}) requires uses_low_rank<C> : count_(count),
                                                                       backend_(b) {
    if constexpr (is_error_feedback<C>) residual_.emplace(count, b);
    own_.emplace(inner_of(c).template make_state<T>(count, view, b));
  }
  /// A fresh state for a default-constructed `C`.
  explicit compression_state(std::size_t count, const Backend& b = {})
      : compression_state(C{}, count, b) {}

  /// The elements of the tensor this state belongs to.
  std::size_t count() const { return count_; }
  /// The step the next collective draws with.
  std::uint64_t step() const { return step_; }
  /// Sets the step (every rank must set the same).
  void set_step(std::uint64_t step) { step_ = step; }
  /// Moves to the next step; each compressed collective calls it once.
  void advance() { ++step_; }
  /// The draws of `rank` at this step.
  random_stream stream(int rank) const { return {step_, static_cast<std::uint32_t>(rank)}; }

  /// The error-feedback residual (only with `error_feedback<Inner>`).
  error_feedback_state<T, Backend>& residual() requires is_error_feedback<C> { return *residual_; }
  const error_feedback_state<T, Backend>& residual() const requires is_error_feedback<C> {
    return *residual_;
  }
  /// The compressor's own state (only where it keeps one: PowerSGD's Q, FetchSGD's sketches).
  own_state_type& own() requires keeps_own_state<C> { return *own_; }
  const own_state_type& own() const requires keeps_own_state<C> { return *own_; }
  /// The low-rank state, Q (only with a low-rank compressor: PowerSGD).
  own_state_type& low_rank() requires uses_low_rank<C> { return *own_; }
  const own_state_type& low_rank() const requires uses_low_rank<C> { return *own_; }

  /// The state as bytes (layout in the file comment).
  std::vector<std::byte> save() const {
    std::vector<std::byte> out(fixed_bytes);
    const std::uint32_t magic = save_magic;
    const std::uint16_t version = 2;
    const auto type = static_cast<std::uint8_t>(dtype_of<T>);
    const std::uint8_t kind = compressor_kind<C>();
    const std::uint64_t fields[2] = {count_, step_};
    const std::string label = compressor_label<C>();
    std::memcpy(out.data(), &magic, 4);
    std::memcpy(out.data() + 4, &version, 2);
    std::memcpy(out.data() + 6, &type, 1);
    std::memcpy(out.data() + 7, &kind, 1);
    std::memcpy(out.data() + 8, fields, 16);
    std::memcpy(out.data() + 24, label.data(), std::min(label.size(), label_bytes));
    append_blob(out, residual_ ? residual_->save() : std::vector<std::byte>{});
    if constexpr (keeps_own_state<C>) {
      append_blob(out, own_->save());
    } else {
      append_blob(out, {});
    }
    const std::uint64_t sum = detail::fnv1a64(out.data(), out.size());
    out.resize(out.size() + 8);
    std::memcpy(out.data() + out.size() - 8, &sum, 8);
    return out;
  }

  /// Replaces this state by `save()`'s bytes. Throws `invalid_argument` (and leaves this
  /// state unchanged) unless they are a version-2 state whose checksum matches (or a version-1
  /// state, which has none) of the same compressor (label and kind), element type and count,
  /// with the sub-states this compressor has, each valid and of this state's shape (residual
  /// count; PowerSGD's m, c and rank; FetchSGD's rows and columns).
  void restore(host_view<const std::byte> all) {
    const error_context where{.operation = "compression_state restore"};
    if (all.count() < fixed_bytes + 8) {
      throw invalid_argument(where, std::to_string(all.count()) + " bytes, fewer than " +
                                        std::to_string(fixed_bytes + 8));
    }
    host_view<const std::byte> bytes = all;
    std::uint32_t magic = 0;
    std::uint16_t version = 0;
    std::uint8_t type = 0;
    std::uint8_t kind = 0;
    std::uint64_t fields[2] = {};
    char label[label_bytes + 1] = {};
    std::memcpy(&magic, bytes.data(), 4);
    std::memcpy(&version, bytes.data() + 4, 2);
    std::memcpy(&type, bytes.data() + 6, 1);
    std::memcpy(&kind, bytes.data() + 7, 1);
    std::memcpy(fields, bytes.data() + 8, 16);
    std::memcpy(label, bytes.data() + 24, label_bytes);
    if (magic != save_magic) throw invalid_argument(where, "not a saved compression state");
    if (version != 1 && version != 2) {
      throw invalid_argument(where, "version " + std::to_string(version) + " is not 1 or 2");
    }
    if (version == 2) {  // the checksum first: nothing else is read from changed bytes
      std::uint64_t sum = 0;
      std::memcpy(&sum, all.data() + all.count() - 8, 8);
      bytes = all.subview(0, all.count() - 8);
      if (sum != detail::fnv1a64(bytes.data(), bytes.count())) {
        throw invalid_argument(where, "checksum mismatch: the " + std::to_string(all.count()) +
                                          " bytes were changed or cut since they were saved");
      }
    }
    const std::string want = compressor_label<C>().substr(0, label_bytes);
    if (std::string_view(label) != want || kind != compressor_kind<C>()) {
      throw invalid_argument(where, "a state of compressor '" + std::string(label) + "' (kind " +
                                        std::to_string(kind) + ") restored for '" + want +
                                        "' (kind " + std::to_string(compressor_kind<C>()) + ")");
    }
    if (type != static_cast<std::uint8_t>(dtype_of<T>)) {
      throw invalid_argument(where,
                             "a state of " + std::string(to_string(static_cast<dtype>(type))) +
                                 " elements restored as " + std::string(to_string(dtype_of<T>)));
    }
    if (fields[0] != count_) {
      throw invalid_argument(where, "a state of " + std::to_string(fields[0]) +
                                        " elements restored for " + std::to_string(count_));
    }
    std::size_t at = fixed_bytes;
    const host_view<const std::byte> residual_bytes = take_blob(bytes, at, where);
    const host_view<const std::byte> own_bytes = take_blob(bytes, at, where);
    if (at != bytes.count()) {
      throw invalid_argument(where,
                             std::to_string(bytes.count() - at) + " bytes after the sub-states");
    }
    std::optional<error_feedback_state<T, Backend>> residual;
    if constexpr (is_error_feedback<C>) {
      residual.emplace(error_feedback_state<T, Backend>::restore(residual_bytes, backend_));
      if (residual->count() != count_) {
        throw invalid_argument(where, "a residual of " + std::to_string(residual->count()) +
                                          " elements for " + std::to_string(count_));
      }
    } else if (!residual_bytes.empty()) {
      throw invalid_argument(where, "a residual, where the compressor keeps none");
    }
    std::optional<own_state_type> own;
    if constexpr (keeps_own_state<C>) {
      if constexpr (requires { own_state_type::restore(own_bytes, backend_); }) {
        own.emplace(own_state_type::restore(own_bytes, backend_));
      } else {
        own.emplace(own_state_type::restore(own_bytes));
      }
      if constexpr (requires { own->rank(); }) {  // PowerSGD: the view and rank must agree
        if (own->rows() != own_->rows() || own->columns() != own_->columns() ||
            own->rank() != own_->rank()) {
          throw invalid_argument(
              where, "a low-rank state of " + std::to_string(own->rows()) + " x " +
                         std::to_string(own->columns()) + " rank " + std::to_string(own->rank()) +
                         " restored for " + std::to_string(own_->rows()) + " x " +
                         std::to_string(own_->columns()) + " rank " + std::to_string(own_->rank()));
        }
      }
    } else if (!own_bytes.empty()) {
      throw invalid_argument(where, "a compressor's own state, where the compressor keeps none");
    }
    step_ = fields[1];
    if constexpr (is_error_feedback<C>) residual_ = std::move(residual);
    if constexpr (keeps_own_state<C>) own_ = std::move(own);
  }

 private:
  static constexpr std::uint32_t save_magic = 0x53435153;  // "SQCS"
  static constexpr std::size_t label_bytes = 48;
  static constexpr std::size_t fixed_bytes = 24 + label_bytes;

  static void append_blob(std::vector<std::byte>& out, const std::vector<std::byte>& blob) {
    const std::uint64_t n = blob.size();
    const std::size_t at = out.size();
    out.resize(at + 8 + blob.size());
    std::memcpy(out.data() + at, &n, 8);
    if (!blob.empty()) std::memcpy(out.data() + at + 8, blob.data(), blob.size());
  }

  // The length-prefixed blob at `at`; advances `at` past it. Throws if it overruns `bytes`.
  static host_view<const std::byte> take_blob(host_view<const std::byte> bytes, std::size_t& at,
                                              const error_context& where) {
    if (bytes.count() - at < 8) throw invalid_argument(where, "ends inside a sub-state's length");
    std::uint64_t n = 0;
    std::memcpy(&n, bytes.data() + at, 8);
    at += 8;
    if (n > bytes.count() - at) {
      throw invalid_argument(where, "a sub-state of " + std::to_string(n) + " bytes where " +
                                        std::to_string(bytes.count() - at) + " remain");
    }
    const host_view<const std::byte> blob(bytes.data() + at, static_cast<std::size_t>(n));
    at += static_cast<std::size_t>(n);
    return blob;
  }

  std::size_t count_ = 0;
  std::uint64_t step_ = 0;
  Backend backend_;
  std::optional<error_feedback_state<T, Backend>> residual_;
  std::optional<own_state_type> own_;
};

}  // namespace squall
