// SPDX-License-Identifier: Apache-2.0
#pragma once
/// The POSIX shared-memory segment under `shm_transport`: its layout, its creation by rank 0
/// (O_CREAT|O_EXCL, mode 0600, memory reserved up front), attachment by the other ranks (only
/// to a segment of this process's effective uid with no group or other permission bits),
/// recognition of stale segments from crashed jobs, unlinking once every rank is in (or by
/// rank 0's reaper if the ranks die before), futex waits and process liveness.

#include <squall/core/completion.hpp>
#include <squall/core/error.hpp>

#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <sys/wait.h>

#include <algorithm>  // min
#include <atomic>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <ctime>
#include <fcntl.h>
#include <fstream>
#include <linux/futex.h>
#include <new>
#include <poll.h>
#include <signal.h>
#include <string>
#include <thread>
#include <unistd.h>

namespace squall::detail::shm {

inline constexpr std::uint64_t segment_magic = 0x31304c4c41555153ull;  // "SQUALL01"
inline constexpr std::uint32_t layout_version = 5;
inline constexpr std::size_t cache_line = 64;
/// The most ranks whose barrier notes fit the barrier's cache line (`header::barrier_notes`).
inline constexpr int noted_barrier_ranks = 7;

/// Per-rank words: the process id, and the doorbell this rank sleeps on. Any event that may
/// unblock the rank (data in, space freed, barrier released, failure) bumps the doorbell.
struct alignas(cache_line) rank_words {
  std::atomic<std::int32_t> pid;
  std::atomic<std::uint32_t> doorbell;
  std::atomic<std::uint32_t> sleeping;
  /// Single-copy probe: the address of a word in this process holding `probe_value`, and
  /// this rank's verdict on reading every peer's (0 unknown, 1 all readable, 2 not).
  std::atomic<std::uint64_t> probe_address;
  std::atomic<std::uint32_t> single_copy;
  /// 1 once this rank has failed and closed its memory to the peers' reads and writes
  /// (`state::revoke`); a peer checks it before every cross-memory copy.
  std::atomic<std::uint32_t> revoked;
};

/// What `rank_words::probe_address` points at in every process.
inline constexpr std::uint64_t probe_value = 0x5351554c4c50524full;

/// The two ends of a one-way channel, on separate cache lines: `head` counts slots published
/// by the sender, `tail` slots released by the receiver (both wrap modulo 2^32).
struct channel_words {
  alignas(cache_line) std::atomic<std::uint32_t> head;
  /// 1 while the sender side of this channel (rank `from`) is inside a cross-memory copy of
  /// the receiver's (rank `to`'s) memory: what a failing `to` waits out before it returns.
  std::atomic<std::uint32_t> touching;
  alignas(cache_line) std::atomic<std::uint32_t> tail;
  /// Single-copy messages the receiver has finished reading from the sender's memory.
  std::atomic<std::uint32_t> acked;
};

/// Every slot starts with this: the size of the whole message the slot belongs to, so a
/// receiver that expects another size finds out at once.
struct alignas(16) slot_header {
  std::uint64_t message_bytes;
  std::uint64_t sequence;
  /// Non-zero for a single-copy message: the address of the data in the sender's memory;
  /// the receiver reads it with process_vm_readv and acknowledges through `acked`.
  std::uint64_t source_address;
  std::uint64_t reserved;
};

/// How failures are recorded in the header, for every rank to see.
enum class failure : std::uint32_t { none = 0, died = 1, gave_up = 2 };

struct alignas(cache_line) header {
  std::uint64_t magic;
  std::uint32_t version;
  std::uint32_t world_size;
  std::uint64_t generation;
  std::uint64_t total_bytes;
  std::uint64_t slot_bytes;
  std::uint64_t slots;
  std::uint64_t window_bytes;
  std::uint64_t job_key;  ///< `shm_job::key` of the job rank 0 made it for
  std::atomic<std::uint32_t> ready;
  std::atomic<std::uint32_t> attached;
  std::atomic<std::int32_t> failed_rank;
  std::atomic<std::uint32_t> failure_kind;
  alignas(cache_line) std::atomic<std::uint32_t> barrier_arrived;
  std::atomic<std::uint32_t> barrier_generation;
  /// Each rank's note of the call its barrier belongs to, two calls' worth (by the call's
  /// parity), in the barrier's own cache line: the line that releases a waiting rank brings
  /// the peers' notes with it (`shm_transport::note_next_barrier`; jobs of up to
  /// `noted_barrier_ranks` ranks).
  std::atomic<std::uint32_t> barrier_notes[2][noted_barrier_ranks];
  /// What the rank in `failed_rank` gave up on (its error's message, cut to fit), written
  /// before `failed_rank` is released, for the peers' errors to name the cause.
  char failure_reason[192];
};

static_assert(sizeof(std::atomic<std::uint32_t>) * (2 + 2 * noted_barrier_ranks) <= cache_line,
              "the barrier's counter, generation and notes share one cache line");

/// Sizes of a segment; the same on every rank of a job.
struct geometry {
  int world_size = 1;
  std::size_t slot_bytes = 0;  ///< bytes per slot, header included
  std::size_t slots = 0;       ///< slots per channel
  std::size_t window_bytes = 0;

