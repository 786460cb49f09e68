// SPDX-License-Identifier: Apache-2.0
#pragma once
/// `shm_transport`: the processes of one host joined through POSIX shared memory, with no MPI
/// and no launcher needed. The embedded default transport.
///
/// Data moves through one-way channels, one per ordered pair of ranks: a ring of `slots`
/// slots of `slot_bytes`. A message is cut into slots; the sender copies into free slots while
/// the receiver copies out of full ones, so copying and signalling overlap (a pipeline two
/// copies deep). Every rank also exposes a window of `window_bytes` that all ranks map
/// (`peer_view`), so a schedule can reduce straight out of a peer's memory.
///
/// Progress is made by whichever call waits: `wait()` or `test()` on any completion advances
/// every pending send and receive of the transport, in posting order per peer (as MPI does),
/// so posting a send and a receive and then waiting on either never deadlocks.
///
/// Waiting spins briefly, then sleeps on a futex in the segment (this rank's doorbell), so 4
/// ranks on 2 cores do not starve each other. Every wait has the deadline of the options and
/// checks, at least every 100 ms, that the peers are alive: when one dies, every survivor gets
/// `peer_failure` naming it. A rank that gives up (timeout, mismatch) records it in the
/// segment, so its peers stop waiting for it too. A failed transport stays failed: every later
/// call throws at once; and before its error leaves, it closes this rank's memory to the
/// peers' cross-memory copies and waits out any in progress, so the caller may free its
/// buffers at once.

#include <squall/concepts.hpp>
#include <squall/core/buffer.hpp>
#include <squall/core/completion.hpp>
#include <squall/core/error.hpp>
#include <squall/core/link_costs.hpp>
#include <squall/core/options.hpp>
#include <squall/detail/math.hpp>
#include <squall/kernels/host/copy.hpp>
#include <squall/transport/detail/cross_memory.hpp>
#include <squall/transport/detail/shared_heap.hpp>
#include <squall/transport/detail/shm_registry.hpp>
#include <squall/transport/detail/shm_segment.hpp>

#include <sys/uio.h>  // process_vm_readv

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>  // getenv, strtoull
#include <cstring>  // memcpy
#include <deque>
#include <fstream>
#include <limits>
#include <memory>
#include <sched.h>  // sched_getaffinity, CPU_COUNT
#include <sstream>
#include <string>
#include <thread>
#include <unistd.h>
#include <utility>  // exchange
#include <vector>

namespace squall {

/// Who this process is in a shared-memory job: the job's name (shared by its ranks, unique
/// on the host), its rank and the number of ranks.
struct shm_job {
  std::string name;
  int rank = 0;
  int size = 1;
  /// The job's key: rank 0 writes it into the segment and every other rank must find its own
  /// there, so two jobs that share a name never merge (`mismatch_error`). 0: none (a job
  /// without a key only joins a segment made without one).
  std::uint64_t key = 0;

  /// From `SQUALL_JOB`, `SQUALL_RANK`, `SQUALL_WORLD_SIZE` and `SQUALL_JOB_KEY` (set by
  /// `squall-run` and `squall::launch`; without `SQUALL_JOB` the name is "job-" and the
  /// parent's pid, so ranks started by one shell or script share it and other jobs do not);
  /// else from Open MPI's launcher (`OMPI_COMM_WORLD_LOCAL_RANK`, `..._LOCAL_SIZE`, job id)
  /// or MPICH's Hydra (`MPI_LOCALRANKID`, `MPI_LOCALNRANKS`), so the same binary runs under
  /// `mpiexec`; there the key is derived from the job id (Open MPI) or the proxy's pid and
  /// start time (Hydra); else from torchrun's (`LOCAL_RANK`, `LOCAL_WORLD_SIZE`, named and
  /// keyed by `TORCHELASTIC_RUN_ID` and `MASTER_ADDR:MASTER_PORT`). Throws `invalid_argument`
  /// naming the variables when none are set or they are malformed.
  static shm_job from_environment() {
    const auto get = [](const char* name) -> const char* { return std::getenv(name); };
    if (get("SQUALL_RANK") != nullptr || get("SQUALL_WORLD_SIZE") != nullptr) {
      const char* name = get("SQUALL_JOB");
      shm_job job =
          make(name != nullptr ? name : "job-" + std::to_string(getppid()), get("SQUALL_RANK"),
               get("SQUALL_WORLD_SIZE"), "SQUALL_JOB/SQUALL_RANK/SQUALL_WORLD_SIZE");
      if (const char* key = get("SQUALL_JOB_KEY"); key != nullptr) {
        char* end = nullptr;
        job.key = std::strtoull(key, &end, 16);
        if (*key == '\0' || *end != '\0') {
          throw invalid_argument({.operation = "shm_job"},
                                 "SQUALL_JOB_KEY='" + std::string(key) + "' is not a hex number");
        }
      }
      return job;
    }
    if (get("OMPI_COMM_WORLD_LOCAL_RANK") != nullptr) {
      const char* id = get("OMPI_MCA_ess_base_jobid");
      if (id == nullptr) id = get("PMIX_NAMESPACE");
      const std::string job_id = id != nullptr ? id : std::to_string(getppid());
      shm_job job = make("ompi-" + job_id, get("OMPI_COMM_WORLD_LOCAL_RANK"),
                         get("OMPI_COMM_WORLD_LOCAL_SIZE"),
                         "OMPI_COMM_WORLD_LOCAL_RANK/OMPI_COMM_WORLD_LOCAL_SIZE");
      job.key = key_of(job_id + "/" + std::to_string(getppid()));
      return job;
    }
    if (get("MPI_LOCALRANKID") != nullptr) {
      // Hydra starts the ranks of a host from one proxy: its pid names the job there, and its
      // pid with its start time (a pid is reused, the pair is not) keys it.
      shm_job job = make("hydra-" + std::to_string(getppid()), get("MPI_LOCALRANKID"),
                         get("MPI_LOCALNRANKS"), "MPI_LOCALRANKID/MPI_LOCALNRANKS");
      job.key = key_of("hydra/" + std::to_string(getppid()) + "/" + start_time_of(getppid()));
      return job;
    }
    if (get("TORCHELASTIC_RUN_ID") != nullptr && get("LOCAL_RANK") != nullptr) {
      // torchrun: the ranks of this host, named by the run id and the rendezvous address.
      const std::string run = get("TORCHELASTIC_RUN_ID");
      const char* address = get("MASTER_ADDR");
      const char* port = get("MASTER_PORT");
      const std::string where =
          std::string(address != nullptr ? address : "") + ":" + (port != nullptr ? port : "");
      std::string tag;
      for (char c : run + "-" + std::to_string(key_of(where) & 0xffffffu)) {
        const bool plain = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                           (c >= '0' && c <= '9') || c == '-' || c == '_' || c == '.';
        tag += plain ? c : '_';
      }
      shm_job job = make("torch-" + tag.substr(0, 150), get("LOCAL_RANK"), get("LOCAL_WORLD_SIZE"),
                         "LOCAL_RANK/LOCAL_WORLD_SIZE");
      job.key = key_of("torch/" + run + "/" + where);
      return job;
    }
    throw invalid_argument({.operation = "shm_job"},
                           "no job in the environment: set SQUALL_JOB, SQUALL_RANK and "
                           "SQUALL_WORLD_SIZE, or start the program with squall-run, mpiexec "
                           "or torchrun");
  }

