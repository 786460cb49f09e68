// SPDX-License-Identifier: Apache-2.0
// The CUDA kernels beside the device-to-device copy of the same elements, in one run (Google
// Benchmark, manual time from CUDA events around each call on the backend's stream).
// bytes_per_second counts the fewest bytes each call must move through device memory (each
// input read once, each output written once): the copy 2 x 4 bytes per float, reduce_into
// 3 x 4, an encode 4 + its payload's bytes per element, a decode the reverse. `of_copy` is
// that rate over the copy's at the same count, measured first. Top-k (1%) is timed beside
// the full CUB radix sort of (key, index) pairs that it runs: `of_sort` is the sort's time
// over top-k's. Inputs are normal draws (a hash of the index), different per buffer.
// Built only where nvcc is; run on a GPU by scripts/gpu-check.sh.

#include <squall/compress/cast.hpp>
#include <squall/compress/homomorphic.hpp>
#include <squall/compress/quantize.hpp>
#include <squall/compress/sparsify.hpp>
#include <squall/cuda.cuh>

#include <benchmark/benchmark.h>
#include <cub/device/device_radix_sort.cuh>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <map>
#include <utility>

namespace {

using squall::cuda_backend;
using squall::device_view;

using squall::kernels::device_scratch;
namespace kernels = squall::kernels;

/// The work goes to the legacy default stream; buffers come from squall's scratch pool.
const cuda_backend gpu{};

template <class T>
device_scratch<T> device_buffer(std::size_t count) {
  return squall::kernels::allocate_scratch<T>(gpu, count);
}

template <class T>
device_view<const T> cview(const device_scratch<T>& b) {
  return device_view<const T>(b.data(), b.count());
}

__global__ void fill_normal(float* out, std::size_t count, std::uint32_t salt) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += stride) {
    // sum of 4 uniform draws from a 32-bit hash of (i, salt): about normal, never all equal
    std::uint32_t h = static_cast<std::uint32_t>(i) * 0x9e3779b9u ^ salt;
    float s = 0;
    for (int k = 0; k < 4; ++k) {
      h ^= h >> 16;
      h *= 0x7feb352du;
      h ^= h >> 15;
      h *= 0x846ca68bu;
      h ^= h >> 16;
      s += static_cast<float>(h) * 0x1p-32f;
    }
    out[i] = s - 2.0f;
  }
}

device_scratch<float> normal_buffer(std::size_t count, std::uint32_t salt) {
  device_scratch<float> b = device_buffer<float>(count);
  fill_normal<<<1024, 256>>>(b.data(), count, salt);
  SQUALL_CUDA_CHECK(cudaGetLastError());
  SQUALL_CUDA_CHECK(cudaDeviceSynchronize());
  return b;
}

/// The copy's rate (bytes per second) at each count, set by `d2d_copy` (registered first).
std::map<std::size_t, double>& copy_rates() {
  static std::map<std::size_t, double> rates;
  return rates;
}

/// The pair sort's seconds at each count, set by `radix_sort_pairs` (registered before top-k).
std::map<std::size_t, double>& sort_times() {
  static std::map<std::size_t, double> times;
  return times;
}

/// Times `call()` on `stream` with events, once per iteration; returns the mean seconds per
/// call.
template <class Call>
double time_calls(benchmark::State& state, cudaStream_t stream, Call&& call) {
  cudaEvent_t start{}, stop{};
  SQUALL_CUDA_CHECK(cudaEventCreate(&start));
  SQUALL_CUDA_CHECK(cudaEventCreate(&stop));
  call();  // warm: module load, CUB's first allocation
  SQUALL_CUDA_CHECK(cudaStreamSynchronize(stream));
  double seconds = 0;
  for (auto _ : state) {
    SQUALL_CUDA_CHECK(cudaEventRecord(start, stream));
    call();
    SQUALL_CUDA_CHECK(cudaEventRecord(stop, stream));
    SQUALL_CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    SQUALL_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    state.SetIterationTime(ms * 1e-3);
    seconds += ms * 1e-3;
  }
  SQUALL_CUDA_CHECK(cudaEventDestroy(start));
  SQUALL_CUDA_CHECK(cudaEventDestroy(stop));
  return seconds / static_cast<double>(state.iterations());
}

