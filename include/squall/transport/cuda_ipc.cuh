// SPDX-License-Identifier: Apache-2.0
#pragma once
/// `cuda_ipc_transport`: processes of one host exchange device buffers through CUDA IPC
/// (issue 21, item 2), bootstrapped and signalled over `shm_transport`, which also carries
/// liveness (a dead peer gives `peer_failure`) and the barrier.
///
/// A message is one copy, device to device, by the receiver, straight out of the sender's
/// memory: the sender offers its buffer (the IPC handle of the allocation that holds it and
/// the offset, through the shm transport, once the work enqueued on its stream before the
/// send has finished); the receiver opens the handle (cached: `detail::handle_cache`),
/// enqueues `cudaMemcpyAsync` from it into its own buffer on its stream, and answers once the
/// copy has finished; the send completes on the answer. Memory that cannot be exported
/// (stream-ordered pool memory, such as squall's own scratch and the default
/// `cudaMallocAsync` pool; host memory, which the collectives' small control messages use) is
/// first copied into one of the sender's exported staging buffers, kept for reuse. Tested
/// with several processes on one GPU (what the machines lent have); one process per GPU is
/// what it is for (handles are opened with lazy peer access), not run here.
///
/// Ordering is host-side, as with the other transports: the sender's offer waits until the
/// work enqueued on its stream before `send` has finished (at once if the stream is idle,
/// else through an event recorded there), and the receiver's answer for an event recorded
/// after its copy; no IPC event is needed.

#include <squall/backend/cuda.cuh>
#include <squall/concepts.hpp>
#include <squall/core/completion.hpp>
#include <squall/core/error.hpp>
#include <squall/core/link_costs.hpp>
#include <squall/transport/detail/handle_cache.hpp>
#include <squall/transport/shm.hpp>

#include <cuda.h>  // the driver's types only: its entry points come through the runtime
#include <cuda_runtime.h>

#include <algorithm>
#include <bit>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace squall {

/// Settings of `cuda_ipc_transport`.
struct cuda_ipc_config {
  /// Opened peer allocations kept (least recently used closed first).
  std::size_t open_handles = 256;
  /// The smallest staging buffer made for memory that cannot be exported.
  std::size_t staging_bytes = std::size_t{1} << 20;
};

namespace detail::cuda_ipc {

/// A control message through the shm transport: an offer (a sender's bytes: where they are)
/// or an answer (the receiver took them, or expected another size).
struct message {
  static constexpr std::uint32_t offer = 1;
  static constexpr std::uint32_t answer = 2;
  std::uint32_t kind = 0;
  std::uint32_t reserved = 0;
  std::uint64_t bytes = 0;  // offer: the message's size; answer: the size the receiver expected
  std::uint64_t start = 0;  // offer: the exported allocation's start in the sender
  std::uint64_t allocation = 0;  // offer: its id there (CU_POINTER_ATTRIBUTE_BUFFER_ID)
  std::uint64_t offset = 0;      // offer: from its start
  cudaIpcMemHandle_t handle{};
};

/// The key of an opened allocation: the peer and the allocation's start there. (An
/// allocation freed and made again at the same start has another id, and the old mapping
/// must be closed before the new one opens, else cudaErrorAlreadyMapped.)
struct handle_key {
  int peer = 0;
  std::uint64_t start = 0;
  auto operator<=>(const handle_key&) const = default;
};

/// An opened allocation: where it is mapped here, and its id in the peer.
struct opened_allocation {
  std::byte* base = nullptr;
  std::uint64_t allocation = 0;
};

/// An allocation of this process: its start and its id, unique in the process for its
/// lifetime (a freed allocation's successor at the same start has another).
struct allocation_id {
  const std::byte* start = nullptr;
  std::uint64_t id = 0;
};

/// A handle this process exported, kept for the next send from the same allocation
/// (cudaIpcGetMemHandle is a driver round trip).
struct exported_allocation {
  std::uint64_t id = 0;
  cudaIpcMemHandle_t handle{};
};

/// The driver's cuPointerGetAttributes, through the runtime (no link against libcuda, so the
/// programs start where no driver is installed).
using pointer_attributes_fn = CUresult (*)(unsigned int, CUpointer_attribute*, void**, CUdeviceptr);
inline pointer_attributes_fn pointer_attributes() {
  static const pointer_attributes_fn fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult found{};
    SQUALL_CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuPointerGetAttributes", &p, 12000,
                                                       cudaEnableDefault, &found));
    if (found != cudaDriverEntryPointSuccess || p == nullptr) {
      throw error(make_error_code(errc::internal), {.operation = "cuda_ipc_transport"},
                  "the driver has no cuPointerGetAttributes");
    }
    return reinterpret_cast<pointer_attributes_fn>(p);
  }();
  return fn;
}

