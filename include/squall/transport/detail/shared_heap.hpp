// SPDX-License-Identifier: Apache-2.0
#pragma once
/// The process's shared heap (issue 19): large allocations in anonymous memory files, so that
/// the peers of a shared-memory job can map a rank's ordinary buffers and the peer-memory
/// collectives reach them with plain loads and stores, as they reach registered memory
/// (`shm_transport::register_memory`), with no cross-memory copy pinning every page per call.
/// What `libsquall_mpi.so` serves an MPI program's large `malloc`s from when
/// `SQUALL_MPI_SHARED_HEAP` says so: the program's own buffers become mappable without a
/// change to it.
///
/// Layout: the heap reserves one range of address space (`arena_bytes`, no memory behind it)
/// and places each allocation there, whole 2 MiB units, as its own memory file mapped shared:
/// a header page (`heap_header`: what a peer checks after mapping the file), then the data.
/// Whether a pointer is the heap's is one range comparison (`owns`), so `free` of other memory
/// pays nothing more. A rank tells its peers an allocation's file descriptor and serial
/// number (`find`); a peer opens /proc/<pid>/fd/<fd> (the same-user access cross-memory
/// attach needs), maps it, and checks the header's serial and bounds (`heap_mappings`).
///
/// Freed allocations are kept for reuse (at most `most_kept`, `kept_bytes` in all), as glibc
/// keeps freed memory: an MPI library allocates a temporary of the message's size per call,
/// and a fresh file each time would fault every page in again. A reused allocation keeps its
/// file and serial, so the peers' mappings of it stay good.
///
/// A peer's mapping keeps the file's memory alive after the owner frees it (no fault, only
/// stale data the collectives no longer ask for); peers drop such mappings when the owner's
/// descriptor comes back with another serial, and keep at most `heap_mappings::most` per
/// peer. After `fork` the child turns every allocation into private memory with the same
/// contents (memory files stay shared across a fork, which would let a child's writes reach
/// the parent): the fork costs a copy of the pages the allocations hold (where no memory is
/// left for a copy, the child's mapping is made read-only: a write faults, never reaches the
/// parent).
///
/// `shared_heap` allocates nothing itself (its `allocate` and `release` run inside `malloc`
/// and `free`); `heap_mappings`, the peers' side, runs inside the collectives.

#include <squall/transport/detail/peer_file.hpp>

#include <sys/mman.h>
#include <sys/resource.h>  // getrlimit

#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>  // memcpy
#include <fcntl.h>
#include <mutex>
#include <pthread.h>  // pthread_atfork
#include <unistd.h>
#include <vector>

namespace squall::detail::shm {

/// The first bytes of every shared-heap allocation's file (its header page).
struct heap_header {
  static constexpr std::uint64_t magic_value = 0x5351484541504844;  // "SQHEAPHD"
  std::uint64_t magic = 0;
  std::uint64_t serial = 0;        ///< the allocation's number in its process (1, 2, ...)
  std::uint64_t data_address = 0;  ///< where its data start in the owner
  std::uint64_t data_offset = 0;   ///< the data's offset in the file
  std::uint64_t data_bytes = 0;    ///< bytes from there to the end of the file
};

/// The process's shared heap (see the file comment). `instance()` is constant-initialized and
/// never destroyed, so `malloc` may reach it before any constructor and after every destructor.
class shared_heap {
 public:
  static constexpr std::size_t unit = std::size_t{2} << 20;         ///< allocations in whole 2 MiB
  static constexpr std::size_t arena_bytes = std::size_t{1} << 38;  ///< 256 GiB of addresses
  /// Live allocations at most (each holds a file descriptor): this, or a quarter of the
  /// process's descriptor limit where that is less.
  static constexpr std::size_t most_allocations = 1024;

  static shared_heap& instance() {
    static constinit shared_heap heap;
    return heap;
  }

