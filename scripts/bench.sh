#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The main job: builds the release preset and runs the benchmark. Until squall-bench (the
# collective benchmark on the shared-memory transport) lands, this is the host kernel
# benchmark: reduce_into for each element type beside memcpy of the same bytes, in one run.
# Extra arguments go to the benchmark (e.g. --benchmark_filter=float).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
source scripts/cuda-path.sh
cmake --preset release -DSQUALL_BUILD_TESTS=OFF >/dev/null
cmake --build --preset release -j "$(nproc)" --target squall_bench_kernels
exec build/release/bench/squall_bench_kernels --benchmark_counters_tabular=true "$@"