  /// Checks the fields: a job name of letters, digits, '-', '_', '.' (1 to 200 characters),
  /// `0 <= rank < size`. Throws `invalid_argument`.
  void validate() const {
    const bool good_name =
        !name.empty() && name.size() <= 200 && std::all_of(name.begin(), name.end(), [](char c) {
          return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                 c == '-' || c == '_' || c == '.';
        });
    if (!good_name) {
      throw invalid_argument({.operation = "shm_job", .rank = rank},
                             "job name '" + name + "' must be 1-200 of [A-Za-z0-9._-]");
    }
    if (size < 1 || rank < 0 || rank >= size) {
      throw invalid_argument(
          {.operation = "shm_job", .rank = rank},
          "rank " + std::to_string(rank) + " of " + std::to_string(size) + " ranks");
    }
  }

  /// A job key from text that names one job (64-bit FNV-1a, never 0).
  static std::uint64_t key_of(const std::string& text) {
    const std::uint64_t h = detail::fnv1a64(text.data(), text.size());
    return h == 0 ? 1 : h;
  }

 private:
  // Field 22 of /proc/<pid>/stat, the process's start time in clock ticks since boot ("" if
  // unreadable): with the pid, it names one process.
  static std::string start_time_of(pid_t pid) {
    std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
    std::string line;
    if (!std::getline(stat, line)) return {};
    const auto paren = line.rfind(')');
    if (paren == std::string::npos) return {};
    std::istringstream fields(line.substr(paren + 2));
    std::string field;
    for (int i = 3; i <= 22 && fields >> field; ++i) {
      if (i == 22) return field;
    }
    return {};
  }

  static shm_job make(std::string name, const char* rank, const char* size, const char* source) {
    const auto number = [&](const char* text) {
      char* end = nullptr;
      const long value = text != nullptr ? std::strtol(text, &end, 10) : -1;
      if (text == nullptr || *text == '\0' || *end != '\0' || value < 0 || value > 1'000'000) {
        throw invalid_argument({.operation = "shm_job"},
                               std::string(source) + " must be set to non-negative integers");
      }
      return static_cast<int>(value);
    };
    shm_job job{std::move(name), number(rank), number(size)};
    job.validate();
    return job;
  }
};

/// The slots per channel of `shm_config::slots` 0 for `size` ranks: 256 / size, from 4 to 32.
constexpr std::size_t automatic_slots(int size) {
  const std::size_t by_size = std::size_t{256} / static_cast<std::size_t>(size < 1 ? 1 : size);
  return by_size < 4 ? 4 : by_size > 32 ? 32 : by_size;
}

/// Sizes of the shared-memory segment; every rank of a job must use the same values. The
/// segment holds P^2 channels of `slots` x `slot_bytes` and P windows of `window_bytes`
/// (`detail::shm::geometry::total_bytes`); rank 0 refuses, naming the sizes, a job whose
/// segment is larger than what /dev/shm has free.
struct shm_config {
  /// Bytes per channel slot (a 16-byte header included): the pipelining granularity.
  std::size_t slot_bytes = std::size_t{64} << 10;
  /// Slots per one-way channel; a sender runs at most this many slots (or single-copy
  /// messages) ahead. 0 (automatic): 256 / P, from 4 to 32 (`automatic_slots`), so that the
  /// segment's P^2 channels take 16 MiB x P for 8 <= P <= 64 instead of growing as P^2.
  std::size_t slots = 0;
  /// Bytes each rank exposes to all ranks for direct access (`peer_view`).
  std::size_t window_bytes = std::size_t{4} << 20;
  /// Messages of at least this many bytes move in one copy: the receiver reads them straight
  /// from the sender's memory (Linux cross-memory attach, `process_vm_readv`), when every
  /// pair of ranks may do so (checked when the job forms). 0 turns it off.
  std::size_t single_copy_bytes = std::size_t{64} << 10;
  /// Rank 0 starts a small detached process when it creates the segment, which removes the
  /// segment's name from /dev/shm if rank 0 dies before every rank attached (so a job killed
  /// during start-up, by `mpiexec` or anything else, leaves nothing behind) and ends once the
  /// name is gone. Off: only `launch` and `squall-run` clean up after such a job.
  bool reaper = true;
};

namespace detail::shm {

/// One posted send or receive.
struct operation {
  bool is_send = false;
  std::byte* recv_data = nullptr;
  const std::byte* send_data = nullptr;
  std::size_t bytes = 0;
  std::size_t done = 0;  ///< bytes moved so far
  bool started = false;  ///< a first slot has moved (zero-byte messages take one slot)
  bool complete = false;
  int peer = 0;
  std::uint32_t ticket = 0;  ///< single-copy sends: complete once the peer acked this many
};

/// The transport's state, on the heap so that completions can point at it across moves.
struct state {
  state(const shm_job& job, const options& opts, const shm_config& config)
      : budget(opts.resolved_deadline()),
        rank(job.rank),
        size(job.size),
        seg(job.name, job.rank, job.key, shape_of(job, config), deadline(budget), config.reaper),
        sends(static_cast<std::size_t>(job.size)),
        recvs(static_cast<std::size_t>(job.size)),
        payload(config.slot_bytes - sizeof(slot_header)),
        single_copy_bytes(config.single_copy_bytes),
        awaiting_ack(static_cast<std::size_t>(job.size)),
        tickets(static_cast<std::size_t>(job.size), 0) {
    last_liveness_check = std::chrono::steady_clock::now();
    if (single_copy_bytes != 0) single_copy = probe_single_copy(deadline(budget));
    spins = size > usable_cpus() ? oversubscribed_spins : 512;
  }