/// The allocation `p` lies in, if it is device memory that `cudaIpcGetMemHandle` can export.
inline std::optional<allocation_id> exportable(const void* p) {
  CUdeviceptr start = 0;
  int legacy_ipc = 0;
  unsigned long long id = 0;
  CUpointer_attribute which[] = {CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
                                 CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE,
                                 CU_POINTER_ATTRIBUTE_BUFFER_ID};
  void* into[] = {&start, &legacy_ipc, &id};
  if (pointer_attributes()(3, which, into, reinterpret_cast<CUdeviceptr>(p)) != CUDA_SUCCESS ||
      legacy_ipc == 0 || start == 0) {
    return std::nullopt;
  }
  return allocation_id{.start = reinterpret_cast<const std::byte*>(start), .id = id};
}

/// A device buffer of the sender's own, exported once, into which memory that cannot be
/// exported is copied before it is offered.
struct staging_buffer {
  std::byte* data = nullptr;
  std::size_t bytes = 0;
  std::uint64_t id = 0;
  cudaIpcMemHandle_t handle{};
  bool busy = false;
};

struct send_op {
  int peer = 0;
  std::size_t bytes = 0;
  const std::byte* data = nullptr;
  cudaEvent_t ready = nullptr;  // recorded at send: the producer's work is done
  message offer;
  staging_buffer* staged = nullptr;
  bool offered = false;
  bool complete = false;
  std::string failure;  // a mismatch the answer reported
};

struct recv_op {
  int peer = 0;
  std::size_t bytes = 0;
  std::byte* data = nullptr;
  cudaEvent_t copied = nullptr;
  bool copying = false;
  bool complete = false;
  std::string failure;
};

/// An outgoing control message and its shm completion (the message must outlive it).
struct outgoing {
  std::unique_ptr<message> msg;
  std::optional<shm_completion> sent;
};

struct peer_queues {
  std::deque<std::shared_ptr<send_op>> sends;  // offered or to offer, awaiting the answer
  std::deque<std::shared_ptr<recv_op>> recvs;  // in posting order
  std::deque<message> offers;                  // arrived, not yet taken by a receive
  std::unique_ptr<message> incoming = std::make_unique<message>();
  std::optional<shm_completion> listening;  // the receive of the next control message
  std::size_t awaited_answers = 0;          // offers sent whose answers have not come
};

/// Everything a transport owns; its completions point here, so it does not move.
struct state {
  state(shm_transport control_in, cuda_backend on_in, const cuda_ipc_config& config_in)
      : control(std::move(control_in)),
        on(on_in),
        config(config_in),
        peers(static_cast<std::size_t>(control.size())),
        opened(config.open_handles, [this](const handle_key&, opened_allocation& a) {
          cudaStreamSynchronize(on.stream);  // no copy from it may be in flight
          cudaIpcCloseMemHandle(a.base);
        }) {}

  ~state() {
    const detail::device_guard guard(on.device);
    for (auto& q : peers) q.listening.reset();
    outbox.clear();
    opened.clear();
    for (auto& s : staging) cudaFree(s->data);
    for (cudaEvent_t e : events) cudaEventDestroy(e);
  }

  int rank() const { return control.rank(); }
  int size() const { return control.size(); }

  // A CUDA call's status: throws naming the call, the device (through throw_cuda_error) and
  // this rank and peer.
  void check(cudaError_t status, const char* call, int peer) const {
    if (status == cudaSuccess) return;
    try {
      throw_cuda_error(status, call, __FILE__, __LINE__);
    } catch (const error& e) {
      throw error(e.code(), {.operation = call, .rank = rank(), .peer = peer}, e.what());
    }
  }

