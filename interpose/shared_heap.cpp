// SPDX-License-Identifier: Apache-2.0
// libsquall_mpi.so's allocation functions: SQUALL_MPI_SHARED_HEAP=BYTES (digits, optionally K,
// M or G) serves every allocation of at least BYTES from the process's shared heap
// (squall::detail::shm::shared_heap: each in a memory file of its own, which the peers of a
// shared-memory communicator map once and then reach with plain loads and stores), so that
// squall's collectives on an unmodified program's large buffers need no cross-memory copy,
// which pins every page it touches, per call. Unset or 0 (the default): every call goes
// straight to glibc's allocator, as without the library. SQUALL_MPI_ENABLE=0 turns it off too.
//
// glibc documents the set replaced here (malloc, free, calloc, realloc, aligned_alloc,
// malloc_usable_size, memalign, posix_memalign, pvalloc, valloc; and reallocarray); memory
// the shared heap did not give goes to glibc's own functions (`__libc_malloc` and the others,
// which glibc exports for this), memory it gave is recognised by its address range. A request
// the shared heap cannot take (its table full, an alignment above 2 MiB, no memory file) goes
// to glibc. Nothing here allocates: these functions run inside malloc.

#include <squall/transport/detail/shared_heap.hpp>

#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdlib>  // getenv
#include <cstring>  // memcpy
#include <dlfcn.h>  // dlsym: glibc's malloc_usable_size
#include <unistd.h>

#ifdef __GLIBC__

extern "C" {
void* __libc_malloc(std::size_t bytes);
void __libc_free(void* p);
void* __libc_calloc(std::size_t count, std::size_t bytes);
void* __libc_realloc(void* p, std::size_t bytes);
void* __libc_memalign(std::size_t alignment, std::size_t bytes);
}

namespace {

using squall::detail::shm::shared_heap;

constexpr std::size_t off = ~std::size_t{0};
constexpr std::size_t unread = off - 1;
std::atomic<std::size_t> shared_from{unread};

/// SQUALL_MPI_SHARED_HEAP as a byte count (K, M, G: powers of 1024); `off` when unset, 0, or
/// malformed (the library's configuration check names a malformed value at MPI_Init).
std::size_t parse_threshold(const char* text) noexcept {
  if (text == nullptr || *text == '\0') return off;
  std::size_t value = 0;
  const char* c = text;
  for (; *c >= '0' && *c <= '9'; ++c) {
    if (value > (off >> 4)) return off;
    value = value * 10 + static_cast<std::size_t>(*c - '0');
  }
  if (c == text) return off;
  int shift = 0;
  if (*c == 'K') shift = 10;
  if (*c == 'M') shift = 20;
  if (*c == 'G') shift = 30;
  if (shift != 0) ++c;
  if (*c != '\0' || value == 0 || value > (off >> (shift + 1))) return off;
  return value << shift;
}

/// The smallest allocation the shared heap serves; `off` when it serves none.
std::size_t threshold() noexcept {
  std::size_t t = shared_from.load(std::memory_order_relaxed);
  if (t != unread) return t;
  const char* enable = std::getenv("SQUALL_MPI_ENABLE");
  t = enable != nullptr && enable[0] == '0' && enable[1] == '\0'
          ? off
          : parse_threshold(std::getenv("SQUALL_MPI_SHARED_HEAP"));
  shared_from.store(t, std::memory_order_relaxed);
  return t;
}

/// `bytes` from the shared heap when they reach the threshold, else null; zero-filled where
/// `zero`.
void* from_shared_heap(std::size_t bytes, std::size_t alignment, bool zero = false) noexcept {
  return bytes >= threshold() ? shared_heap::instance().allocate(bytes, alignment, zero) : nullptr;
}

bool is_power_of_two(std::size_t x) noexcept { return x != 0 && (x & (x - 1)) == 0; }

}  // namespace

#define SQUALL_MPI_EXPORT __attribute__((visibility("default")))

