// SPDX-License-Identifier: Apache-2.0
#pragma once
/// The mismatch check (`options::check_mismatch`): before each collective every rank states a
/// 24-byte call signature (sequence number, kind, count, type, op, root or step, and the
/// compressed algorithm), every rank learns every rank's and compares them all, so a
/// difference throws the same `mismatch_error` on every rank instead of a hang or a wrong
/// result.

#include <squall/algorithm/detail/executor.hpp>
#include <squall/concepts.hpp>
#include <squall/core/error.hpp>
#include <squall/core/types.hpp>
#include <squall/detail/math.hpp>  // fnv1a64

#include <algorithm>  // min
#include <array>
#include <concepts>  // convertible_to
#include <cstddef>   // byte, size_t
#include <cstdint>
#include <cstring>  // memcpy, memcmp
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace squall {

/// The collectives, as the mismatch check and squall-bench name them.
enum class collective : std::uint8_t {
  allreduce = 1,
  allgather,
  reduce_scatter,
  broadcast,
  barrier,
  allgatherv
};

constexpr std::string_view to_string(collective c) noexcept {
  switch (c) {
    case collective::allreduce:
      return "allreduce";
    case collective::allgather:
      return "allgather";
    case collective::reduce_scatter:
      return "reduce_scatter";
    case collective::broadcast:
      return "broadcast";
    case collective::barrier:
      return "barrier";
    case collective::allgatherv:
      return "allgatherv";
  }
  return "?";
}

namespace detail {

/// What each rank says about a call before running it.
struct call_signature {
  std::uint64_t sequence = 0;
  std::uint64_t count = 0;
  std::int32_t root = -1;  ///< broadcast's root; a compressed call's step (low 31 bits)
  std::uint8_t kind = 0;
  std::uint8_t type = 0;
  std::uint8_t op = 0;
  std::uint8_t compressed = 0;  ///< `compressed_code`, 0 if dense
};
static_assert(sizeof(call_signature) == 24);

/// A compressed collective's `aggregation` (bits 0-2) and the chunks it overlaps in, 1 to 32
/// (bits 3-7: chunks - 1; `collective_tuning::overlap_chunks`).
constexpr std::uint8_t compressed_code(aggregation how, std::size_t chunks) {
  return static_cast<std::uint8_t>(static_cast<unsigned>(how) |
                                   (static_cast<unsigned>(chunks - 1) & 31u) << 3);
}

constexpr std::uint8_t op_code(std::string_view name) {
  if (name == "sum") return 1;
  if (name == "avg") return 2;
  if (name == "min") return 3;
  if (name == "max") return 4;
  return 0;
}

inline std::string describe(const call_signature& s) {
  static constexpr std::array<std::string_view, 5> ops = {"?", "sum", "avg", "min", "max"};
  std::string text = "call #" + std::to_string(s.sequence) + " " +
                     std::string(to_string(static_cast<collective>(s.kind)));
  if (static_cast<collective>(s.kind) == collective::barrier) return text;
  text +=
      " of " + std::to_string(s.count) + " " + std::string(to_string(static_cast<dtype>(s.type)));
  if (s.op != 0) text += " " + std::string(ops[std::min<std::size_t>(s.op, 4)]);
  if (s.compressed != 0) {
    const unsigned chunks = (s.compressed >> 3) + 1u;
    text += ", compressed (" + std::string(to_string(static_cast<aggregation>(s.compressed & 7))) +
            (chunks > 1 ? " in " + std::to_string(chunks) + " chunks" : std::string()) +
            "), at step " + std::to_string(s.root) + " (mod 2^31)";
  } else if (s.root >= 0) {
    text += " from root " + std::to_string(s.root);
  }
  return text;
}

/// A direct transport whose barrier carries a note per rank (`shm_transport`): the mismatch
/// check's digests travel in the barrier's own cache line.
template <class T>
concept noted_barriers = direct_transport<T> && requires(T& t, std::uint32_t note, int q) {
  t.note_next_barrier(note, 0u);
  { t.barrier_note(q, 0u) } -> std::convertible_to<std::uint32_t>;
  { t.notes_barriers() } -> std::convertible_to<bool>;
};

/// One communicator's mismatch check. On a direct transport the signatures go through a slot
/// at the end of each window (alternating by call, so a rank one call ahead never overwrites
/// one still read) and one barrier: `begin` writes the slot and leaves the check pending,
/// `settle` is that barrier and the comparison, and a one-shot allreduce fuses it with its
/// own first barrier (`read_pending`). Elsewhere `begin` swaps the signatures by messages and
/// compares at once.
template <transport Transport>
class call_check {
 public:
  explicit call_check(bool enabled) : enabled_(enabled) {}

  /// Starts the next call, described by `mine` (its sequence number is filled in here).
  void begin(Transport& t, executor<Transport>&& ex, call_signature mine) {
    ++sequence_;
    pending_ = false;
    if (!enabled_ || t.size() == 1) return;
    mine.sequence = sequence_;
    signatures_.resize(static_cast<std::size_t>(t.size()));
    if constexpr (direct_transport<Transport>) {
      if (t.local_view().count() >= signature_area) {
        std::memcpy(slot(t, t.rank()), &mine, sizeof mine);
        if constexpr (noted_barriers<Transport>) {
          if (t.notes_barriers()) {  // jobs too large for the notes skip the digest
            note_ = digest(mine);
            t.note_next_barrier(note_, static_cast<unsigned>(sequence_ % 2));
          }
        }
        pending_ = true;
        return;
      }
    }
    ex.exchange(&mine, sizeof mine, signatures_.data());
    compare(t.rank());
  }

  /// Whether a window check waits for its barrier.
  bool pending() const noexcept { return pending_; }

  /// Completes a pending window check: barrier, then compare.
  void settle(Transport& t) {
    if (!pending_) return;
    t.barrier().wait();
    read_pending(t);
  }

  /// Compares the window signatures, once the caller's own barrier has ordered them: where
  /// the barrier carried every rank's digest of its signature (`noted_barriers`), those, in
  /// the barrier's own cache line; the signatures themselves only where a digest differs.
  void read_pending(Transport& t) {
    pending_ = false;
    if constexpr (noted_barriers<Transport>) {
      if (t.notes_barriers()) {
        const auto parity = static_cast<unsigned>(sequence_ % 2);
        bool alike = true;
        for (int q = 0; q < t.size(); ++q) alike = alike && t.barrier_note(q, parity) == note_;
        if (alike) return;
      }
    }
    if constexpr (direct_transport<Transport>) {
      for (int q = 0; q < t.size(); ++q) {
        std::memcpy(&signatures_[static_cast<std::size_t>(q)], slot(t, q), sizeof(call_signature));
      }
    }
    compare(t.rank());
  }

 private:
  std::byte* slot(Transport& t, int q) const {
    const std::size_t at = window_data_bytes(t) + (sequence_ % 2) * 128;
    return t.peer_view(q).data() + at;
  }

  void compare(int rank) const {
    const auto p = static_cast<int>(signatures_.size());
    for (int q = 0; q < p; ++q) {
      const call_signature& theirs = signatures_[static_cast<std::size_t>(q)];
      if (std::memcmp(&theirs, &signatures_[0], sizeof theirs) != 0) {
        const auto kind = static_cast<collective>(signatures_[static_cast<std::size_t>(rank)].kind);
        throw mismatch_error({.operation = to_string(kind), .rank = rank, .peer = q},
                             "rank " + std::to_string(q) + " made " + describe(theirs) +
                                 ", rank 0 made " + describe(signatures_[0]));
      }
    }
  }

  // 32 bits of the signature (FNV-1a, folded): two different calls share a digest with a
  // chance of 2^-32, and then run as if they matched.
  static std::uint32_t digest(const call_signature& s) {
    const std::uint64_t h = fnv1a64(&s, sizeof s);
    return static_cast<std::uint32_t>(h ^ (h >> 32));
  }

  bool enabled_ = true;
  std::uint64_t sequence_ = 0;
  std::uint32_t note_ = 0;  ///< this call's digest, where the barrier carries it
  bool pending_ = false;
  std::vector<call_signature> signatures_;
};

}  // namespace detail
}  // namespace squall