/// Times `call()` as `time_calls`, counting `bytes_per_call`; returns bytes per second.
template <class Call>
double rate_of_calls(benchmark::State& state, cudaStream_t stream, double bytes_per_call,
                     Call&& call) {
  const double seconds = time_calls(state, stream, std::forward<Call>(call));
  state.SetBytesProcessed(static_cast<std::int64_t>(bytes_per_call * state.iterations()));
  return bytes_per_call / seconds;
}

void report_of_copy(benchmark::State& state, std::size_t count, double rate) {
  const auto it = copy_rates().find(count);
  if (it != copy_rates().end()) state.counters["of_copy"] = rate / it->second;
}

void d2d_copy(benchmark::State& state) {
  const auto count = static_cast<std::size_t>(state.range(0));
  const auto in = normal_buffer(count, 1);
  const auto out = device_buffer<float>(count);
  const double rate = rate_of_calls(state, nullptr, 8.0 * count, [&] {
    SQUALL_CUDA_CHECK(cudaMemcpyAsync(out.data(), in.data(), count * sizeof(float),
                                      cudaMemcpyDeviceToDevice, nullptr));
  });
  copy_rates()[count] = rate;
}

void reduce_sum(benchmark::State& state) {
  const auto count = static_cast<std::size_t>(state.range(0));
  const auto in = normal_buffer(count, 2);
  const auto sum = normal_buffer(count, 3);
  const double rate = rate_of_calls(state, nullptr, 12.0 * count, [&] {
    squall::kernels::reduce_into(gpu, squall::sum_op{}, sum.view(), cview(in));
  });
  report_of_copy(state, count, rate);
}

/// A codec's row: its rate beside the copy's, and its ratio (`size` payload bytes for `count`
/// floats).
void report_codec(benchmark::State& state, std::size_t count, std::size_t size, double rate) {
  report_of_copy(state, count, rate);
  state.counters["ratio"] = 4.0 * count / static_cast<double>(size);
}

/// Encode (`decode` false) or decode of compressor `C` on `count` floats.
template <class C>
void codec(benchmark::State& state, const C& c, bool decode) {
  const auto count = static_cast<std::size_t>(state.range(0));
  const auto in = normal_buffer(count, 4);
  const auto out = device_buffer<float>(count);
  const auto payload = device_buffer<std::byte>(c.max_payload_bytes(squall::dtype::float32, count));
  const std::size_t size = c.encode(gpu, cview(in), payload.view(), squall::random_stream{});
  const device_view<const std::byte> sent(payload.data(), size);
  const double bytes = 4.0 * count + static_cast<double>(size);
  const double rate =
      decode ? rate_of_calls(state, nullptr, bytes, [&] { c.decode(gpu, sent, out.view()); })
             : rate_of_calls(state, nullptr, bytes, [&] {
                 benchmark::DoNotOptimize(
                     c.encode(gpu, cview(in), payload.view(), squall::random_stream{}));
               });
  report_codec(state, count, size, rate);
}

/// hq's encode against a range agreed before (what the collective calls after the ranks'
/// max-allreduce: the words' memset, the header's copy and the kernel, no wait), beside
/// `codec`'s call, which first reads its own range back.
void hq_encode_agreed(benchmark::State& state, const squall::homomorphic_compressor& c) {
  const auto count = static_cast<std::size_t>(state.range(0));
  const auto in = normal_buffer(count, 7);
  const squall::agreed_range agreed = c.local_range(gpu, cview(in));
  const auto payload =
      device_buffer<std::byte>(c.max_payload_bytes(squall::dtype::float32, count, agreed.ranks));
  const auto encode = [&] {
    return c.encode(gpu, cview(in), payload.view(), squall::random_stream{}, agreed);
  };
  const std::size_t size = encode();
  const double rate = rate_of_calls(state, nullptr, 4.0 * count + static_cast<double>(size),
                                    [&] { benchmark::DoNotOptimize(encode()); });
  report_codec(state, count, size, rate);
}

