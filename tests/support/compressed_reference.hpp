// SPDX-License-Identifier: Apache-2.0
#pragma once
// Serial references for the compressed allreduce, computed from every rank's input without
// any collective: each rank's payload encoded on its own with the stream the communicator
// uses (random_stream{step, rank}), decoded, and combined in rank order.

#include <squall/backend/host.hpp>
#include <squall/compress/homomorphic.hpp>
#include <squall/compress/sketch.hpp>
#include <squall/compress/state.hpp>
#include <squall/core/buffer.hpp>
#include <squall/core/error.hpp>
#include <squall/core/random.hpp>

#include <algorithm>  // max, sort, stable_sort
#include <bit>        // countr_zero
#include <cmath>      // fabs
#include <cstddef>
#include <cstdint>
#include <cstring>  // memcpy, memcmp
#include <string>
#include <utility>  // pair
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

/// The range the ranks of a homomorphic compressor agree for `inputs` at `step`: the largest
/// max |y| and rms of their local ranges, summing `inputs.size()` ranks.
template <class T>
agreed_range hq_agreed(const homomorphic_compressor& c, const std::vector<std::vector<T>>& inputs,
                       std::uint64_t step) {
  agreed_range r{.ranks = static_cast<std::uint32_t>(inputs.size())};
  for (const auto& x : inputs) {
    const agreed_range mine = c.local_range(host_backend{}, host_view<const T>(x), step);
    r.max_abs = std::max(r.max_abs, mine.max_abs);
    r.rms = std::max(r.rms, mine.rms);
  }
  return r;
}

/// Rank `rank`'s payload of `in` at `step` against the agreed range `agreed`.
template <class T>
std::vector<std::byte> hq_payload(const homomorphic_compressor& c, const std::vector<T>& in,
                                  std::uint64_t step, std::uint32_t rank, agreed_range agreed) {
  std::vector<std::byte> payload(c.max_payload_bytes(dtype_of<T>, in.size()));
  payload.resize(c.encode(host_backend{}, host_view<const T>(in), host_view<std::byte>(payload),
                          random_stream{step, rank}, agreed));
  return payload;
}

/// The payloads' bodies added as 64-bit words, as a topology's sum adds them (the prefix,
/// equal in all, from the first).
inline std::vector<std::byte> hq_add_bodies(const std::vector<std::vector<std::byte>>& payloads) {
  std::vector<std::byte> sum = payloads.at(0);
  const std::size_t offset = homomorphic_compressor::body_offset;
  for (std::size_t q = 1; q < payloads.size(); ++q) {
    if (payloads[q].size() != sum.size() || std::memcmp(payloads[q].data(), sum.data(), offset)) {
      throw invalid_argument({.operation = "hq reference"}, "payloads of different prefixes");
    }
    for (std::size_t at = offset; at < sum.size(); at += 8) {
      std::uint64_t a = 0;
      std::uint64_t b = 0;
      std::memcpy(&a, sum.data() + at, 8);
      std::memcpy(&b, payloads[q].data() + at, 8);
      a += b;
      std::memcpy(sum.data() + at, &a, 8);
    }
  }
  return sum;
}

/// The homomorphic (linear) result: every rank's payload against the agreed range, the bodies
/// added as integers, decoded once.
template <class T>
std::vector<T> hq_reference(const homomorphic_compressor& c,
                            const std::vector<std::vector<T>>& inputs, std::uint64_t step) {
  const agreed_range r = hq_agreed(c, inputs, step);
  std::vector<std::vector<std::byte>> payloads;
  for (std::size_t q = 0; q < inputs.size(); ++q) {
    payloads.push_back(hq_payload(c, inputs[q], step, static_cast<std::uint32_t>(q), r));
  }
  const std::vector<std::byte> sum = hq_add_bodies(payloads);
  std::vector<T> out(inputs.at(0).size());
  c.decode(host_backend{}, host_view<const std::byte>(sum), host_view<T>(out));
  return out;
}