  cudaEvent_t take_event() {
    if (!events.empty()) {
      cudaEvent_t e = events.back();
      events.pop_back();
      return e;
    }
    cudaEvent_t e = nullptr;
    check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreateWithFlags",
          no_peer);
    return e;
  }
  void give_event(cudaEvent_t& e) {
    if (e != nullptr) events.push_back(std::exchange(e, nullptr));
  }

  // A free staging buffer of at least `bytes` (made and exported on a miss).
  staging_buffer* stage(std::size_t bytes) {
    staging_buffer* best = nullptr;
    for (auto& s : staging) {
      if (!s->busy && s->bytes >= bytes && (best == nullptr || s->bytes < best->bytes)) {
        best = s.get();
      }
    }
    if (best == nullptr) {
      auto made = std::make_unique<staging_buffer>();
      made->bytes = std::max(std::bit_ceil(bytes), config.staging_bytes);
      check(cudaMalloc(reinterpret_cast<void**>(&made->data), made->bytes), "cudaMalloc", no_peer);
      const cudaError_t status = cudaIpcGetMemHandle(&made->handle, made->data);
      const auto allocation = exportable(made->data);
      if (status != cudaSuccess || !allocation) cudaFree(made->data);
      check(status, "cudaIpcGetMemHandle", no_peer);
      if (!allocation) {
        throw error(make_error_code(errc::internal), {.operation = "cudaMalloc", .rank = rank()},
                    "a staging buffer from cudaMalloc is not exportable");
      }
      made->id = allocation->id;
      best = made.get();
      staging.push_back(std::move(made));
    }
    best->busy = true;
    return best;
  }

  // Where the allocation that `offer` names is mapped here: cached, or opened (a cached
  // mapping of the same start with another id is the peer's freed allocation: closed first).
  // cudaErrorAlreadyMapped, the driver's word for a mapping of that memory still open under
  // another start, closes every mapping of the peer and tries once more.
  std::byte* open_peer(int peer, const message& offer) {
    const handle_key key{.peer = peer, .start = offer.start};
    if (opened_allocation* a = opened.find(key)) {
      if (a->allocation == offer.allocation) return a->base;
      opened.erase(key);
    }
    void* base = nullptr;
    cudaError_t status = cudaIpcOpenMemHandle(&base, offer.handle, cudaIpcMemLazyEnablePeerAccess);
    if (status == cudaErrorAlreadyMapped) {
      cudaGetLastError();
      opened.erase_if([peer](const handle_key& k) { return k.peer == peer; });
      status = cudaIpcOpenMemHandle(&base, offer.handle, cudaIpcMemLazyEnablePeerAccess);
    }
    check(status, "cudaIpcOpenMemHandle", peer);
    opened.insert(key, {.base = static_cast<std::byte*>(base), .allocation = offer.allocation});
    return static_cast<std::byte*>(base);
  }

  // Whether work of this transport is on the device (an offer waiting for its data, a copy
  // in flight): then a wait polls instead of sleeping on the doorbell.
  bool device_busy() const {
    for (const auto& q : peers) {
      for (const auto& op : q.sends) {
        if (!op->offered) return true;
      }
      for (const auto& op : q.recvs) {
        if (op->copying && !op->complete) return true;
      }
    }
    return false;
  }

  // Posts `m` to `peer` through the shm transport.
  void post(int peer, const message& m) {
    ++moves;
    auto& o = outbox.emplace_back();
    o.msg = std::make_unique<message>(m);
    o.sent.emplace(control.send(peer, {reinterpret_cast<const std::byte*>(o.msg.get()), sizeof m}));
  }

  // The IPC handle of `a` into `handle`: the one exported before for the same allocation, or a
  // new one; false if the driver refuses (then the data goes through a staging buffer).
  bool export_handle(const allocation_id& a, cudaIpcMemHandle_t& handle) {
    const auto start = reinterpret_cast<std::uint64_t>(a.start);
    if (const auto it = exported.find(start); it != exported.end() && it->second.id == a.id) {
      handle = it->second.handle;
      return true;
    }
    if (cudaIpcGetMemHandle(&handle, const_cast<std::byte*>(a.start)) != cudaSuccess) {
      cudaGetLastError();  // a refused export is not the next launch's error
      return false;
    }
    if (exported.size() >= 4096) exported.clear();  // bounded: starts of freed allocations
    exported[start] = {.id = a.id, .handle = handle};
    ++exports;
    return true;
  }

  // Makes `op`'s offer once its data is ready: its own allocation's handle, or a staging
  // buffer's after a copy.
  bool try_offer(send_op& op) {
    if (op.ready != nullptr) {
      const cudaError_t ready = cudaEventQuery(op.ready);
      if (ready == cudaErrorNotReady) return false;
      check(ready, "cudaEventQuery", op.peer);
      give_event(op.ready);
    }
    op.offer.kind = message::offer;
    op.offer.bytes = op.bytes;
    if (op.bytes != 0) {
      const auto allocation = exportable(op.data);
      if (allocation && export_handle(*allocation, op.offer.handle)) {
        op.offer.start = reinterpret_cast<std::uint64_t>(allocation->start);
        op.offer.allocation = allocation->id;
        op.offer.offset = static_cast<std::uint64_t>(op.data - allocation->start);
      } else {
        op.staged = stage(op.bytes);
        check(cudaMemcpyAsync(op.staged->data, op.data, op.bytes, cudaMemcpyDefault, on.stream),
              "cudaMemcpyAsync", op.peer);
        check(cudaStreamSynchronize(on.stream), "cudaStreamSynchronize", op.peer);
        op.offer.handle = op.staged->handle;
        op.offer.start = reinterpret_cast<std::uint64_t>(op.staged->data);
        op.offer.allocation = op.staged->id;
        op.offer.offset = 0;
      }
    }
    post(op.peer, op.offer);
    op.offered = true;
    ++peers[static_cast<std::size_t>(op.peer)].awaited_answers;
    return true;
  }

  // One control message from `peer` arrived: an offer is queued for the receives, an answer
  // completes the oldest offered send.
  void arrived(int peer, const message& m) {
    ++moves;
    auto& q = peers[static_cast<std::size_t>(peer)];
    if (m.kind == message::offer) {
      q.offers.push_back(m);
      return;
    }
    if (m.kind != message::answer || q.sends.empty() || !q.sends.front()->offered) {
      throw error(make_error_code(errc::internal),
                  {.operation = "recv", .rank = rank(), .peer = peer},
                  "an unexpected control message from the peer");
    }
    auto op = q.sends.front();
    q.sends.pop_front();
    --q.awaited_answers;
    if (op->staged != nullptr) op->staged->busy = false;
    if (m.bytes != op->bytes) {
      op->failure = "sent " + std::to_string(op->bytes) + " bytes; the peer expected " +
                    std::to_string(m.bytes);
    }
    op->complete = true;
  }

  // Whether a control message from `peer` is due: an offer for a posted receive or an answer.
  bool expecting(const peer_queues& q) const {
    std::size_t waiting = 0;
    for (const auto& r : q.recvs) waiting += r->copying || r->complete ? 0 : 1;
    return q.awaited_answers > 0 || waiting > q.offers.size();
  }

  // Moves everything along once: control messages in, offers out, copies in, answers out.
  void advance() {
    const detail::device_guard guard(on.device);
    for (int peer = 0; peer < size(); ++peer) {
      if (peer == rank()) continue;
      auto& q = peers[static_cast<std::size_t>(peer)];
      for (auto& op : q.sends) {  // offers leave in posting order
        if (!op->offered && !try_offer(*op)) break;
      }
      while (true) {
        if (!q.listening) {
          if (!expecting(q)) break;
          q.listening.emplace(control.recv(
              peer, {reinterpret_cast<std::byte*>(q.incoming.get()), sizeof(message)}));
        }
        if (!q.listening->test()) break;
        q.listening.reset();
        arrived(peer, *q.incoming);
      }
      take_offers(peer, q);
    }
    while (!outbox.empty() && outbox.front().sent->test()) outbox.pop_front();
  }

  // The receives from `peer`, in order: copies enqueued as offers arrive, answered as the
  // copies finish (one stream: they finish in order).
  void take_offers(int peer, peer_queues& q) {
    for (auto& op : q.recvs) {
      if (op->copying || op->complete) continue;
      if (q.offers.empty()) break;
      const message offer = q.offers.front();
      q.offers.pop_front();
      op->copying = true;
      if (offer.bytes != op->bytes) {  // answered in turn below, with the size expected here
        op->failure = "expected " + std::to_string(op->bytes) + " bytes; the peer sent " +
                      std::to_string(offer.bytes);
        continue;
      }
      if (op->bytes == 0) continue;
      const std::byte* from = open_peer(peer, offer) + offer.offset;
      ++moves;
      op->copied = take_event();
      check(cudaMemcpyAsync(op->data, from, op->bytes, cudaMemcpyDefault, on.stream),
            "cudaMemcpyAsync", peer);
      check(cudaEventRecord(op->copied, on.stream), "cudaEventRecord", peer);
    }
    while (!q.recvs.empty()) {
      auto& op = *q.recvs.front();
      if (!op.complete) {
        if (!op.copying) break;
        if (op.copied != nullptr) {
          const cudaError_t done = cudaEventQuery(op.copied);
          if (done == cudaErrorNotReady) break;
          check(done, "cudaEventQuery", peer);
          give_event(op.copied);
        }
        post(peer, {.kind = message::answer, .bytes = op.bytes});
        op.complete = true;
      }
      q.recvs.pop_front();
    }
  }

  // Fails this transport for good: every later call throws `why`.
  void fail(const std::string& why) {
    if (failed.empty()) failed = why;
  }

  shm_transport control;  // first: destroyed last, after the completions that point into it
  cuda_backend on;
  cuda_ipc_config config;
  std::vector<peer_queues> peers;
  std::deque<outgoing> outbox;
  handle_cache<handle_key, opened_allocation> opened;
  std::map<std::uint64_t, exported_allocation> exported;  // by allocation start
  std::size_t exports = 0;
  std::vector<std::unique_ptr<staging_buffer>> staging;
  std::vector<cudaEvent_t> events;
  std::string failed;
  std::uint64_t moves = 0;  // counts every step of progress (a wait starts spinning again)
};

}  // namespace detail::cuda_ipc