/// A quantizer's kernel alone, without the call's waits (the encode's for its first
/// non-finite element where it checks, the decode's for its header and its first invalid
/// code): the encode's kernel with the bucket (512) in registers or (`read_twice`) the kernel
/// of larger buckets, or (`decode`) the decode's kernel.
template <kernels::quantize_scheme Q>
void kernel_alone(benchmark::State& state, bool read_twice, bool decode) {
  const auto count = static_cast<std::size_t>(state.range(0));
  constexpr std::size_t bucket = 512;
  const std::size_t buckets = (count + bucket - 1) / bucket;
  const auto in = normal_buffer(count, 6);
  const auto out = device_buffer<float>(count);
  const auto scales = device_buffer<float>(buckets);
  const auto codes = device_buffer<std::uint8_t>(count * Q.width / 8);
  const auto first_bad = device_buffer<unsigned long long>(1);
  const auto encode = [&] {
    kernels::detail::launch_quantize<Q>(gpu, in.data(), count, bucket, scales.data(), codes.data(),
                                        0, squall::random_stream{}, first_bad.data(), read_twice);
  };
  encode();  // the decode's codes
  const double bytes = 4.0 * count + static_cast<double>(count * Q.width / 8 + buckets * 4);
  const double rate = decode ? rate_of_calls(state, nullptr, bytes,
                                             [&] {
                                               kernels::detail::launch_dequantize<Q>(
                                                   gpu, scales.data(), codes.data(), count, bucket,
                                                   out.data(), first_bad.data());
                                             })
                             : rate_of_calls(state, nullptr, bytes, encode);
  report_of_copy(state, count, rate);
}

void int8_kernel_alone(benchmark::State& state, bool read_twice, bool decode) {
  kernel_alone<squall::int8_compressor::scheme>(state, read_twice, decode);
}

void qsgd4_kernel_alone(benchmark::State& state, bool read_twice) {
  kernel_alone<squall::qsgd_compressor<4>::scheme>(state, read_twice, false);
}

void fp8_kernel_alone(benchmark::State& state, bool read_twice) {
  kernel_alone<squall::quantize_compressor<squall::fp8_spec<1, false>>::scheme>(state, read_twice,
                                                                                false);
}

/// The full radix sort of (magnitude key, index) pairs that top-k runs, alone.
void radix_sort_pairs(benchmark::State& state) {
  const auto count = static_cast<std::size_t>(state.range(0));
  const auto keys = device_buffer<std::uint32_t>(count),
             sorted_keys = device_buffer<std::uint32_t>(count),
             index = device_buffer<std::uint32_t>(count),
             sorted_index = device_buffer<std::uint32_t>(count);
  fill_normal<<<1024, 256>>>(reinterpret_cast<float*>(keys.data()), count, 9);
  SQUALL_CUDA_CHECK(cudaGetLastError());
  std::size_t temp_bytes = 0;
  SQUALL_CUDA_CHECK(cub::DeviceRadixSort::SortPairsDescending(
      nullptr, temp_bytes, keys.data(), sorted_keys.data(), index.data(), sorted_index.data(),
      static_cast<std::int64_t>(count), 0, 31));
  const auto temp = device_buffer<std::byte>(temp_bytes);
  sort_times()[count] = time_calls(state, nullptr, [&] {
    SQUALL_CUDA_CHECK(cub::DeviceRadixSort::SortPairsDescending(
        temp.data(), temp_bytes, keys.data(), sorted_keys.data(), index.data(), sorted_index.data(),
        static_cast<std::int64_t>(count), 0, 31));
  });
  state.SetItemsProcessed(static_cast<std::int64_t>(count * state.iterations()));
}