/// hq gathered: every rank's payload against the agreed range of one rank per field,
/// decoded one by one and summed in rank order, in T.
template <class T>
std::vector<T> hq_gather_reference(const homomorphic_compressor& c,
                                   const std::vector<std::vector<T>>& inputs, std::uint64_t step) {
  agreed_range r = hq_agreed(c, inputs, step);
  r.ranks = 1;
  std::vector<T> sum(inputs.at(0).size());
  std::vector<T> one(sum.size());
  for (std::size_t q = 0; q < inputs.size(); ++q) {
    const auto payload = hq_payload(c, inputs[q], step, static_cast<std::uint32_t>(q), r);
    c.decode(host_backend{}, host_view<const std::byte>(payload), host_view<T>(one));
    for (std::size_t i = 0; i < sum.size(); ++i) sum[i] = q == 0 ? one[i] : sum[i] + one[i];
  }
  return sum;
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

/// A count sketch in double from the hash formula (kernels/host/sketch.hpp's `sketch_word`,
/// `sketch_bucket`, `sketch_sign_bit`), for the serial references of the sketching
/// aggregations (FetchSGD, count sketch's two rounds): independent of the sketch kernels.
template <std::size_t Rows, std::size_t Cols>
struct sketch_reference {
  std::uint64_t seed = 0;
  std::uint64_t step = 0;  ///< the hashes' step

  /// Where coordinate i lands in row r (r x Cols + its column) and its sign there.
  std::pair<std::size_t, double> at(std::size_t r, std::size_t i) const {
    constexpr unsigned bits = static_cast<unsigned>(std::countr_zero(Cols));
    const auto h = kernels::make_sketch_row_hash(seed, {step, shared_rank}, r);
    const std::uint64_t w = kernels::sketch_word(h, i);
    return {r * Cols + kernels::sketch_bucket(w, bits),
            kernels::sketch_sign_bit(w) != 0 ? -1.0 : 1.0};
  }
  /// Adds the sketch of `x` to `sketch` (Rows x Cols).
  template <class V>
  void add(std::vector<double>& sketch, const std::vector<V>& x) const {
    for (std::size_t i = 0; i < x.size(); ++i) {
      for (std::size_t r = 0; r < Rows; ++r) {
        const auto [b, sign] = at(r, i);
        sketch[b] += sign * static_cast<double>(x[i]);
      }
    }
  }
  /// Every coordinate's median over the rows of its signed bucket in `sketch`.
  std::vector<double> estimates(const std::vector<double>& sketch, std::size_t count) const {
    std::vector<double> est(count);
    for (std::size_t i = 0; i < count; ++i) {
      std::vector<double> rows;
      for (std::size_t r = 0; r < Rows; ++r) {
        const auto [b, sign] = at(r, i);
        rows.push_back(sign * sketch[b]);
      }
      std::sort(rows.begin(), rows.end());
      est[i] = rows[Rows / 2];
    }
    return est;
  }
};

/// 0 .. v.size() - 1 in order of decreasing |v| (ties: the lower index first), as the top-k
/// selections order them.
inline std::vector<std::size_t> by_magnitude(const std::vector<double>& v) {
  std::vector<std::size_t> order(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](std::size_t a, std::size_t b) { return std::fabs(v[a]) > std::fabs(v[b]); });
  return order;
}

/// Count sketch's two rounds, serially in double (`sketch_reference`): r_q = residual_q + x_q
/// (error feedback) or x_q; the sum of the ranks' sketches of r at the step's hashes; its
/// median estimates; I = the k largest in magnitude (ties to the lower index); the result is
/// the exact sum of the r_q at I, 0 elsewhere, and residual_q = r_q with I zeroed. Integer
/// inputs: every sum exact, so any order must give these bits.
template <std::size_t Rows, std::size_t Cols>
struct two_round_reference {
  count_sketch_compressor<Rows, Cols> c;
  bool feedback = false;
  std::vector<std::vector<double>> residual;

  std::vector<float> step(const std::vector<std::vector<float>>& in, std::size_t count,
                          std::uint64_t step) {
    const sketch_reference<Rows, Cols> hashes{.seed = c.seed, .step = step};
    residual.resize(in.size(), std::vector<double>(count, 0.0));
    std::vector<std::vector<double>> r(in.size(), std::vector<double>(count));
    std::vector<double> sketch(Rows * Cols, 0.0);
    for (std::size_t q = 0; q < in.size(); ++q) {
      for (std::size_t i = 0; i < count; ++i) {
        r[q][i] = (feedback ? residual[q][i] : 0.0) + in[q][i];
      }
      hashes.add(sketch, r[q]);
    }
    const std::vector<std::size_t> order = by_magnitude(hashes.estimates(sketch, count));
    std::vector<float> out(count, 0.0f);
    for (std::size_t j = 0; j < std::min(c.kept(), count); ++j) {
      const std::size_t i = order[j];
      double sum = 0;
      for (auto& x : r) {
        sum += x[i];
        x[i] = 0;  // sent: it leaves the residual
      }
      out[i] = static_cast<float>(sum);
    }
    if (feedback) residual = r;
    return out;
  }
};

}  // namespace squall::test