  /// The CPUs this process may run on.
  static int usable_cpus() {
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof set, &set) != 0) return 1;
    return CPU_COUNT(&set);
  }

  static geometry shape_of(const shm_job& job, const shm_config& config) {
    job.validate();
    if (config.slot_bytes <= sizeof(slot_header) || config.slot_bytes % 64 != 0) {
      throw invalid_argument({.operation = "shm_config", .rank = job.rank},
                             "slot_bytes must be a multiple of 64 above 16");
    }
    const std::size_t slots = config.slots != 0 ? config.slots : automatic_slots(job.size);
    return {job.size, config.slot_bytes, slots, align_up(config.window_bytes, 4096)};
  }

  std::chrono::nanoseconds budget;
  /// Pauses a wait spins before it yields: 512 (about 30 us) when every rank has a CPU of its
  /// own; `oversubscribed_spins` when ranks outnumber CPUs, where spinning only burns the time
  /// slice of the rank being waited for. Measured with squall-bench -n 4 on 2 CPUs, 4 KiB
  /// direct allreduce: see docs/performance.md.
  int spins = 512;
  static constexpr int oversubscribed_spins = 8;
  int rank;
  int size;
  segment seg;
  std::vector<std::deque<std::shared_ptr<operation>>> sends;
  std::vector<std::deque<std::shared_ptr<operation>>> recvs;
  std::size_t payload;
  std::string failed;  ///< empty while healthy; else why this transport failed
  std::uint32_t barrier_generation = 0;
  /// The note this rank's next barrier writes (`shm_transport::note_next_barrier`).
  std::uint32_t next_note = 0;
  unsigned next_note_parity = 0;
  bool note_pending = false;
  std::chrono::steady_clock::time_point last_liveness_check;
  std::size_t single_copy_bytes;
  bool single_copy = false;
  /// Single-copy sends published to each peer, waiting for its acknowledgement.
  std::vector<std::deque<std::shared_ptr<operation>>> awaiting_ack;
  std::vector<std::uint32_t> tickets;
  /// Registered memory (`shm_transport::register_memory`), shared with its handles.
  std::shared_ptr<registry> registered = std::make_shared<registry>(rank);
  /// This rank's mappings of its peers' shared-heap memory (`shared_heap`).
  heap_mappings heap_mapped{size};
  std::uint64_t registrations = 0;    ///< registrations made, the same count on every rank
  std::uint64_t mapped_accesses = 0;  ///< `with_peer` calls
  /// The word every peer reads once, at setup, to learn whether it may read our memory.
  std::uint64_t probe = probe_value;

  /// Every rank tries to read every peer's probe word with process_vm_readv (ptrace rules
  /// may forbid it), publishes its verdict, and all use single-copy only if all succeeded.
  bool probe_single_copy(const deadline& limit) {
    const error_context where{.operation = "shm attach", .rank = rank};
    rank_words& me = seg.rank(rank);
    me.probe_address.store(reinterpret_cast<std::uint64_t>(&probe), std::memory_order_release);
    const auto wait_all = [&](auto ready) {
      backoff pause;
      for (int r = 0; r < size; ++r) {
        while (!ready(seg.rank(r))) {
          if (limit.expired()) {
            throw timeout_error(where, "rank " + std::to_string(r) +
                                           " did not finish setup within " + limit.describe());
          }
          pause.pause();
        }
      }
    };
    wait_all(
        [](const rank_words& w) { return w.probe_address.load(std::memory_order_acquire) != 0; });
    std::uint32_t verdict = 1;
    for (int r = 0; r < size; ++r) {
      std::uint64_t value = 0;
      const rank_words& peer = seg.rank(r);
      if (read_peer(peer.pid.load(), &value, peer.probe_address.load(), sizeof(value)) !=
              static_cast<long>(sizeof(value)) ||
          value != probe_value) {
        verdict = 2;
      }
    }
    me.single_copy.store(verdict, std::memory_order_release);
    wait_all(
        [](const rank_words& w) { return w.single_copy.load(std::memory_order_acquire) != 0; });
    bool all = true;
    for (int r = 0; r < size; ++r) all = all && seg.rank(r).single_copy.load() == 1;
    return all;
  }

  static long read_peer(std::int32_t pid, void* into, std::uint64_t from, std::size_t bytes) {
    iovec local{into, bytes};
    iovec remote{reinterpret_cast<void*>(from), bytes};
    return static_cast<long>(process_vm_readv(pid, &local, 1, &remote, 1, 0));
  }

  header& head() const { return seg.head(); }

  /// Wakes rank `r` if it sleeps. The caller has just published something (a slot, a tail,
  /// a barrier generation, a failure). Dekker-style with `wait`: the sleeper stores
  /// `sleeping = 1`, then re-checks for work; we publish, fence, then read `sleeping`. One of
  /// the two sees the other, so either the sleeper finds the work or we bump its doorbell
  /// (which its FUTEX_WAIT compares against) and wake it. No read-modify-write otherwise.
  void ring(int r) const {
    rank_words& w = seg.rank(r);
    std::atomic_thread_fence(std::memory_order_seq_cst);
    if (w.sleeping.load(std::memory_order_relaxed) != 0) {
      w.doorbell.fetch_add(1);
      futex_wake_all(w.doorbell);
    }
  }
  void ring_all() const {
    for (int r = 0; r < size; ++r) ring(r);
  }

