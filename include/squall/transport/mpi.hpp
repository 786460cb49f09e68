// SPDX-License-Identifier: Apache-2.0
#pragma once
/// `mpi_transport`: squall's bytes as MPI point-to-point messages on a private duplicate of a
/// communicator. This is the only squall header that includes <mpi.h>.
///
/// Semantics, shared with the other transports:
/// - `send` and `recv` are non-blocking (`MPI_Isend`/`MPI_Irecv` on `MPI_BYTE`) and return an
///   `mpi_completion`. Messages from one rank to another match in the order they were posted
///   (FIFO); a rank may send to itself.
/// - A message travels as pieces of at most `mpi_transport::max_piece_bytes` (1 GiB), which
///   both sides derive from the size alone, so MPI's `int` counts never overflow and messages
///   above 2^31 bytes work. Sizes are `std::size_t` throughout.
/// - A message to a rank on another node (`MPI_Comm_split_type` with `MPI_COMM_TYPE_SHARED`)
///   travels as pieces of `network_piece_bytes` (32 KiB unless `SQUALL_MPI_PIECE_BYTES` says
///   otherwise; 0: no such pieces): each below Open MPI's TCP eager limit (64 KiB with its
///   header), so the pieces stream instead of each waiting for a rendezvous handshake that
///   only the receiver's MPI calls answer (on emulated 1 Gbit/s links a ring allreduce of
///   64 MiB over 4 hosts reached 35% of the wire bound in 256 KiB messages, 90% in these
///   pieces: docs/performance.md). Their tag is a function of the message's size, so a recv
///   whose size differs from the send's does not silently take part of it: it fails on a
///   piece's size or waits to its deadline.
/// - A recv must post exactly the size of the matching send; otherwise its `wait()`/`test()`
///   throws `mismatch_error`. Two MPI quirks bend this for a send *longer* than its recv:
///   Open MPI 4.1 truncates a short (eager) message to self silently when the recv was posted
///   first; MPICH 4 raises the truncation on `MPI_COMM_WORLD` (4.0; `MPI_COMM_SELF` later),
///   not on squall's communicator, so it aborts the job unless that has `MPI_ERRORS_RETURN`.
/// - Every wait gives up after the deadline of the `options` the transport was built with and
///   throws `timeout_error`. After a timeout, a mismatch or an MPI error the transport has
///   *failed*: every later `send`, `recv`, `barrier`, `wait` and `test` throws at once.
///
/// Thread safety: like an MPI communicator, a transport and its completions are used by one
/// thread at a time (from any thread only with `MPI_THREAD_MULTIPLE`).

#include <squall/concepts.hpp>
#include <squall/core/buffer.hpp>
#include <squall/core/completion.hpp>
#include <squall/core/error.hpp>
#include <squall/core/link_costs.hpp>
#include <squall/core/options.hpp>
#include <squall/detail/math.hpp>

#include <mpi.h>

#include <algorithm>  // all_of, fill_n, min
#include <array>
#include <chrono>
#include <cstddef>  // byte, size_t
#include <cstdlib>  // getenv, strtoull
#include <memory>   // shared_ptr, unique_ptr
#include <numeric>  // iota
#include <optional>
#include <string>
#include <string_view>
#include <system_error>  // error_code
#include <utility>       // exchange, move
#include <vector>

