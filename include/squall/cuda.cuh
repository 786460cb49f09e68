// SPDX-License-Identifier: Apache-2.0
#pragma once
/// The umbrella for nvcc translation units: squall.hpp plus the CUDA backend and kernels.

#include <squall/backend/cuda.cuh>
#include <squall/kernels/cuda/convert.cuh>
#include <squall/kernels/cuda/homomorphic.cuh>
#include <squall/kernels/cuda/quantize.cuh>
#include <squall/kernels/cuda/reduce.cuh>
#include <squall/kernels/cuda/select.cuh>
#include <squall/kernels/cuda/sketch.cuh>
#include <squall/kernels/cuda/sparse_merge.cuh>
#include <squall/squall.hpp>
