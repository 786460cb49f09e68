// SPDX-License-Identifier: Apache-2.0
#pragma once
/// Host byte copies: `copy_bytes`, the copy every host path of the library takes (a memcpy
/// that sidesteps one slow case of the C library's), and `stream_copy`, the copy with
/// non-temporal stores for outputs larger than the last-level cache.

#include <algorithm>  // min
#include <cstddef>    // size_t
#include <cstdint>    // uintptr_t
#include <cstring>    // memcpy
#if defined(__SSE2__) && !defined(__CUDACC__)
#include <emmintrin.h>  // _mm_loadu_si128, _mm_stream_si128, _mm_sfence
#endif

namespace squall::kernels {

/// Asks for the cache lines of `bytes` bytes at `p` into L2 (a hint: no fault, no effect on
/// results). For loops that alternate a read of a block from memory with a pass over it in
/// L1, during which the hardware prefetcher has no misses to follow: asking for a block ahead
/// keeps memory busy through the pass. Into L1 (prefetcht0) the quantizers' loop stalled on
/// the fill buffers.
inline void prefetch_lines(const void* p, std::size_t bytes) {
  const auto* at = static_cast<const char*>(p);
  for (std::size_t offset = 0; offset < bytes; offset += 64) __builtin_prefetch(at + offset, 0, 2);
}

/// The copies `copy_bytes` takes backwards: more than `min_bytes`, with the destination
/// 1 to `distance - 1` bytes after the source modulo a 4 KiB page.
struct aliased_copy {
  static constexpr std::size_t min_bytes = 2048;
  static constexpr std::uintptr_t distance = 128;
  static constexpr std::uintptr_t page = 4096;
  /// The kernel's cross-memory copies (REP MOVSB too) are slow only 1-31 bytes apart (4-6x;
  /// measured at 64 KiB, every distance 0-127, three source offsets).
  static constexpr std::uintptr_t kernel_distance = 32;
  static bool applies(const void* dst, const void* src, std::size_t bytes,
                      std::uintptr_t within = distance) {
    const std::uintptr_t apart =
        (reinterpret_cast<std::uintptr_t>(dst) - reinterpret_cast<std::uintptr_t>(src)) % page;
    return bytes > min_bytes && apart != 0 && apart < within;
  }
};

/// `bytes` from `src` to `dst`, which do not overlap. A memcpy, except where the destination
/// lies a few bytes after the source modulo 4 KiB (`aliased_copy`: a heap buffer, 16 bytes into
/// its page, filled from a page-aligned window or segment): glibc 2.36's memcpy copies those
/// with REP MOVSB from 2 KiB on, which ran at 1.1-2.4 GB/s instead of 26-60 on the project's
/// AMD EPYC for 2.5 KiB-256 KiB (measured, docs/performance.md, "Copies a few bytes apart
/// modulo 4 KiB"; the likely cause is 4 KiB aliasing: each load matches the store just before
/// it in its page offset). Those are copied from the end down in 64-byte blocks, each loaded
/// whole before it is stored, so no load follows a store to the same offset in a page:
/// 30-45 GB/s there.
inline void copy_bytes(void* dst, const void* src, std::size_t bytes) {
#if defined(__SSE2__) && !defined(__CUDACC__)
  if (aliased_copy::applies(dst, src, bytes)) {
    auto* d = static_cast<std::byte*>(dst);
    const auto* s = static_cast<const std::byte*>(src);
    std::size_t i = bytes;
    for (; i >= 64; i -= 64) {
      const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i - 64));
      const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i - 48));
      const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i - 32));
      const __m128i e = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i - 16));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(d + i - 64), a);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(d + i - 48), b);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(d + i - 32), c);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(d + i - 16), e);
    }
    std::memcpy(d, s, i);  // the first i < 64 bytes
    return;
  }
#endif
  if (bytes != 0) std::memcpy(dst, src, bytes);
}

/// What `publish_copy` remembers of the last buffer it published into one destination: its
/// size and its first and last 64 bytes, kept in the publisher's own memory.
struct published_lines {
  std::size_t bytes = 0;
  std::byte head[64] = {};
  std::byte tail[64] = {};
};

