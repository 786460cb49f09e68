#!/usr/bin/env bash
# Builds what scripts/gpu-check.sh runs on a GPU machine (the CUDA tests, squall-run that
# starts their process cases, the CUDA kernel benchmark, the CUDA IPC allreduce benchmark and
# the CUDA example; sm_90 by default) and gathers them, with the shared libraries they need
# that a bare CUDA machine may lack, into DIR (default .devrun, which .gitignore names, so a
# copy of the working tree takes it only where told to). With SQUALL_GPU_MPI_BUILD=DIR2 (a
# build configured with MPICH, e.g. -DMPI_CXX_COMPILER=mpicxx.mpich), also the tests of device
# buffers over MPI built there and MPICH's launcher and libraries (the GPU machine has no
# MPI) into DIR/mpi.tar.gz.
# Usage: scripts/gpu-build.sh [DIR] [BUILD_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-.devrun}
build=${2:-build/ci}
[[ -f $build/CMakeCache.txt ]] || cmake --preset ci >/dev/null
cmake --build "$build" --target squall_cuda_tests squall_cuda_bench squall_cuda_ipc_bench \
  squall_cuda_topk squall_run -j "$(nproc)"
mkdir -p "$out"
cp "$build/tests/squall_cuda_tests" "$build/bench/squall_cuda_bench" \
  "$build/bench/squall_cuda_ipc_bench" "$build/examples/squall-cuda-topk" "$build/squall-run" \
  "$out/"
for lib in libcudart.so.13 libbenchmark.so.1debian; do
  path=$(ldd "$out/squall_cuda_bench" | awk -v l="$lib" '$1 == l {print $3}')
  [[ -n $path ]] && cp -L "$path" "$out/"
done
if [[ -n ${SQUALL_GPU_MPI_BUILD:-} ]]; then
  mpi_build=$SQUALL_GPU_MPI_BUILD
  cmake --build "$mpi_build" --target squall_cuda_mpi_tests -j "$(nproc)"
  mkdir -p "$out/mpi"
  cp "$mpi_build/tests/squall_cuda_mpi_tests" "$out/mpi/"
  # hydra finds its proxy on PATH; UCX its modules in UCX_MODULE_DIR (gpu-check.sh sets both):
  # cross-memory attach alone, since the GPU machine has no InfiniBand
  cp -L "$(command -v mpiexec.hydra)" "$(command -v hydra_pmi_proxy)" "$out/mpi/"
  # every library they load but the C and C++ runtimes (hydra's: hwloc, slurm, udev)
  ldd "$out"/mpi/* | awk '$3 ~ /^\// {print $3}' | sort -u |
    grep -vE '/(libc|libm|libstdc\+\+|libgcc_s|libdl|libpthread|librt|libresolv|libcudart)\.so' |
    xargs -r cp -L -t "$out/mpi/"
  ucx=$(dirname "$(ldd "$out/mpi/squall_cuda_mpi_tests" | awk '$1 == "libucs.so.0" {print $3}')")/ucx
  [[ -d $ucx ]] && mkdir -p "$out/mpi/ucx" && cp -L "$ucx"/libuct_cma.so.0 "$out/mpi/ucx/"
  # packed: MPICH's library alone is 41 MB, and what travels to the GPU machine is 64 MiB
  tar -C "$out" -czf "$out/mpi.tar.gz" mpi && rm -r "$out/mpi"
fi
ls -la "$out"
