// SPDX-License-Identifier: Apache-2.0
#pragma once
/// The header every compressed payload starts with, and its validation. Layout (16 bytes,
/// little-endian, then the compressor's body; docs/compressors.md):
///
///   offset 0  u16 magic 0x5153 ("SQ")   offset 2  u8 kind       offset 3  u8 version
///   offset 4  u8  dtype of the input     offset 5  u8 reserved (0)  offset 6  u16 parameter
///   offset 8  u64 count of input elements
///
/// `read_payload_header` checks every field against what the decoder expects and throws
/// `invalid_argument` naming the first field that is wrong, so a corrupt or foreign payload
/// never reaches a decode loop.

#include <squall/core/error.hpp>
#include <squall/core/types.hpp>

#include <cstddef>  // byte, size_t
#include <cstdint>
#include <cstring>  // memcpy
#include <string>
#include <string_view>

namespace squall {

/// Which compressor wrote a payload.
enum class payload_kind : std::uint8_t {
  cast_float16 = 1,
  cast_bfloat16 = 2,
  int8 = 3,
  sign = 4,
  sign_vote = 5,
  terngrad = 6,
  qsgd = 7,
  topk = 8,
  randomk = 9,
  threshold = 10,
  count_sketch = 11,
  powersgd = 12,
  fp8 = 13,  ///< E4M3 or E5M2, told apart by the levels field (448 or 57344)
  hq = 14,   ///< homomorphic integer quantization (compress/homomorphic.hpp)
  int4 = 15,
  chain = 16,  ///< a selection and its compressed values (compress/chain.hpp)
};

struct payload_header {
  static constexpr std::uint16_t magic_value = 0x5153;
  static constexpr std::size_t bytes = 16;

  std::uint16_t magic = magic_value;
  payload_kind kind{};
  std::uint8_t version = 1;
  dtype type{};
  std::uint8_t reserved = 0;
  std::uint16_t parameter = 0;
  std::uint64_t count = 0;
};
static_assert(sizeof(payload_header) == payload_header::bytes);

namespace detail {
/// Throws `invalid_argument` naming `operation` unless a payload buffer of `have` bytes holds
/// `size`.
inline void require_room(std::string_view operation, std::size_t have, std::size_t size) {
  if (have < size) {
    throw invalid_argument({.operation = operation}, "payload buffer of " + std::to_string(have) +
                                                         " bytes for " + std::to_string(size));
  }
}
}  // namespace detail

/// Throws `invalid_argument` naming `operation` unless `payload` is aligned to `alignment`
/// bytes (a compressor whose body is read as 16-bit values needs 2).
inline void require_payload_alignment(std::string_view operation, const std::byte* payload,
                                      std::size_t alignment) {
  if (reinterpret_cast<std::uintptr_t>(payload) % alignment != 0) {
    throw invalid_argument({.operation = operation}, "payload address is not aligned to " +
                                                         std::to_string(alignment) + " bytes");
  }
}

/// Writes `h` to the first 16 bytes of `out` (which has at least that many).
inline void write_payload_header(const payload_header& h, std::byte* out) {
  std::memcpy(out, &h, sizeof h);
}

/// Reads and checks the header of `payload` (`size` bytes): magic, `kind`, version 1, the
/// element type `type`, `count` and the reserved byte. Throws `invalid_argument` naming
/// `operation` and the first field that differs.
inline payload_header read_payload_header(std::string_view operation, const std::byte* payload,
                                          std::size_t size, payload_kind kind, dtype type,
                                          std::size_t count) {
  const error_context where{.operation = operation};
  if (size < payload_header::bytes) {
    throw invalid_argument(
        where, "payload of " + std::to_string(size) + " bytes is shorter than its 16-byte header");
  }
  payload_header h;
  std::memcpy(&h, payload, sizeof h);
  if (h.magic != payload_header::magic_value) {
    throw invalid_argument(where, "payload does not start with the squall magic");
  }
  if (h.kind != kind) {
    throw invalid_argument(where, "payload of kind " + std::to_string(static_cast<int>(h.kind)) +
                                      " where kind " + std::to_string(static_cast<int>(kind)) +
                                      " is expected");
  }
  if (h.version != 1) {
    throw invalid_argument(where, "payload version " + std::to_string(h.version) + " is not 1");
  }
  if (h.type != type) {
    throw invalid_argument(where, "payload of " + std::string(to_string(h.type)) +
                                      " elements decoded as " + std::string(to_string(type)));
  }
  if (h.reserved != 0) throw invalid_argument(where, "payload's reserved byte is not 0");
  if (h.count != count) {
    throw invalid_argument(where, "payload of " + std::to_string(h.count) +
                                      " elements decoded into " + std::to_string(count));
  }
  return h;
}

}  // namespace squall
