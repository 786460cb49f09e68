#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The main job: builds the release preset and runs squall-bench, the collective benchmark, on
# the shared-memory default: allreduce of float sums on every topology, 4 KiB to 256 MiB, beside
# MPI_Allreduce of the same data in the same run. Extra arguments go to squall-bench
# (e.g. -n 4, --op allgather, --topology direct,ring, --csv out.csv).
# The host kernel benchmark: SQUALL_BENCH=kernels ./scripts/bench.sh [google-benchmark args];
# the compressor kernels: SQUALL_BENCH=compress ./scripts/bench.sh [google-benchmark args].
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
source scripts/cuda-path.sh
cmake --preset release -DSQUALL_BUILD_TESTS=OFF >/dev/null
if [[ "${SQUALL_BENCH:-collectives}" == "compress" ]]; then
  cmake --build --preset release -j "$(nproc)" --target squall_bench_compress
  exec build/release/bench/squall_bench_compress --benchmark_counters_tabular=true "$@"
fi
if [[ "${SQUALL_BENCH:-collectives}" == "kernels" ]]; then
  cmake --build --preset release -j "$(nproc)" --target squall_bench_kernels
  exec build/release/bench/squall_bench_kernels --benchmark_counters_tabular=true "$@"
fi
cmake --build --preset release -j "$(nproc)" --target squall_bench
exec build/release/bench/squall-bench "$@"