namespace squall {
namespace detail {

/// The text MPI gives for `code` ("MPI_ERR_TRUNCATE: message truncated").
inline std::string mpi_error_text(int code) {
  std::array<char, MPI_MAX_ERROR_STRING> text{};
  int length = 0;
  if (MPI_Error_string(code, text.data(), &length) != MPI_SUCCESS) {
    return "unknown MPI error " + std::to_string(code);
  }
  return std::string(text.data(), static_cast<std::size_t>(length));
}

/// Throws `squall::error` in the mpi category, naming `where` and `expression`, unless `code`
/// is `MPI_SUCCESS`.
inline void mpi_check(int code, const error_context& where, const char* expression) {
  if (code != MPI_SUCCESS) [[unlikely]] {
    throw error(std::error_code(code, mpi_category()), where,
                std::string(expression) + ": " + mpi_error_text(code));
  }
}

}  // namespace detail

/// Throws `squall::error` in the mpi category if `expr` does not return `MPI_SUCCESS`; its
/// message names the `error_context` called `where` in the calling scope, the expression and
/// MPI's text for the code.
#define SQUALL_MPI_CHECK(expr) ::squall::detail::mpi_check((expr), where, #expr)

namespace detail {

/// The tag of every squall message in whole pieces. The communicator is squall's own
/// duplicate, so no other code's message can match it.
inline constexpr int mpi_tag = 0;

/// The tag of the network pieces of a message of `bytes`: 1 + `bytes` mod 32749 (a prime
/// below 32767, the least tag bound MPI allows), so that sends and recvs of different sizes
/// match no piece of each other unless they differ by a multiple of 32749.
constexpr int mpi_network_tag(std::size_t bytes) { return 1 + static_cast<int>(bytes % 32749); }

/// The default size of the pieces of a message to a rank on another node (`mpi_transport`).
inline constexpr std::size_t mpi_network_piece_bytes = std::size_t{32} << 10;
/// The environment variable that overrides it, in bytes (0: whole messages).
inline constexpr const char* mpi_piece_env_var = "SQUALL_MPI_PIECE_BYTES";

/// `SQUALL_MPI_PIECE_BYTES` if set (a whole number of bytes, 0 or from 1 KiB to 1 GiB), else
/// `mpi_network_piece_bytes`; throws `invalid_argument` naming the variable otherwise.
inline std::size_t mpi_network_piece_from_env() {
  const char* text = std::getenv(mpi_piece_env_var);
  if (text == nullptr) return mpi_network_piece_bytes;
  const std::string copy(text);
  char* end = nullptr;
  const unsigned long long v = copy.empty() ? 0 : std::strtoull(copy.c_str(), &end, 10);
  const bool whole = !copy.empty() && copy[0] != '-' && end == copy.c_str() + copy.size();
  if (!whole || (v != 0 && (v < 1024 || v > (std::size_t{1} << 30)))) {
    throw invalid_argument({.operation = "mpi_transport"},
                           std::string(mpi_piece_env_var) + "='" + copy +
                               "' is not 0 or a whole number of bytes from 1024 to 2^30");
  }
  return static_cast<std::size_t>(v);
}

/// How many idle polls `mpi_completion::wait()` makes after each sleep of its backoff, and how
/// long a poll must take to count as busy (it moved data). Measured with 2 ranks on a 2-core
/// machine, 1 GiB from rank 0 to rank 1: with one poll per wake-up, MPICH 4.0.2 took 3.7 s and
/// Open MPI 4.1.4 without single-copy (`btl_vader_single_copy_mechanism=none`) 19 s; with these
/// values 0.19 s and 0.40 s (polling without ever sleeping: 0.24 s and 0.15 s). An idle poll
/// costs about 0.1 us: a recv waiting 2 s for a late sender used 0.06 s (MPICH) and 0.09 s
/// (Open MPI) of CPU.
inline constexpr int mpi_idle_polls = 64;
/// See `mpi_idle_polls`.
inline constexpr std::chrono::nanoseconds mpi_busy_poll{2000};

/// The number of pieces a message of `bytes` travels as (a message of 0 bytes is one piece).
constexpr std::size_t mpi_piece_count(std::size_t bytes, std::size_t piece_bytes) {
  return bytes == 0 ? 1 : div_up(bytes, piece_bytes);
}

/// Piece `piece` of a message of `bytes`: whole pieces of `piece_bytes`, then the remainder.
constexpr index_range mpi_piece(std::size_t bytes, std::size_t piece_bytes, std::size_t piece) {
  const std::size_t begin = piece * piece_bytes;
  return {begin, std::min(piece_bytes, bytes - begin)};
}

/// What an `mpi_transport` shares with the completions it returns: this rank, the deadline and
/// whether the transport has failed. Shared ownership lets a completion outlive its transport,
/// or a transport be moved while completions are in flight.
class mpi_state {
 public:
  mpi_state(int rank, int size, std::chrono::nanoseconds deadline) noexcept
      : rank_(rank), size_(size), deadline_(deadline) {}

