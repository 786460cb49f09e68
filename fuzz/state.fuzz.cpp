// SPDX-License-Identifier: Apache-2.0
// libFuzzer target for `compression_state::restore` (issue 15): saved states are read from
// checkpoints, so any bytes must give a restored state or `squall::invalid_argument`, never a
// crash, a sanitizer report or another exception.
//
// Input: byte 0 selects the state type (modulo 5: error_feedback<topk> float, int8 double,
// PowerSGD rank 2 float, error_feedback<threshold> double, FetchSGD 3 x 64 float); bytes 1.. are
// restored. A state restored must save bytes that restore again to the same state. With
// SQUALL_FUZZ_SEED_DIR set, LLVMFuzzerInitialize writes valid saved states of each type there (at
// two steps, with non-zero residuals) for the fuzzer to mutate.
#include <squall/compress/error_feedback.hpp>
#include <squall/compress/fetchsgd.hpp>
#include <squall/compress/quantize.hpp>
#include <squall/compress/sketch.hpp>
#include <squall/compress/sparsify.hpp>
#include <squall/compress/state.hpp>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace {

constexpr std::size_t count = 120;  // PowerSGD views it as 10 x 12

/// Calls `f(state)` with a fresh state of the `which`-th type.
template <class F>
void with_state(std::uint8_t which, F&& f) {
  switch (which % 5) {
    case 0: {
      using C = squall::error_feedback<squall::topk_compressor>;
      squall::compression_state<C, float> s(C{}, count);
      f(s);
      return;
    }
    case 1: {
      squall::compression_state<squall::int8_compressor, double> s(count);
      f(s);
      return;
    }
    case 2: {
      const squall::powersgd_compressor c{.rank = 2, .columns = 12, .seed = 3};
      squall::compression_state<squall::powersgd_compressor, float> s(c, count);
      f(s);
      return;
    }
    case 4: {
      const squall::fetchsgd_compressor<3, 64> c{.seed = 3};
      squall::compression_state<squall::fetchsgd_compressor<3, 64>, float> s(c, count);
      f(s);
      return;
    }
    default: {
      using C = squall::error_feedback<squall::threshold_compressor>;
      squall::compression_state<C, double> s(C{}, count);
      f(s);
      return;
    }
  }
}

/// A valid saved state of the `which`-th type at `step`, with a residual of distinct values.
std::vector<std::byte> seed_of(std::uint8_t which, std::uint64_t step) {
  std::vector<std::byte> out;
  with_state(which, [&](auto& s) {
    s.set_step(step);
    if constexpr (requires { s.residual(); }) {
      auto r = s.residual().residual();
      for (std::size_t i = 0; i < r.count(); ++i) r[i] = static_cast<double>(i) * 0.25 - 7.0;
    }
    out = s.save();
  });
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  const char* dir = std::getenv("SQUALL_FUZZ_SEED_DIR");
  if (dir == nullptr) return 0;
  for (std::uint8_t which = 0; which < 5; ++which) {
    for (const std::uint64_t step : {std::uint64_t{0}, std::uint64_t{12345}}) {
      const std::vector<std::byte> bytes = seed_of(which, step);
      const std::string path =
          std::string(dir) + "/seed-" + std::to_string(which) + "-" + std::to_string(step);
      if (std::FILE* file = std::fopen(path.c_str(), "wb")) {
        std::fputc(which, file);
        std::fwrite(bytes.data(), 1, bytes.size(), file);
        std::fclose(file);
      }
    }
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const auto* bytes = reinterpret_cast<const std::byte*>(data + 1);
  const squall::host_view<const std::byte> view(bytes, size - 1);
  with_state(data[0], [&](auto& s) {
    try {
      s.restore(view);
    } catch (const squall::invalid_argument&) {
      return;  // the one accepted outcome of bad bytes
    }
    // restored: what it saves restores again, into a fresh state, to the same bytes
    const std::vector<std::byte> saved = s.save();
    with_state(data[0], [&](auto& again) {
      again.restore(squall::host_view<const std::byte>(saved));
      if (again.save() != saved) {
        std::fprintf(stderr, "a restored state does not round-trip\n");
        std::abort();
      }
    });
  });
  return 0;
}
