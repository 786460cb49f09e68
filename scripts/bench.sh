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
case "${SQUALL_BENCH:-collectives}" in
  compress)
    ./scripts/build-release.sh squall_bench_compress
    exec build/release/bench/squall_bench_compress --benchmark_counters_tabular=true "$@" ;;
  kernels)
    ./scripts/build-release.sh squall_bench_kernels
    exec build/release/bench/squall_bench_kernels --benchmark_counters_tabular=true "$@" ;;
  collectives)
    ./scripts/build-release.sh squall_bench
    exec build/release/bench/squall-bench "$@" ;;
  *)
    echo "bench.sh: SQUALL_BENCH='${SQUALL_BENCH}': expected collectives, kernels or compress" >&2
    exit 2 ;;
esac
