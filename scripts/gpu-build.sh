#!/usr/bin/env bash
# Builds what scripts/gpu-check.sh runs on a GPU machine (the CUDA tests, squall-run that
# starts their process cases, the CUDA kernel benchmark, the CUDA IPC allreduce benchmark and
# the CUDA example; sm_90 by default) and gathers them, with the shared libraries they need
# that a bare CUDA machine may lack, into DIR (default .devrun, which git ignores where
# .git/info/exclude names it). Usage: scripts/gpu-build.sh [DIR] [BUILD_DIR]
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
ls -la "$out"
