// SPDX-License-Identifier: Apache-2.0
// Host kernels against serial double-precision references, for every element type and op.

#include <squall/algorithm/detail/executor.hpp>
#include <squall/kernels/host/reduce.hpp>

#include <doctest/doctest.h>
#include <sys/mman.h>  // mmap, mprotect: read-only destinations for publish_copy

#include <algorithm>  // equal, fill
#include <cmath>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

#include "../support/data.hpp"
#include "../support/page_aligned.hpp"

using squall::host_backend;
using squall::host_view;
namespace kernels = squall::kernels;
namespace test = squall::test;

namespace {

// Counts that cover empty input, vector tails and odd sizes.
constexpr std::size_t counts[] = {0, 1, 3, 16, 17, 1023, 4099};

template <class T, class Reference>
void check_against(const std::vector<T>& got, const std::vector<T>& a, const std::vector<T>& b,
                   Reference reference) {
  REQUIRE(got.size() == a.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double expected =
        test::as_double(static_cast<T>(reference(test::as_double(a[i]), test::as_double(b[i]))));
    REQUIRE(test::as_double(got[i]) == expected);
  }
}

}  // namespace

TEST_SUITE("kernels") {
  TEST_CASE_TEMPLATE("reduce_into and reduce match the serial reference", T,
                     SQUALL_TEST_ELEMENT_TYPES) {
    for (const std::size_t count : counts) {
      CAPTURE(count);
      const auto a = test::random_values<T>(count, 10 + count);
      const auto b = test::random_values<T>(count, 20 + count);
      auto plus = [](double x, double y) { return x + y; };
      auto lesser = [](double x, double y) { return std::fmin(x, y); };
      auto greater = [](double x, double y) { return std::fmax(x, y); };

      auto dst = a;
      kernels::reduce_into(host_backend{}, squall::sum_op{}, host_view<T>(dst),
                           host_view<const T>(b));
      check_against(dst, a, b, plus);
      dst = a;
      kernels::reduce_into(host_backend{}, squall::min_op{}, host_view<T>(dst),
                           host_view<const T>(b));
      check_against(dst, a, b, lesser);
      dst = a;
      kernels::reduce_into(host_backend{}, squall::max_op{}, host_view<T>(dst),
                           host_view<const T>(b));
      check_against(dst, a, b, greater);

      std::vector<T> out(count);
      kernels::reduce(host_backend{}, squall::sum_op{}, host_view<T>(out), host_view<const T>(a),
                      host_view<const T>(b));
      check_against(out, a, b, plus);
      // dst aliasing b: out = a + out.
      out = b;
      kernels::reduce(host_backend{}, squall::max_op{}, host_view<T>(out), host_view<const T>(a),
                      host_view<const T>(out));
      check_against(out, a, b, greater);
      // In place on itself: x + x.
      dst = a;
      kernels::reduce_into(host_backend{}, squall::sum_op{}, host_view<T>(dst),
                           host_view<const T>(dst));
      check_against(dst, a, a, plus);
    }
  }

  TEST_CASE_TEMPLATE("avg is sum then finalize by the contribution count", T,
                     SQUALL_TEST_ELEMENT_TYPES) {
    const std::size_t count = 1025;
    const auto a = test::random_values<T>(count, 3);
    const auto b = test::random_values<T>(count, 4);
    auto dst = a;
    kernels::reduce_into(host_backend{}, squall::avg_op{}, host_view<T>(dst),
                         host_view<const T>(b));
    kernels::finalize(host_backend{}, squall::avg_op{}, host_view<T>(dst), 2);
    for (std::size_t i = 0; i < count; ++i) {
      const T sum = static_cast<T>(test::as_double(a[i]) + test::as_double(b[i]));
      double expected;
      if constexpr (std::is_integral_v<T>) {
        expected = static_cast<double>(sum / 2);
      } else {
        expected = test::as_double(static_cast<T>(test::as_double(sum) / 2));
      }
      REQUIRE(test::as_double(dst[i]) == expected);
    }
    CHECK_THROWS_AS(kernels::finalize(host_backend{}, squall::avg_op{}, host_view<T>(dst), 0),
                    squall::invalid_argument);
    // sum has no finalize step: the data is left alone.
    auto untouched = a;
    kernels::finalize(host_backend{}, squall::sum_op{}, host_view<T>(untouched), 4);
    CHECK(test::as_double(untouched[7]) == test::as_double(a[7]));
  }

  TEST_CASE_TEMPLATE("reduce_many folds 1-11 inputs in their order, in place or not", T,
                     SQUALL_TEST_ELEMENT_TYPES) {
    // The reference: a serial left fold in double, each step rounded to T as the two-input
    // kernels round it (exact for the types whose sums of these values fit their mantissa).
    const auto fold = [](const std::vector<std::vector<T>>& in, std::size_t i, auto op) {
      double acc = test::as_double(in[0][i]);
      for (std::size_t j = 1; j < in.size(); ++j) {
        acc = test::as_double(static_cast<T>(op(acc, test::as_double(in[j][i]))));
      }
      return acc;
    };
    const auto plus = [](double x, double y) { return x + y; };
    const auto greater = [](double x, double y) { return std::fmax(x, y); };
    for (const std::size_t count : counts) {
      for (std::size_t k = 1; k <= 11; ++k) {
        CAPTURE(count);
        CAPTURE(k);
        std::vector<std::vector<T>> in;
        std::vector<const T*> srcs;
        for (std::size_t j = 0; j < k; ++j)
          in.push_back(test::random_values<T>(count, 100 * k + j));
        for (const auto& v : in) srcs.push_back(v.data());
        std::vector<T> dst(count);
        kernels::reduce_many(host_backend{}, squall::sum_op{}, host_view<T>(dst),
                             std::span<const T* const>(srcs));
        for (std::size_t i = 0; i < count; ++i) {
          REQUIRE(test::as_double(dst[i]) == fold(in, i, plus));
        }
        kernels::reduce_many(host_backend{}, squall::max_op{}, host_view<T>(dst),
                             std::span<const T* const>(srcs));
        for (std::size_t i = 0; i < count; ++i) {
          REQUIRE(test::as_double(dst[i]) == fold(in, i, greater));
        }
        // in place: the first input is dst
        std::vector<T> first = in[0];
        srcs[0] = first.data();
        kernels::reduce_many(host_backend{}, squall::sum_op{}, host_view<T>(first),
                             std::span<const T* const>(srcs));
        for (std::size_t i = 0; i < count; ++i) {
          REQUIRE(test::as_double(first[i]) == fold(in, i, plus));
        }
      }
    }
  }

  TEST_CASE("the executor's reducer folds any number of inputs as the chain does") {
    // reducer::reduce_many hands kernels::reduce_many groups of at most fused_inputs; the
    // reducer without the fused pass (as on CUDA) chains reduce and reduce_into.
    const host_backend backend;
    const auto fused = squall::detail::make_reducer<float, squall::sum_op>(backend);
    auto chained = fused;
    chained.combine_many = nullptr;
    REQUIRE((fused.combine_many != nullptr));
    // floats of many magnitudes, so that any change of the order of additions shows
    const auto values = [](std::size_t count, std::uint64_t seed) {
      auto v = test::random_values<float>(count, seed);
      for (std::size_t i = 0; i < count; ++i)
        v[i] *= std::ldexp(1.0f, static_cast<int>(i % 40) - 20);
      return v;
    };
    for (const std::size_t k : {1, 2, 5, 8, 9, 16, 17, 23}) {
      CAPTURE(k);
      const std::size_t count = 1021;
      std::vector<std::vector<float>> in;
      for (std::size_t j = 0; j < k; ++j) in.push_back(values(count, 7 * k + j));
      std::vector<const std::byte*> srcs;
      for (const auto& v : in) srcs.push_back(reinterpret_cast<const std::byte*>(v.data()));
      std::vector<float> a(count);
      std::vector<float> b(count);
      fused.reduce_many(reinterpret_cast<std::byte*>(a.data()), srcs, count);
      chained.reduce_many(reinterpret_cast<std::byte*>(b.data()), srcs, count);
      REQUIRE(std::memcmp(a.data(), b.data(), count * sizeof(float)) == 0);
      for (std::size_t i = 0; i < count; ++i) {  // a serial left fold
        float acc = in[0][i];
        for (std::size_t j = 1; j < k; ++j) acc += in[j][i];
        REQUIRE(std::memcmp(&acc, &a[i], sizeof acc) == 0);
      }
      std::vector<float> first = in[0];  // in place
      srcs[0] = reinterpret_cast<const std::byte*>(first.data());
      fused.reduce_many(reinterpret_cast<std::byte*>(first.data()), srcs, count);
      REQUIRE(std::memcmp(first.data(), a.data(), count * sizeof(float)) == 0);
    }
  }

  TEST_CASE("reduce_many: no input, dst as a later input, partial overlap") {
    std::vector<float> a = {1, 2, 3, 4, 5, 6};
    std::vector<float> b = {6, 5, 4, 3, 2, 1};
    const float* none[] = {a.data()};
    CHECK_THROWS_WITH_AS(kernels::reduce_many(host_backend{}, squall::sum_op{}, host_view<float>(b),
                                              std::span<const float* const>(none, 0)),
                         doctest::Contains("no input"), squall::invalid_argument);
    const float* later[] = {a.data(), b.data()};
    CHECK_THROWS_WITH_AS(kernels::reduce_many(host_backend{}, squall::sum_op{}, host_view<float>(b),
                                              std::span<const float* const>(later)),
                         doctest::Contains("input 1 overlaps dst"), squall::invalid_argument);
    const float* shifted[] = {a.data() + 1, b.data()};
    CHECK_THROWS_WITH_AS(
        kernels::reduce_many(host_backend{}, squall::sum_op{}, host_view<float>(a).subview(0, 4),
                             std::span<const float* const>(shifted)),
        doctest::Contains("input 0 overlaps dst"), squall::invalid_argument);
    CHECK(a == std::vector<float>{1, 2, 3, 4, 5, 6});
  }

  TEST_CASE("copy, mismatched counts and partial overlap") {
    std::vector<float> a = {1, 2, 3, 4, 5, 6};
    std::vector<float> b(6);
    kernels::copy(host_backend{}, host_view<float>(b), host_view<const float>(a));
    CHECK(b == a);
    // Overlapping copy has memmove semantics.
    kernels::copy(host_backend{}, host_view<float>(a).subview(1, 5),
                  host_view<const float>(a).subview(0, 5));
    CHECK(a == std::vector<float>{1, 1, 2, 3, 4, 5});
    CHECK_THROWS_WITH_AS(
        kernels::reduce_into(host_backend{}, squall::sum_op{}, host_view<float>(a).subview(0, 3),
                             host_view<const float>(b)),
        doctest::Contains("counts differ: 3 and 6"), squall::invalid_argument);
    CHECK_THROWS_WITH_AS(
        kernels::reduce_into(host_backend{}, squall::sum_op{}, host_view<float>(a).subview(0, 4),
                             host_view<const float>(a).subview(1, 4)),
        doctest::Contains("overlap"), squall::invalid_argument);
    CHECK_THROWS_AS(
        kernels::reduce(host_backend{}, squall::sum_op{}, host_view<float>(a).subview(0, 3),
                        host_view<const float>(a).subview(1, 3),
                        host_view<const float>(b).subview(0, 3)),
        squall::invalid_argument);
  }

  TEST_CASE("copy_bytes at every distance modulo a page, sizes around its thresholds") {
    // The bytes of a page-aligned source put at each offset of a destination page: the
    // offsets 1-127 take copy_bytes' backward path above 2 KiB, the others memcpy. Each copy
    // is checked byte for byte, and the bytes just outside the destination stay untouched.
    constexpr std::size_t page = kernels::aliased_copy::page;
    const std::size_t sizes[] = {0, 1, 63, 64, 65, 2048, 2049, 4096, 4159, 65536 + 17};
    std::vector<std::byte> source(65536 + 64 + page);
    for (std::size_t i = 0; i < source.size(); ++i) {
      source[i] = static_cast<std::byte>((i * 131 + i / 251) & 0xff);
    }
    std::vector<std::byte> target(source.size() + 2 * page);
    const std::byte* src = test::page_aligned(source, page);
    std::size_t backward = 0;
    for (const std::size_t bytes : sizes) {
      for (std::size_t offset : {0ul, 1ul, 16ul, 17ul, 64ul, 127ul, 128ul, 2048ul, 4080ul}) {
        std::byte* base = test::page_aligned(target, page);
        std::byte* dst = base + offset + 1;  // one guard byte before
        std::fill(target.begin(), target.end(), std::byte{0x5a});
        if (kernels::aliased_copy::applies(dst, src, bytes)) ++backward;
        kernels::copy_bytes(dst, src, bytes);
        CAPTURE(bytes);
        CAPTURE(offset);
        REQUIRE(std::equal(dst, dst + bytes, src));
        CHECK(dst[-1] == std::byte{0x5a});
        CHECK(dst[bytes] == std::byte{0x5a});
      }
    }
    CHECK(backward == 4 * 5);  // 2049 bytes and up, 1, 2, 17, 18 and 65 bytes after the source
    // kernels::copy on overlapping ranges of such a size still moves as memmove does
    std::vector<float> a(5000);
    for (std::size_t i = 0; i < a.size(); ++i) a[i] = static_cast<float>(i);
    kernels::copy(host_backend{}, host_view<float>(a).subview(4, 4000),
                  host_view<const float>(a).subview(0, 4000));
    for (std::size_t i = 0; i < 4000; ++i) REQUIRE(a[4 + i] == static_cast<float>(i));
  }

  TEST_CASE("publish_copy stores only the pieces of an unchanged buffer that differ") {
    // Two pages of destination, mapped apart so that each can be made read-only: a publish
    // of what is already there must store nothing (no fault on read-only pages), one changed
    // between the first and last 64 bytes must store only into the page holding the change,
    // one with a new head or size copies everything; the destination equals the source after
    // every publish, and the bytes after it stay untouched.
    constexpr std::size_t page = 4096;
    void* mapped =
        mmap(nullptr, 3 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    REQUIRE(mapped != MAP_FAILED);
    auto* dst = static_cast<std::byte*>(mapped);
    const auto protect = [&](std::size_t which, bool writable) {
      REQUIRE(mprotect(dst + which * page, page, writable ? PROT_READ | PROT_WRITE : PROT_READ) ==
              0);
    };
    for (const std::size_t offset : {std::size_t{0}, std::size_t{16}, std::size_t{300}}) {
      CAPTURE(offset);
      for (const std::size_t bytes : {2 * page, 2 * page - 36, page + 200}) {
        CAPTURE(bytes);
        std::vector<std::byte> storage(bytes + offset + page);
        std::byte* src = test::page_aligned(storage, page) + offset;
        for (std::size_t i = 0; i < bytes; ++i) src[i] = static_cast<std::byte>((i * 7 + 3) & 0xff);
        std::fill(dst, dst + 3 * page, std::byte{0x5a});
        kernels::published_lines last;
        kernels::publish_copy(dst, src, bytes, last);  // first: a copy
        REQUIRE(std::equal(src, src + bytes, dst));
        CHECK(dst[bytes] == std::byte{0x5a});
#if defined(__SSE2__)
        const bool aliased = kernels::aliased_copy::applies(dst, src, bytes);
        if (!aliased) {
          protect(0, false);
          protect(1, false);
          kernels::publish_copy(dst, src, bytes, last);  // unchanged: no store (or a fault)
          const std::size_t changed = page + 8;          // in the second page, before the tail
          REQUIRE(changed + 64 < bytes);
          src[changed] = static_cast<std::byte>(~static_cast<unsigned char>(src[changed]));
          protect(1, true);
          kernels::publish_copy(dst, src, bytes, last);  // only the second page written
          protect(0, true);
          REQUIRE(std::equal(src, src + bytes, dst));
        }
#endif
        src[0] = static_cast<std::byte>(~static_cast<unsigned char>(src[0]));  // a new head
        kernels::publish_copy(dst, src, bytes, last);
        REQUIRE(std::equal(src, src + bytes, dst));
        src[bytes / 2] = std::byte{0x11};  // same head and tail, but one byte fewer
        kernels::publish_copy(dst, src, bytes - 1, last);
        REQUIRE(std::equal(src, src + bytes - 1, dst));
        CHECK(last.bytes == bytes - 1);
        for (std::size_t i = bytes; i < 3 * page; ++i) REQUIRE(dst[i] == std::byte{0x5a});
      }
    }
    munmap(mapped, 3 * page);
  }
}

TEST_SUITE("kernels") {
  TEST_CASE_TEMPLATE("16-bit blocked reduction equals the scalar combine on every pattern", T,
                     squall::float16, squall::bfloat16) {
#if defined(SQUALL_HAS_F16C_PATH)
    MESSAGE("F16C path in use for float16: " << kernels::detail::cpu_has_f16c());
#endif
    // Every 16-bit pattern against a scrambled permutation of them: NaNs, infinities,
    // subnormals and ties included. Odd count, so the blocks end in a partial one.
    const std::size_t count = 65536 + 1;
    std::vector<T> a(count);
    std::vector<T> b(count);
    for (std::size_t i = 0; i < count; ++i) {
      a[i] = T::from_bits(static_cast<std::uint16_t>(i));
      b[i] = T::from_bits(static_cast<std::uint16_t>(i * 40503u + 17u));
    }
    auto check = [&](auto op) {
      std::vector<T> got(count);
      kernels::reduce(host_backend{}, op, host_view<T>(got), host_view<const T>(a),
                      host_view<const T>(b));
      for (std::size_t i = 0; i < count; ++i) {
        const T expected = squall::combine(op, a[i], b[i]);
        if (std::isnan(static_cast<float>(expected))) {
          REQUIRE(std::isnan(static_cast<float>(got[i])));
        } else {
          REQUIRE(got[i].bits() == expected.bits());
        }
      }
    };
    check(squall::sum_op{});
    check(squall::min_op{});
    check(squall::max_op{});
    // widen and narrow on their own, on every pattern and on random floats.
    std::vector<float> wide(count);
    kernels::detail::widen(a.data(), wide.data(), count);
    for (std::size_t i = 0; i < count; ++i) {
      const float expected = static_cast<float>(a[i]);
      REQUIRE((std::isnan(expected) ? std::isnan(wide[i]) : wide[i] == expected));
    }
    std::vector<float> floats = test::random_values<float>(count, 77);
    for (std::size_t i = 0; i < count; i += 3)
      floats[i] = std::ldexp(floats[i], -20 + static_cast<int>(i % 40));
    std::vector<T> narrow(count);
    kernels::detail::narrow(floats.data(), narrow.data(), count);
    for (std::size_t i = 0; i < count; ++i) REQUIRE(narrow[i].bits() == T(floats[i]).bits());
  }
}

TEST_SUITE("large") {
  TEST_CASE("reduce_into covers more than 2^31 elements") {
    // 2^31 + 17 float16 values (4 GiB): x + x over all of them, checked at both ends and
    // past the 2^31 boundary where a 32-bit index would wrap.
    const std::size_t count = (std::size_t{1} << 31) + 17;
    std::vector<squall::float16> data(count, squall::float16(1.0f));
    const std::size_t marks[] = {0, (std::size_t{1} << 31) - 1, std::size_t{1} << 31, count - 1};
    for (std::size_t i : marks) data[i] = squall::float16(static_cast<float>(i % 1000 + 3));
    kernels::reduce_into(host_backend{}, squall::sum_op{}, host_view<squall::float16>(data),
                         host_view<const squall::float16>(data));
    for (std::size_t i : marks) {
      CHECK(static_cast<float>(data[i]) == 2.0f * static_cast<float>(i % 1000 + 3));
    }
    CHECK(static_cast<float>(data[count / 2]) == 2.0f);
    CHECK(static_cast<float>(data[count - 2]) == 2.0f);
  }
}