  std::size_t ranks_offset() const { return sizeof(header); }
  std::size_t channels_offset() const {
    return ranks_offset() + sizeof(rank_words) * static_cast<std::size_t>(world_size);
  }
  std::size_t channel_count() const {
    return static_cast<std::size_t>(world_size) * static_cast<std::size_t>(world_size);
  }
  std::size_t slots_offset() const {
    return channels_offset() + sizeof(channel_words) * channel_count();
  }
  std::size_t windows_offset() const {
    return slots_offset() + channel_count() * slots * slot_bytes;
  }
  std::size_t total_bytes() const {
    return windows_offset() + static_cast<std::size_t>(world_size) * window_bytes;
  }
};

/// Whether process `pid` exists and is not a zombie (a dead child its parent has not reaped).
/// The state letter of process `pid` in /proc/<pid>/stat ('R', 'S', 'T' stopped, 'Z' zombie,
/// ...); 0 if it cannot be read.
inline char process_state(std::int32_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return 0;
  const auto paren = line.rfind(')');
  if (paren == std::string::npos || paren + 2 >= line.size()) return 0;
  return line[paren + 2];
}

inline bool process_alive(std::int32_t pid) {
  if (pid <= 0) return false;
  if (kill(pid, 0) != 0 && errno == ESRCH) return false;
  const char state = process_state(pid);
  return state != 'Z' && state != 'X';  // 0 (no /proc): trust kill()
}

inline void futex_wait(std::atomic<std::uint32_t>& word, std::uint32_t expected,
                       std::chrono::nanoseconds timeout) {
  const auto seconds = std::chrono::duration_cast<std::chrono::seconds>(timeout);
  timespec ts{static_cast<std::time_t>(seconds.count()),
              static_cast<long>((timeout - seconds).count())};
  syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&word), FUTEX_WAIT, expected, &ts, nullptr,
          0);
}

inline void futex_wake_all(std::atomic<std::uint32_t>& word) {
  syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&word), FUTEX_WAKE, INT_MAX, nullptr, nullptr,
          0);
}

/// The shared-memory name of job `job` for this user: "/squall-<uid>-<job>".
inline std::string segment_name(const std::string& job) {
  return "/squall-" + std::to_string(getuid()) + "-" + job;
}

/// Removes the segment of job `job` if one is left and it was made for `key` by this user
/// (its ranks all ended: a launcher's clean-up, whatever happened to them); true if it did.
inline bool remove_leftover(const std::string& job, std::uint64_t key) {
  const std::string name = segment_name(job);
  const int fd = shm_open(name.c_str(), O_RDONLY, 0);
  if (fd < 0) return false;
  struct stat info {};
  bool ours = fstat(fd, &info) == 0 && info.st_uid == geteuid() &&
              static_cast<std::size_t>(info.st_size) >= sizeof(header);
  if (ours) {
    void* base = mmap(nullptr, sizeof(header), PROT_READ, MAP_SHARED, fd, 0);
    if (base == MAP_FAILED) {
      ours = false;
    } else {
      const auto& h = *static_cast<const header*>(base);
      ours = h.magic == segment_magic && h.version == layout_version && h.job_key == key;
      munmap(base, sizeof(header));
    }
  } else if (fstat(fd, &info) == 0 && info.st_uid == geteuid()) {
    ours = true;  // never initialised: its creator died before reserving the memory
  }
  close(fd);
  return ours && shm_unlink(name.c_str()) == 0;
}

