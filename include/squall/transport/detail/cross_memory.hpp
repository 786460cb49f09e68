// SPDX-License-Identifier: Apache-2.0
#pragma once
/// Cross-memory copies (`process_vm_readv`/`_writev`) around the kernel's slow REP MOVSB case.

#include <squall/kernels/host/copy.hpp>

#include <sys/types.h>
#include <sys/uio.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace squall::detail::shm {

/// One cross-memory copy between this process and another (or itself): the kernel copies with
/// REP MOVSB, page by page, and is as slow as glibc's memcpy (1.5-2 GB/s instead of 7-10, at
/// every size) when the destination lies 1-31 bytes after the source modulo 4 KiB
/// (`kernels::aliased_copy::kernel_distance`: a heap buffer 16 bytes into its page against a
/// peer's page-aligned one, or two ranks whose heaps differ). Such a copy goes through a bounce
/// buffer of its own, placed at the remote address's offset in its page, at most
/// `bounce_piece` at a time, and `kernels::copy_bytes` moves the bytes between there and the
/// local side: one local copy more, at 30-60 GB/s, and the whole 3.3-3.9x faster
/// (`squall_bench_kernels --benchmark_filter=cross_memory/`). Not thread-safe (one per
/// transport).
class cross_memory {
 public:
  static constexpr std::size_t bounce_piece = std::size_t{256} << 10;

  /// Copies at most `bytes` between `local` and address `remote` of process `pid` (`write`:
  /// into it); returns what the system call returns (the bytes moved, or -1 with errno set).
  ssize_t copy(pid_t pid, std::byte* local, std::uint64_t remote, std::size_t bytes, bool write) {
    const void* const there = reinterpret_cast<const void*>(remote);
    constexpr std::uintptr_t within = kernels::aliased_copy::kernel_distance;
    std::byte* through = local;
    if (write ? kernels::aliased_copy::applies(there, local, bytes, within)
              : kernels::aliased_copy::applies(local, there, bytes, within)) {
      bytes = std::min(bytes, bounce_piece);
      if (bounce_.empty()) bounce_.resize(bounce_piece + kernels::aliased_copy::page);
      through = bounce_.data() + (remote - reinterpret_cast<std::uintptr_t>(bounce_.data())) %
                                     kernels::aliased_copy::page;
      if (write) kernels::copy_bytes(through, local, bytes);
    }
    iovec mine{through, bytes};
    iovec theirs{const_cast<void*>(there), bytes};
    const ssize_t got = write ? process_vm_writev(pid, &mine, 1, &theirs, 1, 0)
                              : process_vm_readv(pid, &mine, 1, &theirs, 1, 0);
    if (got > 0 && !write && through != local) {
      kernels::copy_bytes(local, through, static_cast<std::size_t>(got));  // keeps errno
    }
    return got;
  }

 private:
  std::vector<std::byte> bounce_;
};

}  // namespace squall::detail::shm
