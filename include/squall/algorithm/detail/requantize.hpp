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
/// Deviation from STYLE A3 (one executor walks every schedule): the executor moves elements
/// through a type-erased reducer; these hops move payloads that must be decoded and encoded
/// between receive and send, so they loop over their own steps, one message per block.

#include <squall/algorithm/detail/scratch.hpp>
#include <squall/backend/host.hpp>
#include <squall/compress/traits.hpp>
#include <squall/concepts.hpp>
#include <squall/core/buffer.hpp>
#include <squall/core/error.hpp>
#include <squall/core/ops.hpp>
#include <squall/core/random.hpp>
#include <squall/core/types.hpp>
#include <squall/detail/math.hpp>
#include <squall/kernels/host/reduce.hpp>
#include <squall/topology/ring.hpp>
#include <squall/topology/schedule.hpp>
#include <squall/topology/tree.hpp>
#include <squall/tuning/tuning.hpp>

#include <algorithm>  // max
#include <concepts>   // same_as
#include <cstddef>    // byte, size_t
#include <cstdint>
#include <cstring>  // memcpy
#include <string>
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

/// Whether topology `Topology` runs per-hop requantization (ring and tree).
template <class Topology>
inline constexpr bool per_hop_topology =
    std::same_as<Topology, ring_topology> || std::same_as<Topology, tree_topology>;

/// Whether a compressed allreduce of compressor `Inner` over `Topology` requantizes per hop
/// under `algorithm`: `automatic` on ring and tree with a fixed-size payload, `per_hop`
/// there too (elsewhere `invalid_argument` naming the topology), `gather` never.
template <class Topology, class Inner>
bool uses_per_hop(requantize_algorithm algorithm, int rank, int size) {
  constexpr bool able = per_hop_topology<Topology> && compression_traits<Inner>::fixed_size;
  if (algorithm == requantize_algorithm::gather) return false;
  if (algorithm == requantize_algorithm::per_hop && !able) {
    throw invalid_argument({.operation = "compressed allreduce", .rank = rank},
                           "requantize_algorithm::per_hop runs on ring_topology and "
                           "tree_topology with fixed-size payloads, not on topology '" +
                               std::string(Topology::name) + "' with compressor '" +
                               std::string(Inner::name) + "'");
  }
  if (able && std::same_as<Topology, ring_topology> && size > max_per_hop_ranks) {
    if (algorithm == requantize_algorithm::automatic) return false;
    throw invalid_argument({.operation = "compressed allreduce", .rank = rank},
                           "per-hop requantization on a ring of " + std::to_string(size) +
                               " ranks (at most " + std::to_string(max_per_hop_ranks) + ")");
  }
  return able;
}

/// The buffers per-hop requantization keeps between calls (owned by the communicator).
struct requantize_buffers {
  std::vector<std::byte> send;       ///< the payload this rank encodes
  std::vector<std::byte> recv;       ///< received payloads (the tree: one per child)
  std::vector<std::byte> finals;     ///< the ring's final payload of every block
  std::vector<std::byte> decoded;    ///< a decoded payload
  std::vector<std::size_t> offsets;  ///< where each block's final payload starts in `finals`
};

/// One per-hop requantized allreduce (sum) on one rank: `c` is the bare compressor (no
/// error feedback), `residual` the rank's residual or null, `sent` and `received` the
/// communicator's byte counters.
template <transport Transport, class C, real_gradient T>
struct requantize_hops {
  Transport& transport;
  const C& c;
  requantize_buffers& buffers;
  std::uint64_t& sent;
  std::uint64_t& received;
  std::uint64_t step = 0;
  T* residual = nullptr;

  /// The ring over P near-equal blocks (`split_range`):
  // step k < P-1: encode the partial of block r-k-1 (hop k), send it to r+1; receive block
  //   r-k-2's partial from r-1, decode it and add it to this rank's block r-k-2;
  // then: block r holds the full sum: encode it once (hop P-1), the final payload;
  // step P-1+k: send the final payload of block r-k to r+1, receive block r-k-1's from r-1;
  // last: every rank decodes every block's final payload (its own too).
  void ring(T* data, std::size_t count) {
    const int r = transport.rank();
    const int p = transport.size();
    if (count == 0) return;
    const auto parts = static_cast<std::size_t>(p);
    const auto block = [&](int b) {
      return split_range(count, parts, static_cast<std::size_t>(wrap(b, p)));
    };
    const auto payload_bytes = [&](int b) {
      return c.max_payload_bytes(dtype_of<T>, block(b).count);
    };
    // final payloads at 16-byte aligned offsets (decode reads the scales in place)
    std::size_t widest = 0;
    std::vector<std::size_t>& at = buffers.offsets;
    at.assign(parts + 1, 0);
    for (int b = 0; b < p; ++b) {
      const std::size_t n = payload_bytes(b);
      widest = std::max(widest, n);
      at[static_cast<std::size_t>(b) + 1] = at[static_cast<std::size_t>(b)] + align_up(n, 16);
    }
    if (buffers.finals.size() < at[parts]) buffers.finals.resize(at[parts]);
    if (buffers.send.size() < widest) buffers.send.resize(widest);
    if (buffers.recv.size() < widest) buffers.recv.resize(widest);
    T* decoded = elements_of<T>(buffers.decoded, block(0).count);
    compensate(data, count);
    const int next = wrap(r + 1, p);
    const int prev = wrap(r - 1, p);
    for (int k = 0; k + 1 < p; ++k) {
      const index_range out = block(r - k - 1);
      const index_range in = block(r - k - 2);
      const std::size_t in_bytes = payload_bytes(r - k - 2);
      auto got = transport.recv(prev, {buffers.recv.data(), in_bytes});
      received += in_bytes;
      const std::size_t n =
          encode(data, out, buffers.send.data(), hop_stream(step, r, p, k), decoded);
      auto gone = transport.send(next, {buffers.send.data(), n});
      sent += n;
      got.wait();
      decode(buffers.recv.data(), in_bytes, decoded, in.count);
      kernels::reduce_into(host_backend{}, sum_op{}, host_view<T>(data + in.begin, in.count),
                           host_view<const T>(decoded, in.count));
      gone.wait();
    }
    const index_range mine = block(r);
    encode(data, mine, buffers.finals.data() + at[static_cast<std::size_t>(r)],
           hop_stream(step, r, p, p - 1), decoded);
    for (int k = 0; k + 1 < p; ++k) {
      const auto out = static_cast<std::size_t>(wrap(r - k, p));
      const auto in = static_cast<std::size_t>(wrap(r - k - 1, p));
      const std::size_t in_bytes = payload_bytes(static_cast<int>(in));
      const std::size_t out_bytes = payload_bytes(static_cast<int>(out));
      auto got = transport.recv(prev, {buffers.finals.data() + at[in], in_bytes});
      auto gone = transport.send(next, {buffers.finals.data() + at[out], out_bytes});
      received += in_bytes;
      sent += out_bytes;
      got.wait();
      gone.wait();
    }
    for (int b = 0; b < p; ++b) {
      const index_range range = block(b);
      decode(buffers.finals.data() + at[static_cast<std::size_t>(b)], payload_bytes(b),
             data + range.begin, range.count);
    }
  }

