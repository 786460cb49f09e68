// SPDX-License-Identifier: Apache-2.0
#pragma once
/// The harness every payload-decoder fuzz target shares (fuzz/<family>.fuzz.cpp). A family file
/// defines `family` (a struct with `static constexpr std::size_t compressors` and
/// `template <class F> static void with(std::size_t index, std::uint8_t parameter, F&& f)`,
/// which calls `f(compressor)` with the index-th compressor configured from `parameter`) and
/// then `SQUALL_FUZZ_TARGET(family)`.
///
/// Input layout (every input is valid; short inputs are padded with zeros):
///
///   byte 0     selector: bit 0 mode (0 raw, 1 mutate), bit 1 element type (0 float,
///              1 double), bits 2..7 the compressor (modulo `compressors`)
///   byte 1     the compressor's parameter byte (bucket, ratio, rank, ...: see `with`)
///   bytes 2-3  u16 count of output elements
///   byte 4     raw: bit 0 set takes the count from the payload header's count field
///                   (when it is at most 65535); mutate: the gradient's style (`gradient`)
///   raw:       bytes 5.. the payload, decoded as it is
///   mutate:    byte 5 the output-count change (int8; 0 decodes into the encoded count), then
///              edits of 4 bytes each (u16 offset, u8 operation, u8 value) applied to the valid
///              payload of a deterministic gradient before it is decoded
///
/// The only accepted outcome of a bad payload is `squall::error` (decoders throw
/// `invalid_argument`); any other exception escapes and libFuzzer reports it as a crash, as it
/// does ASan and UBSan reports. With SQUALL_FUZZ_SEED_DIR set, LLVMFuzzerInitialize writes a
/// seed corpus there (valid payloads in both modes) before fuzzing starts.

#include <squall/backend/host.hpp>
#include <squall/compress/state.hpp>
#include <squall/core/buffer.hpp>
#include <squall/core/error.hpp>
#include <squall/core/types.hpp>

#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

