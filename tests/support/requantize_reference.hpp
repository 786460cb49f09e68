// SPDX-License-Identifier: Apache-2.0
#pragma once
// A serial re-implementation of per-hop requantization (the compressed allreduce of int8,
// qsgd, terngrad and sign on a ring or a tree), written from the documented hop order, not
// from algorithm/detail/requantize.hpp: every rank's input in one process, each block's chain
// of encodes walked in order with the documented streams, so a collective's result can be
// compared with it bitwise. It also returns, per element, the sum over the chain's encodes of
// the encode's quantization step (scale / levels of the bucket that holds the element), the
// unit of every per-hop error bound.

#include <squall/backend/host.hpp>
#include <squall/core/buffer.hpp>
#include <squall/core/random.hpp>
#include <squall/core/types.hpp>
#include <squall/detail/math.hpp>
#include <squall/kernels/host/quantize.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace squall::test {

template <class T>
struct hop_reference {
  std::vector<T> out;          ///< what every rank holds
  std::vector<double> steps;   ///< per element: the sum of the encodes' quantization steps
  std::vector<double> steps2;  ///< per element: the sum of their squares
};

/// Encodes `partial` (the elements [begin, begin + n) of the vector) with stream
/// {step, word}, decodes it into `partial`'s place and adds each element's quantization step
/// scale / s (and its square) to `ref`: scale the bucket's L2 norm (qsgd) or max |x|.
template <class C, class T>
void encode_hop(const C& c, std::vector<T>& partial, std::size_t begin, std::size_t n,
                std::uint64_t step, std::uint32_t word, hop_reference<T>& ref,
                std::vector<T>* residual) {
  const host_backend b{};
  std::vector<std::byte> payload(c.max_payload_bytes(dtype_of<T>, n));
  const std::size_t size =
      c.encode(b, host_view<const T>(partial.data() + begin, n),
               host_view<std::byte>(payload.data(), payload.size()), random_stream{step, word});
  std::vector<T> decoded(n);
  c.decode(b, host_view<const std::byte>(payload.data(), size), host_view<T>(decoded));
  // the payload's buckets: `bucket` elements from the block's start (one if bucket >= n or 0)
  const std::size_t bucket =
      c.bucket == 0 || c.bucket >= n ? n : static_cast<std::size_t>(c.bucket);
  for (std::size_t first = 0; first < n; first += bucket) {
    const std::size_t last = std::min(n, first + bucket);
    double largest = 0;
    double squares = 0;
    for (std::size_t i = first; i < last; ++i) {
      const double x = partial[begin + i];
      largest = std::max(largest, std::fabs(x));
      squares += x * x;
    }
    // qsgd scales by the L2 norm, the others by max |x| (sign's mean |x| is below it)
    const double scale =
        C::scheme.scale == kernels::bucket_scale::l2_norm ? std::sqrt(squares) : largest;
    const double levels = C::scheme.levels;
    for (std::size_t i = first; i < last; ++i) {
      ref.steps[begin + i] += scale / levels;
      ref.steps2[begin + i] += (scale / levels) * (scale / levels);
    }
  }
  for (std::size_t i = 0; i < n; ++i) {
    if (residual != nullptr) (*residual)[begin + i] = partial[begin + i] - decoded[i];
    partial[begin + i] = decoded[i];
  }
}

/// What each rank adds along the hops: its input, or with error feedback (`residuals`) its
/// residual after residual += input (which this updates).
template <class T>
std::vector<std::vector<T>> with_residuals(const std::vector<std::vector<T>>& inputs,
                                           std::vector<std::vector<T>>* residuals) {
  if (residuals == nullptr) return inputs;
  std::vector<std::vector<T>> x(inputs.size());
  for (std::size_t q = 0; q < inputs.size(); ++q) {
    auto& r = (*residuals)[q];
    for (std::size_t i = 0; i < inputs[q].size(); ++i) r[i] += inputs[q][i];
    x[q] = r;
  }
  return x;
}

/// The ring: block b (of P near-equal blocks) starts at rank b+1 and passes b+2, ..., b+P = b;
/// the j-th rank of the chain q adds its input to the decoded partial (j > 0) and encodes it
/// with stream {step, q + P j}; the last (the owner, j = P-1) encodes the final payload.
/// With `residuals` (error feedback): residual_q += input_q first, the chain adds residual_q,
/// and each encode sets residual_q = partial - decode over its block.
template <class C, class T>
hop_reference<T> ring_reference(const C& c, const std::vector<std::vector<T>>& inputs,
                                std::uint64_t step,
                                std::vector<std::vector<T>>* residuals = nullptr) {
  const int p = static_cast<int>(inputs.size());
  const std::size_t count = inputs[0].size();
  hop_reference<T> ref{std::vector<T>(count), std::vector<double>(count),
                       std::vector<double>(count)};
  std::vector<std::vector<T>> x = with_residuals(inputs, residuals);
  if (count == 0) return ref;
  std::vector<T> partial(count);
  for (int b = 0; b < p; ++b) {
    const auto block =
        detail::split_range(count, static_cast<std::size_t>(p), static_cast<std::size_t>(b));
    for (int j = 0; j < p; ++j) {
      const int q = (b + 1 + j) % p;
      const auto& mine = x[static_cast<std::size_t>(q)];
      for (std::size_t i = block.begin; i < block.begin + block.count; ++i) {
        partial[i] = j == 0 ? mine[i] : mine[i] + partial[i];
      }
      encode_hop(c, partial, block.begin, block.count, step, static_cast<std::uint32_t>(q + p * j),
                 ref, residuals != nullptr ? &(*residuals)[static_cast<std::size_t>(q)] : nullptr);
    }
  }
  ref.out = partial;
  return ref;
}

/// The tree (heap-ordered, root 0): rank v's partial is its input plus the decoded payload of
/// child 2v+1, then of child 2v+2, encoded with stream {step, v}; the root's is the final
/// payload. Error feedback as for the ring.
template <class C, class T>
hop_reference<T> tree_reference(const C& c, const std::vector<std::vector<T>>& inputs,
                                std::uint64_t step,
                                std::vector<std::vector<T>>* residuals = nullptr) {
  const int p = static_cast<int>(inputs.size());
  const std::size_t count = inputs[0].size();
  hop_reference<T> ref{std::vector<T>(count), std::vector<double>(count),
                       std::vector<double>(count)};
  std::vector<std::vector<T>> x = with_residuals(inputs, residuals);
  if (count == 0) return ref;
  // children have larger numbers than parents: walk v from P-1 down to 0
  std::vector<std::vector<T>> sent(static_cast<std::size_t>(p));
  for (int v = p - 1; v >= 0; --v) {
    std::vector<T> partial = x[static_cast<std::size_t>(v)];
    for (const int child : {2 * v + 1, 2 * v + 2}) {
      if (child >= p) continue;
      for (std::size_t i = 0; i < count; ++i)
        partial[i] += sent[static_cast<std::size_t>(child)][i];
    }
    encode_hop(c, partial, 0, count, step, static_cast<std::uint32_t>(v), ref,
               residuals != nullptr ? &(*residuals)[static_cast<std::size_t>(v)] : nullptr);
    sent[static_cast<std::size_t>(v)] = partial;
  }
  ref.out = sent[0];
  return ref;
}

}  // namespace squall::test