  /// `bytes` aligned to `alignment` (a power of two, at most `unit`) in a memory file of its
  /// own; null where the heap cannot take it (a larger alignment, no address space left, the
  /// table full, a system call failed): the caller then allocates elsewhere. A freed
  /// allocation of the same layout and at most twice the size is taken again first (its pages
  /// are in place, and the peers' mappings of it stay good); zero-filled where `zero`.
  void* allocate(std::size_t bytes, std::size_t alignment, bool zero) noexcept {
    if (alignment > unit) return nullptr;
    const std::size_t offset = alignment > page ? alignment : page;
    if (bytes > arena_bytes - offset) return nullptr;
    const std::size_t total = (offset + bytes + unit - 1) / unit * unit;
    if (!reserved()) return nullptr;
    std::lock_guard lock(mutex_);
    if (void* again = reuse(total, offset)) {
      if (zero) std::memset(again, 0, bytes);
      return again;
    }
    if (count_ >= most_) evict_oldest_freed();
    if (count_ >= most_) return nullptr;
    // first fit between the live allocations, which are kept in address order
    std::size_t at = 0;
    std::size_t slot = 0;
    for (; slot < count_; ++slot) {
      if (live_[slot].base - base_ >= at + total) break;
      at = live_[slot].base - base_ + live_[slot].total;
    }
    if (at + total > arena_bytes) return nullptr;
    const int fd = static_cast<int>(memfd_create("squall-heap", MFD_CLOEXEC));
    if (fd < 0) return nullptr;
    auto* const where = reinterpret_cast<std::byte*>(base_ + at);
    if (ftruncate(fd, static_cast<off_t>(total)) != 0 ||
        mmap(where, total, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0) == MAP_FAILED) {
      close(fd);
      return nullptr;
    }
    madvise(where, total, MADV_HUGEPAGE);  // advice: ignored where shared huge pages are off
    const std::uint64_t serial = ++serials_;
    const heap_header header{.magic = heap_header::magic_value,
                             .serial = serial,
                             .data_address = base_ + at + offset,
                             .data_offset = offset,
                             .data_bytes = total - offset};
    std::memcpy(where, &header, sizeof header);
    for (std::size_t i = count_; i > slot; --i) live_[i] = live_[i - 1];
    live_[slot] = {
        .base = base_ + at, .total = total, .offset = offset, .fd = fd, .serial = serial};
    ++count_;
    return where + offset;
  }

  /// Whether `p` lies in the heap's address range (then it is the heap's to free).
  bool owns(const void* p) const noexcept {
    const auto a = reinterpret_cast<std::uintptr_t>(p);
    const std::uintptr_t base = base_;
    return base != 0 && a >= base && a - base < arena_bytes;
  }

  /// Frees the allocation whose data start at `p` (a pointer `allocate` returned): kept for
  /// reuse while at most `most_kept` freed ones of `kept_bytes` in all are (the oldest
  /// given back beyond), as glibc keeps freed memory for the next request.
  void release(void* p) noexcept {
    std::lock_guard lock(mutex_);
    const std::size_t i = index_of(p);
    if (i == count_) return;
    if (live_[i].fd < 0) {  // private after a fork: nothing to keep it for
      remove(i);
      return;
    }
    live_[i].freed = ++frees_;
    std::size_t kept = 0;
    std::size_t bytes = 0;
    for (std::size_t j = 0; j < count_; ++j) {
      if (live_[j].freed != 0) {
        ++kept;
        bytes += live_[j].total;
      }
    }
    for (; kept > most_kept || bytes > kept_bytes; --kept) bytes -= evict_oldest_freed();
  }

  /// The bytes usable from `p` (a pointer `allocate` returned) to its allocation's end.
  std::size_t usable(const void* p) noexcept {
    std::lock_guard lock(mutex_);
    const std::size_t i = index_of(p);
    return i == count_ ? 0 : live_[i].total - live_[i].offset;
  }