  int rank() const noexcept { return rank_; }
  int size() const noexcept { return size_; }
  std::chrono::nanoseconds deadline() const noexcept { return deadline_; }
  bool failed() const noexcept { return failed_; }

  /// Marks the transport failed by `cause`. Only the first cause is kept: later errors are
  /// its consequences.
  void fail(const error& cause) {
    if (failed_) return;
    failed_ = true;
    cause_code_ = cause.code();
    cause_ = cause.what();
  }

  /// Throws `squall::error` with the first failure's code and message if the transport failed.
  void throw_if_failed(const error_context& where) const {
    if (failed_) [[unlikely]] {
      throw error(cause_code_, where, "the transport failed earlier: " + cause_);
    }
  }

  /// Returns `f()`; a `squall::error` it throws marks the transport failed on its way out.
  template <class F>
  decltype(auto) fail_on_error(F&& f) {
    try {
      return f();
    } catch (const error& cause) {
      fail(cause);
      throw;
    }
  }

 private:
  int rank_;
  int size_;
  std::chrono::nanoseconds deadline_;
  bool failed_ = false;
  std::error_code cause_code_;
  std::string cause_;
};

/// The requests of one operation, one per piece. Up to `inline_capacity` pieces (4 GiB) are
/// held inline, so an ordinary message allocates nothing.
class mpi_request_list {
 public:
  static constexpr std::size_t inline_capacity = 4;

  mpi_request_list() noexcept = default;
  /// `count` requests, all `MPI_REQUEST_NULL`.
  explicit mpi_request_list(std::size_t count) : count_(count) {
    if (count > inline_capacity) heap_ = std::make_unique<MPI_Request[]>(count);
    std::fill_n(begin(), count, MPI_REQUEST_NULL);
  }
  mpi_request_list(mpi_request_list&& other) noexcept
      : count_(std::exchange(other.count_, 0)),
        inline_(other.inline_),
        heap_(std::move(other.heap_)) {}
  mpi_request_list& operator=(mpi_request_list&& other) noexcept {
    count_ = std::exchange(other.count_, 0);
    inline_ = other.inline_;
    heap_ = std::move(other.heap_);
    return *this;
  }
  mpi_request_list(const mpi_request_list&) = delete;
  mpi_request_list& operator=(const mpi_request_list&) = delete;
  ~mpi_request_list() = default;

  std::size_t size() const noexcept { return count_; }
  MPI_Request& operator[](std::size_t i) noexcept { return begin()[i]; }
  MPI_Request* begin() noexcept { return heap_ ? heap_.get() : inline_.data(); }
  MPI_Request* end() noexcept { return begin() + count_; }
  /// True when no request is in flight (each completed, freed or never posted).
  bool all_null() noexcept {
    return std::all_of(begin(), end(), [](MPI_Request r) { return r == MPI_REQUEST_NULL; });
  }

 private:
  std::size_t count_ = 0;
  std::array<MPI_Request, inline_capacity> inline_{};
  std::unique_ptr<MPI_Request[]> heap_;
};

}  // namespace detail

class mpi_transport;

/// A send, recv or barrier of an `mpi_transport` in flight. Move-only.
///
/// `wait()` blocks until the operation is done and `test()` says whether it is; both throw
/// `timeout_error`, `mismatch_error` or `squall::error` (mpi category) as described for
/// `mpi_transport`. A completion that is done stays done: `wait()` returns and `test()` is true.
/// The destructor of a completion still in flight waits for it and swallows any error (the
/// error still marks the transport failed); on a failed transport it does not wait but
/// abandons the operation (see `mpi_transport`), so no destructor blocks forever.
class mpi_completion {
 public:
  /// A completion with nothing in flight: `test()` is true, `wait()` returns at once.
  mpi_completion() noexcept = default;
  mpi_completion(mpi_completion&& other) noexcept = default;
  /// Finishes the operation this completion held (as the destructor does), then takes `other`'s.
  mpi_completion& operator=(mpi_completion&& other) noexcept;
  mpi_completion(const mpi_completion&) = delete;
  mpi_completion& operator=(const mpi_completion&) = delete;
  ~mpi_completion() { finish_quietly(); }

