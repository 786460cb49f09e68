// SPDX-License-Identifier: Apache-2.0
#pragma once
/// Per-hop requantization: the compressed allreduce of requantize-class compressors (int8,
/// qsgd, terngrad, sign) that decodes, adds and re-encodes at each hop of a ring or a tree,
/// as CGX does (Markov et al., "CGX: Adaptive System Support for Communication-Efficient Deep
/// Learning", Middleware 2022), so each rank moves the bytes of a dense ring or tree times the
/// compression instead of P payloads.
///
/// Streams: encode number `hop` of rank r draws from `random_stream{step, r + P x hop}`
/// (`hop_stream`): ring hop k < P-1 is the payload r sends at reduce-scatter step k, hop P-1
/// its block's final payload; on the tree every rank encodes once (hop 0, the stream of the
/// gather path). The rank word is below P^2 <= 65535^2 < `shared_rank`, so no two encodes of
/// one call, and no shared draw, use the same Philox words.
///
/// Error feedback (with `residual`): residual += g and the rank adds the residual where it
/// would add g; every encode this rank makes of a partial sum p feeds its error back into the
/// elements it covers, residual = p - decode(C(p)). Each element is encoded exactly once per
/// rank (ring: block b once; tree: the whole vector once), so the residual of element i is
/// the error of the one payload of i this rank sent, and the errors telescope along each
/// chain: sum of the results and of every rank's new residual = sum of the inputs and of the
/// old residuals (up to the rounding of the additions), the error-compensated compressed
/// allreduce of 1-bit Adam (Tang et al., ICML 2021) generalized from two hops to P.
///
/// The hops walk the topology's schedule through `walk_steps` and `wire` (detail/verbs.hpp),
/// as the executor does, with a payload in place of a piece of elements: the send encodes
/// (the transform in flight), the reducing receive decodes and adds. STYLE A3 (one executor
/// walks every schedule) holds for the loop and the verbs; the executor itself stays a
/// mover of elements through a type-erased reducer.

#include <squall/algorithm/detail/scratch.hpp>
#include <squall/algorithm/detail/verbs.hpp>
#include <squall/backend/dispatch.hpp>
#include <squall/compress/traits.hpp>
#include <squall/concepts.hpp>
#include <squall/core/buffer.hpp>
#include <squall/core/error.hpp>
#include <squall/core/ops.hpp>
#include <squall/core/random.hpp>
#include <squall/core/types.hpp>
#include <squall/detail/math.hpp>
#include <squall/topology/ring.hpp>
#include <squall/topology/schedule.hpp>
#include <squall/topology/tree.hpp>
#include <squall/tuning/tuning.hpp>

#include <algorithm>  // max
#include <concepts>   // same_as
#include <cstddef>    // byte, size_t
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>  // pair
#include <vector>

