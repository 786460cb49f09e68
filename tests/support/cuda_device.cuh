// SPDX-License-Identifier: Apache-2.0
#pragma once
// Device discovery for the CUDA tests: with no device they are skipped (doctest::skip) and
// "skipped: no CUDA device" is printed once, which CTest reads as a skip.

#include <squall/backend/cuda.cuh>

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdio>
#include <vector>

namespace squall::test {

inline bool no_cuda_device() {
  static const bool none = [] {
    int devices = 0;
    const bool missing = cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0;
    if (missing) std::printf("skipped: no CUDA device\n");
    return missing;
  }();
  return none;
}

/// A device allocation holding a copy of `host`, freed with the object.
template <class T>
class device_vector {
 public:
  explicit device_vector(const std::vector<T>& host) : count_(host.size()) {
    SQUALL_CUDA_CHECK(cudaMalloc(&data_, count_ * sizeof(T) + 1));
    if (count_ != 0) {
      SQUALL_CUDA_CHECK(cudaMemcpy(data_, host.data(), count_ * sizeof(T), cudaMemcpyHostToDevice));
    }
  }
  ~device_vector() { cudaFree(data_); }
  device_vector(const device_vector&) = delete;
  device_vector& operator=(const device_vector&) = delete;

  device_view<T> view() { return {data_, count_}; }
  device_view<const T> view() const { return {data_, count_}; }
  std::vector<T> to_host() const {
    std::vector<T> out(count_);
    if (count_ != 0) {
      SQUALL_CUDA_CHECK(cudaMemcpy(out.data(), data_, count_ * sizeof(T), cudaMemcpyDeviceToHost));
    }
    return out;
  }

 private:
  T* data_ = nullptr;
  std::size_t count_;
};

/// The element counts the kernel tests try: empty, one, a small odd size, and a large one that
/// is not a multiple of any block or tile.
inline constexpr std::size_t device_test_counts[] = {0, 1, 1000, 1024 * 1024 + 3};

}  // namespace squall::test