  /// Blocks until the operation is done. Polls with `detail::backoff` (spin, yield, then sleep),
  /// never a pure busy loop; after each sleep it polls on while MPI is moving data (see
  /// `detail::mpi_idle_polls`). Throws `timeout_error` once the transport's deadline has passed
  /// since the call, and at once if the transport has failed and this operation is not done.
  void wait();
  /// True once the operation is done; never blocks. Throws as `wait()` does, except timeouts.
  bool test();

 private:
  friend class mpi_transport;
  enum class kind { send, recv, barrier };

  mpi_completion(std::shared_ptr<detail::mpi_state> state, kind what, int peer, std::size_t bytes,
                 std::size_t piece_bytes)
      : state_(std::move(state)),
        kind_(what),
        peer_(peer),
        bytes_(bytes),
        piece_bytes_(piece_bytes),
        requests_(detail::mpi_piece_count(bytes, piece_bytes)) {}

  error_context where() const noexcept;
  /// "recv of 16 bytes", for messages.
  std::string describe() const;
  /// Tests each piece still in flight; true when none is left. Throws on an MPI error or a
  /// received size other than the one posted.
  bool poll();
  [[noreturn]] void throw_failed_piece(int code, std::size_t piece) const;
  void check_received(const MPI_Status& status, std::size_t piece) const;
  void finish_quietly() noexcept;

  std::shared_ptr<detail::mpi_state> state_;
  kind kind_ = kind::send;
  int peer_ = no_peer;
  std::size_t bytes_ = 0;
  std::size_t piece_bytes_ = 0;  ///< the size of each piece but the last
  std::size_t next_ = 0;         ///< the pieces before it are done
  detail::mpi_request_list requests_;
};
static_assert(completion<mpi_completion>);

/// Moves bytes between the ranks of an MPI communicator with non-blocking point-to-point
/// messages on `MPI_BYTE` (see the top of this file for the shared semantics).
///
/// Failure: after a timeout, a size mismatch or an MPI error the transport has failed, and
/// every later call on it or on its completions throws at once a `squall::error` that carries
/// the first failure's code and quotes its message. The failure is local to this rank: peers
/// find out through their own deadlines. Completions still in flight on a failed transport are
/// abandoned when destroyed: recvs and sends are `MPI_Cancel`ed and freed, a barrier's request
/// is dropped (MPI forbids cancelling or freeing a nonblocking collective). MPI may not be able
/// to cancel a send, and may then still read its buffer if the peer receives it later.
class mpi_transport {
 public:
  using memory_space = host_memory;

  /// What `automatic_topology` predicts with before any calibration: a one-port cluster
  /// network, about 5 us per message and 100 Gb/s (documented figures of InfiniBand HDR and
  /// 100 GbE with MPI; calibrate on the machine at hand to do better).
  static constexpr link_costs costs{
      .alpha = 5e-6, .beta = 1.0 / 12.5e9, .gamma = 1.0 / 16e9, .all_peers_at_once = false};

  /// The largest piece a message travels as: 1 GiB, so that counts fit MPI's `int`.
  static constexpr std::size_t max_piece_bytes = std::size_t{1} << 30;