/// The handle of a send, receive or barrier on `cuda_ipc_transport`. Move-only; waiting
/// moves the whole transport along (so a posted send and receive never deadlock, whichever is
/// waited first). A pending completion's destructor waits for it without throwing.
class cuda_ipc_completion {
 public:
  cuda_ipc_completion(cuda_ipc_completion&& other) noexcept
      : state_(std::exchange(other.state_, nullptr)),
        send_(std::move(other.send_)),
        recv_(std::move(other.recv_)),
        barrier_(std::move(other.barrier_)),
        what_(other.what_),
        peer_(other.peer_) {}
  cuda_ipc_completion& operator=(cuda_ipc_completion&& other) noexcept {
    if (this != &other) {
      finish_quietly();
      state_ = std::exchange(other.state_, nullptr);
      send_ = std::move(other.send_);
      recv_ = std::move(other.recv_);
      barrier_ = std::move(other.barrier_);
      what_ = other.what_;
      peer_ = other.peer_;
    }
    return *this;
  }
  cuda_ipc_completion(const cuda_ipc_completion&) = delete;
  cuda_ipc_completion& operator=(const cuda_ipc_completion&) = delete;
  ~cuda_ipc_completion() { finish_quietly(); }

  /// Blocks until done; throws `timeout_error` at the transport's deadline, `peer_failure`
  /// for a dead or failed peer, `mismatch_error` for a size mismatch, `squall::error` (cuda)
  /// for a CUDA error.
  void wait() {
    if (state_ == nullptr) return;
    auto& s = *state_;
    const detail::deadline limit(s.control.deadline());
    // Spin, then yield for up to 200 us, as shm_transport does; then, while the device has
    // work of ours (a copy, an offer's data), sleep 20 us at a time, else sleep on the shm
    // doorbell, which the peers' control messages ring. Any progress starts again.
    constexpr int spins = 512;
    constexpr auto yield_time = std::chrono::microseconds(200);
    int spun = 0;
    std::uint64_t seen = s.moves;
    auto yielding_since = std::chrono::steady_clock::now();
    while (!test_once()) {
      if (s.moves != seen) {
        seen = s.moves;
        spun = 0;
      }
      if (limit.expired()) {
        const error_context where{.operation = what_, .rank = s.rank(), .peer = peer_};
        s.fail(std::string(what_) + " did not complete within " + limit.describe());
        throw timeout_error(where,
                            std::string(what_) + " did not complete within " + limit.describe());
      }
      if (spun < spins) {
        if (++spun == spins) yielding_since = std::chrono::steady_clock::now();
        detail::cpu_relax();
      } else if (std::chrono::steady_clock::now() - yielding_since < yield_time) {
        std::this_thread::yield();
      } else if (s.device_busy()) {
        std::this_thread::sleep_for(std::chrono::microseconds(20));
      } else {
        s.control.idle(
            std::min<std::chrono::nanoseconds>(limit.remaining(), std::chrono::milliseconds(10)));
      }
    }
    state_ = nullptr;
  }

