#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The main job: builds the release preset and runs squall-bench, the collective benchmark, on
# the shared-memory default: allreduce of float sums on every topology, 4 KiB to 256 MiB, beside
# MPI_Allreduce of the same data in the same run. Extra arguments go to squall-bench
# (e.g. -n 4, --op allgather, --topology direct,ring, --csv out.csv).
# The host kernel benchmark: SQUALL_BENCH=kernels ./scripts/bench.sh [google-benchmark args];
# the compressor kernels: SQUALL_BENCH=compress ./scripts/bench.sh [google-benchmark args];
# an unmodified MPI program under libsquall_mpi.so, MPI_* against PMPI_* in one run:
# SQUALL_BENCH=interpose ./scripts/bench.sh [-n P] [--op allreduce|allgather|reduce_scatter|
# bcast] [-b 4K] [-e 256M] (Open MPI's mpiexec; SQUALL_MPI_* settings pass through).
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
  interpose)
    ./scripts/build-release.sh squall_mpi_bench squall_mpi_interpose
    ranks=2
    if [[ "${1:-}" == "-n" ]]; then ranks=$2; shift 2; fi
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
    exec mpiexec.openmpi -n "$ranks" --oversubscribe \
      env LD_PRELOAD="$PWD/build/release/libsquall_mpi.so" build/release/bench/squall-mpi-bench "$@" ;;
  collectives)
    ./scripts/build-release.sh squall_bench
    exec build/release/bench/squall-bench "$@" ;;
  *)
    echo "bench.sh: SQUALL_BENCH='${SQUALL_BENCH}': expected collectives, kernels, compress or interpose" >&2
    exit 2 ;;
esac
