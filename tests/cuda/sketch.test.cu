// SPDX-License-Identifier: Apache-2.0
// The CUDA sketching kernels against their host twins:
// - count-sketch estimates and the heavy-hitter selection, from the same sketch, bit for bit;
// - count-sketch accumulation (atomicAdd: each bucket's terms summed in another order) within
//   the reassociation bound 2 n_b eps sum_b |g_i| per bucket, with n_b and sum_b |g_i| from an
//   independent replay of the hashes here;
// - PowerSGD's random factor bit for bit; its products within one rounding of T plus
//   2 n eps_double sum |terms| (sums in double in another order, with fused multiply-adds);
//   orthogonalization and whole payloads within the absolute / relative tolerances below.
// The host side is tested against the papers in tests/compress/sketch.test.cpp.

#include <squall/cuda.cuh>

#include <doctest/doctest.h>

#include <algorithm>
#include <bit>  // countr_zero
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "../support/cuda_device.cuh"
#include "../support/data.hpp"

namespace kernels = squall::kernels;
namespace test = squall::test;
using squall::cuda_backend;
using squall::device_view;
using squall::host_backend;
using squall::host_view;

namespace {

template <class T>
T value_at(const std::vector<std::byte>& bytes, std::size_t offset) {
  T v;
  std::memcpy(&v, bytes.data() + offset, sizeof v);
  return v;
}

// ---- count sketch ----------------------------------------------------------------------------

/// The device sketch `got` against the host's `expected` (same header; buckets within the
/// reassociation bound).
template <std::size_t Rows, std::size_t Cols, class T>
void check_sketch_bytes(const std::vector<std::byte>& got, const std::vector<std::byte>& expected,
                        const std::vector<T>& g, std::uint64_t seed, std::uint64_t step) {
  constexpr std::size_t head = squall::count_sketch_compressor<Rows, Cols>::body_offset;
  REQUIRE(got.size() == expected.size());
  REQUIRE(std::equal(got.begin(), got.begin() + head, expected.begin()));
  // n_b and sum_b |g_i| per bucket, from the hashes replayed here
  std::vector<double> mass(Rows * Cols, 0.0);
  std::vector<double> terms(Rows * Cols, 0.0);
  constexpr auto bits = static_cast<unsigned>(std::countr_zero(Cols));
  for (std::size_t r = 0; r < Rows; ++r) {
    const auto h = kernels::make_sketch_row_hash(seed, {step, squall::shared_rank}, r);
    for (std::size_t i = 0; i < g.size(); ++i) {
      const auto b =
          static_cast<std::size_t>(kernels::sketch_bucket(kernels::sketch_word(h, i), bits));
      mass[r * Cols + b] += std::fabs(static_cast<double>(g[i]));
      terms[r * Cols + b] += 1;
    }
  }
  const double eps = std::numeric_limits<T>::epsilon();
  for (std::size_t e = 0; e < Rows * Cols; ++e) {
    const double d = static_cast<double>(value_at<T>(got, head + e * sizeof(T)));
    const double h = static_cast<double>(value_at<T>(expected, head + e * sizeof(T)));
    CAPTURE(e);
    REQUIRE(std::fabs(d - h) <= 2.0 * terms[e] * eps * mass[e]);
  }
}

template <std::size_t Rows, std::size_t Cols, class T>
void check_count_sketch(std::size_t count) {
  CAPTURE(count);
  CAPTURE(Rows);
  CAPTURE(Cols);
  squall::count_sketch_compressor<Rows, Cols> c;
  c.seed = 5;
  const squall::random_stream stream{7, 2};
  const auto g = test::normal_values<T>(count, 700 + count);
  const std::size_t size = c.max_payload_bytes(squall::dtype_of<T>, count);
  std::vector<std::byte> expected(size);
  REQUIRE(c.encode(host_backend{}, host_view<const T>(g), host_view<std::byte>(expected), stream) ==
          size);

  const cuda_backend gpu;
  test::device_vector<T> in(g);
  // aligned, and 4 bytes off (unaligned for double: the scratch path)
  for (const std::size_t offset : {std::size_t{0}, std::size_t{4}}) {
    test::device_vector<std::byte> payload{std::vector<std::byte>(size + offset)};
    const device_view<std::byte> at(payload.view().data() + offset, size);
    REQUIRE(c.encode(gpu, device_view<const T>(in.view()), at, stream) == size);
    gpu.synchronize();
    auto got = payload.to_host();
    got.erase(got.begin(), got.begin() + static_cast<std::ptrdiff_t>(offset));
    check_sketch_bytes<Rows, Cols>(got, expected, g, c.seed, stream.step);
  }

  // estimates and decode of the host's sketch: bit for bit
  test::device_vector<std::byte> host_payload(expected);
  for (const bool decode : {false, true}) {
    std::vector<T> host_out(count);
    test::device_vector<T> out{std::vector<T>(count, T(3))};
    if (decode) {
      c.decode(host_backend{}, host_view<const std::byte>(expected), host_view<T>(host_out));
      c.decode(gpu, device_view<const std::byte>(host_payload.view()), out.view());
    } else {
      c.estimate(host_backend{}, host_view<const std::byte>(expected), host_view<T>(host_out));
      c.estimate(gpu, device_view<const std::byte>(host_payload.view()), out.view());
    }
    gpu.synchronize();
    const auto got = out.to_host();
    for (std::size_t i = 0; i < count; ++i) {
      REQUIRE(test::bits_of(got[i]) == test::bits_of(host_out[i]));
    }
  }
}

// ---- PowerSGD --------------------------------------------------------------------------------

/// |got - expected| <= eps_T |expected| + 2 n eps_double scale, entry by entry.
template <class T>
void check_within(const std::vector<T>& got, const std::vector<T>& expected,
                  const std::vector<double>& scale, double terms) {
  REQUIRE(got.size() == expected.size());
  const double eps_t = std::numeric_limits<T>::epsilon();
  const double eps_d = std::numeric_limits<double>::epsilon();
  for (std::size_t e = 0; e < got.size(); ++e) {
    CAPTURE(e);
    const double h = static_cast<double>(expected[e]);
    REQUIRE(std::fabs(static_cast<double>(got[e]) - h) <=
            eps_t * std::fabs(h) + 2.0 * terms * eps_d * scale[e]);
  }
}

/// |got - expected| <= tolerance x max |expected|, entry by entry.
template <class T>
void check_relative(const std::vector<T>& got, const std::vector<T>& expected, double tolerance) {
  REQUIRE(got.size() == expected.size());
  double largest = 0;
  for (const T v : expected) largest = std::max(largest, std::fabs(static_cast<double>(v)));
  for (std::size_t e = 0; e < got.size(); ++e) {
    CAPTURE(e);
    REQUIRE(std::fabs(static_cast<double>(got[e]) - static_cast<double>(expected[e])) <=
            tolerance * largest);
  }
}

/// The factors of a PowerSGD payload, as values of T.
template <class T>
std::vector<T> payload_values(const std::vector<std::byte>& bytes) {
  std::vector<T> out((bytes.size() - squall::powersgd_compressor::body_offset) / sizeof(T));
  std::memcpy(out.data(), bytes.data() + squall::powersgd_compressor::body_offset,
              out.size() * sizeof(T));
  return out;
}

template <class T>
void check_powersgd(std::size_t count, std::size_t rank) {
  CAPTURE(count);
  CAPTURE(rank);
  squall::powersgd_compressor c;
  c.rank = rank;
  c.seed = 9;
  const auto s = c.shape(count);
  const std::size_t m = s.rows;
  const std::size_t cols = s.columns;
  const auto g = test::normal_values<T>(count, 800 + count);
  const cuda_backend gpu;
  test::device_vector<T> in(g);
  const device_view<const T> in_view(in.view());

  // the random factor: the same Philox words
  std::vector<T> q(cols * rank);
  kernels::powersgd_random_factor(host_backend{}, c.seed, {3, squall::shared_rank}, q.data(),
                                  q.size());
  test::device_vector<T> dq{std::vector<T>(q.size())};
  kernels::powersgd_random_factor(gpu, c.seed, {3, squall::shared_rank}, dq.view().data(),
                                  q.size());
  gpu.synchronize();
  {
    const auto got = dq.to_host();
    for (std::size_t e = 0; e < q.size(); ++e)
      REQUIRE(test::bits_of(got[e]) == test::bits_of(q[e]));
  }

  // P = M Q
  std::vector<T> p(m * rank);
  c.multiply(host_backend{}, host_view<const T>(g), host_view<const T>(q), host_view<T>(p));
  test::device_vector<T> dp{std::vector<T>(p.size())};
  c.multiply(gpu, in_view, device_view<const T>(dq.view()), dp.view());
  gpu.synchronize();
  {
    std::vector<double> scale(p.size(), 0.0);
    for (std::size_t i = 0; i < m; ++i) {
      for (std::size_t j = 0; j < cols && i * cols + j < count; ++j) {
        for (std::size_t k = 0; k < rank; ++k) {
          scale[i * rank + k] += std::fabs(static_cast<double>(g[i * cols + j]) *
                                           static_cast<double>(q[j * rank + k]));
        }
      }
    }
    check_within(dp.to_host(), p, scale, static_cast<double>(cols));
  }

  // orthogonalize the host's P on both sides: orthonormal columns, entries at most 1
  test::device_vector<T> dp_host(p);
  c.orthogonalize(host_backend{}, host_view<T>(p));
  c.orthogonalize(gpu, dp_host.view());
  gpu.synchronize();
  {
    const std::vector<double> none(p.size(), 0.0);
    const double absolute = std::is_same_v<T, float> ? 2.5e-7 : 1e-11;
    const auto got = dp_host.to_host();
    for (std::size_t e = 0; e < p.size(); ++e) {
      CAPTURE(e);
      REQUIRE(std::fabs(static_cast<double>(got[e]) - static_cast<double>(p[e])) <= absolute);
    }
  }

  // Q = M^T P, from the host's P
  test::device_vector<T> dp2(p);
  std::vector<T> q2(q.size());
  c.multiply_transposed(host_backend{}, host_view<const T>(g), host_view<const T>(p),
                        host_view<T>(q2));
  test::device_vector<T> dq2{std::vector<T>(q.size())};
  c.multiply_transposed(gpu, in_view, device_view<const T>(dp2.view()), dq2.view());
  gpu.synchronize();
  {
    std::vector<double> scale(q2.size(), 0.0);
    for (std::size_t i = 0; i < m; ++i) {
      for (std::size_t j = 0; j < cols && i * cols + j < count; ++j) {
        for (std::size_t k = 0; k < rank; ++k) {
          scale[j * rank + k] += std::fabs(static_cast<double>(p[i * rank + k]) *
                                           static_cast<double>(g[i * cols + j]));
        }
      }
    }
    check_within(dq2.to_host(), q2, scale, static_cast<double>(m));
  }

  // out = P Q^T, from the host's factors
  test::device_vector<T> dq3(q2);
  std::vector<T> out(count);
  c.decompress(host_backend{}, host_view<const T>(p), host_view<const T>(q2), host_view<T>(out));
  test::device_vector<T> dout{std::vector<T>(count)};
  c.decompress(gpu, device_view<const T>(dp2.view()), device_view<const T>(dq3.view()),
               dout.view());
  gpu.synchronize();
  {
    std::vector<double> scale(count, 0.0);
    for (std::size_t e = 0; e < count; ++e) {
      for (std::size_t k = 0; k < rank; ++k) {
        scale[e] += std::fabs(static_cast<double>(p[(e / cols) * rank + k]) *
                              static_cast<double>(q2[(e % cols) * rank + k]));
      }
    }
    check_within(dout.to_host(), out, scale, static_cast<double>(rank));
  }

  // whole payloads: the stateless encode, the stateful one (Q comes back), decode
  const double relative = std::is_same_v<T, float> ? 1e-4 : 1e-10;
  const std::size_t size = c.max_payload_bytes(squall::dtype_of<T>, count);
  std::vector<std::byte> expected(size);
  c.encode(host_backend{}, host_view<const T>(g), host_view<std::byte>(expected), {5, 1});
  test::device_vector<std::byte> payload{std::vector<std::byte>(size)};
  REQUIRE(c.encode(gpu, in_view, payload.view(), {5, 1}) == size);
  gpu.synchronize();
  auto got = payload.to_host();
  REQUIRE(std::equal(got.begin(), got.begin() + squall::powersgd_compressor::body_offset,
                     expected.begin()));
  check_relative(payload_values<T>(got), payload_values<T>(expected), relative);

  auto host_state = c.make_state<T>(count);
  auto device_state = c.make_state<T>(count);
  c.encode(host_backend{}, host_state, host_view<const T>(g), host_view<std::byte>(expected));
  REQUIRE(c.encode(gpu, device_state, in_view, payload.view()) == size);
  gpu.synchronize();
  got = payload.to_host();
  check_relative(payload_values<T>(got), payload_values<T>(expected), relative);
  check_relative(std::vector<T>(device_state.q().begin(), device_state.q().end()),
                 std::vector<T>(host_state.q().begin(), host_state.q().end()), relative);

  std::vector<T> host_out(count);
  c.decode(host_backend{}, host_view<const std::byte>(expected), host_view<T>(host_out));
  test::device_vector<std::byte> host_payload(expected);
  test::device_vector<T> device_out{std::vector<T>(count)};
  c.decode(gpu, device_view<const std::byte>(host_payload.view()), device_out.view());
  gpu.synchronize();
  {
    const auto factors = payload_values<T>(expected);  // P (m x r), then Q (c x r)
    std::vector<double> scale(count, 0.0);
    for (std::size_t e = 0; e < count; ++e) {
      for (std::size_t k = 0; k < rank; ++k) {
        scale[e] += std::fabs(static_cast<double>(factors[(e / cols) * rank + k]) *
                              static_cast<double>(factors[m * rank + (e % cols) * rank + k]));
      }
    }
    check_within(device_out.to_host(), host_out, scale, static_cast<double>(rank));
  }
}

}  // namespace

