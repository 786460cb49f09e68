// SPDX-License-Identifier: Apache-2.0
// Homomorphic quantization (`homomorphic_compressor`, "hq:<bits>", issue 17) against references
// computed here in double from the inputs alone: the rotation is orthonormal and its own
// inverse; one rank's decode is within sqrt(padded) levels of its input and, without clipping,
// unbiased over 3,000 encodings; P ranks' payloads encoded against the agreed range and added
// as 64-bit words decode to the sum of their single decodes (the integer sum is the payloads'
// sum, no carry crossing a field) and to within sqrt(P padded) levels of the exact sum; the
// largest codes of P ranks fill a field without overflowing it, for every bits and P up to
// 1024; decode refuses corrupt payloads; the relative error of the sum does not grow with P;
// and the fields sit where the wire format says (written from its formula).
#include <squall/backend/host.hpp>
#include <squall/compress/by_name.hpp>
#include <squall/compress/homomorphic.hpp>
#include <squall/compress/linear_body.hpp>
#include <squall/kernels/host/homomorphic_phases.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>
#include <utility>  // pair
#include <vector>

#include "../support/compressed_reference.hpp"
#include "../support/data.hpp"
#include "../support/host_codec.hpp"

namespace {

using squall::agreed_range;
using squall::homomorphic_compressor;
using squall::test::hq_add_bodies;
using squall::test::hq_agreed;
using squall::test::hq_payload;
using host_view_f = squall::host_view<const float>;

template <class T>
double norm_of(const std::vector<T>& v) {
  double s = 0;
  for (const T x : v) s += static_cast<double>(x) * static_cast<double>(x);
  return std::sqrt(s);
}

// The scale an encode used (the prefix's f64 at offset 40).
double scale_of(const std::vector<std::byte>& payload) {
  double s = 0;
  std::memcpy(&s, payload.data() + 40, 8);
  return s;
}

// ---- the CUDA kernels' phases (kernels/host/homomorphic_phases.hpp), thread by thread --------
// What kernels/cuda/homomorphic.cuh runs on each CUDA block, with the barriers made sequence
// points: every thread finishes a phase before any starts the next. `threads` is the block's
// size (the kernels use 256; others show that no phase depends on it).
namespace phase = squall::kernels::hq_phase;

template <class F>
void each_thread(unsigned threads, F&& f) {
  for (unsigned t = 0; t < threads; ++t) f(t);
}

template <class T>
T norm_of_block(std::size_t n) {
  return static_cast<T>(1) / std::sqrt(static_cast<T>(n));
}

template <class T>
void rotate_block(unsigned threads, std::vector<T>& v, std::size_t length, T norm) {
  for (std::size_t h = 1; h < length; h *= 2) {
    each_thread(threads, [&](unsigned t) {
      phase::butterflies(t, threads, v.data(), length, h, phase::stage_scale(h, length, norm));
    });
  }
}

/// hq_encode_kernel's words; a word written twice where `alone` said it was the block's own,
/// or stored over another block's bits, fails the test.
template <class T>
std::vector<std::uint64_t> phases_encode(const squall::kernels::hq_shape& s, const T* in,
                                         double scale, std::uint64_t seed,
                                         squall::random_stream stream, unsigned threads,
                                         std::size_t& first_bad) {
  const std::uint32_t levels = squall::kernels::hq_levels(s.bits);
  const T inverse_step = scale > 0 ? static_cast<T>(levels / scale) : T{0};
  std::vector<std::uint64_t> words(s.words(), 0);
  std::vector<int> writes(s.words(), 0);
  first_bad = s.count;
  for (std::size_t k = 0; k < s.blocks(); ++k) {
    const std::size_t first = k * squall::kernels::hq_max_block;
    const std::size_t length = phase::block_length(s.count, k, s.rotate);
    REQUIRE(length == s.block_length(k));
    std::vector<std::uint32_t> signs(phase::sign_words);
    std::vector<std::uint32_t> draws(phase::draw_words<T>);
    std::vector<T> v(length);
    std::vector<std::uint8_t> codes(length);
    each_thread(threads, [&](unsigned t) {
      if (s.rotate) phase::signs(t, threads, s.seed, s.step, k, length, signs.data());
      phase::draws<T>(t, threads, seed, stream, first, length, draws.data());
    });
    each_thread(threads, [&](unsigned t) {
      phase::load(t, threads, in, s.count, first, length, s.rotate, signs.data(), v.data());
    });
    for (std::size_t j = 0; j < length && first + j < s.count; ++j) {
      if (!std::isfinite(in[first + j])) first_bad = std::min(first_bad, first + j);
    }
    if (s.rotate) {
      rotate_block(threads, v, length,
                   norm_of_block<T>(k + 1 == s.blocks() ? length : squall::kernels::hq_max_block));
    }
    each_thread(threads, [&](unsigned t) {
      phase::codes(
          t, threads, v.data(), length, draws.data(), [&](T y) { return y * inverse_step; }, levels,
          codes.data());
    });
    each_thread(threads, [&](unsigned t) {
      phase::pack(t, threads, codes.data(), first, length, s.padded(), s.field, s.words(),
                  [&](std::size_t w, std::uint64_t bits, bool alone) {
                    REQUIRE(w < words.size());
                    if (alone) {
                      REQUIRE(writes[w] == 0);
                      words[w] = bits;
                    } else {
                      REQUIRE((words[w] & bits) == 0);
                      words[w] |= bits;
                    }
                    ++writes[w];
                  });
    });
  }
  return words;
}

/// hq_decode_kernel's values.
template <class T>
std::vector<T> phases_decode(const squall::kernels::hq_shape& s, const std::uint64_t* words,
                             std::uint64_t contributions, double scale, unsigned threads,
                             std::size_t& first_bad) {
  const std::uint32_t levels = squall::kernels::hq_levels(s.bits);
  const auto offset = static_cast<T>(static_cast<double>(contributions * levels));
  const auto step = static_cast<T>(scale / levels);
  std::vector<T> out(s.count, T(7));
  first_bad = s.count;
  for (std::size_t k = 0; k < s.blocks(); ++k) {
    const std::size_t first = k * squall::kernels::hq_max_block;
    const std::size_t length = phase::block_length(s.count, k, s.rotate);
    std::vector<std::uint32_t> signs(phase::sign_words);
    std::vector<T> v(length, std::numeric_limits<T>::quiet_NaN());  // an unwritten value shows
    each_thread(threads, [&](unsigned t) {
      if (s.rotate) phase::signs(t, threads, s.seed, s.step, k, length, signs.data());
      phase::unpack(t, threads, words, first, length, s.padded(), s.field, s.words(),
                    contributions * 2u * levels, offset, step, v.data(), [&](std::size_t e) {
                      first_bad = std::min(first_bad, e < s.count ? e : s.count - 1);
                    });
    });
    if (s.rotate) {
      rotate_block(threads, v, length,
                   norm_of_block<T>(k + 1 == s.blocks() ? length : squall::kernels::hq_max_block));
    }
    const std::size_t n = std::min(length, s.count - first);
    each_thread(threads, [&](unsigned t) {
      phase::store(t, threads, v.data(), n, s.rotate, signs.data(), step, out.data() + first);
    });
  }
  return out;
}
}  // namespace