  /// Closes this rank's memory to the peers (issue 15: no use after failure): sets its
  /// `revoked` word, then waits until no peer is inside a cross-memory copy of it. A peer
  /// checks the word after raising its `touching` flag and before every copy (`copy_with_peer`), so
  /// once this returns no peer reads or writes this rank's buffers again, and the caller may
  /// free them. A copy takes milliseconds (`copy_piece`); a peer still holding its flag after
  /// `revoke_grace` while stopped (SIGSTOP, a debugger) is killed (SIGKILL): the job has
  /// failed, and letting it resume would write into memory this rank is about to reuse. One
  /// that runs (starved of CPU) is waited for, up to `revoke_limit`. A dead peer touches
  /// nothing.
  void revoke() noexcept {
    if (seg.rank(rank).revoked.exchange(1) != 0) return;
    for (int p = 0; p < size; ++p) {
      if (p == rank) continue;
      const std::atomic<std::uint32_t>& flag = seg.channel(p, rank).touching;
      const std::int32_t pid = seg.rank(p).pid.load();
      const deadline grace(revoke_grace);
      const deadline limit(revoke_limit);
      backoff pause;
      while (flag.load() != 0 && process_alive(pid) && !limit.expired()) {
        if (grace.expired() && process_state(pid) == 'T') kill(pid, SIGKILL);
        pause.pause();
      }
    }
  }
  static constexpr std::chrono::milliseconds revoke_grace{250};
  static constexpr std::chrono::seconds revoke_limit{10};

  /// One cross-memory copy of at most `copy_piece` bytes between `local` and address `remote`
  /// of `peer` (`write`: into the peer), run with this rank's `touching` flag raised, unless
  /// `peer` has closed its memory: then throws `peer_failure` with what `peer` recorded.
  /// Returns the bytes moved (> 0); a dead peer gives `peer_failure`, any other error the
  /// system's, both leaving this transport failed. The kernel's slow case (a destination 1-31 bytes
  /// after the source modulo 4 KiB) goes through `cross`'s bounce buffer.
  std::size_t copy_with_peer(int peer, const error_context& where, std::byte* local,
                             std::uint64_t remote, std::size_t bytes, bool write) {
    touch(peer, where);
    const pid_t pid = seg.rank(peer).pid.load();
    const ssize_t got = cross.copy(pid, local, remote, std::min(bytes, copy_piece), write);
    const int err = errno;
    untouch(peer);
    if (got <= 0) {
      if (err == ESRCH) {
        give_up(peer_failure(where, "rank " + std::to_string(peer) + " died"), failure::died, peer);
      }
      give_up(error(std::error_code(err, shm_category()), where,
                    write ? "process_vm_writev" : "process_vm_readv"),
              failure::gave_up, rank);
    }
    return static_cast<std::size_t>(got);
  }
  cross_memory cross;  ///< `copy_with_peer`'s copies (and bounce buffer)
  /// Raises this rank's `touching` flag on `peer` before it reads or writes the peer's
  /// memory, unless `peer` has closed its memory: then throws `peer_failure` with what `peer`
  /// recorded, leaving this transport failed. `untouch` lowers it.
  void touch(int peer, const error_context& where) {
    std::atomic<std::uint32_t>& flag = seg.channel(rank, peer).touching;
    flag.store(1);  // seq_cst: ordered before the read of `revoked` (Dekker with `revoke`)
    if (seg.rank(peer).revoked.load() != 0) {
      flag.store(0);
      check_peers(where, true);  // a rank records its failure before it revokes
      give_up(peer_failure(where, "rank " + std::to_string(peer) + " closed its memory"),
              failure::gave_up, peer);
    }
  }
  void untouch(int peer) { seg.channel(rank, peer).touching.store(0, std::memory_order_release); }

  /// The most one cross-memory copy moves, so that a failing peer waits at most one piece.
  static constexpr std::size_t copy_piece = std::size_t{16} << 20;

  /// Marks this transport failed and records `culprit` (and why) in the segment for the
  /// peers, once: the first record stands. Then closes this rank's memory (`revoke`).
  void record_failure(const std::string& why, failure kind, int culprit) noexcept {
    failed = why;
    std::int32_t none = -1;
    // claim the record (-2: being written), write the reason and kind, then publish
    if (head().failed_rank.compare_exchange_strong(none, -2)) {
      const std::size_t n = std::min(why.size(), sizeof(head().failure_reason) - 1);
      std::memcpy(head().failure_reason, why.data(), n);
      head().failure_reason[n] = '\0';
      head().failure_kind.store(static_cast<std::uint32_t>(kind));
      head().failed_rank.store(culprit, std::memory_order_release);
    }
    ring_all();
    revoke();
  }

  /// Marks this transport failed, records it in the segment for the peers, and throws `e`.
  template <class Error>
  [[noreturn]] void give_up(Error e, failure kind, int culprit) {
    record_failure(e.what(), kind, culprit);
    throw e;
  }

  void check_healthy(const error_context& where) const {
    if (!failed.empty()) throw peer_failure(where, "transport already failed: " + failed);
  }

  /// Whether this rank's pending work still needs `peer`: a send to it or a receive from it
  /// not complete, a single-copy send it has not acknowledged, or a barrier not complete
  /// (which needs every rank).
  bool needs(int peer) const {
    const auto p = static_cast<std::size_t>(peer);
    if (!sends[p].empty() || !recvs[p].empty() || !awaiting_ack[p].empty()) return true;
    return barrier_generation != seg.head().barrier_generation.load(std::memory_order_acquire);
  }

  /// Throws `peer_failure` if a rank recorded a failure, or (at most every 100 ms, or when
  /// `force`) if a peer process this rank's pending work needs is gone: a peer that exited
  /// after its part of the last operation is not a failure.
  void check_peers(const error_context& where, bool force) {
    const std::int32_t culprit = head().failed_rank.load();
    if (culprit >= 0) {
      const auto kind = static_cast<failure>(head().failure_kind.load());
      char reason[sizeof(head().failure_reason)] = {};
      std::memcpy(reason, head().failure_reason, sizeof reason - 1);
      const std::string what =
          kind == failure::died
              ? "rank " + std::to_string(culprit) + " died"
              : "rank " + std::to_string(culprit) + " failed and left" +
                    (reason[0] != '\0' ? std::string(": ") + reason : std::string());
      error_context at = where;
      at.peer = culprit;
      failed = what;
      revoke();
      throw peer_failure(at, what);
    }
    const auto now = std::chrono::steady_clock::now();
    if (!force && now - last_liveness_check < std::chrono::milliseconds(100)) return;
    last_liveness_check = now;
    for (int r = 0; r < size; ++r) {
      if (r == rank || !needs(r)) continue;
      const std::int32_t pid = seg.rank(r).pid.load();
      if (!process_alive(pid)) {
        error_context at = where;
        at.peer = r;
        give_up(peer_failure(
                    at, "rank " + std::to_string(r) + " (pid " + std::to_string(pid) + ") died"),
                failure::died, r);
      }
    }
  }

