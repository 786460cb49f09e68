#!/usr/bin/env bash
# The checks that need a GPU, in one run (the device machine's time is short): the CUDA tests,
# the same tests under compute-sanitizer memcheck and racecheck, and the CUDA kernel benchmark.
# Usage: scripts/gpu-check.sh DIR [LOG_DIR]: DIR holds what scripts/gpu-build.sh gathers
# (squall_cuda_tests, squall_cuda_bench, the shared libraries), and may hold another build's
# as squall_cuda_tests-NAME / squall_cuda_bench-NAME, run beside them; logs go to LOG_DIR
# (default: $OUT where set, else DIR). Prints a short table last.
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
if ! nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv \
  >"$logs/gpu.txt" 2>&1; then
  echo "gpu-check: no GPU here (nvidia-smi failed): run it on a machine with one" >&2
  exit 2
fi
cat "$logs/gpu.txt"
# squall_cuda_tests (and squall_cuda_tests-NAME: another build's, for comparison)
for tests in "$dir"/squall_cuda_tests*; do
  [[ -x $tests ]] || continue
  name=$(basename "$tests")
  step "${name#squall_cuda_}" 60 "$tests" --duration=true
done
tests=$dir/squall_cuda_tests
sanitizer=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null)
if [[ -x $tests && -n $sanitizer ]]; then
  step memcheck 80 "$sanitizer" --tool memcheck --error-exitcode 9 "$tests"
  # racecheck is slow: the kernels that share memory within a block (CUB, the reductions)
  step racecheck 50 "$sanitizer" --tool racecheck --error-exitcode 9 "$tests" \
    "${SQUALL_RACECHECK_CASES:--tc=*random-k*,*PowerSGD*,*write_selected*}"
fi
# squall_cuda_bench (and squall_cuda_bench-NAME: another build's, in the same run)
for bench in "$dir"/squall_cuda_bench*; do
  [[ -x $bench ]] || continue
  name=$(basename "$bench")
  step "${name#squall_cuda_}" 40 "$bench" --benchmark_min_time=0.2
done
for f in "$logs"/*.log; do
  echo "== $(basename "$f"): last lines"
  tail -25 "$f"
done
printf '%s\n' "${summary[@]}"
