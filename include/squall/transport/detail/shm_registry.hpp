// SPDX-License-Identifier: Apache-2.0
#pragma once
/// Registered memory of a shared-memory job (issue 22): memory a rank allocates so that every
/// rank of the job maps it, and collectives on buffers inside it read and write the peers'
/// copies with plain loads and stores (no system call, no page pinning).
///
/// Each registration is one anonymous memory file per rank (`memfd_create`: it has no name in
/// /dev/shm, so a crashed job leaves nothing behind); the peers open it through
/// /proc/<pid>/fd/<fd> (the same-user access that cross-memory attach needs too) and map it;
/// the owner closes its descriptor once every peer has (a barrier), and the memory lives as
/// long as one mapping does. `registry` keeps, per registration, this rank's mapping and where
/// each peer's lies in this process; lookups go by the owner's registration id, which the
/// collectives exchange with the addresses, so a freed region's stale mapping is never used.

#include <squall/core/error.hpp>
#include <squall/transport/detail/peer_file.hpp>

#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <system_error>
#include <tuple>
#include <type_traits>
#include <unistd.h>
#include <utility>
#include <vector>

namespace squall::detail::shm {

/// What a rank tells its peers about its memory of one registration (every rank sends one).
struct registration_record {
  std::uint64_t id = 0;       ///< the registration's sequence number, the same on every rank
  std::uint64_t bytes = 0;    ///< the size asked for, the same on every rank
  std::uint64_t address = 0;  ///< where the memory lies in its owner
  std::int32_t pid = 0;       ///< the owner's process
  std::int32_t fd = -1;       ///< its memory file, open until every peer has mapped it
};

/// The registrations of one transport, shared with the `registered_memory` handles (which may
/// outlive the transport). Thread-safe: a handle may be freed while the communicator's
/// progress thread looks a region up.
class registry {
 public:
  struct region {
    std::uint64_t id = 0;
    std::size_t bytes = 0;               ///< mapped length (whole pages)
    std::vector<std::uint64_t> address;  ///< each rank's address of its own memory
    std::vector<std::byte*> here;        ///< where each rank's memory lies in this process, or null
  };

  /// A registration being made: this rank's memory file (`make_local`), its descriptor
  /// (closed when the draft ends: by then every peer has opened it, or the registration
  /// failed) and the region's mappings, unmapped at the end unless `add`ed.
  struct draft {
    region made;
    int fd;
    draft(std::uint64_t id, std::size_t bytes, std::size_t ranks, int rank,
          const error_context& where)
        : made{.id = id,
               .bytes = bytes,
               .address = std::vector<std::uint64_t>(ranks),
               .here = std::vector<std::byte*>(ranks)} {
      std::tie(fd, made.here[static_cast<std::size_t>(rank)]) = make_local(bytes, where);
    }
    draft(const draft&) = delete;
    draft& operator=(const draft&) = delete;
    ~draft() {
      close(fd);
      unmap(made);
    }
  };

  explicit registry(int rank) : rank_(rank) {}
  registry(const registry&) = delete;
  registry& operator=(const registry&) = delete;
  ~registry() {
    for (region& r : regions_) unmap(r);
  }

  /// A new memory file of `bytes` (whole pages), mapped here; huge pages asked for where the
  /// kernel offers them on shared memory (transparent_hugepage/shmem_enabled).
  static std::pair<int, std::byte*> make_local(std::size_t bytes, const error_context& where) {
    const int fd = static_cast<int>(memfd_create("squall-registered", MFD_CLOEXEC));
    if (fd < 0) throw error(std::error_code(errno, shm_category()), where, "memfd_create");
    if (ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
      const int err = errno;
      close(fd);
      throw error(std::error_code(err, shm_category()), where,
                  "ftruncate of " + std::to_string(bytes) + " bytes");
    }
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
      const int err = errno;
      close(fd);
      throw error(std::error_code(err, shm_category()), where,
                  "mmap of " + std::to_string(bytes) + " bytes");
    }
    madvise(p, bytes, MADV_HUGEPAGE);  // advice: ignored where shared huge pages are off
    return {fd, static_cast<std::byte*>(p)};
  }

  /// Keeps `d`'s region (its mappings now the registry's, unmapped by `remove`).
  void add(draft& d) {
    const std::lock_guard lock(mutex_);
    regions_.push_back(std::move(d.made));
    d.made.here.clear();  // moved from: empty, so the draft unmaps nothing
  }

  /// Unmaps registration `id` here (this rank's memory and its mappings of the peers').
  void remove(std::uint64_t id) noexcept {
    const std::lock_guard lock(mutex_);
    const auto it =
        std::find_if(regions_.begin(), regions_.end(), [&](const region& r) { return r.id == id; });
    if (it == regions_.end()) return;
    unmap(*it);
    regions_.erase(it);
  }

