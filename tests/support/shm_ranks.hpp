// SPDX-License-Identifier: Apache-2.0
#pragma once
// Helpers for tests that run ranks as real processes (squall::launch): byte patterns that
// depend on (source, destination, size, index), and checks on what the ranks returned.

#include <squall/transport/launch.hpp>

#include <doctest/doctest.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <unistd.h>
#include <vector>

namespace squall::test {

/// The byte at `index` of the message `src` sends to `dst` of `size` bytes.
inline std::byte pattern(int src, int dst, std::size_t size, std::size_t index) {
  std::uint64_t x = index * 0x9E3779B97F4A7C15ull + static_cast<std::uint64_t>(src) * 1000003u +
                    static_cast<std::uint64_t>(dst) * 10007u + size;
  x ^= x >> 29;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 32;
  return static_cast<std::byte>(x & 0xff);
}

inline std::vector<std::byte> make_message(int src, int dst, std::size_t size) {
  std::vector<std::byte> bytes(size);
  for (std::size_t i = 0; i < size; ++i) bytes[i] = pattern(src, dst, size, i);
  return bytes;
}

/// True if `bytes` is exactly the message `src` sends to `dst`.
inline bool is_message(const std::vector<std::byte>& bytes, int src, int dst) {
  for (std::size_t i = 0; i < bytes.size(); ++i) {
    if (bytes[i] != pattern(src, dst, bytes.size(), i)) return false;
  }
  return true;
}

/// Whether the shared-memory name of `job` still exists in /dev/shm.
inline bool segment_left(const std::string& job) {
  return access(("/dev/shm" + detail::shm::segment_name(job)).c_str(), F_OK) == 0;
}

inline std::string statuses(const launch_result& result) {
  std::string text;
  for (std::size_t r = 0; r < result.status.size(); ++r) {
    text += "rank " + std::to_string(r) + ": " + std::to_string(result.status[r]) + "; ";
  }
  return text;
}

/// Runs `body` on `ranks` processes and checks that every one returned 0.
template <class Body>
void expect_ranks_succeed(int ranks, Body&& body, const launch_options& opts = {}) {
  const launch_result result = launch(ranks, body, opts);
  INFO(statuses(result));
  CHECK(result.ok());
}

}  // namespace squall::test