namespace squall::detail {

/// The most ranks per-hop requantization takes on a ring (the rank words stay below P^2).
inline constexpr int max_per_hop_ranks = 65535;

/// The stream of encode number `hop` of `rank` out of `size` at `step`: rank word
/// rank + size x hop (documented in docs/compressors.md).
constexpr random_stream hop_stream(std::uint64_t step, int rank, int size, int hop) {
  return {step, static_cast<std::uint32_t>(rank) +
                    static_cast<std::uint32_t>(size) * static_cast<std::uint32_t>(hop)};
}

/// Whether `Topology` declares that its allreduce schedule suits per-hop requantization
/// (`static constexpr bool per_hop_schedule = true`): a reduce phase in which each rank sends
/// each block at most once, then a distribute phase that starts at a step receiving with
/// `copy` or marked `new_phase`, over the blocks of one partition (or the whole buffer).
/// ring, tree, direct, halving_doubling and automatic do; hierarchical does not (its phases
/// mix partitions).
template <class Topology>
inline constexpr bool per_hop_topology = [] {
  if constexpr (requires { Topology::per_hop_schedule; }) {
    return static_cast<bool>(Topology::per_hop_schedule);
  } else {
    return false;
  }
}();

/// Whether per-hop requantization runs on `size` ranks for a topology (`topology`, declaring
/// `per_hop_schedule` or not) and a compressor (`compressor`, with fixed-size payloads or
/// not): a topology declaring it, a fixed-size payload, at most `max_per_hop_ranks`. Where
/// not, `why` says why. Not a template: one copy however many policies a program uses.
inline bool per_hop_runs(std::string_view topology, bool per_hop_schedule,
                         std::string_view compressor, bool fixed_size, int size,
                         std::string* why = nullptr) {
  if (!per_hop_schedule || !fixed_size) {
    if (why != nullptr) {
      *why =
          "per-hop requantization runs on a topology declaring per_hop_schedule (ring, tree, "
          "direct, halving_doubling, automatic) with fixed-size payloads, not on topology '" +
          std::string(topology) + "' with compressor '" + std::string(compressor) + "'";
    }
    return false;
  }
  if (size > max_per_hop_ranks) {
    if (why != nullptr) {
      *why = "per-hop requantization on " + std::to_string(size) + " ranks (at most " +
             std::to_string(max_per_hop_ranks) + ")";
    }
    return false;
  }
  return true;
}

/// `per_hop_runs` for compressor `Inner` over `Topology`.
template <class Topology, class Inner>
bool per_hop_runs(int size, std::string* why = nullptr) {
  return per_hop_runs(Topology::name, per_hop_topology<Topology>, Inner::name,
                      compression_traits<Inner>::fixed_size, size, why);
}

/// The buffers per-hop requantization keeps between calls (owned by the communicator): the
/// payloads and decoded elements in the backend's memory, the bookkeeping on the host.
template <class Backend>
struct requantize_buffers {
  scratch_bytes<Backend> send;       ///< the payload this rank encodes in the reduce phase
  scratch_bytes<Backend> recv;       ///< a received partial's payload
  scratch_bytes<Backend> finals;     ///< the final payload of every block
  scratch_bytes<Backend> decoded;    ///< a decoded payload
  std::vector<std::size_t> offsets;  ///< where each block's final payload starts in `finals`
  std::vector<char> encoded;         ///< per block: this rank encoded it
  std::vector<char> final_here;      ///< per block: its final payload is in `finals`
};

/// One per-hop requantized allreduce (sum) on one rank, its kernels on `backend`: `c` is the
/// bare compressor (no error feedback), `residual` the rank's residual or null; `link` moves
/// the payloads and counts their bytes.
template <transport Transport, class Backend, class C, real_gradient T>
struct requantize_hops {
  using memory_space = typename Backend::memory_space;
  using view = buffer_view<T, memory_space>;
  using const_view = buffer_view<const T, memory_space>;
  using bytes_view = buffer_view<std::byte, memory_space>;

  wire<Transport> link;
  const Backend& backend;
  const C& c;
  requantize_buffers<Backend>& buffers;
  std::uint64_t step = 0;
  T* residual = nullptr;