/// Starts the reaper of a segment just created by this process: a detached grandchild that
/// removes the name `path` (in /dev/shm) when this process dies while the name still names
/// the file `made` (device and inode), and ends as soon as the name is gone or names another
/// file (the last rank attached and unlinked it, or rank 0 unlinked it on an error), or at
/// `lifetime` (the start-up deadline and 10 s more: by then no rank can still attach), when it
/// removes a name still there. So a job whose ranks are all killed during start-up (as
/// `mpiexec` kills every rank when one fails) leaves nothing in /dev/shm, with no launcher of
/// squall's to clean up (issue 15).
///
/// Made by a raw `clone` (no `pthread_atfork` handlers run: the process may be threaded, with
/// handlers from MPI or torch), twice, so that nobody has to reap it; it leaves this process's
/// session and process group (signals sent to the job's group leave it running to clean up),
/// closes every descriptor, and calls only system calls. Without a reaper (clone refused)
/// `launch` and `squall-run` still remove the segment when their ranks end.
inline void start_reaper(const std::string& name, const struct stat& made,
                         std::chrono::nanoseconds lifetime) noexcept {
  char path[320];
  std::snprintf(path, sizeof path, "/dev/shm%s", name.c_str());
  const pid_t owner = getpid();
  // The reaper says on `ready` when it has left this process group and holds its pidfd; we
  // wait for that (at most 2 s), so a group kill right after this returns cannot take it.
  int ready[2];
  if (pipe2(ready, O_CLOEXEC) != 0) return;
  const auto fork_raw = [] { return syscall(SYS_clone, SIGCHLD, 0, 0, 0, 0); };
  const long child = fork_raw();
  if (child < 0) {
    close(ready[0]);
    close(ready[1]);
    return;
  }
  if (child > 0) {
    close(ready[1]);
    int status = 0;
    while (waitpid(static_cast<pid_t>(child), &status, 0) < 0 && errno == EINTR) {
    }
    pollfd said{ready[0], POLLIN, 0};
    char byte = 0;
    if (poll(&said, 1, 2000) > 0) (void)!read(ready[0], &byte, 1);  // or EOF: no reaper
    close(ready[0]);
    return;
  }
  if (fork_raw() != 0) _exit(0);  // the child ends at once; the grandchild is the reaper
  const auto keep = static_cast<unsigned>(ready[1]);
  if ((keep > 0 && syscall(SYS_close_range, 0u, keep - 1, 0u) != 0) ||
      syscall(SYS_close_range, keep + 1, ~0u, 0u) != 0) {
    for (int fd = 0; fd < 1024; ++fd) {
      if (fd != ready[1]) close(fd);
    }
  }
  setsid();
  const long pidfd = syscall(SYS_pidfd_open, owner, 0u);
  (void)!write(ready[1], "r", 1);
  close(ready[1]);
  const auto still_ours = [&] {
    struct stat now {};
    return stat(path, &now) == 0 && now.st_dev == made.st_dev && now.st_ino == made.st_ino;
  };
  timespec start{};
  clock_gettime(CLOCK_MONOTONIC, &start);
  const auto budget = std::chrono::duration_cast<std::chrono::seconds>(lifetime).count() + 10;
  for (;;) {
    if (!still_ours()) _exit(0);
    bool owner_gone = false;
    if (pidfd >= 0) {
      pollfd wait_on{static_cast<int>(pidfd), POLLIN, 0};
      owner_gone = poll(&wait_on, 1, 20) > 0;
    } else {
      const timespec pause{0, 20'000'000};
      nanosleep(&pause, nullptr);
      owner_gone = kill(owner, 0) != 0 && errno == ESRCH;
    }
    timespec now{};
    clock_gettime(CLOCK_MONOTONIC, &now);
    if (owner_gone || now.tv_sec - start.tv_sec > budget) {
      if (still_ours()) unlink(path);
      _exit(0);
    }
  }
}