  /// Moves the transport along once; true when done (then `wait()` returns at once).
  bool test() {
    if (state_ == nullptr) return true;
    if (!test_once()) return false;
    state_ = nullptr;
    return true;
  }

 private:
  friend class cuda_ipc_transport;
  cuda_ipc_completion(detail::cuda_ipc::state* s, std::shared_ptr<detail::cuda_ipc::send_op> op)
      : state_(s), send_(std::move(op)), what_("send"), peer_(send_->peer) {}
  cuda_ipc_completion(detail::cuda_ipc::state* s, std::shared_ptr<detail::cuda_ipc::recv_op> op)
      : state_(s), recv_(std::move(op)), what_("recv"), peer_(recv_->peer) {}
  cuda_ipc_completion(detail::cuda_ipc::state* s, shm_completion barrier)
      : state_(s), barrier_(std::move(barrier)), what_("barrier") {}

  bool test_once() {
    auto& s = *state_;
    const error_context where{.operation = what_, .rank = s.rank(), .peer = peer_};
    if (!s.failed.empty()) throw peer_failure(where, "the transport failed earlier: " + s.failed);
    try {
      s.advance();
      if (barrier_) return barrier_->test();
    } catch (const std::exception& e) {
      s.fail(e.what());
      throw;
    }
    const std::string& failure = send_ ? send_->failure : recv_->failure;
    if (!failure.empty()) {
      s.fail(failure);
      throw mismatch_error(where, failure);
    }
    return send_ ? send_->complete : recv_->complete;
  }