  /// What a peer needs to map the allocation that holds all of [`p`, `p` + `bytes`).
  struct shared_file {
    int fd = -1;
    std::uint64_t serial = 0;
  };
  /// The allocation holding [`p`, `p` + `bytes`) within its data, if it is still shared (not
  /// turned private by a fork); else `fd` -1.
  shared_file find(const void* p, std::size_t bytes) noexcept {
    if (!owns(p)) return {};
    const auto a = reinterpret_cast<std::uintptr_t>(p);
    std::lock_guard lock(mutex_);
    for (std::size_t i = 0; i < count_; ++i) {
      const allocation& x = live_[i];
      if (x.freed != 0) continue;
      const std::uintptr_t data = x.base + x.offset;
      if (a >= data && bytes <= x.total - x.offset && a - data <= x.total - x.offset - bytes) {
        return x.fd < 0 ? shared_file{} : shared_file{x.fd, x.serial};
      }
    }
    return {};
  }

  /// How many allocations are live (for tests and statistics).
  std::size_t live() noexcept {
    std::lock_guard lock(mutex_);
    std::size_t n = 0;
    for (std::size_t i = 0; i < count_; ++i) n += live_[i].freed == 0 ? 1 : 0;
    return n;
  }

 private:
  struct allocation {
    std::uintptr_t base = 0;  ///< the header's address; the file is mapped from here
    std::size_t total = 0;    ///< bytes mapped (the file's size)
    std::size_t offset = 0;   ///< the data's offset from `base`
    int fd = -1;              ///< the memory file; -1 once a fork made the memory private
    std::uint64_t serial = 0;
    std::uint64_t freed = 0;  ///< 0 in use; else freed, kept for reuse (`frees_` then)
  };
  static constexpr std::size_t most_kept = 4;
  static constexpr std::size_t kept_bytes = std::size_t{1} << 30;
  static constexpr std::size_t page = 4096;

  constexpr shared_heap() = default;

  // The arena, reserved at the first allocation; false if that failed (the heap stays empty).
  // The fork handlers are registered after the lock is let go: `pthread_atfork` allocates,
  // and with a small threshold that allocation comes back here.
  bool reserved() noexcept {
    if (base_ != 0) return true;
    bool made = false;
    {
      std::lock_guard lock(mutex_);
      made = reserve();
    }
    if (made) pthread_atfork(&prepare_fork, &parent_fork, &child_fork);
    return base_ != 0;
  }

