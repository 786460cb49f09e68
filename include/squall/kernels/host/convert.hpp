// SPDX-License-Identifier: Apache-2.0
#pragma once
/// Host conversion of float16 / bfloat16 arrays to and from float, for the blocked 16-bit
/// reduce loops. float16 uses the CPU's F16C instructions (vcvtph2ps / vcvtps2ph, round to
/// nearest even) when the running CPU has them, chosen at run time; otherwise, and for
/// bfloat16, the branch-free routines of core/types.hpp, which give the same bits.

#include <squall/backend/host.hpp>
#include <squall/core/config.hpp>
#include <squall/core/types.hpp>

#include <concepts>  // same_as
#include <cstddef>   // size_t
#include <cstring>   // memcpy
#include <type_traits>

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__CUDACC__)
#include <immintrin.h>  // _mm256_cvtph_ps, _mm256_cvtps_ph
#define SQUALL_HAS_F16C_PATH 1
#endif

namespace squall::kernels::detail {

#if defined(SQUALL_HAS_F16C_PATH)
__attribute__((target("avx,f16c"))) inline void widen_f16c(const float16* src, float* dst,
                                                           std::size_t count) {
  std::size_t i = 0;
  for (; i + 8 <= count; i += 8) {
    const __m128i half = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(half));
  }
  for (; i < count; ++i) dst[i] = static_cast<float>(src[i]);
}

__attribute__((target("avx,f16c"))) inline void narrow_f16c(const float* src, float16* dst,
                                                            std::size_t count) {
  std::size_t i = 0;
  for (; i + 8 <= count; i += 8) {
    const __m128i half = _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), half);
  }
  for (; i < count; ++i) dst[i] = float16(src[i]);
}

inline bool cpu_has_f16c() noexcept {
#if defined(__clang__) && __clang_major__ < 15
  // clang 14 (the fuzzers' and the asan preset's compiler) rejects the "f16c" query; every AVX2
  // CPU has F16C.
  return __builtin_cpu_supports("avx2");
#else
  return __builtin_cpu_supports("f16c") && __builtin_cpu_supports("avx");
#endif
}
#endif

template <class T>
SQUALL_HOST_CLONES void widen_portable(const T* SQUALL_RESTRICT src, float* SQUALL_RESTRICT dst,
                                       std::size_t count) {
  for (std::size_t i = 0; i < count; ++i) dst[i] = static_cast<float>(src[i]);
}

template <class T>
SQUALL_HOST_CLONES void narrow_portable(const float* SQUALL_RESTRICT src, T* SQUALL_RESTRICT dst,
                                        std::size_t count) {
  for (std::size_t i = 0; i < count; ++i) dst[i] = T(src[i]);
}

/// `dst[i] = float(src[i])` for `count` 16-bit values.
template <float16_like T>
void widen(const T* SQUALL_RESTRICT src, float* SQUALL_RESTRICT dst, std::size_t count) {
#if defined(SQUALL_HAS_F16C_PATH)
  if constexpr (std::is_same_v<T, float16>) {
    if (cpu_has_f16c()) return widen_f16c(src, dst, count);
  }
#endif
  widen_portable(src, dst, count);
}

/// `dst[i] = T(src[i])`, to nearest even, for `count` values.
template <float16_like T>
void narrow(const float* SQUALL_RESTRICT src, T* SQUALL_RESTRICT dst, std::size_t count) {
#if defined(SQUALL_HAS_F16C_PATH)
  if constexpr (std::is_same_v<T, float16>) {
    if (cpu_has_f16c()) return narrow_f16c(src, dst, count);
  }
#endif
  narrow_portable(src, dst, count);
}

}  // namespace squall::kernels::detail

namespace squall::kernels {

/// The element types `convert` takes: float, double, float16 and bfloat16.
template <class T>
concept convertible_element = std::same_as<T, float> || std::same_as<T, double> || float16_like<T>;

/// `out[i] = To(in[i])` for `count` elements, at least one of `From` and `To` 16-bit (the cast
/// compressor's body, kernels/cuda/convert.cuh is the twin): float and double round to the
/// 16-bit type to nearest even (double once, not through float); 16-bit values widen exactly;
/// one 16-bit type becomes the other through float (exact) and one rounding; the same type is
/// copied. NaN stays NaN (quieted, top payload bits kept), as core/types.hpp rounds it.
template <convertible_element To, convertible_element From>
void convert(const host_backend& /*backend*/, const From* SQUALL_RESTRICT in,
             To* SQUALL_RESTRICT out, std::size_t count) {
  if constexpr (std::same_as<From, To>) {
    if (count != 0) std::memcpy(out, in, count * sizeof(To));
  } else if constexpr (std::same_as<From, float> && float16_like<To>) {
    detail::narrow(in, out, count);
  } else if constexpr (float16_like<From> && std::same_as<To, float>) {
    detail::widen(in, out, count);
  } else if constexpr (std::same_as<From, double>) {
    for (std::size_t i = 0; i < count; ++i) out[i] = To(in[i]);  // one rounding
  } else {
    // a 16-bit type to double or to the other 16-bit type: exact in float, then To
    for (std::size_t i = 0; i < count; ++i) out[i] = To(static_cast<float>(in[i]));
  }
}

}  // namespace squall::kernels