  /// Duplicates `comm` (`MPI_Comm_dup`, collective over `comm`) so that squall's messages never
  /// match the user's, and sets `MPI_ERRORS_RETURN` on the duplicate. The deadline of every
  /// wait is `opts.resolved_deadline()`, resolved once here. Finds which ranks share this
  /// rank's node (`MPI_Comm_split_type`, collective): messages to the others travel in pieces
  /// of `network_piece_bytes` (else `SQUALL_MPI_PIECE_BYTES`, else 32 KiB; 0: whole; every
  /// rank must use the same). Preconditions: MPI is initialized and `comm` is an
  /// intracommunicator (else `invalid_argument`; so is a bad `SQUALL_MPI_PIECE_BYTES`).
  explicit mpi_transport(MPI_Comm comm = MPI_COMM_WORLD, const options& opts = {},
                         std::optional<std::size_t> network_piece_bytes = {});
  /// Frees the duplicate communicator (`MPI_Comm_free`) unless MPI is already finalized.
  /// Completions still in flight remain valid.
  ~mpi_transport() { release(); }
  /// Takes `other`'s communicator; `other` may then only be destroyed or assigned to.
  mpi_transport(mpi_transport&& other) noexcept
      : comm_(std::exchange(other.comm_, MPI_COMM_NULL)),
        state_(std::move(other.state_)),
        remote_(std::move(other.remote_)),
        network_piece_(other.network_piece_) {}
  /// Frees this transport's communicator, then takes `other`'s.
  mpi_transport& operator=(mpi_transport&& other) noexcept;
  mpi_transport(const mpi_transport&) = delete;
  mpi_transport& operator=(const mpi_transport&) = delete;

  /// This process's rank in `[0, size())`.
  int rank() const noexcept { return state_->rank(); }
  /// The number of ranks of the communicator.
  int size() const noexcept { return state_->size(); }
  /// How long any single wait may last.
  std::chrono::nanoseconds deadline() const noexcept { return state_->deadline(); }
  /// The duplicate communicator squall's messages travel on.
  MPI_Comm comm() const noexcept { return comm_; }
  /// Whether `peer` is on another node than this rank (`MPI_COMM_TYPE_SHARED`).
  bool remote(int peer) const noexcept { return remote_[static_cast<std::size_t>(peer)] != 0; }
  /// The size of the pieces of a message to `peer`: `network_piece_bytes` for a remote one
  /// (unless 0), `max_piece_bytes` otherwise.
  std::size_t piece_bytes(int peer) const noexcept {
    return remote(peer) && network_piece_ != 0 ? network_piece_ : max_piece_bytes;
  }

  /// Starts sending `bytes` to `peer`; `bytes` must stay valid and unchanged until the
  /// completion is done. Throws `invalid_argument` for a peer outside `[0, size())`.
  [[nodiscard]] mpi_completion send(int peer, buffer_view<const std::byte> bytes);
  /// Starts receiving exactly `bytes.size_bytes()` bytes from `peer` into `bytes`, which must
  /// stay valid until the completion is done. The completion throws `mismatch_error` if the
  /// matching send has another size. Throws `invalid_argument` for a peer outside `[0, size())`.
  [[nodiscard]] mpi_completion recv(int peer, buffer_view<std::byte> bytes);
  /// Starts a barrier (`MPI_Ibarrier`): the completion is done once every rank has entered it.
  [[nodiscard]] mpi_completion barrier();

 private:
  /// The context of `operation` to `peer`; throws if the transport failed or `peer` is bad.
  error_context start(std::string_view operation, int peer) const;
  /// The tag of every piece of a message of `bytes` to or from `peer`.
  int tag(int peer, std::size_t bytes) const noexcept {
    return piece_bytes(peer) == max_piece_bytes ? detail::mpi_tag : detail::mpi_network_tag(bytes);
  }
  /// Marks the ranks of `comm_` on other nodes than this one in `remote_`.
  void find_remote();
  void release() noexcept;