  // step: move slots of the first pending send to each peer while its channel has room.
  bool push_sends() {
    bool moved = false;
    for (int peer = 0; peer < size; ++peer) {
      auto& queue = sends[static_cast<std::size_t>(peer)];
      if (queue.empty()) continue;
      channel_words& ch = seg.channel(rank, peer);
      std::uint32_t head_seq = ch.head.load(std::memory_order_relaxed);
      const std::uint32_t tail_seq = ch.tail.load(std::memory_order_acquire);
      bool pushed = false;
      while (!queue.empty() && head_seq - tail_seq < seg.shape().slots) {
        operation& op = *queue.front();
        std::byte* slot = seg.slot(rank, peer, head_seq);
        if (single_copy && !op.started && op.bytes >= single_copy_bytes) {
          // One slot carries where the data is; the receiver copies it and acknowledges.
          const slot_header sh{op.bytes, head_seq, reinterpret_cast<std::uint64_t>(op.send_data),
                               0};
          std::memcpy(slot, &sh, sizeof(sh));
          op.started = true;
          op.done = op.bytes;
          op.ticket = ++tickets[static_cast<std::size_t>(peer)];
          ++head_seq;
          ch.head.store(head_seq, std::memory_order_release);
          pushed = true;
          awaiting_ack[static_cast<std::size_t>(peer)].push_back(std::move(queue.front()));
          queue.pop_front();
          continue;
        }
        const std::size_t chunk = std::min(payload, op.bytes - op.done);
        const slot_header sh{op.bytes, head_seq, 0, 0};
        std::memcpy(slot, &sh, sizeof(sh));
        kernels::copy_bytes(slot + sizeof(slot_header), op.send_data + op.done, chunk);
        op.done += chunk;
        op.started = true;
        ++head_seq;
        ch.head.store(head_seq, std::memory_order_release);
        pushed = true;
        if (op.done == op.bytes) {
          op.complete = true;
          queue.pop_front();
        }
      }
      if (pushed) {
        ring(peer);
        moved = true;
      }
    }
    return moved;
  }

  // step: copy full slots from each peer into the first pending receive from it.
  bool pull_recvs() {
    bool moved = false;
    for (int peer = 0; peer < size; ++peer) {
      auto& queue = recvs[static_cast<std::size_t>(peer)];
      if (queue.empty()) continue;
      channel_words& ch = seg.channel(peer, rank);
      std::uint32_t tail_seq = ch.tail.load(std::memory_order_relaxed);
      const std::uint32_t head_seq = ch.head.load(std::memory_order_acquire);
      bool pulled = false;
      while (!queue.empty() && tail_seq != head_seq) {
        operation& op = *queue.front();
        const std::byte* slot = seg.slot(peer, rank, tail_seq);
        slot_header sh{};
        std::memcpy(&sh, slot, sizeof(sh));
        if (sh.message_bytes != op.bytes || sh.sequence != tail_seq) {
          give_up(mismatch_error({.operation = "recv", .rank = rank, .peer = peer},
                                 "expected a message of " + std::to_string(op.bytes) +
                                     " bytes, the peer sent " + std::to_string(sh.message_bytes)),
                  failure::gave_up, rank);
        }
        if (sh.source_address != 0) {
          if (!read_single_copy(peer, op, sh.source_address)) break;  // more next time
          ++tail_seq;
          ch.tail.store(tail_seq, std::memory_order_release);
          ch.acked.fetch_add(1, std::memory_order_release);
          op.complete = true;
          queue.pop_front();
          pulled = true;
          continue;
        }
        const std::size_t chunk = std::min(payload, op.bytes - op.done);
        kernels::copy_bytes(op.recv_data + op.done, slot + sizeof(slot_header), chunk);
        op.done += chunk;
        op.started = true;
        ++tail_seq;
        ch.tail.store(tail_seq, std::memory_order_release);
        pulled = true;
        if (op.done == op.bytes) {
          op.complete = true;
          queue.pop_front();
        }
      }
      if (pulled) {
        ring(peer);
        moved = true;
      }
    }
    return moved;
  }

  /// Reads up to `copy_piece` bytes of a single-copy message from `peer`'s memory into `op`;
  /// true when all of it is in. Bounded per call so that waits keep checking deadlines and
  /// failures, and a failing sender waits at most one piece.
  bool read_single_copy(int peer, operation& op, std::uint64_t source) {
    op.done += copy_with_peer(peer, {.operation = "recv", .rank = rank, .peer = peer},
                              op.recv_data + op.done, source + op.done, op.bytes - op.done, false);
    op.started = true;
    return op.done == op.bytes;
  }

  // step: complete the single-copy sends each peer has acknowledged.
  bool collect_acks() {
    bool moved = false;
    for (int peer = 0; peer < size; ++peer) {
      auto& queue = awaiting_ack[static_cast<std::size_t>(peer)];
      if (queue.empty()) continue;
      const std::uint32_t acked = seg.channel(rank, peer).acked.load(std::memory_order_acquire);
      while (!queue.empty() && static_cast<std::int32_t>(acked - queue.front()->ticket) >= 0) {
        queue.front()->complete = true;
        queue.pop_front();
        moved = true;
      }
    }
    return moved;
  }

  bool progress() {
    const bool sent = push_sends();
    const bool received = pull_recvs();
    const bool acked = single_copy && collect_acks();
    return sent || received || acked;
  }

  /// Sleeps on this rank's doorbell until it rings (something was published for this rank)
  /// or `at_most` has passed; returns at once if work moves first (the Dekker pairing of
  /// `ring`).
  void idle(std::chrono::nanoseconds at_most) {
    rank_words& me = seg.rank(rank);
    const std::uint32_t bell = me.doorbell.load();
    me.sleeping.store(1);
    std::atomic_thread_fence(std::memory_order_seq_cst);
    if (!progress()) futex_wait(me.doorbell, bell, at_most);
    me.sleeping.store(0);
  }