/// A mapped segment. Rank 0 creates it (and starts its reaper, `start_reaper`); the others
/// attach; the last to attach unlinks the name, so nothing stays in /dev/shm whatever happens
/// to the processes afterwards.
class segment {
 public:
  /// `reaper`: whether rank 0 starts the segment's reaper (`start_reaper`).
  segment(const std::string& job, int rank, std::uint64_t key, const geometry& shape,
          const deadline& limit, bool reaper = true)
      : name_(segment_name(job)), rank_(rank), key_(key) {
    const error_context where{.operation = "shm attach", .rank = rank};
    if (rank == 0) {
      create(shape, limit, where, reaper);
    } else {
      attach(shape, limit, where);
    }
    wait_for_everyone(limit, where);
  }
  ~segment() {
    if (base_ != nullptr) munmap(base_, bytes_);
  }
  segment(const segment&) = delete;
  segment& operator=(const segment&) = delete;

  header& head() const { return *static_cast<header*>(base_); }
  rank_words& rank(int r) const {
    return reinterpret_cast<rank_words*>(at(shape_.ranks_offset()))[r];
  }
  channel_words& channel(int from, int to) const {
    return reinterpret_cast<channel_words*>(at(shape_.channels_offset()))[index(from, to)];
  }
  std::byte* slot(int from, int to, std::uint32_t sequence) const {
    return at(shape_.slots_offset() +
              (index(from, to) * shape_.slots + sequence % shape_.slots) * shape_.slot_bytes);
  }
  std::byte* window(int r) const {
    return at(shape_.windows_offset() + static_cast<std::size_t>(r) * shape_.window_bytes);
  }
  const geometry& shape() const { return shape_; }
  const std::string& name() const { return name_; }

 private:
  std::byte* at(std::size_t offset) const { return static_cast<std::byte*>(base_) + offset; }
  std::size_t index(int from, int to) const {
    return static_cast<std::size_t>(from) * static_cast<std::size_t>(shape_.world_size) +
           static_cast<std::size_t>(to);
  }

  [[noreturn]] void fail(int err, const error_context& where, const std::string& what) const {
    throw error(std::error_code(err, shm_category()), where, what + " (" + name_ + ")");
  }

  void map(int fd, std::size_t bytes, const error_context& where) {
    void* base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (base == MAP_FAILED) {
      const int err = errno;
      close(fd);
      fail(err, where, "mmap of " + std::to_string(bytes) + " bytes");
    }
    base_ = base;
    bytes_ = bytes;
  }

  // Throws at once unless the open segment `fd` belongs to this process's effective uid and
  // grants nothing to group or others (squall makes it 0600): another user who knows the job's
  // name could otherwise plant a file that this job's ranks exchange data through.
  void require_private(int fd, const struct stat& info, const error_context& where) const {
    if (info.st_uid != geteuid()) {
      close(fd);
      fail(EPERM, where,
           "the shared-memory segment belongs to uid " + std::to_string(info.st_uid) +
               ", not to this process's uid " + std::to_string(geteuid()) +
               ": another user's file carries this job's name; refusing it (set SQUALL_JOB to "
               "a name of your own)");
    }
    if ((info.st_mode & 077) != 0) {
      char mode[8];
      std::snprintf(mode, sizeof mode, "%04o", static_cast<unsigned>(info.st_mode & 07777));
      close(fd);
      fail(EPERM, where,
           std::string("the shared-memory segment has mode ") + mode +
               ": group or others may read or write it, and squall makes its segments 0600; "
               "refusing it (remove the file, or set SQUALL_JOB to another name)");
    }
  }