  // Reserves the arena (under the lock) unless it is, or failed; true if it did now.
  bool reserve() noexcept {
    if (base_ == 0 && !failed_) {
      void* p = mmap(nullptr, arena_bytes + unit, PROT_NONE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
      if (p == MAP_FAILED) {
        failed_ = true;
        return false;
      }
      // exactly `arena_bytes` from a 2 MiB-aligned start (so every allocation's data can sit
      // on huge pages); the rest given back
      const auto a = reinterpret_cast<std::uintptr_t>(p);
      const std::uintptr_t aligned = (a + unit - 1) / unit * unit;
      if (aligned != a) munmap(p, aligned - a);
      munmap(reinterpret_cast<void*>(aligned + arena_bytes), a + unit - aligned);
      // each allocation holds a descriptor: at most a quarter of the process's limit
      rlimit files{};
      const std::size_t quarter =
          getrlimit(RLIMIT_NOFILE, &files) == 0 ? static_cast<std::size_t>(files.rlim_cur / 4) : 64;
      most_ = quarter < most_allocations ? quarter : most_allocations;
      base_ = aligned;
      return true;
    }
    return false;
  }

  // The allocation in use whose data start at `p`, or `count_`.
  std::size_t index_of(const void* p) const noexcept {
    const auto a = reinterpret_cast<std::uintptr_t>(p);
    for (std::size_t i = 0; i < count_; ++i) {
      if (live_[i].freed == 0 && live_[i].base + live_[i].offset == a) return i;
    }
    return count_;
  }

  // The smallest freed allocation of `offset` and `total` to 2 `total` bytes, taken into use
  // again (its data); null if none.
  void* reuse(std::size_t total, std::size_t offset) noexcept {
    std::size_t best = count_;
    for (std::size_t i = 0; i < count_; ++i) {
      const allocation& a = live_[i];
      if (a.freed != 0 && a.offset == offset && a.total >= total && a.total / 2 <= total &&
          (best == count_ || a.total < live_[best].total)) {
        best = i;
      }
    }
    if (best == count_) return nullptr;
    live_[best].freed = 0;
    return reinterpret_cast<void*>(live_[best].base + live_[best].offset);
  }

  // Gives back the freed allocation kept longest, if any; its size (0 if none).
  std::size_t evict_oldest_freed() noexcept {
    std::size_t oldest = count_;
    for (std::size_t i = 0; i < count_; ++i) {
      if (live_[i].freed != 0 && (oldest == count_ || live_[i].freed < live_[oldest].freed)) {
        oldest = i;
      }
    }
    if (oldest == count_) return 0;
    const std::size_t total = live_[oldest].total;
    remove(oldest);
    return total;
  }

  // Unmaps allocation `i` (its range reserved again, no memory behind it) and closes its file.
  void remove(std::size_t i) noexcept {
    const allocation a = live_[i];
    mmap(reinterpret_cast<void*>(a.base), a.total, PROT_NONE,
         MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
    if (a.fd >= 0) close(a.fd);
    for (std::size_t j = i; j + 1 < count_; ++j) live_[j] = live_[j + 1];
    --count_;
  }

  // Copies the pages of `a` that hold data (the file's holes read as zeros in the fresh
  // mapping already) to `to`: touching a hole would allocate it in the file.
  static void copy_data(const allocation& a, std::byte* to) noexcept {
    const auto* from = reinterpret_cast<const std::byte*>(a.base);
    for (off_t at = 0; at < static_cast<off_t>(a.total);) {
      const off_t data = lseek(a.fd, at, SEEK_DATA);
      if (data < 0) {
        if (errno != ENXIO) std::memcpy(to + at, from + at, a.total - static_cast<std::size_t>(at));
        return;  // ENXIO: no data from `at` on; else no SEEK_DATA here, so all of it copied
      }
      off_t hole = lseek(a.fd, data, SEEK_HOLE);
      if (hole < 0) hole = static_cast<off_t>(a.total);
      std::memcpy(to + data, from + data, static_cast<std::size_t>(hole - data));
      at = hole;
    }
  }

  static void prepare_fork() noexcept { instance().mutex_.lock(); }
  static void parent_fork() noexcept { instance().mutex_.unlock(); }
  // The child's copy of each allocation becomes private memory with the same contents.
  // Where no private copy can be made (no memory), the child's mapping becomes read-only: a
  // write there faults rather than reaching the parent's memory.
  static void child_fork() noexcept {
    const int saved = errno;
    shared_heap& h = instance();
    for (std::size_t i = h.count_; i-- > 0;) {
      if (h.live_[i].freed != 0) h.remove(i);  // nothing to copy for memory not in use
    }
    for (std::size_t i = 0; i < h.count_; ++i) {
      allocation& a = h.live_[i];
      if (a.fd < 0) continue;
      void* const at = reinterpret_cast<void*>(a.base);
      void* copy =
          mmap(nullptr, a.total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (copy != MAP_FAILED) {
        copy_data(a, static_cast<std::byte*>(copy));
        if (mremap(copy, a.total, a.total, MREMAP_MAYMOVE | MREMAP_FIXED, at) == MAP_FAILED) {
          munmap(copy, a.total);
          copy = MAP_FAILED;
        }
      }
      if (copy == MAP_FAILED) mprotect(at, a.total, PROT_READ);
      close(a.fd);
      a.fd = -1;
    }
    h.mutex_.unlock();
    errno = saved;
  }

  std::mutex mutex_;
  std::atomic<std::uintptr_t> base_{0};
  bool failed_ = false;
  std::uint64_t serials_ = 0;
  std::uint64_t frees_ = 0;
  std::size_t most_ = 0;  ///< live allocations allowed (`most_allocations`, fewer for few fds)
  std::size_t count_ = 0;
  allocation live_[most_allocations] = {};
};

/// A rank's mappings of its peers' shared-heap allocations (`shared_heap`), by the owner's
/// descriptor: mapped at first use, checked against the owner's serial and bounds each time,
/// dropped when the descriptor comes back with another serial, at most `most` per peer (the
/// least recently used goes). Thread-safe.
class heap_mappings {
 public:
  static constexpr std::size_t most = 16;
  /// Registration ids of shared-heap memory carry this bit (collective registrations count
  /// from 1 and never reach it), the owner's descriptor in bits 32-62 and the serial's low
  /// 32 bits below.
  static constexpr std::uint64_t heap_bit = std::uint64_t{1} << 63;

  static std::uint64_t id_of(shared_heap::shared_file f) {
    return heap_bit | (static_cast<std::uint64_t>(f.fd) << 32) | (f.serial & 0xffffffffu);
  }

  /// How many peer allocations the process has mapped, over every transport.
  static std::uint64_t made() { return made_.load(std::memory_order_relaxed); }

  explicit heap_mappings(int ranks) : peers_(static_cast<std::size_t>(ranks)) {}
  heap_mappings(const heap_mappings&) = delete;
  heap_mappings& operator=(const heap_mappings&) = delete;
  ~heap_mappings() {
    for (std::vector<mapping>& m : peers_) {
      for (mapping& x : m) munmap(x.here, x.bytes);
    }
  }

  /// Where [`address`, `address` + `bytes`) of `peer` (process `pid`) lies in this process,
  /// inside its shared-heap allocation `id`; null if it cannot be mapped or checked (the
  /// caller then reaches it by cross-memory copy).
  std::byte* here(int peer, std::int32_t pid, std::uint64_t id, std::uint64_t address,
                  std::size_t bytes) {
    const int fd = static_cast<int>((id >> 32) & 0x7fffffffu);
    const auto serial = static_cast<std::uint32_t>(id);
    const std::lock_guard lock(mutex_);
    std::vector<mapping>& mine = peers_[static_cast<std::size_t>(peer)];
    ++clock_;
    mapping* m = nullptr;
    for (mapping& x : mine) {
      if (x.fd == fd) m = &x;
    }
    if (m != nullptr && static_cast<std::uint32_t>(header_of(*m).serial) != serial) {
      munmap(m->here, m->bytes);  // the owner's descriptor now names another allocation
      *m = mine.back();
      mine.pop_back();
      m = nullptr;
    }
    if (m == nullptr) {
      if (mine.size() == most) {
        std::size_t oldest = 0;
        for (std::size_t i = 1; i < mine.size(); ++i) {
          if (mine[i].used < mine[oldest].used) oldest = i;
        }
        munmap(mine[oldest].here, mine[oldest].bytes);
        mine[oldest] = mine.back();
        mine.pop_back();
      }
      const peer_file_mapping fresh = map_peer_file(pid, fd, 0, sizeof(heap_header));
      if (fresh.here == nullptr) return nullptr;
      made_.fetch_add(1, std::memory_order_relaxed);
      mine.push_back({.fd = fd, .here = fresh.here, .bytes = fresh.bytes});
      m = &mine.back();
      if (static_cast<std::uint32_t>(header_of(*m).serial) != serial) return nullptr;
    }
    m->used = clock_;
    const heap_header h = header_of(*m);
    if (h.magic != heap_header::magic_value || h.data_offset > m->bytes ||
        h.data_bytes != m->bytes - h.data_offset || address < h.data_address ||
        bytes > h.data_bytes || address - h.data_address > h.data_bytes - bytes) {
      return nullptr;
    }
    return m->here + h.data_offset + (address - h.data_address);
  }

 private:
  struct mapping {
    int fd = -1;  ///< the owner's descriptor
    std::byte* here = nullptr;
    std::size_t bytes = 0;
    std::uint64_t used = 0;  ///< `clock_` at the last use
  };

  static heap_header header_of(const mapping& m) {
    heap_header h;
    std::memcpy(&h, m.here, sizeof h);
    return h;
  }

  static inline std::atomic<std::uint64_t> made_{0};
  std::mutex mutex_;
  std::uint64_t clock_ = 0;
  std::vector<std::vector<mapping>> peers_;
};

}  // namespace squall::detail::shm