/// `copy_bytes` into a buffer that other cores read after it (a window the peers copy out of).
/// Where `src` has the size and the first and last 64 bytes of the last buffer published into
/// `dst` (`last`), it compares every 64-byte piece and stores only those that differ: a buffer
/// published again unchanged (a benchmark's loop, weights broadcast again) then leaves the
/// destination's lines as they were, in the readers' caches, where a copy would take each line
/// back from them and hand it to them again. A buffer with new values (a new gradient) is
/// copied at once, after the 128 bytes compared with `last`, which is the publisher's and in
/// its cache (reading the destination first would wait for lines the readers took). Either
/// way `dst` ends with `src`'s bytes.
inline void publish_copy(void* dst, const void* src, std::size_t bytes, published_lines& last) {
  const auto* s = static_cast<const std::byte*>(src);
#if defined(__SSE2__) && !defined(__CUDACC__)
  auto* d = static_cast<std::byte*>(dst);
  if (bytes >= 64 && bytes == last.bytes && std::memcmp(s, last.head, 64) == 0 &&
      std::memcmp(s + bytes - 64, last.tail, 64) == 0 && !aliased_copy::applies(dst, src, bytes)) {
    const auto same = [&](std::size_t i) {  // whether the 64 bytes at i are equal
      __m128i eq = _mm_set1_epi8(-1);
      for (std::size_t k = 0; k < 64; k += 16) {
        const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + k));
        const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(d + i + k));
        eq = _mm_and_si128(eq, _mm_cmpeq_epi8(a, b));
      }
      return _mm_movemask_epi8(eq) == 0xFFFF;
    };
    std::size_t i = 0;
    for (; i + 64 <= bytes; i += 64) {
      if (!same(i)) std::memcpy(d + i, s + i, 64);
    }
    if (i < bytes && std::memcmp(d + i, s + i, bytes - i) != 0)
      std::memcpy(d + i, s + i, bytes - i);
    return;
  }
#endif
  copy_bytes(dst, src, bytes);
  last.bytes = bytes;
  if (bytes >= 64) {
    std::memcpy(last.head, s, 64);
    std::memcpy(last.tail, s + bytes - 64, 64);
  }
}

/// From this many bytes of output the host decoders (hq's, the quantizers') write it with
/// non-temporal stores, each block made in a stack buffer then streamed out (`stream_copy`):
/// an output larger than the last-level cache goes to memory anyway, and its lines are then
/// not read before they are written (hq's decode of 16 Mi floats 1.3x faster rotated, 2.1x
/// unrotated, on the Intel VM; docs/performance.md). About the last-level cache, as
/// `collective_tuning::non_temporal_bytes`.
inline constexpr std::size_t stream_output_bytes = std::size_t{32} << 20;

/// `bytes` from `src` to `dst` (not overlapping) with non-temporal stores where the CPU has
/// them (x86-64's SSE2, every x86-64): the destination's lines are written without being read
/// first and bypass the caches, which pays for outputs larger than the last-level cache that
/// nothing reads soon (issue 22); then a store fence, so that what follows (a barrier's
/// atomic) is ordered after the stores. Elsewhere a plain memcpy.
inline void stream_copy(std::byte* dst, const std::byte* src, std::size_t bytes,
                        bool fence = true) {
#if defined(__SSE2__) && !defined(__CUDACC__)
  const std::size_t head = std::min(bytes, (16 - reinterpret_cast<std::uintptr_t>(dst) % 16) % 16);
  std::memcpy(dst, src, head);
  std::size_t i = head;
  for (; i + 64 <= bytes; i += 64) {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 16));
    const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 32));
    const __m128i d = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 48));
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i), a);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 16), b);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 32), c);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 48), d);
  }
  std::memcpy(dst + i, src + i, bytes - i);
  if (fence) _mm_sfence();
#else
  (void)fence;
  std::memcpy(dst, src, bytes);
#endif
}

/// The store fence after `stream_copy(..., false)`s (nothing where they were plain copies).
inline void stream_fence() {
#if defined(__SSE2__) && !defined(__CUDACC__)
  _mm_sfence();
#endif
}

}  // namespace squall::kernels