extern "C" {

SQUALL_MPI_EXPORT void* malloc(std::size_t bytes) {
  if (void* p = from_shared_heap(bytes, alignof(std::max_align_t))) return p;
  return __libc_malloc(bytes);
}

SQUALL_MPI_EXPORT void free(void* p) {
  if (shared_heap::instance().owns(p)) {
    shared_heap::instance().release(p);
    return;
  }
  __libc_free(p);
}

SQUALL_MPI_EXPORT void* calloc(std::size_t count, std::size_t bytes) {
  std::size_t total = 0;
  if (!__builtin_mul_overflow(count, bytes, &total)) {
    if (void* p = from_shared_heap(total, alignof(std::max_align_t), true)) return p;
  }
  return __libc_calloc(count, bytes);
}

SQUALL_MPI_EXPORT void* realloc(void* p, std::size_t bytes) {
  shared_heap& heap = shared_heap::instance();
  if (p == nullptr) return malloc(bytes);
  if (!heap.owns(p)) return __libc_realloc(p, bytes);
  if (bytes == 0) {  // as glibc: frees, returns null
    heap.release(p);
    return nullptr;
  }
  const std::size_t usable = heap.usable(p);
  if (bytes <= usable) return p;
  void* moved = malloc(bytes);
  if (moved == nullptr) return nullptr;  // errno is malloc's; p stays valid
  std::memcpy(moved, p, usable);
  heap.release(p);
  return moved;
}

SQUALL_MPI_EXPORT void* reallocarray(void* p, std::size_t count, std::size_t bytes) {
  std::size_t total = 0;
  if (__builtin_mul_overflow(count, bytes, &total)) {
    errno = ENOMEM;
    return nullptr;
  }
  return realloc(p, total);
}

SQUALL_MPI_EXPORT int posix_memalign(void** out, std::size_t alignment, std::size_t bytes) {
  if (!is_power_of_two(alignment) || alignment % sizeof(void*) != 0) return EINVAL;
  void* p = from_shared_heap(bytes, alignment);
  if (p == nullptr) p = __libc_memalign(alignment, bytes);
  if (p == nullptr) return ENOMEM;
  *out = p;
  return 0;
}

SQUALL_MPI_EXPORT void* memalign(std::size_t alignment, std::size_t bytes) {
  if (void* p = is_power_of_two(alignment) ? from_shared_heap(bytes, alignment) : nullptr) {
    return p;
  }
  return __libc_memalign(alignment, bytes);
}

SQUALL_MPI_EXPORT void* aligned_alloc(std::size_t alignment, std::size_t bytes) {
  return memalign(alignment, bytes);
}

SQUALL_MPI_EXPORT void* valloc(std::size_t bytes) {
  return memalign(static_cast<std::size_t>(sysconf(_SC_PAGESIZE)), bytes);
}

SQUALL_MPI_EXPORT void* pvalloc(std::size_t bytes) {
  const auto page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
  std::size_t rounded = 0;
  if (__builtin_add_overflow(bytes, page - 1, &rounded)) {
    errno = ENOMEM;
    return nullptr;
  }
  return memalign(page, rounded / page * page);
}

/// How many times a rank of this process mapped a peer's shared-heap allocation (what the
/// tests read to see that the peers' buffers were reached through mappings).
SQUALL_MPI_EXPORT unsigned long long squall_mpi_shared_heap_mappings() {
  return squall::detail::shm::heap_mappings::made();
}

SQUALL_MPI_EXPORT std::size_t malloc_usable_size(void* p) {
  if (shared_heap::instance().owns(p)) return shared_heap::instance().usable(p);
  using usable_size = std::size_t (*)(void*);
  static const auto glibcs = reinterpret_cast<usable_size>(dlsym(RTLD_NEXT, "malloc_usable_size"));
  return glibcs == nullptr || p == nullptr ? 0 : glibcs(p);
}

}  // extern "C"

#endif  // __GLIBC__
