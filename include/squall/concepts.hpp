// SPDX-License-Identifier: Apache-2.0
#pragma once
/// The four policy roles of a squall communicator, as C++20 concepts: read this file first.
///
///   communicator<Transport, Topology, Compressor, Backend>
///
/// Each concept is a conjunction of small named clauses, one per thing the executor calls.
/// `check_<role><T>()` asserts the clauses one by one, so that a wrong policy fails with one
/// `static assertion failed: squall: ...` line naming the missing piece, not a page of
/// template noise. Entry points that take policies call it (`static_assert(check_backend<B>())`).

#include <squall/core/aggregation.hpp>
#include <squall/core/buffer.hpp>
#include <squall/core/random.hpp>
#include <squall/core/types.hpp>
#include <squall/topology/schedule.hpp>

#include <concepts>  // same_as, convertible_to, movable
#include <cstddef>   // byte, size_t
#include <cstdint>   // uint64_t
#include <string_view>

namespace squall {

// ---- completion: what non-blocking calls return ----------------------------------------------

template <class C>
concept completion_waitable = requires(C& c) {
  /// blocks until the operation is done; throws timeout_error past the deadline
  c.wait();
};
template <class C>
concept completion_testable = requires(C& c) {
  /// true once the operation is done; never blocks
  { c.test() } -> std::same_as<bool>;
};
/// A handle to an operation in flight: `wait()` and `test()`, movable, not copyable.
template <class C>
concept completion = std::movable<C> && completion_waitable<C> && completion_testable<C>;

// ---- backend: where kernels run --------------------------------------------------------------

template <class B>
concept backend_has_memory_space = requires {
  typename B::memory_space;
}
&&memory_space<typename B::memory_space>;
template <class B>
concept backend_has_name = requires {
  /// "host", "cuda": names the backend in output
  { B::name } -> std::convertible_to<std::string_view>;
};
template <class B>
concept backend_has_synchronize = requires(const B& b) {
  /// returns once every kernel this backend started has finished
  b.synchronize();
};
/// Where kernels run: `host_backend` (the CPU) or `cuda_backend{device, stream}`. A backend is
/// a small value (copyable) that kernels are overloaded on.
template <class B>
concept backend = std::copyable<B> && backend_has_memory_space<B> && backend_has_name<B> &&
    backend_has_synchronize<B>;

// ---- transport: moves bytes between ranks ----------------------------------------------------

template <class T>
concept transport_has_memory_space = requires {
  typename T::memory_space;
}
&&memory_space<typename T::memory_space>;
template <class T>
concept transport_has_rank_and_size = requires(const T& t) {
  /// this process's rank in [0, size())
  { t.rank() } -> std::same_as<int>;
  /// the number of ranks
  { t.size() } -> std::same_as<int>;
};
template <class T>
concept transport_has_send_recv = transport_has_memory_space<T> &&
    requires(T& t, int peer, buffer_view<const std::byte, typename T::memory_space> src,
             buffer_view<std::byte, typename T::memory_space> dst) {
  /// starts sending `src` to `peer`; `src` stays valid until the completion is done
  { t.send(peer, src) } -> completion;
  /// starts receiving exactly `dst.count()` bytes from `peer` into `dst`
  { t.recv(peer, dst) } -> completion;
};
template <class T>
concept transport_has_barrier = requires(T& t) {
  /// completes once every rank has entered the barrier
  { t.barrier() } -> completion;
};
/// Moves bytes between the ranks of one job; knows nothing of element types or reductions.
template <class T>
concept transport = std::movable<T> && transport_has_memory_space<T> &&
    transport_has_rank_and_size<T> && transport_has_send_recv<T> && transport_has_barrier<T>;

/// A transport whose peers' staging buffers this rank can read directly (shared memory,
/// CUDA IPC), so a schedule can reduce straight out of a peer's memory.
template <class T>
concept direct_transport = transport<T> && requires(T& t, int peer) {
  /// the bytes `peer` has exposed to this rank
  { t.peer_view(peer) } -> std::same_as<buffer_view<std::byte, typename T::memory_space>>;
};

/// A transport that can copy straight out of and into a peer's own memory (shared memory with
/// cross-memory attach; threads), so a schedule needs no staging copy for large messages.
template <class T>
concept peer_memory_transport = transport<T> &&
    requires(T& t, const T& ct, int peer, std::uint64_t address,
             buffer_view<std::byte, typename T::memory_space> into,
             buffer_view<const std::byte, typename T::memory_space> from) {
  /// whether `read_peer` and `write_peer` are allowed between these processes
  { ct.can_access_peers() } -> std::same_as<bool>;
  /// copies `into.count()` bytes at `address` of `peer`'s memory into `into`
  t.read_peer(peer, address, into);
  /// copies `from` to `address` of `peer`'s memory
  t.write_peer(peer, address, from);
};

/// A peer-memory transport whose ranks may also map each other's registered memory (issue
/// 22, `shm_transport::register_memory`): collectives on buffers inside it reach the peers'
/// copies with plain loads and stores, inside `with_peer` (which keeps the transport's
/// promise that no rank touches a failed rank's memory), and by cross-memory copies where a
/// buffer is not registered.
namespace detail {
/// A function that does nothing, for concepts that take one (a lambda in a requires
/// expression trips nvcc).
struct do_nothing {
  void operator()() const {}
};
}  // namespace detail

template <class T>
concept registered_memory_transport = peer_memory_transport<T> &&
    requires(T& t, const T& ct, int peer, std::uint64_t id, std::uint64_t address,
             std::size_t bytes, const void* p) {
  /// the registration of this rank's memory holding [p, p + bytes), or 0
  { ct.registration_of(p, bytes) } -> std::same_as<std::uint64_t>;
  /// where [address, address + bytes) of peer's registration `id` lies here, or null
  { ct.mapped_peer(peer, id, address, bytes) } -> std::same_as<std::byte*>;
  /// runs the function while this rank may touch peer's memory
  t.with_peer(peer, detail::do_nothing{});
  /// registrations made so far: the same on every rank (registering is collective)
  { ct.registrations() } -> std::same_as<std::uint64_t>;
};

// ---- topology: who talks to whom, as a pure schedule -----------------------------------------

template <class T>
concept topology_has_name = requires {
  /// "ring", "tree": names the schedule in output
  { T::name } -> std::convertible_to<std::string_view>;
};
template <class T>
concept topology_has_schedule = requires(const T& t, int rank, int size, std::size_t bytes) {
  /// the steps `rank` of `size` runs for an allreduce of `bytes`; pure: no I/O, no buffers
  { t.allreduce_schedule(rank, size, bytes) } -> std::same_as<schedule>;
};
/// A schedule: for each (rank, size) the list of steps the executor walks. Pure and
/// constexpr-friendly, so it can be checked exhaustively on the host.
template <class T>
concept topology = std::default_initializable<T> && std::copyable<T> && topology_has_name<T> &&
    topology_has_schedule<T>;

// ---- compressor: what travels ----------------------------------------------------------------

template <class C>
concept compressor_has_identity = requires {
  /// "none", "topk": names the compressor in output
  { C::name } -> std::convertible_to<std::string_view>;
  /// the aggregations its payloads allow, preferred first
  { C::aggregations } -> std::convertible_to<aggregation_set>;
};
template <class C>
concept compressor_has_payload_bound = requires(const C& c, dtype type, std::size_t count) {
  /// an upper bound on the payload bytes for `count` elements of `type`
  { c.max_payload_bytes(type, count) } -> std::same_as<std::size_t>;
};
/// Decides what travels. Tuning knobs (ratio, bits, seed) are run-time members of the object;
/// element types and backends are template parameters of `encode` and `decode`.
template <class C>
concept compressor =
    std::copyable<C> && compressor_has_identity<C> && compressor_has_payload_bound<C>;

/// A compressor that can encode and decode elements of `T` with backend `B`: exactly what
/// the compressed algorithms call (every encode gets the rank's stream of the step; a
/// deterministic compressor ignores it). Optional: `c.decode_add(b, received, out)`, `out +=`
/// the decoded payload, which the gather path then calls for every payload after the first
/// instead of a decode into scratch and an add (topk and threshold: only their k entries).
template <class C, class T, class B>
concept compressor_for = compressor<C> && backend<B> && element<T> &&
    requires(const C& c, const B& b, buffer_view<const T, typename B::memory_space> in,
             buffer_view<T, typename B::memory_space> out,
             buffer_view<std::byte, typename B::memory_space> payload,
             buffer_view<const std::byte, typename B::memory_space> received,
             random_stream stream) {
  /// writes the payload of `in`, drawing from `stream`; returns its size in bytes
  { c.encode(b, in, payload, stream) } -> std::same_as<std::size_t>;
  /// reads a payload back into `out`; throws invalid_argument if it is malformed
  c.decode(b, received, out);
};

// ---- readable diagnostics --------------------------------------------------------------------

/// Asserts that `B` models `backend`, one clause at a time; returns true.
template <class B>
consteval bool check_backend() {
  static_assert(backend_has_memory_space<B>,
                "squall: the Backend policy has no 'memory_space' type (host_memory or "
                "device_memory); see squall/concepts.hpp");
  static_assert(backend_has_name<B>,
                "squall: the Backend policy has no 'static constexpr name'; see concepts.hpp");
  static_assert(backend_has_synchronize<B>,
                "squall: the Backend policy has no 'synchronize() const'; see concepts.hpp");
  static_assert(std::copyable<B>, "squall: the Backend policy must be copyable");
  return true;
}

/// Asserts that `T` models `transport`, one clause at a time; returns true.
template <class T>
consteval bool check_transport() {
  static_assert(transport_has_memory_space<T>,
                "squall: the Transport policy has no 'memory_space' type (host_memory or "
                "device_memory); see squall/concepts.hpp");
  static_assert(transport_has_rank_and_size<T>,
                "squall: the Transport policy needs 'int rank() const' and 'int size() const'");
  static_assert(transport_has_send_recv<T>,
                "squall: the Transport policy needs send(peer, bytes) and recv(peer, bytes) "
                "returning a completion (wait(), test()); see squall/concepts.hpp");
  static_assert(transport_has_barrier<T>,
                "squall: the Transport policy needs barrier() returning a completion");
  static_assert(std::movable<T>, "squall: the Transport policy must be movable");
  return true;
}

/// Asserts that `T` models `topology`, one clause at a time; returns true.
template <class T>
consteval bool check_topology() {
  static_assert(topology_has_name<T>,
                "squall: the Topology policy has no 'static constexpr name'; see concepts.hpp");
  static_assert(topology_has_schedule<T>,
                "squall: the Topology policy has no 'allreduce_schedule(rank, size, bytes) "
                "const' returning squall::schedule");
  static_assert(std::default_initializable<T> && std::copyable<T>,
                "squall: the Topology policy must be default-constructible and copyable");
  return true;
}

/// Asserts that `C` models `compressor`, one clause at a time; returns true.
template <class C>
consteval bool check_compressor() {
  static_assert(compressor_has_identity<C>,
                "squall: the Compressor policy needs 'static constexpr name' and "
                "'static constexpr aggregation_set aggregations'; see squall/concepts.hpp");
  static_assert(compressor_has_payload_bound<C>,
                "squall: the Compressor policy has no "
                "'std::size_t max_payload_bytes(dtype, std::size_t count) const'");
  static_assert(std::copyable<C>, "squall: the Compressor policy must be copyable");
  return true;
}

}  // namespace squall
