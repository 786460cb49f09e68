// SPDX-License-Identifier: Apache-2.0
#pragma once
/// Macros that let one function body compile for the host (g++) and the device (nvcc).

#if defined(__CUDACC__)
/// Marks a function callable from host and device code; empty without nvcc.
#define SQUALL_HOST_DEVICE __host__ __device__
/// Marks a function callable from device code only; empty without nvcc.
#define SQUALL_DEVICE __device__
#else
#define SQUALL_HOST_DEVICE
#define SQUALL_DEVICE
#endif

#if defined(__CUDA_ARCH__)
/// Defined while nvcc compiles the device side of a translation unit.
#define SQUALL_DEVICE_PASS 1
#endif

#if defined(__GNUC__) || defined(__clang__)
/// Asks for inlining of the small per-element functors on hot paths.
#define SQUALL_FORCEINLINE inline __attribute__((always_inline))
/// Promises that a pointer is not aliased inside the function.
#define SQUALL_RESTRICT __restrict__
#else
#define SQUALL_FORCEINLINE inline
#define SQUALL_RESTRICT
#endif

#if defined(__CUDACC__)
/// Unrolls the next loop of a host loop up to 16 times (`#pragma GCC unroll 16`, which clang
/// reads too). Empty where nvcc parses the host code: its front end rejects the GCC pragma.
#define SQUALL_UNROLL_16
#elif defined(__GNUC__) || defined(__clang__)
#define SQUALL_UNROLL_16 _Pragma("GCC unroll 16")
#else
#define SQUALL_UNROLL_16
#endif

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__CUDACC__) && \
    !defined(SQUALL_NO_CLONES)
/// Function multiversioning for hot host loops: a baseline x86-64 clone and an x86-64-v3
/// (AVX2, FMA, F16C) clone, picked once at load time by the CPU that runs the program. The
/// build itself never assumes more than the baseline (no -march=native). Empty elsewhere,
/// and with SQUALL_NO_CLONES defined.
#define SQUALL_HOST_CLONES __attribute__((target_clones("default", "arch=x86-64-v3")))
/// The same with an x86-64-v4 (AVX-512) clone too, for the loops it measurably speeds up (the
/// quantizers' encode: 1.3-1.8x on an AVX-512 Intel VM, docs/performance.md); not the default,
/// since the same clone made fp8's decode 0.6x as fast there.
#define SQUALL_HOST_CLONES_AVX512 \
  __attribute__((target_clones("default", "arch=x86-64-v3", "arch=x86-64-v4")))
#else
#define SQUALL_HOST_CLONES
#define SQUALL_HOST_CLONES_AVX512
#endif

#if defined(__GNUC__) && !defined(__clang__) && !defined(__CUDACC__)
/// Lets g++ if-convert (and so vectorize) loops of floating-point selects and conversions by
/// assuming no floating-point operation traps, which squall never enables (-fno-trapping-math
/// for this function only; results are unchanged), and keeps every product rounded before a
/// sum (-ffp-contract=off: g++ contracts by default in C++, and would fuse them into FMAs in
/// the x86-64-v3 clone of `SQUALL_HOST_CLONES` only, so the bits would depend on the CPU and
/// differ from the baseline clone's and the CUDA twins'). Empty elsewhere.
#define SQUALL_NO_TRAPPING_MATH __attribute__((optimize("no-trapping-math", "fp-contract=off")))
#else
#define SQUALL_NO_TRAPPING_MATH
#endif
