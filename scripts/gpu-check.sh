#!/usr/bin/env bash
# The checks that need a GPU, in one run (the device machine's time is short): the CUDA tests,
# the same tests under compute-sanitizer memcheck and racecheck, and the CUDA kernel benchmark.
# Usage: scripts/gpu-check.sh DIR [LOG_DIR]: DIR holds the binaries built beside it
# (squall_cuda_tests, squall_cuda_bench where built) and may hold libcudart.so.*; logs go to
# LOG_DIR (default: $OUT where set, else DIR). Prints a short table last.
set -u
dir=$(cd "$1" && pwd)
logs=${2:-${OUT:-$dir}}
mkdir -p "$logs"
export LD_LIBRARY_PATH="$dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
summary=()
step() { # step NAME SECONDS COMMAND...: runs it with a deadline, logs it, records its status
  local name=$1 limit=$2
  shift 2
  local start=$SECONDS
  timeout "$limit" "$@" >"$logs/$name.log" 2>&1
  local rc=$?
  summary+=("$(printf '%-22s rc=%-4s %4ss  %s' "$name" "$rc" $((SECONDS - start)) \
    "$(grep -E 'test cases:|ERROR SUMMARY|RACECHECK SUMMARY' "$logs/$name.log" | tail -1)")")
}
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv \
  >"$logs/gpu.txt" 2>&1
cat "$logs/gpu.txt"
tests=$dir/squall_cuda_tests
if [[ -x $tests ]]; then
  step tests 120 "$tests" --duration=true
  sanitizer=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null)
  if [[ -n $sanitizer ]]; then
    step memcheck 180 "$sanitizer" --tool memcheck --error-exitcode 9 "$tests"
    # racecheck is slow: the kernels that share memory within a block (CUB, the bucket sums)
    step racecheck 150 "$sanitizer" --tool racecheck --error-exitcode 9 "$tests" \
      '-tc=*quantizers*,*top-k*,*sketch*,*heavy*,*threshold*'
  fi
fi
if [[ -x $dir/squall_cuda_bench ]]; then
  step bench 120 "$dir/squall_cuda_bench" --benchmark_min_time=0.2 \
    --benchmark_out="$logs/bench.json" --benchmark_out_format=json
fi
for f in "$logs"/*.log; do
  echo "== $(basename "$f"): last lines"
  tail -25 "$f"
done
printf '%s\n' "${summary[@]}"