  /// Advances everything until `done()`: spins a little, then sleeps on this rank's doorbell,
  /// checking the failure word at every turn and the peers' liveness at every wake-up.
  template <class Done>
  void wait(Done&& done, const error_context& where, std::string_view what) {
    check_healthy(where);
    const deadline limit(budget);
    rank_words& me = seg.rank(rank);
    // Spin `spins` pauses, then yield for up to `yield_before_sleep` (an oversubscribed peer
    // gets the core; on an idle machine we stay awake for the next message), then sleep on the
    // futex until the doorbell rings. Any progress starts the sequence again.
    enum class phase { spinning, yielding, sleeping };
    phase now = phase::spinning;
    int spun = 0;
    std::chrono::steady_clock::time_point yielding_since{};
    for (;;) {
      if (progress()) {
        now = phase::spinning;
        spun = 0;
      }
      if (done()) return;
      if (head().failed_rank.load(std::memory_order_relaxed) >= 0) check_peers(where, true);
      if (now == phase::spinning) {
        if (++spun < spins) {
          cpu_relax();
          continue;
        }
        now = phase::yielding;
        yielding_since = std::chrono::steady_clock::now();
      }
      if (now == phase::yielding) {
        if (std::chrono::steady_clock::now() - yielding_since < yield_before_sleep) {
          std::this_thread::yield();
          continue;
        }
        now = phase::sleeping;
      }
      const std::uint32_t bell = me.doorbell.load();
      me.sleeping.store(1);
      std::atomic_thread_fence(std::memory_order_seq_cst);
      if (!progress() && !done()) {
        check_peers(where, false);
        const auto left = limit.remaining();
        if (left.count() == 0) {
          me.sleeping.store(0);
          check_peers(where, true);
          give_up(timeout_error(where,
                                std::string(what) + " did not complete within " + limit.describe()),
                  failure::gave_up, rank);
        }
        futex_wait(me.doorbell, bell,
                   std::min<std::chrono::nanoseconds>(left, std::chrono::milliseconds(100)));
      }
      me.sleeping.store(0);
    }
  }
};

}  // namespace detail::shm

/// The handle of a send, receive or barrier on `shm_transport`. Move-only. A pending
/// completion's destructor waits for it (errors are not thrown from the destructor; they
/// left the transport failed, and the next call reports them).
class shm_completion {
 public:
  shm_completion(shm_completion&& other) noexcept
      : state_(std::exchange(other.state_, nullptr)),
        op_(std::move(other.op_)),
        barrier_target_(other.barrier_target_),
        what_(other.what_) {}
  shm_completion& operator=(shm_completion&& other) noexcept {
    if (this != &other) {
      finish_quietly();
      state_ = std::exchange(other.state_, nullptr);
      op_ = std::move(other.op_);
      barrier_target_ = other.barrier_target_;
      what_ = other.what_;
    }
    return *this;
  }
  shm_completion(const shm_completion&) = delete;
  shm_completion& operator=(const shm_completion&) = delete;
  ~shm_completion() { finish_quietly(); }

  /// Blocks until done; throws `timeout_error`, `peer_failure` or `mismatch_error`.
  void wait() {
    if (state_ == nullptr) return;
    state_->wait([this] { return finished(); }, where(), what_);
    state_ = nullptr;
  }

  /// Advances the transport once; true when done (then `wait()` returns at once).
  bool test() {
    if (state_ == nullptr) return true;
    state_->check_healthy(where());
    state_->progress();
    state_->check_peers(where(), false);
    if (!finished()) return false;
    state_ = nullptr;
    return true;
  }

 private:
  friend class shm_transport;
  shm_completion(detail::shm::state* state, std::shared_ptr<detail::shm::operation> op,
                 const char* what)
      : state_(state), op_(std::move(op)), what_(what) {}
  shm_completion(detail::shm::state* state, std::uint32_t barrier_target)
      : state_(state), barrier_target_(barrier_target), what_("barrier") {}

  bool finished() const {
    if (op_) return op_->complete;
    return state_->head().barrier_generation.load(std::memory_order_acquire) == barrier_target_;
  }
  error_context where() const {
    return {.operation = what_, .rank = state_->rank, .peer = op_ ? op_->peer : no_peer};
  }
  void finish_quietly() noexcept {
    if (state_ == nullptr || !state_->failed.empty()) return;
    try {
      wait();
    } catch (...) {  // recorded in the transport's failed state; reported by the next call
    }
  }

  detail::shm::state* state_ = nullptr;
  std::shared_ptr<detail::shm::operation> op_;
  std::uint32_t barrier_target_ = 0;
  const char* what_ = "";
};

/// Moves bytes between the processes of one host through POSIX shared memory. See the top
/// of this file for how; `shm_job` for how a process finds its job.
class shm_transport {
 public:
  using memory_space = host_memory;

  /// What `automatic_topology` predicts with before any calibration: one host's memory,
  /// peers reached at once through their mapped buffers; alpha and beta from squall-bench on
  /// the 2-core machine (docs/performance.md: a 4 KiB one-shot allreduce about 2 us, memcpy
  /// about 11 GB/s per rank with every rank copying).
  static constexpr link_costs costs{
      .alpha = 1e-6, .beta = 1.0 / 11e9, .gamma = 1.0 / 8e9, .all_peers_at_once = true};

  /// Joins job `job`: rank 0 creates the segment, the others attach; returns once all
  /// `job.size` ranks are in. Throws `timeout_error` naming the missing ranks at the deadline,
  /// `squall::error` (shm category) if the name is taken by a live job or /dev/shm is full.
  explicit shm_transport(const shm_job& job, const options& opts = {},
                         const shm_config& config = {})
      : state_(std::make_unique<detail::shm::state>(job, opts, config)) {}
  /// Joins the job described by the environment (`shm_job::from_environment()`).
  shm_transport() : shm_transport(shm_job::from_environment()) {}

  int rank() const { return state_->rank; }
  int size() const { return state_->size; }
  std::chrono::nanoseconds deadline() const { return state_->budget; }

  /// Starts sending `bytes` to `peer`. The data is copied out of `bytes` before the
  /// completion is done; messages to one peer arrive in posting order.
  [[nodiscard]] shm_completion send(int peer, buffer_view<const std::byte> bytes) {
    check_peer("send", peer);
    auto op = std::make_shared<detail::shm::operation>();
    op->is_send = true;
    op->send_data = bytes.data();
    op->bytes = bytes.count();
    op->peer = peer;
    state_->sends[static_cast<std::size_t>(peer)].push_back(op);
    state_->push_sends();
    return {state_.get(), std::move(op), "send"};
  }

  /// Starts receiving exactly `bytes.count()` bytes from `peer`; a message of another size
  /// gives `mismatch_error`.
  [[nodiscard]] shm_completion recv(int peer, buffer_view<std::byte> bytes) {
    check_peer("recv", peer);
    auto op = std::make_shared<detail::shm::operation>();
    op->recv_data = bytes.data();
    op->bytes = bytes.count();
    op->peer = peer;
    state_->recvs[static_cast<std::size_t>(peer)].push_back(op);
    state_->pull_recvs();
    return {state_.get(), std::move(op), "recv"};
  }