  /// Walks `s`, the topology's allreduce schedule, with payloads in place of elements:
  // reduce phase (up to the first step that receives with `copy` or is marked `new_phase`):
  //   a send encodes the partial sum of its blocks as one payload (the rank's next hop);
  //   a receive decodes the payload and adds it to this rank's blocks;
  // distribute phase: a send carries the final payload of each of its blocks (the owner
  //   encodes a block's final payload, its next hop, the first time it sends it); a receive
  //   (`copy`) keeps the payloads it gets;
  // last: every rank decodes every block's final payload (its own too).
  // Blocks are those of the schedule's partition (`parts`; whole-buffer ranges span them all).
  // Each rank must send each block at most once in the reduce phase and never encode a block
  // twice (what makes error feedback's residuals add up); a schedule that breaks a rule gets
  // `invalid_argument` naming it.
  // `schedule_of(q)` is rank q's schedule (`s` is this rank's): the partition is the one
  // blocked steps use; a rank whose own steps all move the whole buffer (the tree, the ranks
  // halving-doubling folds in) takes its peers', so the final payloads it relays line up.
  template <class ScheduleOf>
  void walk(const schedule& s, ScheduleOf&& schedule_of, T* data, std::size_t count) {
    const int r = link.rank();
    const int p = link.size();
    if (count == 0) return;
    const auto partition = [&](const schedule& of) {
      std::size_t n = 1;
      for (const squall::step& st : of.steps) {
        for (const block_range* range : {&st.send, &st.recv}) {
          if (range->parts == 1) continue;
          if (n != 1 && range->parts != n) refuse(of, "mixes block partitions");
          n = range->parts;
        }
      }
      return n;
    };
    std::size_t parts = partition(s);
    if (parts == 1) {
      for (const squall::step& st : s.steps) {
        for (const int q : {st.send_to, st.recv_from}) {
          if (q == nobody) continue;
          const std::size_t theirs = partition(schedule_of(q));
          if (parts != 1 && theirs != 1 && theirs != parts) refuse(s, "mixes block partitions");
          parts = std::max(parts, theirs);
        }
      }
    }
    const auto block = [&](std::size_t b) { return split_range(count, parts, b); };
    const auto blocks_of = [&](const block_range& range) -> std::pair<std::size_t, std::size_t> {
      if (range.parts == 1) return {0, parts};
      if (range.first + range.count > parts) refuse(s, "has a range past its last block");
      return {range.first, range.first + range.count};
    };
    const auto span_of = [&](std::pair<std::size_t, std::size_t> b) {
      const std::size_t begin = block(b.first).begin;
      return index_range{begin, block(b.second - 1).begin + block(b.second - 1).count - begin};
    };
    // final payloads at 16-byte aligned offsets (decode reads the scales in place)
    std::vector<std::size_t>& at = buffers.offsets;
    at.assign(parts + 1, 0);
    for (std::size_t b = 0; b < parts; ++b) {
      at[b + 1] = at[b] + align_up(c.max_payload_bytes(dtype_of<T>, block(b).count), 16);
    }
    // the final payloads of blocks [first, last): from the first's start to the last's end
    const auto finals_bytes = [&](std::pair<std::size_t, std::size_t> b) {
      return at[b.second - 1] - at[b.first] +
             c.max_payload_bytes(dtype_of<T>, block(b.second - 1).count);
    };
    const std::size_t widest = c.max_payload_bytes(dtype_of<T>, count);
    std::byte* const finals = buffers.finals.reserve(backend, at[parts]);
    std::byte* const send = buffers.send.reserve(backend, widest);
    std::byte* const recv = buffers.recv.reserve(backend, widest);
    T* decoded = buffers.decoded.template elements<T>(backend, count).data();
    std::vector<char>& encoded = buffers.encoded;        // per block: encoded by this rank
    std::vector<char>& final_here = buffers.final_here;  // per block: its final payload is here
    // The rules first, on this rank's schedule alone, so that a rank refuses a schedule
    // before it moves a byte (a pending receive would wait for its deadline).
    {
      int hops = 0;
      bool distribute = false;
      encoded.assign(parts, 0);
      final_here.assign(parts, 0);
      const auto mark = [&](std::pair<std::size_t, std::size_t> b) {
        for (std::size_t i = b.first; i < b.second; ++i) {
          if (encoded[i] != 0) refuse(s, "makes a rank encode a block twice");
          encoded[i] = 1;
        }
        ++hops;
      };
      for (const squall::step& st : s.steps) {
        if (st.new_phase || st.action == step_action::copy) distribute = true;
        if (distribute && st.action == step_action::reduce) refuse(s, "reduces after distributing");
        if (st.send_to != nobody) {
          const auto out = blocks_of(st.send);
          if (!distribute) mark(out);
          for (std::size_t b = out.first; distribute && b < out.second; ++b) {
            if (final_here[b] == 0) mark({b, b + 1});
            final_here[b] = 1;
          }
        }
        if (st.recv_from != nobody && distribute) {
          const auto in = blocks_of(st.recv);
          for (std::size_t b = in.first; b < in.second; ++b) final_here[b] = 1;
        }
      }
      for (std::size_t b = 0; b < parts; ++b) {
        if (final_here[b] != 0) continue;
        if (p != 1) refuse(s, "leaves a rank without a block's final payload");
        mark({b, b + 1});
      }
      if (hops > p) refuse(s, "makes a rank encode more than P times");
      final_here.assign(parts, 0);
    }
    // The walk itself: the rules hold (checked above), so it only counts its hops.
    compensate(data, count);
    int hop = 0;
    const auto next_stream = [&] { return hop_stream(step, r, p, hop++); };
    bool distribute = false;
    // the phase a step is in: distributing from the first step that copies or starts a phase
    const auto distributing = [&](const squall::step& st) {
      if (st.new_phase || st.action == step_action::copy) distribute = true;
      return distribute;
    };
    using completion = typename wire<Transport>::completion_type;
    std::optional<completion> got;
    std::optional<completion> gone;
    std::pair<std::size_t, std::size_t> in{};
    std::size_t in_bytes = 0;
    walk_steps(
        s.steps,
        step_hooks{
            // receive a partial's payload, or (distributing) final payloads in place
            /*post_recv*/
            [&](const squall::step& st) {
              in = blocks_of(st.recv);
              std::byte* into = recv;
              if (distributing(st)) {
                in_bytes = finals_bytes(in);
                into = finals + at[in.first];
              } else {
                in_bytes = c.max_payload_bytes(dtype_of<T>, span_of(in).count);
              }
              got.emplace(link.recv(st.recv_from, {into, in_bytes}));
            },
            // encode the partial sum (a hop), or send final payloads, encoding a block's own
            /*post_send*/
            [&](const squall::step& st) {
              const auto out = blocks_of(st.send);
              if (distributing(st)) {
                for (std::size_t b = out.first; b < out.second; ++b) {
                  if (final_here[b] != 0) continue;
                  encode(data, block(b), finals + at[b], next_stream(), decoded);
                  final_here[b] = 1;
                }
                gone.emplace(link.send(st.send_to, {finals + at[out.first], finals_bytes(out)}));
              } else {
                const std::size_t n = encode(data, span_of(out), send, next_stream(), decoded);
                gone.emplace(link.send(st.send_to, {send, n}));
              }
            },
            // decode and add the partial, or keep the final payloads
            /*finish_recv*/
            [&](const squall::step&) {
              got->wait();
              got.reset();
              if (distribute) {
                for (std::size_t b = in.first; b < in.second; ++b) final_here[b] = 1;
              } else {
                const index_range range = span_of(in);
                decode(recv, in_bytes, decoded, range.count);
                dispatch::reduce_into_on(backend, sum_op{}, view(data + range.begin, range.count),
                                         const_view(decoded, range.count));
              }
            },
            /*end_step*/
            [&](const squall::step&) {
              if (gone) gone->wait();
              gone.reset();
            }});
    for (std::size_t b = 0; b < parts; ++b) {
      if (final_here[b] == 0) {  // one rank: it holds the whole sum
        encode(data, block(b), finals + at[b], next_stream(), decoded);
      }
      decode(finals + at[b], c.max_payload_bytes(dtype_of<T>, block(b).count),
             data + block(b).begin, block(b).count);
    }
  }