  void finish_quietly() noexcept {
    if (state_ == nullptr || !state_->failed.empty()) return;
    try {
      wait();
    } catch (...) {  // recorded in the transport's failed state; reported by the next call
    }
  }

  detail::cuda_ipc::state* state_ = nullptr;
  std::shared_ptr<detail::cuda_ipc::send_op> send_;
  std::shared_ptr<detail::cuda_ipc::recv_op> recv_;
  std::optional<shm_completion> barrier_;
  const char* what_ = "";
  int peer_ = no_peer;
};

/// Moves device buffers between the processes of one host through CUDA IPC; see the top of
/// this file. `send`/`recv` take device memory (host memory works too, staged).
class cuda_ipc_transport {
 public:
  using memory_space = device_memory;

  /// What `automatic_topology` predicts with before any calibration: one host, peers reached
  /// at once; alpha half a message's round trip (34 us on an H100 under MPS; about 300 us
  /// without MPS when the processes share a GPU), beta a device-to-device copy (1.4 TB/s of
  /// bytes copied), gamma a reduction at the same memory rate (docs/performance.md).
  static constexpr link_costs costs{
      .alpha = 17e-6, .beta = 1.0 / 1.4e12, .gamma = 1.0 / 0.9e12, .all_peers_at_once = true};
  /// The executor's piece size unless the tuning sets another than collective_tuning's
  /// default: a message costs a round trip through the host (tens of microseconds), in which
  /// the device copies megabytes.
  static constexpr std::size_t default_chunk_bytes = std::size_t{64} << 20;

