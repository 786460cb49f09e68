// SPDX-License-Identifier: Apache-2.0
// The bucketed quantizers (compress/quantize.hpp), default buckets of 512 (TernGrad and QSGD
// also with least-squares scales), the 8-bit floats,
// and homomorphic quantization (compress/homomorphic.hpp: its encode is one rank's, the
// local range and the codes; encode_agreed/ the codes alone, against a range agreed before,
// what the collectives run after their max-allreduce, as squall_cuda_bench's agreed rows).
#include <squall/compress/homomorphic.hpp>
#include <squall/compress/quantize.hpp>

#include "compress_common.hpp"

namespace squall::bench {

namespace {

/// encode_agreed/<label>/<count>: hq's encode against its range found once before the loop
/// (one rank's sum, as encode/<label>), so the row times the rotation, draws and codes alone.
void register_agreed(const std::string& label, homomorphic_compressor c) {
  benchmark::RegisterBenchmark(("encode_agreed/" + label).c_str(), [c](benchmark::State& state) {
    const auto n = static_cast<std::size_t>(state.range(0));
    const std::vector<float> in = gradient(n);
    std::vector<std::byte> payload(c.max_payload_bytes(dtype::float32, n));
    const agreed_range agreed = c.local_range(host_backend{}, host_view<const float>(in));
    for (auto _ : state) {
      benchmark::DoNotOptimize(c.encode(host_backend{}, host_view<const float>(in),
                                        host_view<std::byte>(payload), random_stream{}, agreed));
      benchmark::ClobberMemory();
    }
    state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * n * sizeof(float)));
  })->Arg(compress_count);
}

}  // namespace

void register_quantize_benchmarks() {
  register_codec("int8", int8_compressor{});
  register_codec("sign", sign_compressor{});
  register_codec("sign_vote", sign_vote_compressor{});
  register_codec("terngrad", terngrad_compressor{});
  register_codec("qsgd4", qsgd_compressor<4>{});
  register_codec("terngrad_fit", terngrad_compressor{.fit_scale = true});
  register_codec("qsgd4_fit", qsgd_compressor<4>{.fit_scale = true});
  register_codec("qsgd127", qsgd_compressor<127>{});
  register_codec("fp8_e4m3", fp8_compressor{});
  register_codec("fp8_e5m2", fp8_compressor{.format = fp8_format::e5m2});
  register_codec("fp8_e4m3_sr", fp8_compressor{.stochastic = true});
  register_codec("hq4", homomorphic_compressor{});
  register_codec("hq8", homomorphic_compressor{.bits = 8});
  register_codec("hq4_unrotated", homomorphic_compressor{.rotate = false});
  register_agreed("hq4", homomorphic_compressor{});
  register_agreed("hq8", homomorphic_compressor{.bits = 8});
  register_agreed("hq4_unrotated", homomorphic_compressor{.rotate = false});
  // with the compressor's check_finite: the input searched for a NaN or infinity as it is coded
  register_agreed("hq4_checked", homomorphic_compressor{.check_finite = true});
}

}  // namespace squall::bench