  MPI_Comm comm_ = MPI_COMM_NULL;
  std::shared_ptr<detail::mpi_state> state_;
  std::vector<unsigned char> remote_;  ///< per rank of `comm_`: on another node
  std::size_t network_piece_ = 0;
};
static_assert(transport<mpi_transport>);

// ---- mpi_completion ------------------------------------------------------------------------

inline mpi_completion& mpi_completion::operator=(mpi_completion&& other) noexcept {
  if (this != &other) {
    finish_quietly();
    state_ = std::move(other.state_);
    kind_ = other.kind_;
    peer_ = other.peer_;
    bytes_ = other.bytes_;
    piece_bytes_ = other.piece_bytes_;
    next_ = other.next_;
    requests_ = std::move(other.requests_);
  }
  return *this;
}

inline void mpi_completion::wait() {
  if (requests_.all_null()) return;
  const error_context where = this->where();
  state_->throw_if_failed(where);
  state_->fail_on_error([&] {
    const detail::deadline limit(state_->deadline());
    detail::backoff pause;
    while (!poll()) {
      if (limit.expired()) {
        throw timeout_error(where, describe() + " did not complete within " + limit.describe());
      }
      pause.pause();
      if (!pause.sleeping()) continue;
      // A large transfer through MPI's shared-memory fragments (MPICH; Open MPI without
      // single-copy) moves only inside MPI calls, on both sides. One poll per wake-up would
      // move one batch of fragments per sleep, so after each sleep poll on while polls do work
      // (take long), and back to spinning when one did; give up after a run of idle polls.
      // The deadline is checked here too: on a loaded machine a poll that is merely
      // descheduled also takes long, and this loop must not outlive the deadline then.
      for (int idle = 0; idle < detail::mpi_idle_polls;) {
        const auto begin = std::chrono::steady_clock::now();
        if (poll()) return;
        if (limit.expired()) break;
        if (std::chrono::steady_clock::now() - begin > detail::mpi_busy_poll) {
          idle = 0;
          pause.reset();
        } else {
          ++idle;
        }
      }
    }
  });
}

inline bool mpi_completion::test() {
  if (requests_.all_null()) return true;
  state_->throw_if_failed(where());
  return state_->fail_on_error([this] { return poll(); });
}

inline error_context mpi_completion::where() const noexcept {
  switch (kind_) {
    case kind::send:
      return {.operation = "send", .rank = state_->rank(), .peer = peer_};
    case kind::recv:
      return {.operation = "recv", .rank = state_->rank(), .peer = peer_};
    case kind::barrier:
      break;
  }
  return {.operation = "barrier", .rank = state_->rank()};
}

inline std::string mpi_completion::describe() const {
  if (kind_ == kind::barrier) return "barrier";
  return std::string(where().operation) + " of " + std::to_string(bytes_) + " bytes";
}

inline bool mpi_completion::poll() {
  // One MPI_Test per piece rather than MPI_Testall: each piece's received size is checked as
  // it completes, and no array of statuses is needed. Pieces complete in order (MPI's
  // non-overtaking rule, one peer and tag), so a poll stops at the first one not done and the
  // next begins there: a message of many network pieces costs one test per poll, not one per
  // piece.
  for (; next_ < requests_.size(); ++next_) {
    MPI_Request& request = requests_[next_];
    if (request == MPI_REQUEST_NULL) continue;
    int flag = 0;
    MPI_Status status;
    const int code = MPI_Test(&request, &flag, &status);
    if (code != MPI_SUCCESS) {
      // Open MPI keeps a request that completed in error allocated; MPICH frees it.
      if (request != MPI_REQUEST_NULL) MPI_Request_free(&request);
      throw_failed_piece(code, next_);
    }
    if (flag == 0) return false;
    if (kind_ == kind::recv) check_received(status, next_);
  }
  return true;
}

inline void mpi_completion::throw_failed_piece(int code, std::size_t piece) const {
  const error_context where = this->where();
  int error_class = code;
  MPI_Error_class(code, &error_class);
  if (error_class == MPI_ERR_TRUNCATE) {
    throw mismatch_error(where, "the matching send is larger than the " + std::to_string(bytes_) +
                                    " bytes posted (piece " + std::to_string(piece) + ": " +
                                    detail::mpi_error_text(code) + ")");
  }
  throw error(
      std::error_code(code, mpi_category()), where,
      describe() + ", piece " + std::to_string(piece) + ": " + detail::mpi_error_text(code));
}

inline void mpi_completion::check_received(const MPI_Status& status, std::size_t piece) const {
  const error_context where = this->where();
  int received = 0;
  SQUALL_MPI_CHECK(MPI_Get_count(&status, MPI_BYTE, &received));
  const std::size_t expected = detail::mpi_piece(bytes_, piece_bytes_, piece).count;
  if (received == MPI_UNDEFINED || received < 0 || static_cast<std::size_t>(received) != expected) {
    throw mismatch_error(
        where, "piece " + std::to_string(piece) + " of a recv of " + std::to_string(bytes_) +
                   " bytes holds " + std::to_string(received) + " bytes, not " +
                   std::to_string(expected) + ": the matching send has another size");
  }
}

inline void mpi_completion::finish_quietly() noexcept {
  if (requests_.all_null()) return;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized != 0) return;  // MPI is gone, and its requests with it
  if (!state_->failed()) {
    try {
      wait();
      return;
    } catch (...) {  // NOLINT(bugprone-empty-catch): recorded in the state; destructors don't throw
    }
  }
  // The transport has failed, so the peer may never come: let go instead of waiting.
  for (MPI_Request& request : requests_) {
    if (request == MPI_REQUEST_NULL) continue;
    if (kind_ != kind::barrier) {
      MPI_Cancel(&request);
      MPI_Request_free(&request);
    }
    request = MPI_REQUEST_NULL;  // a barrier's request is dropped: it cannot be cancelled
  }
}