  // Reads the header of an existing segment and decides whether it is a leftover of a dead
  // job (true: every process recorded in it is gone) or in use by a live one (throws). One of
  // another uid is refused at once (`require_private`): it is not this user's to replace, and
  // /dev/shm's sticky bit would refuse its unlink anyway.
  bool is_stale(const error_context& where) const {
    const int fd = shm_open(name_.c_str(), O_RDONLY, 0);
    if (fd < 0) {
      if (errno == ENOENT) return false;  // gone meanwhile: just try again
      fail(errno, where, "shm_open");
    }
    struct stat info {};
    if (fstat(fd, &info) != 0) {
      const int err = errno;
      close(fd);
      fail(err, where, "fstat");
    }
    if (info.st_uid != geteuid()) require_private(fd, info, where);
    const auto size = static_cast<std::size_t>(info.st_size);
    if (size < sizeof(header)) {
      close(fd);
      return true;  // never initialised: its creator died before reserving the memory
    }
    void* base = mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    if (base == MAP_FAILED) return true;
    const auto& old = *static_cast<const header*>(base);
    std::int32_t live_pid = 0;
    if (old.magic == segment_magic) {
      const std::size_t count =
          std::min<std::size_t>(old.world_size, (size - sizeof(header)) / sizeof(rank_words));
      const auto* ranks =
          reinterpret_cast<const rank_words*>(static_cast<const std::byte*>(base) + sizeof(header));
      for (std::size_t i = 0; i < count; ++i) {
        const std::int32_t pid = ranks[i].pid.load();
        if (pid != getpid() && process_alive(pid)) live_pid = pid;
      }
    }
    munmap(base, size);
    if (live_pid != 0) {
      fail(EBUSY, where,
           "shared-memory segment is in use by a live job (pid " + std::to_string(live_pid) +
               "): another job runs under the same name; set SQUALL_JOB to a unique name");
    }
    return true;
  }

