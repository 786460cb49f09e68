// SPDX-License-Identifier: Apache-2.0
#pragma once
// Serial references for the compressed allreduce, computed from every rank's input without
// any collective: each rank's payload encoded on its own with the stream the communicator
// uses (random_stream{step, rank}), decoded, and combined in rank order.

#include <squall/backend/host.hpp>
#include <squall/compress/state.hpp>
#include <squall/core/buffer.hpp>
#include <squall/core/error.hpp>
#include <squall/core/random.hpp>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace squall::test {

/// Rank `q`'s payload of `in` at `step`, decoded (what every rank decodes of rank q's).
template <class C, class T>
std::vector<T> decoded_payload(const C& c, const std::vector<T>& in, std::uint64_t step, int q) {
  const host_backend b{};
  std::vector<std::byte> payload(c.max_payload_bytes(dtype_of<T>, in.size()));
  const host_view<const T> view(in.data(), in.size());
  const host_view<std::byte> out(payload.data(), payload.size());
  const random_stream stream{step, static_cast<std::uint32_t>(q)};
  std::size_t size = 0;
  if constexpr (requires { c.encode(b, view, out, stream); }) {
    size = c.encode(b, view, out, stream);
  } else {
    size = c.encode(b, view, out);
  }
  std::vector<T> decoded(in.size());
  c.decode(b, host_view<const std::byte>(payload.data(), size), host_view<T>(decoded));
  return decoded;
}

/// The gather-then-reduce result: the decoded payloads summed in rank order, in T.
template <class C, class T>
std::vector<T> gather_reference(const C& c, const std::vector<std::vector<T>>& inputs,
                                std::uint64_t step) {
  std::vector<T> sum = decoded_payload(c, inputs[0], step, 0);
  for (std::size_t q = 1; q < inputs.size(); ++q) {
    const std::vector<T> d = decoded_payload(c, inputs[q], step, static_cast<int>(q));
    for (std::size_t i = 0; i < sum.size(); ++i) sum[i] += d[i];
  }
  return sum;
}

/// The vote result: sign(sum of the decoded signs) x sum of the decoded magnitudes (0 on a
/// tie), in rank order, in T.
template <class C, class T>
std::vector<T> vote_reference(const C& c, const std::vector<std::vector<T>>& inputs,
                              std::uint64_t step) {
  const std::size_t count = inputs[0].size();
  std::vector<int> votes(count, 0);
  std::vector<T> magnitude(count, T(0));
  for (std::size_t q = 0; q < inputs.size(); ++q) {
    const std::vector<T> d = decoded_payload(c, inputs[q], step, static_cast<int>(q));
    for (std::size_t i = 0; i < count; ++i) {
      votes[i] += d[i] > 0 ? 1 : d[i] < 0 ? -1 : 0;
      magnitude[i] = q == 0 ? (d[i] < 0 ? -d[i] : d[i]) : magnitude[i] + (d[i] < 0 ? -d[i] : d[i]);
    }
  }
  std::vector<T> out(count);
  for (std::size_t i = 0; i < count; ++i) {
    out[i] = votes[i] > 0 ? magnitude[i] : votes[i] < 0 ? -magnitude[i] : T(0);
  }
  return out;
}

/// The message of the `invalid_argument` that `f()` throws, or "(nothing thrown)".
template <class F>
std::string what_of(const F& f) {
  try {
    f();
  } catch (const squall::invalid_argument& e) {
    return e.what();
  }
  return "(nothing thrown)";
}

}  // namespace squall::test