TEST_SUITE("cuda") {
  TEST_CASE_TEMPLATE("device count sketch: estimates bit for bit, sketch within reassociation" *
                         doctest::skip(test::no_cuda_device()),
                     T, float, double) {
    for (const std::size_t count : test::device_test_counts) {
      check_count_sketch<3, 4096, T>(count);
      check_count_sketch<5, 1024, T>(count);
      if (count <= 1000) check_count_sketch<1, 1, T>(count);
    }
  }

  TEST_CASE_TEMPLATE(
      "device heavy hitters equal the host's bit for bit" * doctest::skip(test::no_cuda_device()),
      T, float, double) {
    for (const std::size_t count : {std::size_t{1}, std::size_t{1000}, std::size_t{300007}}) {
      auto values = test::random_values<T>(count, 900 + count);  // many ties
      for (std::size_t i = 5; i < count; i += 4999) values[i] = std::numeric_limits<T>::quiet_NaN();
      for (const std::size_t k : {std::size_t{0}, std::size_t{1}, std::size_t{17}, count / 3,
                                  count - 1, count, count + 1}) {
        CAPTURE(count);
        CAPTURE(k);
        auto expected = values;
        kernels::keep_largest_magnitudes(host_backend{}, host_view<T>(expected), k);
        test::device_vector<T> got(values);
        kernels::keep_largest_magnitudes(cuda_backend{}, got.view(), k);
        const auto back = got.to_host();
        for (std::size_t i = 0; i < count; ++i) {
          REQUIRE(test::bits_of(back[i]) == test::bits_of(expected[i]));
        }
      }
    }
  }

  TEST_CASE_TEMPLATE(
      "device FetchSGD momentum step and support reset equal the host's bit for "
      "bit" *
          doctest::skip(test::no_cuda_device()),
      T, float, double) {
    constexpr std::size_t rows = 3;
    constexpr std::size_t cols = 1024;
    const auto momentum = test::random_values<T>(rows * cols, 31);
    const auto error = test::random_values<T>(rows * cols, 32);
    const auto sum = test::random_values<T>(rows * cols, 33);
    auto u = momentum;
    auto e = error;
    kernels::sketch_momentum_step(host_backend{}, host_view<T>(u), host_view<T>(e),
                                  host_view<const T>(sum), T(0.9));
    test::device_vector<T> du(momentum);
    test::device_vector<T> de(error);
    test::device_vector<T> ds(sum);
    kernels::sketch_momentum_step(cuda_backend{}, du.view(), de.view(),
                                  device_view<const T>(ds.view()), T(0.9));
    for (const auto& [got, expected] : {std::pair{du.to_host(), u}, std::pair{de.to_host(), e}}) {
      for (std::size_t j = 0; j < expected.size(); ++j) {
        REQUIRE(test::bits_of(got[j]) == test::bits_of(expected[j]));
      }
    }
    for (const std::size_t count : test::device_test_counts) {
      CAPTURE(count);
      auto values = test::random_values<T>(count, 34);
      for (std::size_t i = 0; i < count; i += 3) values[i] = T(0);  // a sparse update
      kernels::sketch_row_hash hash[rows];
      for (std::size_t r = 0; r < rows; ++r) {
        hash[r] = kernels::make_sketch_row_hash(7, {2, squall::shared_rank}, r);
      }
      auto a = momentum;
      auto b = error;
      kernels::count_sketch_zero_support<rows, cols>(host_backend{}, host_view<const T>(values),
                                                     hash, a.data(), b.data());
      test::device_vector<T> dv(values);
      test::device_vector<T> da(momentum);
      test::device_vector<T> db(error);
      kernels::count_sketch_zero_support<rows, cols>(cuda_backend{},
                                                     device_view<const T>(dv.view()), hash,
                                                     da.view().data(), db.view().data());
      REQUIRE(da.to_host() == a);  // only zeroes written: equal values are equal bits here
      REQUIRE(db.to_host() == b);
    }
  }

  TEST_CASE_TEMPLATE("device PowerSGD equals the host within its documented tolerances" *
                         doctest::skip(test::no_cuda_device()),
                     T, float, double) {
    for (const std::size_t count : test::device_test_counts) {
      check_powersgd<T>(count, 1);
      check_powersgd<T>(count, 4);
    }
    check_powersgd<T>(10, 8);  // rank above m: the dependent columns are zero on both sides
  }
}