  /// The registration of this rank's memory holding all of [`p`, `p` + `bytes`), or 0.
  std::uint64_t id_of(const void* p, std::size_t bytes) const {
    const auto a = reinterpret_cast<std::uint64_t>(p);
    const std::lock_guard lock(mutex_);
    for (const region& r : regions_) {
      const std::uint64_t base = r.address[static_cast<std::size_t>(rank_)];
      if (a >= base && bytes <= r.bytes && a - base <= r.bytes - bytes) return r.id;
    }
    return 0;
  }

  /// Where [`address`, `address` + `bytes`) of `peer`'s memory in its registration `id` lies
  /// in this process, or null (`id` 0, not registered here, not mapped, or outside it).
  std::byte* here(int peer, std::uint64_t id, std::uint64_t address, std::size_t bytes) const {
    if (id == 0) return nullptr;
    const std::lock_guard lock(mutex_);
    for (const region& r : regions_) {
      if (r.id != id) continue;
      const auto q = static_cast<std::size_t>(peer);
      const std::uint64_t base = r.address[q];
      if (r.here[q] == nullptr || address < base || bytes > r.bytes ||
          address - base > r.bytes - bytes) {
        return nullptr;
      }
      return r.here[q] + (address - base);
    }
    return nullptr;
  }

 private:
  static void unmap(region& r) noexcept {
    for (std::byte*& p : r.here) {
      if (p != nullptr) munmap(p, r.bytes);
      p = nullptr;
    }
  }

  int rank_;
  mutable std::mutex mutex_;
  std::vector<region> regions_;
};

}  // namespace squall::detail::shm

namespace squall {

/// Memory that every rank of a shared-memory job maps (`shm_transport::register_memory`):
/// collectives on buffers inside it reach the peers' copies with plain loads and stores.
/// Move-only; freeing it (destruction) unmaps it here, which only this rank does (a peer's
/// mapping of it lives until the peer frees its own). It may outlive its transport.
class registered_memory {
 public:
  registered_memory() = default;
  registered_memory(std::shared_ptr<detail::shm::registry> owner, std::uint64_t id, std::byte* data,
                    std::size_t bytes)
      : owner_(std::move(owner)), id_(id), data_(data), bytes_(bytes) {}
  registered_memory(registered_memory&& other) noexcept
      : owner_(std::move(other.owner_)),
        id_(std::exchange(other.id_, 0)),
        data_(std::exchange(other.data_, nullptr)),
        bytes_(std::exchange(other.bytes_, 0)) {}
  registered_memory& operator=(registered_memory&& other) noexcept {
    if (this != &other) {
      release();
      owner_ = std::move(other.owner_);
      id_ = std::exchange(other.id_, 0);
      data_ = std::exchange(other.data_, nullptr);
      bytes_ = std::exchange(other.bytes_, 0);
    }
    return *this;
  }
  registered_memory(const registered_memory&) = delete;
  registered_memory& operator=(const registered_memory&) = delete;
  ~registered_memory() { release(); }

  std::byte* data() const { return data_; }
  /// The bytes asked for (the mapping is rounded up to whole pages).
  std::size_t size() const { return bytes_; }
  /// The registration's sequence number on this transport (1, 2, ...; 0 when empty).
  std::uint64_t id() const { return id_; }

 private:
  void release() noexcept {
    if (owner_ != nullptr && id_ != 0) owner_->remove(id_);
    owner_.reset();
    id_ = 0;
    data_ = nullptr;
    bytes_ = 0;
  }

  std::shared_ptr<detail::shm::registry> owner_;
  std::uint64_t id_ = 0;
  std::byte* data_ = nullptr;
  std::size_t bytes_ = 0;
};

/// `count` elements of `T` in registered memory (`shm_transport::allocate<T>`), zero-filled;
/// a contiguous container, so it converts to `buffer_view<T>` / `host_view<const T>` and every
/// view into it (a subview too) is recognised by the collectives, by its address.
template <class T>
class registered_buffer {
  static_assert(std::is_trivially_copyable_v<T>,
                "registered memory holds trivially copyable types");

 public:
  registered_buffer() = default;
  registered_buffer(registered_memory memory, std::size_t count)
      : memory_(std::move(memory)), count_(count) {}

  T* data() const { return reinterpret_cast<T*>(memory_.data()); }
  std::size_t size() const { return count_; }
  T* begin() const { return data(); }
  T* end() const { return data() + count_; }
  T& operator[](std::size_t i) const { return data()[i]; }
  const registered_memory& memory() const { return memory_; }

 private:
  registered_memory memory_;
  std::size_t count_ = 0;
};

}  // namespace squall
