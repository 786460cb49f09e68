// SPDX-License-Identifier: Apache-2.0
#pragma once
/// The vocabulary of data movement: every algorithm in algorithm/ moves bytes through `wire`,
/// and every walker of a schedule through `walk_steps`.
///
/// `wire<Transport>` is the transport's verbs, each counting what it moves into the
/// communicator's `traffic` (so no algorithm keeps its own byte counts): `send` and `recv`
/// (messages), `read_peer` and `write_peer` (a peer's own memory), `exchange` (a few bytes
/// from every rank to every rank), `barrier`, and `count` for what peers move in this rank's
/// memory or window without a message.
///
/// `walk_steps(steps, hooks)` is the one loop over a schedule's steps (topology/schedule.hpp).
/// A step sends a range of blocks, receives one, or both; per step the walker
///   1. posts the receive           (`hooks.post_recv(st)`, if the step receives),
///   2. makes and posts the send    (`hooks.post_send(st)`, if it sends),
///   3. completes the receive and applies the step's action
///                                  (`hooks.finish_recv(st)`, if it receives),
///   4. ends the step               (`hooks.end_step(st)`: retires sends, or keeps a pipeline).
/// Posting the receive first lets a message find its buffer waiting. What a block is, and so
/// what each hook does, belongs to the walker's caller:
///
///   caller                          a block is          post_send             finish_recv: reduce
///   / copy executor (dense)                a piece of elements as is                 reduce into
///   place / in place per-hop requantize              a payload           encode the partial decode
///   and add / keep gTop-k (sparse tree merge)      a sparse set        as is                 merge
///   the sets / take
///
/// The hook that transforms a piece in flight is the pair post_send (encode) and finish_recv
/// (decode and add): per-hop requantize's decode-add-encode. In these verbs the steps that
/// topology/ builds are: send; recv (copy); recv-reduce; and, over consecutive steps of a ring,
/// recv-reduce-send (the block reduced at step k is the one sent at step k + 1) and
/// recv-copy-send (the allgather forwards the block it copied). The one-shot and peer-memory
/// algorithms (executor.hpp) walk no steps; they use `wire`'s peer-memory verbs and barriers.

#include <squall/concepts.hpp>
#include <squall/core/buffer.hpp>
#include <squall/topology/schedule.hpp>

#include <cstddef>  // byte, size_t
#include <cstdint>  // uint64_t
#include <cstring>  // memcpy
#include <span>
#include <utility>  // declval
#include <vector>

namespace squall::detail {

/// Bytes one rank moved since the communicator last reset them (at the start of every
/// collective): `sent` is what it sent, wrote into peers' memory, or published in its window
/// or memory for peers to read (once per reading peer); `received` is what it received, read
/// out of peers' memory or windows, or had written into its memory by peers.
struct traffic {
  std::uint64_t sent = 0;
  std::uint64_t received = 0;
};

template <class Transport>
using completion_of = decltype(std::declval<Transport&>().send(
    0, buffer_view<const std::byte, typename Transport::memory_space>{}));

/// The transport's verbs, counted into `traffic`. Two references: built where needed.
template <transport Transport>
class wire {
 public:
  using completion_type = completion_of<Transport>;
  using memory_space = typename Transport::memory_space;

  wire(Transport& transport, traffic& counted) : transport_(transport), counted_(counted) {}

  int rank() const { return transport_.rank(); }
  int size() const { return transport_.size(); }
  Transport& transport() { return transport_; }

  /// Starts sending `bytes` to `peer`.
  completion_type send(int peer, buffer_view<const std::byte, memory_space> bytes) {
    counted_.sent += bytes.count();
    return transport_.send(peer, bytes);
  }
  /// Starts receiving exactly `bytes.count()` bytes from `peer`.
  completion_type recv(int peer, buffer_view<std::byte, memory_space> bytes) {
    counted_.received += bytes.count();
    return transport_.recv(peer, bytes);
  }
  /// Copies `into.count()` bytes at `address` of `peer`'s memory into `into`.
  void read_peer(int peer, std::uint64_t address,
                 buffer_view<std::byte, memory_space> into) requires
      peer_memory_transport<Transport> {
    transport_.read_peer(peer, address, into);
    counted_.received += into.count();
  }
  /// Copies `from` to `address` of `peer`'s memory.
  void write_peer(int peer, std::uint64_t address,
                  buffer_view<const std::byte, memory_space> from) requires
      peer_memory_transport<Transport> {
    transport_.write_peer(peer, address, from);
    counted_.sent += from.count();
  }
  /// Counts what moves without a message: peers reading this rank's memory or window
  /// (`sent`), or writing into it (`received`).
  void count(std::uint64_t sent, std::uint64_t received) {
    counted_.sent += sent;
    counted_.received += received;
  }
  /// Completes once every rank has entered it.
  void barrier() { transport_.barrier().wait(); }

  /// Every rank sends `mine` (`bytes` long, host memory) to every other; `all` gets rank q's
  /// at q x `bytes`. `pending` is the caller's reusable vector of completions.
  void exchange(const void* mine, std::size_t bytes, void* all,
                std::vector<completion_type>& pending) {
    auto* into = static_cast<std::byte*>(all);
    const int me = rank();
    const int p = size();
    std::memcpy(into + static_cast<std::size_t>(me) * bytes, mine, bytes);
    pending.clear();
    for (int k = 1; k < p; ++k) {
      const int from = wrap(me - k, p);
      pending.push_back(recv(from, {into + static_cast<std::size_t>(from) * bytes, bytes}));
    }
    for (int k = 1; k < p; ++k) {
      pending.push_back(send(wrap(me + k, p), {static_cast<const std::byte*>(mine), bytes}));
    }
    for (auto& c : pending) c.wait();
    pending.clear();
  }

 private:
  Transport& transport_;
  traffic& counted_;
};

/// A walker's hooks from four callables (usually lambdas over the walker's locals), in the
/// order `walk_steps` calls them. Written `step_hooks{/*post_recv*/ ..., /*post_send*/ ...}`:
/// clang before 17 deduces no aggregate's arguments (P1816) and designated initializers take
/// no deduction guide, so the guide below and positional callables keep every compiler able.
template <class PostRecv, class PostSend, class FinishRecv, class EndStep>
struct step_hooks {
  PostRecv post_recv;
  PostSend post_send;
  FinishRecv finish_recv;
  EndStep end_step;
};
template <class PostRecv, class PostSend, class FinishRecv, class EndStep>
step_hooks(PostRecv, PostSend, FinishRecv, EndStep)
    -> step_hooks<PostRecv, PostSend, FinishRecv, EndStep>;

/// The one loop over a schedule's steps (the file comment).
template <class Hooks>
void walk_steps(std::span<const step> steps, Hooks&& hooks) {
  for (const step& st : steps) {
    const bool receives = st.recv_from != nobody;
    if (receives) hooks.post_recv(st);
    if (st.send_to != nobody) hooks.post_send(st);
    if (receives) hooks.finish_recv(st);
    hooks.end_step(st);
  }
}

}  // namespace squall::detail