TEST_SUITE("homomorphic") {
  TEST_CASE("the rotation is orthonormal and its own inverse") {
    for (const std::size_t n : {1, 2, 8, 256, 1024}) {
      CAPTURE(n);
      const auto x = squall::test::normal_values<double>(n, 3 + n);
      auto y = x;
      squall::kernels::hq_hadamard(y.data(), n);
      CHECK(norm_of(y) == doctest::Approx(norm_of(x)).epsilon(1e-12));
      squall::kernels::hq_hadamard(y.data(), n);
      for (std::size_t i = 0; i < n; ++i) REQUIRE(y[i] == doctest::Approx(x[i]).epsilon(1e-9));
    }
  }

  TEST_CASE_TEMPLATE("the rotation's fast paths give the bits of the textbook transform", T, float,
                     double) {
    // one butterfly stage at a time (distance 1, 2, 4, ...), then the scale: what hq_hadamard's
    // AVX2 first stages and two-stages-a-pass loops must reproduce bit for bit
    const auto textbook = [](std::vector<T> v) {
      const std::size_t n = v.size();
      for (std::size_t h = 1; h < n; h *= 2) {
        for (std::size_t i = 0; i < n; i += 2 * h) {
          for (std::size_t j = i; j < i + h; ++j) {
            const T a = v[j];
            const T b = v[j + h];
            v[j] = a + b;
            v[j + h] = a - b;
          }
        }
      }
      const T norm = T(1) / std::sqrt(static_cast<T>(n));
      for (T& x : v) x *= norm;
      return v;
    };
    for (const std::size_t n : {1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024}) {
      CAPTURE(n);
      const auto x = squall::test::normal_values<T>(n, 5 + n);
      auto y = x;
      squall::kernels::hq_hadamard(y.data(), n);
      const auto expected = textbook(x);
      for (std::size_t i = 0; i < n; ++i) {
        REQUIRE(squall::test::bits_of(y[i]) == squall::test::bits_of(expected[i]));
      }
      if (n >= 8) {  // the portable first stages, which a CPU without AVX2 runs
        auto z = x;
        squall::kernels::detail::hq_hadamard8(z.data(), n);
        auto w = x;
        for (std::size_t i = 0; i < n; i += 8) {
          std::vector<T> g(x.begin() + static_cast<std::ptrdiff_t>(i),
                           x.begin() + static_cast<std::ptrdiff_t>(i + 8));
          g = textbook(g);  // scaled by 1 / sqrt(8): undo by comparing scaled copies
          for (std::size_t t = 0; t < 8; ++t) w[i + t] = g[t];
        }
        const T norm8 = T(1) / std::sqrt(T(8));
        for (std::size_t i = 0; i < n; ++i) {
          REQUIRE(squall::test::bits_of(z[i] * norm8) == squall::test::bits_of(w[i]));
        }
      }
    }
  }

#if defined(SQUALL_HAS_AVX2_PHILOX)
  TEST_CASE("the rotation's first pass in AVX-512 registers gives the AVX2 pass's bits") {
    // the fused first six stages from each source: values, signed values (an encode's) and a
    // payload's sums (a decode's), NaNs included where the sign of a NaN matters (not for the
    // signed values, whose NaNs code to 0 whatever their sign)
    namespace d = squall::kernels::detail;
    if (!squall::detail::cpu_has_avx512f() || !squall::detail::cpu_has_avx2()) {
      MESSAGE("this CPU has no AVX-512: the AVX-512 first pass is not run here");
      return;
    }
    for (const std::size_t n : {64, 256, 1024}) {
      CAPTURE(n);
      auto x = squall::test::normal_values<float>(n, 77 + n);
      std::vector<std::uint32_t> signs(n / 32);
      std::vector<std::uint32_t> sums(n);
      std::uint32_t r = 12345;
      for (auto& w : signs) w = r = r * 1664525u + 1013904223u;
      for (auto& v : sums) v = (r = r * 1664525u + 1013904223u) >> 12;
      std::vector<float> with_nan = x;
      with_nan[n / 3] = std::numeric_limits<float>::quiet_NaN();
      const auto same = [n](const std::vector<float>& a, const std::vector<float>& b) {
        for (std::size_t i = 0; i < n; ++i) {
          REQUIRE(squall::test::bits_of(a[i]) == squall::test::bits_of(b[i]));
        }
      };
      std::vector<float> avx2(n);
      std::vector<float> avx512(n);
      d::hq_hadamard64_avx2<d::hq_source::values>(avx2.data(), with_nan.data(), n);
      d::hq_hadamard64_avx512<d::hq_source::values>(avx512.data(), with_nan.data(), n);
      same(avx2, avx512);
      d::hq_hadamard64_avx2<d::hq_source::signed_values>(avx2.data(), x.data(), n, signs.data());
      d::hq_hadamard64_avx512<d::hq_source::signed_values>(avx512.data(), x.data(), n,
                                                           signs.data());
      same(avx2, avx512);
      for (const float step : {0.01f, std::numeric_limits<float>::quiet_NaN()}) {
        d::hq_hadamard64_avx2<d::hq_source::sums>(avx2.data(), sums.data(), n, nullptr, 1000.0f,
                                                  step);
        d::hq_hadamard64_avx512<d::hq_source::sums>(avx512.data(), sums.data(), n, nullptr, 1000.0f,
                                                    step);
        same(avx2, avx512);
      }
    }
  }
#endif

  TEST_CASE_TEMPLATE(
      "the CUDA kernels' phases, thread by thread, write the host kernels' words and values", T,
      float, double) {
    // (256 and 2304: a whole last block of 256, rotated in the fused first pass; 9000: the
    // sign words of a second batch of blocks, `hq_sign_batch`)
    for (const std::size_t n :
         {std::size_t{1}, std::size_t{3}, std::size_t{256}, std::size_t{1000}, std::size_t{1024},
          std::size_t{1025}, std::size_t{2304}, std::size_t{5000}, std::size_t{9000}}) {
      for (const bool rotate : {true, false}) {
        for (const auto& pair :
             {std::pair{2u, 1u}, std::pair{4u, 3u}, std::pair{4u, 4u}, std::pair{8u, 1000u}}) {
          const unsigned bits = pair.first, ranks = pair.second;  // named: CAPTURE takes them
          CAPTURE(n);
          CAPTURE(rotate);
          CAPTURE(bits);
          CAPTURE(ranks);
          const squall::kernels::hq_shape s{.count = n,
                                            .rotate = rotate,
                                            .seed = 11,
                                            .step = 4,
                                            .bits = bits,
                                            .field = squall::kernels::hq_field_bits(bits, ranks)};
          auto x = squall::test::normal_values<T>(n, 40 + n);
          if (n == 5000) x[3000] = std::numeric_limits<T>::quiet_NaN();  // codes 0, element named
          double max_abs = 0;
          double rms = 0;
          squall::kernels::hq_range(squall::host_backend{}, s, x.data(), false, max_abs, rms);
          const double scale = n == 5000 ? 3.0 : max_abs;
          const squall::random_stream stream{4, 2};
          // every word written whatever the buffer held (the encode zeroes the words a block
          // reaches just before it codes into them)
          std::vector<std::uint64_t> expected(s.words(), ~std::uint64_t{0});
          const std::size_t bad = squall::kernels::hq_encode(
              squall::host_backend{}, s, x.data(), scale, 9, stream, true, expected.data());
          for (const unsigned threads : {256u, 96u}) {
            CAPTURE(threads);
            std::size_t got_bad = 0;
            const auto words = phases_encode(s, x.data(), scale, 9, stream, threads, got_bad);
            REQUIRE(words == expected);
            CHECK(got_bad == bad);
          }
          // a sum of `ranks` such payloads (the same codes added: fields up to ranks x 2L)
          std::vector<std::uint64_t> sum(expected.size(), 0);
          for (std::size_t w = 0; w < sum.size(); ++w) sum[w] = expected[w] * ranks;
          for (const double decode_scale : {scale, std::numeric_limits<double>::quiet_NaN()}) {
            std::vector<T> host(n);
            const std::size_t host_bad = squall::kernels::hq_decode(
                squall::host_backend{}, s, sum.data(), ranks, decode_scale, host.data());
            REQUIRE(host_bad == n);
            // the same values written with non-temporal stores: on a cache line and 16, 32 or
            // 48 bytes past one (floats: each rotated block's signs and stores between the
            // next block's passes, 16 bytes a store) and one element off (the signs in the
            // block, then the block streamed)
            std::vector<T> streamed(n + 64 / sizeof(T) + 12);
            const std::size_t line =
                (64 - reinterpret_cast<std::uintptr_t>(streamed.data()) % 64) % 64 / sizeof(T);
            for (const std::size_t off : {0, 4, 8, 12, 1}) {
              CAPTURE(off);
              std::fill(streamed.begin(), streamed.end(), T{0});
              T* const to = streamed.data() + line + off;
              CHECK(squall::kernels::hq_decode(squall::host_backend{}, s, sum.data(), ranks,
                                               decode_scale, to, 0) == n);
              for (std::size_t i = 0; i < n; ++i) {
                REQUIRE(squall::test::bits_of(to[i]) == squall::test::bits_of(host[i]));
              }
            }
            std::size_t got_bad = 0;
            const auto got = phases_decode<T>(s, sum.data(), ranks, decode_scale, 256, got_bad);
            CHECK(got_bad == n);
            for (std::size_t i = 0; i < n; ++i) {
              REQUIRE(squall::test::bits_of(got[i]) == squall::test::bits_of(host[i]));
            }
          }
          // fields above n x 2L: the sum of `ranks` payloads claimed to be one rank's
          if (ranks > 1) {
            std::vector<T> host(n);
            const std::size_t host_bad = squall::kernels::hq_decode(
                squall::host_backend{}, s, sum.data(), 1, scale, host.data());
            std::size_t got_bad = 0;
            phases_decode<T>(s, sum.data(), 1, scale, 256, got_bad);
            if (n >= 1000) CHECK(host_bad < n);  // (a lone element may code as 0)
            CHECK(got_bad == host_bad);
          }
        }
      }
    }
  }

  TEST_CASE("fields hold the sum of P codes: P x (2^bits - 2) < 2^width, for P up to 1024") {
    for (unsigned bits = 2; bits <= 8; ++bits) {
      for (std::uint32_t p = 1; p <= 1024; ++p) {
        const unsigned w = squall::kernels::hq_field_bits(bits, p);
        REQUIRE(w <= 64);
        REQUIRE(std::uint64_t{p} * 2 * squall::kernels::hq_levels(bits) < (std::uint64_t{1} << w));
        REQUIRE(w <= bits + 10);  // ceil(log2 P) more bits, no more
      }
    }
  }

  TEST_CASE(
      "the fields' layout: element i in field (i mod 8F) / 8 of word 8 (i div 8F) + i mod 8") {
    // words written here from the wire format's formula (docs/compressors.md) unpack, in
    // pieces from any first element as the decoder's blocks do, to the codes put there (the
    // encoder's side: "codes coded and packed in vectors")
    std::uint64_t x = 12345;
    const auto next = [&x] {
      x = x * 6364136223846793005ull + 1442695040888963407ull;
      return static_cast<std::uint32_t>(x >> 33);
    };
    for (const unsigned w : {2u, 3u, 4u, 5u, 6u, 7u, 8u, 9u, 13u, 28u}) {
      for (const std::size_t count : {1, 5, 8, 9, 63, 64, 65, 161, 1000, 3001}) {
        for (const std::size_t piece : {std::size_t{1024}, std::size_t{37}, count}) {
          CAPTURE(w);
          CAPTURE(count);
          CAPTURE(piece);
          const std::uint64_t per_word = 64 / w;
          const std::uint32_t top = w >= 8 ? 255 : (1u << w) - 1;
          std::vector<std::uint8_t> codes(count);
          for (auto& c : codes) c = static_cast<std::uint8_t>(next() % (top + 1));
          const std::size_t words = squall::kernels::hq_words_for(count, per_word);
          std::vector<std::uint64_t> expected(words, 0);  // the wire format's words
          for (std::size_t i = 0; i < count; ++i) {
            const std::size_t word = 8 * (i / (8 * per_word)) + i % 8;
            const std::size_t field = (i % (8 * per_word)) / 8;
            REQUIRE(word < words);
            expected[word] |= std::uint64_t{codes[i]} << (field * w);
          }
          std::vector<std::uint32_t> sums(count, 0xdeadbeef);
          std::uint64_t largest = 0;
          for (std::size_t at = 0; at < count; at += piece) {
            const std::size_t n = std::min(piece, count - at);
            const std::uint64_t l =
                squall::kernels::hq_unpack(expected.data(), at, n, w, sums.data() + at);
            largest = std::max(largest, l);
          }
          for (std::size_t i = 0; i < count; ++i) REQUIRE(sums[i] == codes[i]);
          CHECK(largest == *std::max_element(codes.begin(), codes.end()));
        }
      }
    }
  }

  TEST_CASE_TEMPLATE(
      "codes coded and packed in vectors: hq_code's, one at a time, where the layout says", T,
      float, double) {
    // inverse steps that are powers of two keep y / step exact, so a fused multiply-add in one
    // path and not the other cannot move a code
    using draw = squall::stochastic_draw_unit<T>;
    std::uint64_t x = 99;
    const auto next = [&x] {
      x = x * 6364136223846793005ull + 1442695040888963407ull;
      return static_cast<std::uint32_t>(x >> 32);
    };
    for (const unsigned bits : {2u, 3u, 4u, 8u}) {  // 3: a field across the middle, 30-32
      for (const unsigned extra : {0u, 1u, 3u}) {
        for (const std::size_t count : {1, 9, 200, 1024, 2500}) {
          for (const std::size_t piece : {std::size_t{1024}, std::size_t{334}}) {
            CAPTURE(bits);
            CAPTURE(extra);
            CAPTURE(count);
            const unsigned w = bits + extra;
            const std::uint64_t per_word = 64 / w;
            const std::uint32_t levels = squall::kernels::hq_levels(bits);
            const T inverse_step = static_cast<T>(0.5);
            std::vector<T> y(count);
            // element i's draw: unit i of `draw` in the words' bytes (hq_code_pack's rule)
            std::vector<std::uint32_t> random((count * sizeof(draw) + 3) / 4);
            for (auto& r : random) r = next();
            const auto draw_of = [&random](std::size_t i) {
              draw d;
              std::memcpy(&d, reinterpret_cast<const unsigned char*>(random.data()) + i * sizeof d,
                          sizeof d);
              return d;
            };
            for (std::size_t i = 0; i < count; ++i) {
              const double u = static_cast<double>(next()) / 4294967296.0;  // [0, 1)
              y[i] = static_cast<T>((u * 2 - 1) * (2 * levels + 3) / inverse_step);
            }
            if (count > 5) {
              y[1] = std::numeric_limits<T>::quiet_NaN();
              y[2] = std::numeric_limits<T>::infinity();
              y[3] = -std::numeric_limits<T>::infinity();
              y[4] = static_cast<T>(levels) / inverse_step;  // exactly the top code
            }
            std::vector<std::uint64_t> expected(squall::kernels::hq_words_for(count, per_word));
            for (std::size_t i = 0; i < count; ++i) {
              const std::uint64_t code =
                  squall::kernels::hq_code<T>(y[i] * inverse_step, levels, draw_of(i));
              REQUIRE(code <= 2 * levels);
              const std::size_t word = 8 * (i / (8 * per_word)) + i % 8;
              expected[word] |= code << ((i % (8 * per_word)) / 8 * w);
            }
            // (floats: AVX-512 registers where the CPU has them, and the other path)
            for (const bool avx512 : {true, false}) {
              CAPTURE(avx512);
              std::vector<std::uint64_t> packed(expected.size(), 0);
              for (std::size_t at = 0; at < count; at += piece) {
                const std::size_t n = std::min(piece, count - at);
                squall::kernels::hq_code_pack(y.data() + at, random.data() + at * sizeof(draw) / 4,
                                              at, n, inverse_step, levels, w, packed.data(),
                                              static_cast<const T*>(nullptr), avx512);
              }
              REQUIRE(packed == expected);
            }
          }
        }
      }
    }
  }

  TEST_CASE("codes of floats whose draws sit at the rounding's threshold") {
    // x = c + f is rounded up where the 16-bit draw d < f 2^16 (`hq_code`): each value's draw
    // is set one below, at and one above ceil(f 2^16) - 1, the last draw that rounds up, so a
    // path that compares at another point of the step than hq_code (a threshold off by one
    // unit, or f 2^16 rounded to nearest where hq_code compares it exactly) moves codes
    std::uint64_t r = 5;
    const auto next = [&r] {
      r = r * 6364136223846793005ull + 1442695040888963407ull;
      return static_cast<std::uint32_t>(r >> 32);
    };
    for (const unsigned bits : {2u, 4u, 8u}) {
      CAPTURE(bits);
      const std::uint32_t levels = squall::kernels::hq_levels(bits);
      const unsigned w = squall::kernels::hq_field_bits(bits, 4);
      const std::uint64_t per_word = 64 / w;
      const float inverse_step = 0.75f;  // not a power of two: x is rounded as in the kernels
      const std::size_t count = 3 * 1000;
      std::vector<float> y(count);
      std::vector<std::uint16_t> draws(count);
      for (std::size_t i = 0; i < count; i += 3) {
        const double u = static_cast<double>(next()) / 4294967296.0;  // [0, 1)
        const auto v = static_cast<float>((u * 2 - 1) * levels / inverse_step);
        const float x = v * inverse_step + static_cast<float>(levels);  // hq_code's x
        const double threshold =
            std::ceil((static_cast<double>(x) - std::floor(static_cast<double>(x))) * 65536.0);
        for (std::size_t t = 0; t < 3; ++t) {
          y[i + t] = v;
          const double d = threshold - 2.0 + static_cast<double>(t);  // one below, at, above
          draws[i + t] = static_cast<std::uint16_t>(std::clamp(d, 0.0, 65535.0));
        }
      }
      std::vector<std::uint32_t> random((count + 1) / 2);
      std::memcpy(random.data(), draws.data(), count * sizeof(std::uint16_t));
      std::vector<std::uint64_t> expected(squall::kernels::hq_words_for(count, per_word));
      std::size_t ups = 0;
      for (std::size_t i = 0; i < count; ++i) {
        const std::uint64_t code =
            squall::kernels::hq_code<float>(y[i] * inverse_step, levels, draws[i]);
        const auto x = static_cast<double>(y[i] * inverse_step + static_cast<float>(levels));
        ups += code > std::floor(x) ? 1 : 0;
        expected[8 * (i / (8 * per_word)) + i % 8] |= code << ((i % (8 * per_word)) / 8 * w);
      }
      CHECK(ups > count / 3);  // the draws below the threshold round up
      CHECK(ups < 2 * count / 3 + count / 100);
      for (const bool avx512 : {true, false}) {
        CAPTURE(avx512);
        std::vector<std::uint64_t> packed(expected.size(), 0);
        squall::kernels::hq_code_pack(y.data(), random.data(), 0, count, inverse_step, levels, w,
                                      packed.data(), static_cast<const float*>(nullptr), avx512);
        REQUIRE(packed == expected);
      }
    }
  }

  TEST_CASE_TEMPLATE("the range: max |x| and rms against sums in long double, tiny to huge", T,
                     float, double) {
    // float blocks are summed in float lanes where that is exact enough and in double lanes
    // where squares would leave float's range: every magnitude must give the same answer
    for (const double magnitude : {1e-30, 1e-20, 1e-10, 1.0, 1e15, 1e19, 1e30}) {
      for (const std::size_t n : {1, 15, 16, 17, 1024, 3001}) {
        for (const bool mixed : {false, true}) {
          CAPTURE(magnitude);
          CAPTURE(n);
          CAPTURE(mixed);
          auto x = squall::test::normal_values<T>(n, 7 + n, magnitude);
          if (mixed) x[n / 2] = static_cast<T>(1.0);  // one usual value among the others
          long double squares = 0;
          double largest = 0;
          for (const T v : x) {
            squares += static_cast<long double>(v) * static_cast<long double>(v);
            largest = std::max(largest, std::fabs(static_cast<double>(v)));
          }
          const double rms = static_cast<double>(std::sqrt(squares / static_cast<long double>(n)));
          const squall::kernels::hq_shape shape{.count = n, .rotate = false, .bits = 4, .field = 4};
          double max_abs = -1;
          double got_rms = -1;
          squall::kernels::hq_range(squall::host_backend{}, shape, x.data(), true, max_abs,
                                    got_rms);
          CHECK(max_abs == largest);
          const double tolerance = std::is_same_v<T, float> ? 1e-5 : 1e-12;
          CHECK(std::fabs(got_rms - rms) <= tolerance * rms);
        }
      }
    }
  }

  TEST_CASE_TEMPLATE("one rank: within sqrt(padded) levels, the largest codes exact", T, float,
                     double) {
    for (const bool rotate : {true, false}) {
      for (const unsigned bits : {2u, 4u, 8u}) {
        for (const std::size_t n : {1, 7, 1000, 3001}) {
          CAPTURE(rotate);
          CAPTURE(bits);
          CAPTURE(n);
          const homomorphic_compressor c{.bits = bits, .rotate = rotate, .clip = 0, .seed = 5};
          const auto g = squall::test::normal_values<T>(n, 11 + n, 3.0);
          const auto payload = squall::test::encode_on_host(c, g, {2, 0});
          const squall::kernels::hq_shape shape{
              .count = n, .rotate = rotate, .bits = bits, .field = bits};
          // one rank's fields are `bits` wide, floor(64 / bits) to a word
          REQUIRE(payload.size() == homomorphic_compressor::body_offset + 8 + 8 * shape.words());
          REQUIRE(payload.size() <= c.max_payload_bytes(squall::dtype_of<T>, n));
          const auto out = squall::test::decode_on_host(c, payload, n, T(-12345));
          const double level = scale_of(payload) / squall::kernels::hq_levels(bits);
          std::vector<double> d(n);
          for (std::size_t i = 0; i < n; ++i) d[i] = static_cast<double>(out[i]) - g[i];
          const double tolerance = (std::is_same_v<T, float> ? 1e-5 : 1e-12) * norm_of(g);
          CHECK(norm_of(d) <= std::sqrt(static_cast<double>(shape.padded())) * level + tolerance);
        }
      }
    }
  }

  TEST_CASE("without clipping, unbiased: the mean of 3,000 encodings is the input") {
    const std::size_t n = 600;  // one block of 1024 (zero-padded)
    const auto g = squall::test::normal_values<double>(n, 9, 1.0);
    const homomorphic_compressor c{.bits = 3, .clip = 0, .seed = 1};
    const int draws = 3000;
    std::vector<double> mean(n, 0.0);
    double level = 0;
    for (int k = 0; k < draws; ++k) {
      const auto out = squall::test::decode_on_host(
          c, squall::test::encode_on_host(c, g, {static_cast<std::uint64_t>(k), 0}), n, 0.0);
      for (std::size_t i = 0; i < n; ++i) mean[i] += out[i] / draws;
      level = std::max(
          level, scale_of(squall::test::encode_on_host(c, g, {static_cast<std::uint64_t>(k), 0})) /
                     squall::kernels::hq_levels(3));
    }
    // each rotated element's draw has a variance of at most level^2 / 4, so each element of
    // the mean (an orthonormal mix of them) one of at most level^2 / (4 draws): 6 sigma
    const double sigma = level / 2 / std::sqrt(static_cast<double>(draws));
    for (std::size_t i = 0; i < n; ++i) {
      INFO("element " << i);
      REQUIRE(std::fabs(mean[i] - g[i]) <= 6 * sigma);
    }
  }

  TEST_CASE_TEMPLATE("P ranks: the words' integer sum decodes to the sum, within sqrt(P) levels", T,
                     float, double) {
    for (const std::uint32_t p : {1u, 2u, 3u, 4u, 7u, 8u}) {
      for (const unsigned bits : {2u, 4u, 8u}) {
        CAPTURE(p);
        CAPTURE(bits);
        const std::size_t n = 2500;
        const homomorphic_compressor c{.bits = bits, .seed = 3};
        std::vector<std::vector<T>> in;
        for (std::uint32_t q = 0; q < p; ++q) {
          in.push_back(squall::test::normal_values<T>(n, 100 * p + q, 1.0 + q));
        }
        const agreed_range r = hq_agreed(c, in, 6);
        std::vector<std::vector<std::byte>> payloads;
        std::vector<double> single_sum(n, 0.0);
        std::vector<double> exact(n, 0.0);
        for (std::uint32_t q = 0; q < p; ++q) {
          payloads.push_back(hq_payload(c, in[q], 6, q, r));
          const auto one = squall::test::decode_on_host(c, payloads.back(), n, T(0));
          for (std::size_t i = 0; i < n; ++i) {
            single_sum[i] += one[i];
            exact[i] += in[q][i];
          }
        }
        const auto sum = hq_add_bodies(payloads);
        const auto out = squall::test::decode_on_host(c, sum, n, T(-1));
        const double level = scale_of(sum) / squall::kernels::hq_levels(bits);
        const double eps = std::is_same_v<T, float> ? 1e-5 : 1e-12;
        std::vector<double> to_single(n);
        std::vector<double> to_exact(n);
        for (std::size_t i = 0; i < n; ++i) {
          to_single[i] = out[i] - single_sum[i];
          to_exact[i] = out[i] - exact[i];
        }
        CHECK(norm_of(to_single) <= eps * norm_of(exact) * p);
        // clipped elements are not bounded by a level: compare against the unclipped range
        const squall::kernels::hq_shape shape{.count = n, .bits = bits, .field = bits};
        if (scale_of(sum) == r.max_abs) {
          CHECK(norm_of(to_exact) <=
                std::sqrt(static_cast<double>(p * shape.padded())) * level + eps * norm_of(exact));
        }
      }
    }
  }

  TEST_CASE("the largest codes of P ranks fill a field without a carry into the next") {
    for (const std::uint32_t p : {1u, 2u, 3u, 5u, 8u, 16u, 1000u}) {
      for (const unsigned bits : {2u, 4u, 8u}) {
        CAPTURE(p);
        CAPTURE(bits);
        // without rotation an element equal to the scale is the top code 2L, for any draw
        const homomorphic_compressor c{.bits = bits, .rotate = false, .clip = 0};
        const std::vector<double> top(37, 2.0);
        const agreed_range r{.max_abs = 2.0, .rms = 2.0, .ranks = p};
        std::vector<std::vector<std::byte>> payloads;
        for (std::uint32_t q = 0; q < p; ++q) payloads.push_back(hq_payload(c, top, 0, q, r));
        const auto out = squall::test::decode_on_host(c, hq_add_bodies(payloads), top.size(), 0.0);
        for (const double v : out) REQUIRE(v == doctest::Approx(2.0 * p).epsilon(1e-12));
      }
    }
  }

  TEST_CASE("relative error of the sum: flat in P (2, 4, 8), where the exact sum grows") {
    const std::size_t n = 8192;
    const homomorphic_compressor c{.bits = 4, .seed = 7};
    std::vector<double> errors;
    for (const std::uint32_t p : {2u, 4u, 8u}) {
      std::vector<std::vector<float>> in;
      // correlated gradients: a common part and a rank's own
      const auto common = squall::test::normal_values<float>(n, 1, 1.0);
      for (std::uint32_t q = 0; q < p; ++q) {
        auto x = squall::test::normal_values<float>(n, 50 + q, 0.5);
        for (std::size_t i = 0; i < n; ++i) x[i] += common[i];
        in.push_back(x);
      }
      const agreed_range r = hq_agreed(c, in, 1);
      std::vector<std::vector<std::byte>> payloads;
      std::vector<double> exact(n, 0.0);
      for (std::uint32_t q = 0; q < p; ++q) {
        payloads.push_back(hq_payload(c, in[q], 1, q, r));
        for (std::size_t i = 0; i < n; ++i) exact[i] += in[q][i];
      }
      const auto out = squall::test::decode_on_host(c, hq_add_bodies(payloads), n, 0.0f);
      std::vector<double> d(n);
      for (std::size_t i = 0; i < n; ++i) d[i] = out[i] - exact[i];
      errors.push_back(norm_of(d) / norm_of(exact));
      MESSAGE("hq:4, P = " << p << ": relative error " << errors.back());
    }
    // independent draws: the error's norm grows as sqrt(P), the sum's as P
    CHECK(errors[1] < errors[0]);
    CHECK(errors[2] < errors[1]);
  }

  TEST_CASE("decode refuses corrupt payloads, naming what is wrong") {
    const homomorphic_compressor c{.bits = 4};
    const auto g = squall::test::normal_values<float>(100, 2);
    const auto good = hq_payload(c, g, 0, 0, {.max_abs = 4, .rms = 1, .ranks = 3});
    const auto refused = [&](std::vector<std::byte> p, const std::string& what) {
      CAPTURE(what);
      try {
        squall::test::decode_on_host(c, p, g.size(), 0.0f);
        FAIL("decoded");
      } catch (const squall::invalid_argument& e) {
        CHECK(std::string(e.what()).find(what) != std::string::npos);
      }
    };
    auto p = good;
    p[16] = std::byte{5};
    refused(p, "5-bit codes");
    p = good;
    p[17] = std::byte{4};
    refused(p, "does not hold 3 ranks");
    p = good;
    std::uint64_t summed = 0;
    std::memcpy(p.data() + homomorphic_compressor::body_offset, &summed, 8);
    refused(p, "sums 0 ranks");
    summed = 4;
    std::memcpy(p.data() + homomorphic_compressor::body_offset, &summed, 8);
    refused(p, "sums 4 ranks");
    p = good;
    p.back() = std::byte{0xff};  // the last word's top fields: above 1 x 2L
    p[p.size() - 8] = std::byte{0xff};
    refused(p, "is above 1 x 2L");
    p = good;
    p.pop_back();
    refused(p, "bytes where");
    p = good;
    const double negative = -1;
    std::memcpy(p.data() + 40, &negative, 8);
    refused(p, "negative");
    CHECK_THROWS_AS(
        (void)homomorphic_compressor{.bits = 9}.max_payload_bytes(squall::dtype::float32, 8),
        squall::invalid_argument);
  }

  TEST_CASE("NaN: the range is NaN; with check_finite, encode names the element") {
    std::vector<float> g(50, 1.0f);
    g[17] = std::numeric_limits<float>::quiet_NaN();
    homomorphic_compressor c;
    CHECK(std::isnan(c.local_range(squall::host_backend{}, host_view_f(g)).max_abs));
    c.check_finite = true;
    CHECK_THROWS_WITH_AS(squall::test::encode_on_host(c, g), doctest::Contains("element 17"),
                         squall::invalid_argument);
  }

  TEST_CASE("by name: hq:<bits>, 2 to 8") {
    const auto bits = [](const char* text) {
      return squall::visit_compressor(squall::parse_compressor(text), [](const auto& c) {
        if constexpr (requires { c.bits; }) {
          return static_cast<int>(c.bits);
        } else if constexpr (requires { c.inner.bits; }) {
          return static_cast<int>(c.inner.bits);
        } else {
          return -1;
        }
      });
    };
    CHECK(bits("hq") == 4);
    CHECK(bits("hq:2") == 2);
    CHECK(bits("hq:8+ef") == 8);
    for (const char* bad : {"hq:1", "hq:9", "hq:4.5", "hq:x"}) {
      CAPTURE(bad);
      CHECK_THROWS_AS(bits(bad), squall::invalid_argument);
    }
  }
}