void topk_1_percent(benchmark::State& state) {
  const auto count = static_cast<std::size_t>(state.range(0));
  const squall::topk_compressor c{.ratio = 0.01};
  const auto in = normal_buffer(count, 5);
  const auto payload = device_buffer<std::byte>(c.max_payload_bytes(squall::dtype::float32, count));
  const double seconds = time_calls(
      state, nullptr, [&] { benchmark::DoNotOptimize(c.encode(gpu, cview(in), payload.view())); });
  state.SetItemsProcessed(static_cast<std::int64_t>(count * state.iterations()));
  const auto sort = sort_times().find(count);
  if (sort != sort_times().end()) state.counters["of_sort"] = sort->second / seconds;
}

constexpr std::int64_t mib64 = std::int64_t{16} << 20;  // floats in 64 MiB
constexpr std::int64_t mib256 = std::int64_t{64} << 20;

void sizes(benchmark::internal::Benchmark* b) {
  b->Arg(mib64)->Arg(mib256)->UseManualTime()->Unit(benchmark::kMicrosecond);
}

}  // namespace

BENCHMARK(d2d_copy)->Apply(sizes);
BENCHMARK(reduce_sum)->Apply(sizes);
BENCHMARK_CAPTURE(codec, cast_bf16_encode, squall::cast_compressor<squall::bfloat16>{}, false)
    ->Apply(sizes);
BENCHMARK_CAPTURE(codec, cast_bf16_decode, squall::cast_compressor<squall::bfloat16>{}, true)
    ->Apply(sizes);
BENCHMARK_CAPTURE(codec, int8_encode, squall::int8_compressor{}, false)->Apply(sizes);
BENCHMARK_CAPTURE(codec, int8_decode, squall::int8_compressor{}, true)->Apply(sizes);
BENCHMARK_CAPTURE(codec, fp8_e4m3_encode, squall::fp8_compressor{}, false)->Apply(sizes);
BENCHMARK_CAPTURE(codec, fp8_e4m3_decode, squall::fp8_compressor{}, true)->Apply(sizes);
BENCHMARK_CAPTURE(codec, qsgd4_encode, squall::qsgd_compressor<4>{}, false)->Apply(sizes);
BENCHMARK_CAPTURE(codec, qsgd4_decode, squall::qsgd_compressor<4>{}, true)->Apply(sizes);
BENCHMARK_CAPTURE(codec, fp8_e4m3_sr_encode,
                  squall::quantize_compressor<squall::fp8_spec<1, true>>{}, false)
    ->Apply(sizes);
BENCHMARK_CAPTURE(codec, hq4_encode, squall::homomorphic_compressor{}, false)->Apply(sizes);
BENCHMARK_CAPTURE(hq_encode_agreed, hq4, squall::homomorphic_compressor{})->Apply(sizes);
BENCHMARK_CAPTURE(codec, hq4_decode, squall::homomorphic_compressor{}, true)->Apply(sizes);
BENCHMARK_CAPTURE(hq_encode_agreed, hq4_unrotated, squall::homomorphic_compressor{.rotate = false})
    ->Apply(sizes);
BENCHMARK_CAPTURE(codec, hq4_unrotated_decode, squall::homomorphic_compressor{.rotate = false},
                  true)
    ->Apply(sizes);
BENCHMARK_CAPTURE(hq_encode_agreed, hq8, squall::homomorphic_compressor{.bits = 8})->Apply(sizes);
BENCHMARK_CAPTURE(int8_kernel_alone, registers, false, false)->Apply(sizes);
BENCHMARK_CAPTURE(int8_kernel_alone, read_twice, true, false)->Apply(sizes);
BENCHMARK_CAPTURE(fp8_kernel_alone, registers, false)->Apply(sizes);
BENCHMARK_CAPTURE(fp8_kernel_alone, read_twice, true)->Apply(sizes);
BENCHMARK_CAPTURE(qsgd4_kernel_alone, registers, false)->Apply(sizes);
BENCHMARK_CAPTURE(qsgd4_kernel_alone, read_twice, true)->Apply(sizes);
BENCHMARK_CAPTURE(int8_kernel_alone, decode, false, true)->Apply(sizes);
BENCHMARK(radix_sort_pairs)->Arg(mib256)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK(topk_1_percent)->Arg(mib256)->UseManualTime()->Unit(benchmark::kMillisecond);

BENCHMARK_MAIN();