// ---- mpi_transport -------------------------------------------------------------------------

inline mpi_transport::mpi_transport(MPI_Comm comm, const options& opts,
                                    std::optional<std::size_t> network_piece_bytes) {
  const std::chrono::nanoseconds deadline = opts.resolved_deadline();
  network_piece_ =
      network_piece_bytes ? *network_piece_bytes : detail::mpi_network_piece_from_env();
  if (network_piece_ > max_piece_bytes) {
    throw invalid_argument({.operation = "mpi_transport"}, "network_piece_bytes " +
                                                               std::to_string(network_piece_) +
                                                               " is above max_piece_bytes (1 GiB)");
  }
  const error_context where{.operation = "mpi_transport"};
  int initialized = 0;
  int finalized = 0;
  SQUALL_MPI_CHECK(MPI_Initialized(&initialized));
  SQUALL_MPI_CHECK(MPI_Finalized(&finalized));
  if (initialized == 0 || finalized != 0) {
    throw invalid_argument(where, "MPI is not initialized, or already finalized");
  }
  if (comm == MPI_COMM_NULL) throw invalid_argument(where, "the communicator is MPI_COMM_NULL");
  int inter = 0;
  SQUALL_MPI_CHECK(MPI_Comm_test_inter(comm, &inter));
  if (inter != 0) throw invalid_argument(where, "the communicator is an intercommunicator");
  SQUALL_MPI_CHECK(MPI_Comm_dup(comm, &comm_));
  try {
    SQUALL_MPI_CHECK(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
    int rank = 0;
    int size = 0;
    SQUALL_MPI_CHECK(MPI_Comm_rank(comm_, &rank));
    SQUALL_MPI_CHECK(MPI_Comm_size(comm_, &size));
    state_ = std::make_shared<detail::mpi_state>(rank, size, deadline);
    find_remote();
  } catch (...) {
    MPI_Comm_free(&comm_);
    throw;
  }
}

inline mpi_transport& mpi_transport::operator=(mpi_transport&& other) noexcept {
  if (this != &other) {
    release();
    comm_ = std::exchange(other.comm_, MPI_COMM_NULL);
    state_ = std::move(other.state_);
    remote_ = std::move(other.remote_);
    network_piece_ = other.network_piece_;
  }
  return *this;
}

inline void mpi_transport::find_remote() {
  const error_context where{.operation = "mpi_transport", .rank = rank()};
  remote_.assign(static_cast<std::size_t>(size()), 1);
  MPI_Comm node = MPI_COMM_NULL;
  SQUALL_MPI_CHECK(MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, rank(), MPI_INFO_NULL, &node));
  MPI_Group all = MPI_GROUP_NULL;
  MPI_Group local = MPI_GROUP_NULL;
  int code = MPI_Comm_group(comm_, &all);
  if (code == MPI_SUCCESS) code = MPI_Comm_group(node, &local);
  int n = 0;
  if (code == MPI_SUCCESS) code = MPI_Group_size(local, &n);
  std::vector<int> in_node(static_cast<std::size_t>(n));
  std::vector<int> in_all(static_cast<std::size_t>(n));
  std::iota(in_node.begin(), in_node.end(), 0);
  if (code == MPI_SUCCESS) {
    code = MPI_Group_translate_ranks(local, n, in_node.data(), all, in_all.data());
  }
  if (local != MPI_GROUP_NULL) MPI_Group_free(&local);
  if (all != MPI_GROUP_NULL) MPI_Group_free(&all);
  MPI_Comm_free(&node);
  SQUALL_MPI_CHECK(code);
  for (const int r : in_all) {
    if (r >= 0 && r < size()) remote_[static_cast<std::size_t>(r)] = 0;
  }
}