  /// The heap-ordered binary tree rooted at rank 0 (`tree_topology`'s):
  // step 0: receive each child's payload (child 2r+1, then 2r+2), decode it, add it to this
  //   rank's input in that order;
  // step 1: encode the partial sum (hop 0); a non-root sends it to its parent and receives
  //   the root's final payload back; the root's own encode is the final payload;
  // step 2: send the final payload to each child; decode it.
  void tree(T* data, std::size_t count) {
    const int r = transport.rank();
    const int p = transport.size();
    if (count == 0) return;
    const std::size_t bytes = c.max_payload_bytes(dtype_of<T>, count);
    const std::size_t slot = align_up(bytes, 16);
    if (buffers.send.size() < bytes) buffers.send.resize(bytes);
    if (buffers.recv.size() < 2 * slot) buffers.recv.resize(2 * slot);
    T* decoded = elements_of<T>(buffers.decoded, count);
    compensate(data, count);
    using completion = decltype(transport.recv(0, buffer_view<std::byte>{}));
    std::vector<completion> from_children;
    int children = 0;
    for (int which = 0; which < 2; ++which) {
      const int child = tree_child(r, which);
      if (child >= p) break;
      from_children.push_back(transport.recv(
          child, {buffers.recv.data() + static_cast<std::size_t>(which) * slot, bytes}));
      received += bytes;
      ++children;
    }
    for (int which = 0; which < children; ++which) {
      from_children[static_cast<std::size_t>(which)].wait();
      decode(buffers.recv.data() + static_cast<std::size_t>(which) * slot, bytes, decoded, count);
      kernels::reduce_into(host_backend{}, sum_op{}, host_view<T>(data, count),
                           host_view<const T>(decoded, count));
    }
    encode(data, {0, count}, buffers.send.data(), hop_stream(step, r, p, 0), decoded);
    if (r != 0) {
      const int parent = tree_parent(r);
      transport.send(parent, {buffers.send.data(), bytes}).wait();
      transport.recv(parent, {buffers.send.data(), bytes}).wait();
      sent += bytes;
      received += bytes;
    }
    std::vector<completion> to_children;
    for (int which = 0; which < children; ++which) {
      to_children.push_back(transport.send(tree_child(r, which), {buffers.send.data(), bytes}));
      sent += bytes;
    }
    for (auto& done : to_children) done.wait();
    decode(buffers.send.data(), bytes, data, count);
  }

  // With error feedback: residual += g; the rank sums the residual where it would sum g.
  void compensate(T* data, std::size_t count) {
    if (residual == nullptr) return;
    kernels::reduce_into(host_backend{}, sum_op{}, host_view<T>(residual, count),
                         host_view<const T>(data, count));
    std::memcpy(data, residual, count * sizeof(T));
  }

  // Encodes the partial sum in `range` of `data` into `out`; with error feedback,
  // residual = partial - decode(out) over `range` (`scratch` gets the decoded payload).
  // Returns the payload's size.
  std::size_t encode(const T* data, index_range range, std::byte* out, random_stream stream,
                     T* scratch) {
    const T* in = data + range.begin;
    const std::size_t bytes = c.max_payload_bytes(dtype_of<T>, range.count);
    const std::size_t n = c.encode(host_backend{}, host_view<const T>(in, range.count),
                                   host_view<std::byte>(out, bytes), stream);
    if (residual != nullptr) {
      decode(out, n, scratch, range.count);
      T* e = residual + range.begin;
      for (std::size_t i = 0; i < range.count; ++i) e[i] = in[i] - scratch[i];
    }
    return n;
  }

  void decode(const std::byte* payload, std::size_t bytes, T* out, std::size_t count) {
    c.decode(host_backend{}, host_view<const std::byte>(payload, bytes), host_view<T>(out, count));
  }
};

}  // namespace squall::detail