  /// Leaves the job after an error on this rank inside a collective (the communicator calls
  /// it): records this rank and `why` in the segment, so that every peer's pending and later
  /// calls fail at once with `peer_failure` ("rank R failed and left: why") instead of waiting
  /// to their deadlines; every later call here fails too. Does nothing on a transport that
  /// has failed already (its failure is recorded).
  void abandon(std::string_view why) noexcept {
    if (!state_->failed.empty()) return;
    try {
      state_->record_failure(std::string(why), detail::shm::failure::gave_up, rank());
    } catch (...) {  // NOLINT(bugprone-empty-catch): a string that cannot be made: nothing to say
    }
  }

  /// Completes once every rank has entered this barrier (one counter and generation in the
  /// segment; reusable).
  [[nodiscard]] shm_completion barrier() {
    state_->check_healthy({.operation = "barrier", .rank = rank()});
    auto& head = state_->head();
    if (state_->note_pending) {  // published by the arrival below
      state_->note_pending = false;
      head.barrier_notes[state_->next_note_parity][rank()].store(state_->next_note,
                                                                 std::memory_order_relaxed);
    }
    const std::uint32_t target = ++state_->barrier_generation;
    if (head.barrier_arrived.fetch_add(1) + 1 == static_cast<std::uint32_t>(size())) {
      head.barrier_arrived.store(0);
      head.barrier_generation.store(target, std::memory_order_release);
      state_->ring_all();
    }
    return {state_.get(), target};
  }

  /// Whether this job's barriers carry notes (`note_next_barrier`): up to
  /// `detail::shm::noted_barrier_ranks` ranks, whose notes fit the barrier's cache line.
  bool notes_barriers() const { return size() <= detail::shm::noted_barrier_ranks; }
  /// Gives this rank's next `barrier()` a note: a digest of the call it belongs to (the
  /// mismatch check's, `detail::call_check`), written beside the barrier's counter under
  /// `parity` (the call's, so that a rank one call ahead never overwrites a note still read),
  /// where the line that releases the peers from the barrier brings it to them with no
  /// further cache-line transfer. Where `notes_barriers()` is false, nothing.
  void note_next_barrier(std::uint32_t note, unsigned parity) {
    if (!notes_barriers()) return;
    state_->next_note = note;
    state_->next_note_parity = parity & 1u;
    state_->note_pending = true;
  }
  /// Rank `q`'s note under `parity`: what its barrier wrote, once that barrier has completed
  /// on this rank.
  std::uint32_t barrier_note(int q, unsigned parity) const {
    return state_->head().barrier_notes[parity & 1u][q].load(std::memory_order_relaxed);
  }

  /// Moves this transport's posted work along, then sleeps until something is published for
  /// this rank (a message, a freed slot, a barrier's release, a failure) or `at_most` has
  /// passed: for a layer above that waits on these messages and on other things too
  /// (`cuda_ipc_transport`), between its own polls.
  void idle(std::chrono::nanoseconds at_most) { state_->idle(at_most); }

  /// The window of `peer`, which every rank maps: for schedules that read or reduce
  /// straight out of a peer's memory. Synchronise around it with messages or `barrier()`.
  buffer_view<std::byte> peer_view(int peer) {
    check_peer("peer_view", peer);
    return {state_->seg.window(peer), state_->seg.shape().window_bytes};
  }
  /// This rank's own window (what the peers see as `peer_view(rank())`).
  buffer_view<std::byte> local_view() { return peer_view(rank()); }

  /// Whether `read_peer` and `write_peer` work: cross-memory attach was allowed between every
  /// pair of ranks at setup (ptrace rules; off in some containers).
  bool can_access_peers() const { return state_->single_copy; }

  /// Copies `into.count()` bytes at address `from` of `peer`'s memory into `into`
  /// (`process_vm_readv`): for schedules that reduce straight out of a peer's own buffers.
  /// The caller synchronises: the peer keeps that memory valid and unchanged meanwhile.
  /// Throws `peer_failure` if the peer died or has failed (a failed rank closes its memory
  /// before its error leaves the transport, `state::revoke`), `squall::error` (shm) for any
  /// other failure or if `can_access_peers()` is false; either leaves this transport failed.
  void read_peer(int peer, std::uint64_t from, buffer_view<std::byte> into) {
    copy_peer("read_peer", peer, from, into.data(), into.count(), false);
  }

  /// Copies `from` to address `to` of `peer`'s memory (`process_vm_writev`), as `read_peer`
  /// the other way: the caller synchronises.
  void write_peer(int peer, std::uint64_t to, buffer_view<const std::byte> from) {
    copy_peer("write_peer", peer, to, const_cast<std::byte*>(from.data()), from.count(), true);
  }