inline void mpi_transport::release() noexcept {
  if (comm_ == MPI_COMM_NULL) return;
  int finalized = 0;
  MPI_Finalized(&finalized);
  // MPI_Comm_free only marks the communicator: operations in flight on it still complete.
  if (finalized == 0) MPI_Comm_free(&comm_);
  comm_ = MPI_COMM_NULL;
}

inline error_context mpi_transport::start(std::string_view operation, int peer) const {
  const error_context where{.operation = operation, .rank = rank(), .peer = peer};
  state_->throw_if_failed(where);
  if (peer < 0 || peer >= size()) {
    throw invalid_argument(
        where, "peer " + std::to_string(peer) + " is outside [0, " + std::to_string(size()) + ")");
  }
  return where;
}

inline mpi_completion mpi_transport::send(int peer, buffer_view<const std::byte> bytes) {
  const error_context where = start("send", peer);
  const std::size_t total = bytes.size_bytes();
  const std::size_t each = piece_bytes(peer);
  const int t = tag(peer, total);
  mpi_completion done(state_, mpi_completion::kind::send, peer, total, each);
  // If a post fails, `done` abandons the pieces already posted as it unwinds (failed state).
  state_->fail_on_error([&] {
    for (std::size_t i = 0; i < done.requests_.size(); ++i) {
      const detail::index_range piece = detail::mpi_piece(total, each, i);
      SQUALL_MPI_CHECK(MPI_Isend(bytes.data() + piece.begin, static_cast<int>(piece.count),
                                 MPI_BYTE, peer, t, comm_, &done.requests_[i]));
    }
  });
  return done;
}

inline mpi_completion mpi_transport::recv(int peer, buffer_view<std::byte> bytes) {
  const error_context where = start("recv", peer);
  const std::size_t total = bytes.size_bytes();
  const std::size_t each = piece_bytes(peer);
  const int t = tag(peer, total);
  mpi_completion done(state_, mpi_completion::kind::recv, peer, total, each);
  state_->fail_on_error([&] {
    for (std::size_t i = 0; i < done.requests_.size(); ++i) {
      const detail::index_range piece = detail::mpi_piece(total, each, i);
      SQUALL_MPI_CHECK(MPI_Irecv(bytes.data() + piece.begin, static_cast<int>(piece.count),
                                 MPI_BYTE, peer, t, comm_, &done.requests_[i]));
    }
  });
  return done;
}

inline mpi_completion mpi_transport::barrier() {
  const error_context where{.operation = "barrier", .rank = rank()};
  state_->throw_if_failed(where);
  mpi_completion done(state_, mpi_completion::kind::barrier, no_peer, 0, max_piece_bytes);
  state_->fail_on_error([&] { SQUALL_MPI_CHECK(MPI_Ibarrier(comm_, &done.requests_[0])); });
  return done;
}

}  // namespace squall