  /// Joins the job of `control` (whose rank and size it takes); copies run on `on`'s device
  /// and stream, which should be the communicator's backend's, so that a send follows the
  /// kernels that wrote its data and a receive precedes those that read it. That stream
  /// must outlive the transport (its destructor waits on it before closing peer memory).
  cuda_ipc_transport(shm_transport control, cuda_backend on, const cuda_ipc_config& config = {})
      : state_(std::make_unique<detail::cuda_ipc::state>(std::move(control), on, config)) {}

  int rank() const { return state_->rank(); }
  int size() const { return state_->size(); }
  std::chrono::nanoseconds deadline() const { return state_->control.deadline(); }

  /// Starts sending `bytes` to `peer`: it is offered once the work enqueued on the stream
  /// before this call has finished, and must stay unchanged until the completion is done.
  [[nodiscard]] cuda_ipc_completion send(int peer,
                                         buffer_view<const std::byte, device_memory> bytes) {
    check_message_peer("send", peer);
    auto op = std::make_shared<detail::cuda_ipc::send_op>();
    op->peer = peer;
    op->bytes = bytes.count();
    op->data = bytes.data();
    const detail::device_guard guard(state_->on.device);
    // An idle stream has finished everything enqueued before: offer at once. Else an event
    // marks that point (device work of its own, which another process's work on the same GPU
    // can keep waiting for a time slice).
    const cudaError_t idle = cudaStreamQuery(state_->on.stream);
    if (idle == cudaErrorNotReady) {
      op->ready = state_->take_event();
      state_->check(cudaEventRecord(op->ready, state_->on.stream), "cudaEventRecord", peer);
    } else {
      state_->check(idle, "cudaStreamQuery", peer);
    }
    state_->peers[static_cast<std::size_t>(peer)].sends.push_back(op);
    return {state_.get(), std::move(op)};
  }

  /// Starts receiving exactly `bytes.count()` bytes from `peer`; a message of another size
  /// gives `mismatch_error` on both sides.
  [[nodiscard]] cuda_ipc_completion recv(int peer, buffer_view<std::byte, device_memory> bytes) {
    check_message_peer("recv", peer);
    auto op = std::make_shared<detail::cuda_ipc::recv_op>();
    op->peer = peer;
    op->bytes = bytes.count();
    op->data = bytes.data();
    state_->peers[static_cast<std::size_t>(peer)].recvs.push_back(op);
    return {state_.get(), std::move(op)};
  }

  /// Completes once every rank has entered it (the shm transport's barrier).
  [[nodiscard]] cuda_ipc_completion barrier() {
    check_peer("barrier", rank());
    return {state_.get(), state_->control.barrier()};
  }

  /// See `shm_transport::abandon`: the peers fail at once instead of at their deadlines.
  void abandon(std::string_view why) noexcept {
    state_->control.abandon(why);
    try {
      state_->fail(std::string(why));
    } catch (...) {  // NOLINT(bugprone-empty-catch): a string that cannot be made: nothing to say
    }
  }

  /// Opened peer allocations now cached, and the lookups that found one (for tests).
  std::size_t open_handles() const { return state_->opened.size(); }
  /// How many times this rank opened a peer's handle, and exported one of its own (for tests).
  std::size_t handles_opened() const { return state_->opened.misses(); }
  std::size_t handles_exported() const { return state_->exports; }
  /// The staging buffers made for memory that could not be exported.
  std::size_t staging_buffers() const { return state_->staging.size(); }

 private:
  void check_peer(const char* what, int peer) const {
    const error_context where{.operation = what, .rank = rank(), .peer = peer};
    if (!state_->failed.empty()) {
      throw peer_failure(where, "the transport failed earlier: " + state_->failed);
    }
    if (peer < 0 || peer >= size()) {
      throw invalid_argument(where, "peer outside [0, " + std::to_string(size()) + ")");
    }
  }
  void check_message_peer(const char* what, int peer) const {
    check_peer(what, peer);
    if (peer == rank()) {
      throw invalid_argument({.operation = what, .rank = rank(), .peer = peer},
                             "a message to this rank itself");
    }
  }

  std::unique_ptr<detail::cuda_ipc::state> state_;
};
static_assert(transport<cuda_ipc_transport>);

}  // namespace squall