namespace squall::fuzz {

inline constexpr std::size_t max_count = 65535;        // raw mode: output elements
inline constexpr std::size_t max_encode_count = 4096;  // mutate mode: encoded elements
inline constexpr std::size_t raw_prefix = 5;
inline constexpr std::size_t mutate_prefix = 6;

/// Reads input bytes; past the end it reads zeros.
struct reader {
  const std::uint8_t* data;
  std::size_t size;
  std::uint8_t at(std::size_t i) const { return i < size ? data[i] : 0; }
  std::uint16_t u16(std::size_t i) const {
    return static_cast<std::uint16_t>(at(i) | (at(i + 1) << 8));
  }
};

/// A deterministic gradient of `n` elements in one of 8 styles: zeros, small values, one NaN,
/// infinities, subnormals, huge values, equal magnitudes, and arbitrary bit patterns.
template <class T>
std::vector<T> gradient(std::size_t n, std::uint8_t style) {
  using bits_t = std::conditional_t<sizeof(T) == 4, std::uint32_t, std::uint64_t>;
  std::vector<T> g(n);
  std::uint64_t state = 0x9e3779b97f4a7c15ull ^ (n * 0x100000001b3ull) ^ style;
  auto next = [&state] {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return state >> 11;  // 53 bits
  };
  auto uniform = [&] { return static_cast<double>(next()) * 0x1p-53 * 2 - 1; };  // [-1, 1)
  for (std::size_t i = 0; i < n; ++i) {
    switch (style % 8) {
      case 0:
        g[i] = T(0);
        break;
      case 1:
        g[i] = static_cast<T>(uniform());
        break;
      case 2:
        g[i] = i == n / 2 ? std::numeric_limits<T>::quiet_NaN() : static_cast<T>(uniform());
        break;
      case 3:
        g[i] = i % 5 == 0 ? (i % 2 ? -1 : 1) * std::numeric_limits<T>::infinity()
                          : static_cast<T>(uniform());
        break;
      case 4:
        g[i] = static_cast<T>(uniform()) * std::numeric_limits<T>::denorm_min() * T(1000);
        break;
      case 5:
        g[i] = static_cast<T>(uniform()) * std::numeric_limits<T>::max();
        break;
      case 6:
        g[i] = i % 2 ? T(0.5) : T(-0.5);
        break;
      default: {
        const auto b = static_cast<bits_t>(next() ^ (next() << 32));
        g[i] = std::bit_cast<T>(b);
      }
    }
  }
  return g;
}

/// Encodes `g` with `c` into a payload of exactly the size encode returns.
template <class C, class T>
std::vector<std::byte> encode(const C& c, const std::vector<T>& g) {
  std::vector<std::byte> payload(c.max_payload_bytes(dtype_of<T>, g.size()));
  const std::size_t size = c.encode(host_backend{}, host_view<const T>(g.data(), g.size()),
                                    host_view<std::byte>(payload.data(), payload.size()));
  payload.resize(size);
  return payload;
}

/// Decodes `payload` into `count` elements; a `squall::error` is the expected failure.
/// Built with -DSQUALL_FUZZ_UNALIGNED, the payload starts one byte past an aligned address
/// (sparsify and sketch accept that; cast and quantize read T through reinterpret_cast and do
/// not yet, so the tests leave it off).
template <class C, class T>
void decode(const C& c, const std::vector<std::byte>& payload, std::size_t count) {
  std::vector<T> out(count, T(-7));
#if defined(SQUALL_FUZZ_UNALIGNED)
  std::vector<std::byte> shifted(payload.size() + 1);
  if (!payload.empty()) std::memcpy(shifted.data() + 1, payload.data(), payload.size());
  const std::byte* bytes = shifted.data() + 1;
#else
  const std::byte* bytes = payload.data();
#endif
  const host_view<const std::byte> view(bytes, payload.size());
  try {
    c.decode(host_backend{}, view, host_view<T>(out.data(), out.size()));
  } catch (const squall::error&) {
  }
  // a compressor that decodes through a state of its own (FetchSGD): through a fresh one too
  // (two steps: clang checks a requires-parameter's type before the requirement)
  if constexpr (squall::keeps_own_state<C>) {
    auto state = c.template make_state<T>(count);
    if constexpr (requires {
                    c.decode(host_backend{}, state, view, host_view<T>(out.data(), out.size()));
                  }) {
      try {
        c.decode(host_backend{}, state, view, host_view<T>(out.data(), out.size()));
      } catch (const squall::error&) {
      }
    }
  }
}

/// Raw mode: the input's tail is the payload.
template <class C, class T>
void run_raw(const C& c, const reader& in) {
  std::vector<std::byte> payload;
  if (in.size > raw_prefix) {
    payload.resize(in.size - raw_prefix);
    std::memcpy(payload.data(), in.data + raw_prefix, payload.size());
  }
  std::size_t count = in.u16(2);
  if ((in.at(4) & 1) && payload.size() >= 16) {
    std::uint64_t header_count = 0;
    std::memcpy(&header_count, payload.data() + 8, 8);
    if (header_count <= max_count) count = static_cast<std::size_t>(header_count);
  }
  decode<C, T>(c, payload, count);
}

/// Mutate mode: a valid payload, then the input's edits.
template <class C, class T>
void run_mutate(const C& c, const reader& in) {
  const std::size_t n = in.u16(2) % (max_encode_count + 1);
  std::vector<std::byte> payload;
  try {
    payload = encode(c, gradient<T>(n, in.at(4)));
  } catch (const squall::error&) {
    return;  // a parameter the encoder refuses (e.g. a bad bucket): not what this fuzzes
  }
  const auto delta = static_cast<std::int8_t>(in.at(5));
  const std::size_t count = delta < 0 && static_cast<std::size_t>(-delta) > n ? 0 : n + delta;
  static constexpr std::uint64_t specials[] = {
      0, 1, 7, 8, 0xffffffffull, 0x100000000ull, 0x7fffffffffffffffull, ~0ull};
  for (std::size_t e = mutate_prefix; e + 4 <= in.size; e += 4) {
    const std::size_t offset = in.u16(e) % (payload.size() + 1);
    const std::uint8_t value = in.at(e + 3);
    switch (in.at(e + 2) % 8) {
      case 0:
      case 1:
      case 2:
        if (offset < payload.size()) payload[offset] ^= std::byte{value};
        break;
      case 3:
        if (offset < payload.size()) payload[offset] = std::byte{value};
        break;
      case 4:
        payload.resize(offset);
        break;
      case 5:
        payload.insert(payload.begin() + offset, value % 16 + 1, std::byte{value});
        break;
      case 6: {  // a u64 field (at an 8-aligned offset) set to a boundary value, or count +- 1
        const std::size_t at = offset / 8 * 8;
        if (at + 8 > payload.size()) break;
        std::uint64_t v =
            value < 8 * 4 ? specials[value % 8] : static_cast<std::uint64_t>(n) + (value % 3) - 1;
        std::memcpy(payload.data() + at, &v, 8);
        break;
      }
      default: {  // a u32 field set to a boundary value or to the value byte
        const std::size_t at = offset / 4 * 4;
        if (at + 4 > payload.size()) break;
        const std::uint32_t v =
            value < 128 ? value : static_cast<std::uint32_t>(specials[value % 8]);
        std::memcpy(payload.data() + at, &v, 4);
      }
    }
  }
  decode<C, T>(c, payload, count);
}

template <class Family>
int test_one_input(const std::uint8_t* data, std::size_t size) {
  const reader in{data, size};
  const std::uint8_t selector = in.at(0);
  Family::with((selector >> 2) % Family::compressors, in.at(1), [&](const auto& c) {
    using C = std::remove_cvref_t<decltype(c)>;
    if (selector & 2) {
      if (selector & 1)
        run_mutate<C, double>(c, in);
      else
        run_raw<C, double>(c, in);
    } else {
      if (selector & 1)
        run_mutate<C, float>(c, in);
      else
        run_raw<C, float>(c, in);
    }
  });
  return 0;
}

inline void write_seed(const std::string& dir, const std::vector<std::uint8_t>& bytes) {
  static unsigned serial = 0;
  const std::string path = dir + "/seed-" + std::to_string(serial++);
  if (std::FILE* f = std::fopen(path.c_str(), "wb")) {
    std::fwrite(bytes.data(), 1, bytes.size(), f);
    std::fclose(f);
  }
}

/// Seeds for every compressor, type and a few counts: a raw input holding a valid payload
/// (count from its header) and a mutate input with no edits.
template <class Family>
void write_seeds(const std::string& dir) {
  static constexpr std::uint16_t counts[] = {0, 1, 7, 8, 9, 64, 100, 1000};
  static constexpr std::uint8_t parameters[] = {0, 1, 16, 200};
  for (std::size_t index = 0; index < Family::compressors; ++index) {
    for (std::uint8_t parameter : parameters) {
      for (unsigned type = 0; type < 2; ++type) {
        for (std::uint16_t n : counts) {
          const auto selector = static_cast<std::uint8_t>(index << 2 | type << 1);
          const std::uint8_t style = static_cast<std::uint8_t>(n % 8);
          write_seed(dir,
                     {static_cast<std::uint8_t>(selector | 1), parameter,
                      static_cast<std::uint8_t>(n), static_cast<std::uint8_t>(n >> 8), style, 0});
          Family::with(index, parameter, [&](const auto& c) {
            std::vector<std::uint8_t> bytes = {selector, parameter, static_cast<std::uint8_t>(n),
                                               static_cast<std::uint8_t>(n >> 8), 1};
            try {
              std::vector<std::byte> payload;
              if (type)
                payload = encode(c, gradient<double>(n, style));
              else
                payload = encode(c, gradient<float>(n, style));
              for (std::byte b : payload) bytes.push_back(static_cast<std::uint8_t>(b));
              write_seed(dir, bytes);
            } catch (const squall::error&) {
            }
          });
        }
      }
    }
  }
}

}  // namespace squall::fuzz

/// Defines libFuzzer's entry points for `Family`.
#define SQUALL_FUZZ_TARGET(Family)                                                    \
  extern "C" int LLVMFuzzerInitialize(int*, char***) {                                \
    if (const char* dir = std::getenv("SQUALL_FUZZ_SEED_DIR")) {                      \
      squall::fuzz::write_seeds<Family>(dir);                                         \
    }                                                                                 \
    return 0;                                                                         \
  }                                                                                   \
  extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) { \
    return squall::fuzz::test_one_input<Family>(data, size);                          \
  }