  /// Allocates `bytes` of registered memory: memory every rank maps, so that collectives on
  /// buffers inside it read and write the peers' copies with plain loads and stores (no
  /// system call, no page pinning; issue 22). Collective: every rank calls it, in the same
  /// order, with the same `bytes`, while no collective is in flight on this transport; a
  /// different size or count of calls gives `mismatch_error` on every rank. Zero-filled,
  /// rounded up to whole pages. A peer whose memory cannot be mapped here (/proc access
  /// refused) is still reached, through `read_peer`/`write_peer`; so is everything on
  /// buffers outside registered memory.
  registered_memory register_memory(std::size_t bytes) {
    const error_context where{.operation = "register_memory", .rank = rank()};
    state_->check_healthy(where);
    if (bytes == 0) throw invalid_argument(where, "0 bytes");
    const std::size_t page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
    const std::size_t mapped = (bytes + page - 1) / page * page;
    const std::uint64_t id = ++state_->registrations;
    const auto ranks = static_cast<std::size_t>(size());
    detail::shm::registry::draft next(id, mapped, ranks, rank(), where);
    std::byte* const local = next.made.here[static_cast<std::size_t>(rank())];
    const detail::shm::registration_record mine{.id = id,
                                                .bytes = bytes,
                                                .address = reinterpret_cast<std::uint64_t>(local),
                                                .pid = static_cast<std::int32_t>(getpid()),
                                                .fd = next.fd};
    std::vector<detail::shm::registration_record> all(ranks);
    all[static_cast<std::size_t>(rank())] = mine;
    {
      std::vector<shm_completion> pending;
      for (int q = 0; q < size(); ++q) {
        if (q == rank()) continue;
        pending.push_back(recv(
            q, {reinterpret_cast<std::byte*>(&all[static_cast<std::size_t>(q)]), sizeof mine}));
        pending.push_back(send(q, {reinterpret_cast<const std::byte*>(&mine), sizeof mine}));
      }
      for (shm_completion& c : pending) c.wait();
    }
    for (int q = 0; q < size(); ++q) {
      const detail::shm::registration_record& theirs = all[static_cast<std::size_t>(q)];
      if (theirs.id != id || theirs.bytes != bytes) {
        std::string sizes;
        std::string ids;
        for (const detail::shm::registration_record& r : all) {
          sizes += (sizes.empty() ? "" : ", ") + std::to_string(r.bytes);
          ids += (ids.empty() ? "" : ", ") + std::to_string(r.id);
        }
        throw mismatch_error(where, "ranks register " + sizes + " bytes as their registration " +
                                        ids + " (every rank must ask the same, in the same order)");
      }
    }
    // every rank has checked the same table: all open their peers' files, or none does
    for (int q = 0; q < size(); ++q) {
      const detail::shm::registration_record& theirs = all[static_cast<std::size_t>(q)];
      next.made.address[static_cast<std::size_t>(q)] = theirs.address;
      if (q != rank()) {
        next.made.here[static_cast<std::size_t>(q)] =
            detail::shm::map_peer_file(theirs.pid, theirs.fd, mapped).here;
      }
    }
    barrier().wait();  // every peer has opened this rank's memory file: it may be closed
    state_->registered->add(next);
    return {state_->registered, id, local, bytes};
  }

  /// `count` elements of `T` in registered memory (`register_memory`), zero-filled.
  template <class T>
  registered_buffer<T> allocate(std::size_t count) {
    if (count > std::numeric_limits<std::size_t>::max() / sizeof(T)) {
      throw invalid_argument({.operation = "allocate", .rank = rank()},
                             "count " + std::to_string(count) + " overflows the byte size");
    }
    return {register_memory(std::max<std::size_t>(count * sizeof(T), 1)), count};
  }

  /// How many `register_memory` calls this transport has made: the same on every rank, as
  /// they are collective (the collectives pick their paths by it alike on every rank).
  std::uint64_t registrations() const { return state_->registrations; }

  /// The registration of this rank's memory that holds all of [`p`, `p` + `bytes`), or 0:
  /// what a peer-memory collective tells the peers with the buffer's address.
  /// Memory of the process's shared heap (`detail::shm::shared_heap`, what libsquall_mpi.so's
  /// `malloc` gives under SQUALL_MPI_SHARED_HEAP) has a registration too, of its own: the
  /// peers map it when they first meet it.
  std::uint64_t registration_of(const void* p, std::size_t bytes) const {
    if (const std::uint64_t id = state_->registered->id_of(p, bytes); id != 0) return id;
    const auto file = detail::shm::shared_heap::instance().find(p, bytes);
    return file.fd < 0 ? 0 : detail::shm::heap_mappings::id_of(file);
  }

  /// Where [`address`, `address` + `bytes`) of `peer`'s memory, inside its registration `id`,
  /// lies in this process; null where it does not (id 0, unmapped, outside). Reach it only
  /// inside `with_peer`.
  std::byte* mapped_peer(int peer, std::uint64_t id, std::uint64_t address,
                         std::size_t bytes) const {
    if ((id & detail::shm::heap_mappings::heap_bit) == 0) {
      return state_->registered->here(peer, id, address, bytes);
    }
    if (peer == rank()) {  // this rank's own: where it is, if it still is
      auto* const p = reinterpret_cast<std::byte*>(address);
      return registration_of(p, bytes) == id ? p : nullptr;
    }
    return state_->heap_mapped.here(peer, state_->seg.rank(peer).pid.load(), id, address, bytes);
  }

  /// Runs `f()` while this rank may touch `peer`'s memory (through `mapped_peer`): as a
  /// cross-memory copy does, with this rank's `touching` flag raised, so a peer that fails
  /// waits for it to end before its error leaves; throws `peer_failure` if the peer has
  /// failed and closed its memory.
  template <class F>
  void with_peer(int peer, F&& f) {
    check_peer("with_peer", peer);
    state_->touch(peer, {.operation = "with_peer", .rank = rank(), .peer = peer});
    struct lower {
      detail::shm::state* s;
      int peer;
      ~lower() { s->untouch(peer); }
    } const guard{state_.get(), peer};
    ++state_->mapped_accesses;
    std::forward<F>(f)();
  }

  /// How many times this rank has reached a peer's registered memory through its mapping
  /// (`with_peer`): how a test or a benchmark sees that the registered path ran.
  std::uint64_t mapped_accesses() const { return state_->mapped_accesses; }

  /// The segment's shared-memory name (already unlinked once all ranks attached).
  const std::string& segment_name() const { return state_->seg.name(); }

 private:
  // process_vm_readv / _writev of `bytes` between `local` and `remote` in `peer`, to the end.
  void copy_peer(const char* what, int peer, std::uint64_t remote, std::byte* local,
                 std::size_t bytes, bool write) {
    check_peer(what, peer);
    const error_context where{.operation = what, .rank = rank(), .peer = peer};
    if (!state_->single_copy) {
      throw error(std::error_code(EPERM, shm_category()), where,
                  "cross-memory attach is not allowed between these processes");
    }
    for (std::size_t done = 0; done < bytes;) {
      done += state_->copy_with_peer(peer, where, local + done, remote + done, bytes - done, write);
    }
  }

  void check_peer(const char* what, int peer) const {
    state_->check_healthy({.operation = what, .rank = rank(), .peer = peer});
    if (peer < 0 || peer >= size()) {
      throw invalid_argument({.operation = what, .rank = rank(), .peer = peer},
                             "peer outside [0, " + std::to_string(size()) + ")");
    }
  }

  std::unique_ptr<detail::shm::state> state_;
};
static_assert(transport<shm_transport>);
static_assert(direct_transport<shm_transport>);
static_assert(peer_memory_transport<shm_transport>);
static_assert(registered_memory_transport<shm_transport>);

}  // namespace squall