  [[noreturn]] void refuse(const schedule& s, std::string_view what) const {
    throw invalid_argument({.operation = "compressed allreduce", .rank = link.rank()},
                           "per-hop requantization over schedule '" + std::string(s.name) +
                               "', which " + std::string(what) +
                               " (a topology declaring per_hop_schedule must not)");
  }

  // With error feedback: residual += g; the rank sums the residual where it would sum g.
  void compensate(T* data, std::size_t count) {
    if (residual == nullptr) return;
    dispatch::reduce_into_on(backend, sum_op{}, view(residual, count), const_view(data, count));
    dispatch::copy_on(backend, view(data, count), const_view(residual, count));
  }

  // Encodes the partial sum in `range` of `data` into `out`; with error feedback,
  // residual = partial - decode(out) over `range` (`scratch` gets the decoded payload).
  // Returns the payload's size.
  std::size_t encode(const T* data, index_range range, std::byte* out, random_stream stream,
                     T* scratch) {
    const T* in = data + range.begin;
    const std::size_t bytes = c.max_payload_bytes(dtype_of<T>, range.count);
    const std::size_t n =
        c.encode(backend, const_view(in, range.count), bytes_view(out, bytes), stream);
    if (residual != nullptr) {
      decode(out, n, scratch, range.count);
      const view e(residual + range.begin, range.count);
      dispatch::copy_on(backend, e, const_view(in, range.count));
      dispatch::subtract_into_on(backend, e, const_view(scratch, range.count));
    }
    return n;
  }

  void decode(const std::byte* payload, std::size_t bytes, T* out, std::size_t count) {
    c.decode(backend, buffer_view<const std::byte, memory_space>(payload, bytes), view(out, count));
  }
};

}  // namespace squall::detail
