// SPDX-License-Identifier: Apache-2.0
#pragma once
/// A peer's memory file mapped into this process: what registered memory (`shm_registry.hpp`)
/// and the shared heap's peer mappings (`shared_heap.hpp`) both do. The peer's descriptor is
/// opened through /proc/<pid>/fd/<fd> (the same-user access cross-memory attach needs too),
/// mapped shared for reading and writing, and closed again: the mapping keeps the memory.

#include <sys/mman.h>
#include <sys/stat.h>

#include <cstddef>
#include <cstdint>
#include <fcntl.h>
#include <string>
#include <unistd.h>

namespace squall::detail::shm {

/// Where a peer's memory file lies in this process (`here` null: not mapped).
struct peer_file_mapping {
  std::byte* here = nullptr;
  std::size_t bytes = 0;  ///< the length mapped
};

/// Maps `bytes` of process `pid`'s descriptor `fd`, or, where `bytes` is 0, the whole file as
/// large as it is now, if it holds at least `least` bytes. `here` null if the file cannot be
/// opened, is shorter, or cannot be mapped (the caller then reaches that memory otherwise).
inline peer_file_mapping map_peer_file(std::int32_t pid, std::int32_t fd, std::size_t bytes,
                                       std::size_t least = 0) {
  const std::string path = "/proc/" + std::to_string(pid) + "/fd/" + std::to_string(fd);
  const int mine = open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (mine < 0) return {};
  if (bytes == 0) {
    struct stat s {};
    if (fstat(mine, &s) == 0 && s.st_size > 0) bytes = static_cast<std::size_t>(s.st_size);
  }
  void* p = bytes == 0 || bytes < least
                ? MAP_FAILED
                : mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, mine, 0);
  close(mine);
  if (p == MAP_FAILED) return {};
  return {.here = static_cast<std::byte*>(p), .bytes = bytes};
}

}  // namespace squall::detail::shm