  void create(const geometry& shape, const deadline& limit, const error_context& where,
              bool reaper) {
    shape_ = shape;
    const std::size_t bytes = shape.total_bytes();
    if (struct statvfs fs{}; statvfs("/dev/shm", &fs) == 0) {
      const auto free = static_cast<std::uint64_t>(fs.f_bavail) * fs.f_frsize;
      if (bytes > free) {
        throw invalid_argument(
            where, "a job of " + std::to_string(shape.world_size) + " ranks needs a segment of " +
                       std::to_string(bytes) + " bytes (" + std::to_string(shape.world_size) +
                       "^2 channels x " + std::to_string(shape.slots) + " slots x " +
                       std::to_string(shape.slot_bytes) + " bytes, and " +
                       std::to_string(shape.world_size) + " windows of " +
                       std::to_string(shape.window_bytes) + "), and /dev/shm has " +
                       std::to_string(free) +
                       " bytes free: lower shm_config's slots, slot_bytes or window_bytes");
      }
    }
    for (;;) {
      const int fd = shm_open(name_.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
      if (fd >= 0) {
        if (struct stat made{}; reaper && shape.world_size > 1 && fstat(fd, &made) == 0) {
          start_reaper(name_, made, limit.remaining());
        }
        if (const int err = posix_fallocate(fd, 0, static_cast<off_t>(bytes)); err != 0) {
          close(fd);
          shm_unlink(name_.c_str());
          fail(err, where,
               "cannot reserve " + std::to_string(bytes) +
                   " bytes of shared memory (is /dev/shm full?)");
        }
        map(fd, bytes, where);
        close(fd);
        initialise(shape);
        return;
      }
      if (errno != EEXIST) fail(errno, where, "shm_open(O_CREAT|O_EXCL)");
      // a crashed job's leftover: replace it; an unlink refused is an error now, not a spin
      if (is_stale(where) && shm_unlink(name_.c_str()) != 0 && errno != ENOENT) {
        fail(errno, where, "shm_unlink of a stale segment");
      }
      if (limit.expired()) {
        throw timeout_error(where, "could not create " + name_ + " within " + limit.describe());
      }
    }
  }

  void initialise(const geometry& shape) {
    auto* h = new (base_) header{};
    h->magic = segment_magic;
    h->version = layout_version;
    h->world_size = static_cast<std::uint32_t>(shape.world_size);
    h->generation =
        (static_cast<std::uint64_t>(getpid()) << 32) ^
        static_cast<std::uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
    h->total_bytes = shape.total_bytes();
    h->slot_bytes = shape.slot_bytes;
    h->slots = shape.slots;
    h->window_bytes = shape.window_bytes;
    h->job_key = key_;
    h->failed_rank.store(-1);
    for (int r = 0; r < shape.world_size; ++r) new (&rank(r)) rank_words{};
    for (int a = 0; a < shape.world_size; ++a) {
      for (int b = 0; b < shape.world_size; ++b) new (&channel(a, b)) channel_words{};
    }
    rank(0).pid.store(getpid());
    h->attached.store(1);
    h->ready.store(1, std::memory_order_release);
  }

  void attach(const geometry& expected, const deadline& limit, const error_context& where) {
    backoff wait;
    for (;; wait.pause()) {
      if (limit.expired()) {
        throw timeout_error(where,
                            "rank 0 did not create " + name_ + " within " + limit.describe());
      }
      const int fd = shm_open(name_.c_str(), O_RDWR, 0);
      if (fd < 0) {
        if (errno == ENOENT) continue;
        fail(errno, where, "shm_open");
      }
      struct stat info {};
      if (fstat(fd, &info) != 0) {
        const int err = errno;
        close(fd);
        fail(err, where, "fstat");
      }
      require_private(fd, info, where);
      if (static_cast<std::size_t>(info.st_size) < sizeof(header)) {
        close(fd);
        continue;
      }
      map(fd, static_cast<std::size_t>(info.st_size), where);
      close(fd);
      const header& h = head();
      if (h.ready.load(std::memory_order_acquire) == 0 || h.magic != segment_magic) {
        unmap();
        continue;
      }
      shape_ = geometry{static_cast<int>(h.world_size), h.slot_bytes, h.slots, h.window_bytes};
      if (!process_alive(rank(0).pid.load())) {  // a crashed job's leftover: rank 0 replaces it
        unmap();
        continue;
      }
      if (h.version != layout_version ||
          h.world_size != static_cast<std::uint32_t>(expected.world_size) ||
          h.slot_bytes != expected.slot_bytes || h.slots != expected.slots ||
          h.window_bytes != expected.window_bytes) {
        const int size = static_cast<int>(h.world_size);
        unmap();
        throw mismatch_error(where, "segment " + name_ + " was made for " + std::to_string(size) +
                                        " ranks or another shm_config; this rank expects " +
                                        std::to_string(expected.world_size));
      }
      if (h.job_key != key_) {  // before anything is written: another job of this name
        const std::uint64_t theirs = h.job_key;
        unmap();
        char keys[80];
        std::snprintf(keys, sizeof keys, "%016llx, this rank's %016llx",
                      static_cast<unsigned long long>(theirs),
                      static_cast<unsigned long long>(key_));
        throw mismatch_error(where, "segment " + name_ +
                                        " belongs to another job of the same name (its job key " +
                                        keys +
                                        "): two jobs were started under one name; give each its "
                                        "own SQUALL_JOB, or start them with squall-run");
      }
      std::int32_t none = 0;
      if (!rank(rank_).pid.compare_exchange_strong(none, getpid())) {
        const int other = none;
        unmap();
        throw mismatch_error(where, "rank " + std::to_string(rank_) +
                                        " is already attached by pid " + std::to_string(other));
      }
      if (head().attached.fetch_add(1) + 1 == h.world_size) shm_unlink(name_.c_str());
      return;
    }
  }

  void wait_for_everyone(const deadline& limit, const error_context& where) {
    backoff wait;
    while (head().attached.load() < static_cast<std::uint32_t>(shape_.world_size)) {
      if (limit.expired()) {
        std::string missing;
        for (int r = 0; r < shape_.world_size; ++r) {
          if (rank(r).pid.load() == 0) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
        }
        if (rank_ == 0) shm_unlink(name_.c_str());  // nothing must be left behind
        throw timeout_error(where, "rank(s) " + missing + " did not attach to " + name_ +
                                       " within " + limit.describe());
      }
      wait.pause();
    }
    if (rank_ == 0 && shape_.world_size == 1) shm_unlink(name_.c_str());
  }

  void unmap() {
    munmap(base_, bytes_);
    base_ = nullptr;
    bytes_ = 0;
  }

  std::string name_;
  int rank_;
  std::uint64_t key_;
  geometry shape_{};
  void* base_ = nullptr;
  std::size_t bytes_ = 0;
};

}  // namespace squall::detail::shm
