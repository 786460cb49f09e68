#!/usr/bin/env bash
# The checks that need a GPU, in one run (the device machine's time is short): the CUDA tests
# (their process cases start ranks with DIR/squall-run); where DIR holds mpi.tar.gz
# (SQUALL_GPU_MPI_BUILD), the tests of device buffers over MPI at 1 to 3 ranks under the MPICH
# packed there; the CUDA kernel benchmark; the CUDA example; then the slower sanitizer steps:
# the tests under compute-sanitizer memcheck (the process cases at 2 ranks, for memory errors)
# and racecheck; last the CUDA IPC allreduce benchmark at 2 and 4 processes, also under MPS
# where nvidia-cuda-mps-control is installed (SQUALL_GPU_MPS=0: not).
# Usage: scripts/gpu-check.sh DIR [LOG_DIR]: DIR holds what scripts/gpu-build.sh gathers
# (squall_cuda_tests, squall_cuda_bench, the shared libraries), and may hold another build's
# as squall_cuda_tests-NAME / squall_cuda_bench-NAME, run beside them; logs go to LOG_DIR
# (default: $OUT where set, else DIR). To narrow a rerun within the lease: SQUALL_GPU_SKIP
# names steps to leave out ("memcheck racecheck bench"); SQUALL_GPU_TEST_ARGS and
# SQUALL_GPU_BENCH_ARGS add arguments to the tests and the benchmark (filters, no spaces);
# SQUALL_MEMCHECK_CASES is memcheck's in-process filter; SQUALL_MEMCHECK_IPC_CASES and
# SQUALL_MEMCHECK_IPC_S the process cases under memcheck and their deadline (the message test,
# 60 s); SQUALL_RACECHECK_CASES and SQUALL_RACECHECK_S racecheck's (50 s). Prints a short
# table last.
set -u
dir=$(cd "$1" && pwd)
logs=${2:-${OUT:-$dir}}
mkdir -p "$logs"
export SQUALL_TIMEOUT_S=${SQUALL_TIMEOUT_S:-30}  # a hang is a named timeout, not a killed step
export LD_LIBRARY_PATH="$dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
summary=()
step() { # step NAME SECONDS COMMAND...: runs it with a deadline, logs it, records its status
  local name=$1 limit=$2
  shift 2
  [[ " ${SQUALL_GPU_SKIP:-} " == *" $name "* ]] && return
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
  # shellcheck disable=SC2086 # (words: doctest filters, no spaces)
  step "${name#squall_cuda_}" 240 "$tests" --duration=true ${SQUALL_GPU_TEST_ARGS:-}
done
# device buffers over MPI, under the carried MPICH (UCX's modules beside it)
[[ -f $dir/mpi.tar.gz ]] && tar -C "$dir" -xzf "$dir/mpi.tar.gz"
if [[ -x $dir/mpi/squall_cuda_mpi_tests ]]; then
  for ranks in 1 2 3; do
    PATH="$dir/mpi:$PATH" LD_LIBRARY_PATH="$dir/mpi:$LD_LIBRARY_PATH" \
      UCX_MODULE_DIR="$dir/mpi/ucx" step "mpi-$ranks" 90 "$dir/mpi/mpiexec.hydra" -n "$ranks" \
      "$dir/mpi/squall_cuda_mpi_tests" --duration=true
  done
fi
# squall_cuda_bench (and squall_cuda_bench-NAME: another build's, in the same run)
for bench in "$dir"/squall_cuda_bench*; do
  [[ -x $bench ]] || continue
  name=$(basename "$bench")
  # shellcheck disable=SC2086
  step "${name#squall_cuda_}" 90 "$bench" --benchmark_min_time=0.2 ${SQUALL_GPU_BENCH_ARGS:-}
done
if [[ -x $dir/squall-cuda-topk ]]; then
  step example-topk 60 "$dir/squall-run" -n 3 "$dir/squall-cuda-topk"
fi
tests=$dir/squall_cuda_tests
sanitizer=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null)
if [[ -x $tests && -n $sanitizer ]]; then
  step memcheck 150 "$sanitizer" --tool memcheck --error-exitcode 9 "$tests" \
    "${SQUALL_MEMCHECK_CASES:---test-case-exclude=*between processes*}"
  export SQUALL_CUDA_TEST_RANKS=1  # the ranks run the case's body (tests/cuda/ipc.test.cu)
  # Memory errors only: opening a peer's handle returns cudaErrorAlreadyMapped where the peer's
  # new allocation shares driver memory with one still mapped here, which the transport
  # handles by closing the peer's mappings and opening again (transport/cuda_ipc.cuh); every
  # other API error throws and fails the test.
  step memcheck-ipc "${SQUALL_MEMCHECK_IPC_S:-60}" "$sanitizer" --tool memcheck --error-exitcode 9 \
    --report-api-errors no --target-processes all "$dir/squall-run" -n 2 "$tests" \
    "--test-case=${SQUALL_MEMCHECK_IPC_CASES:-cuda_ipc_transport*}"
  unset SQUALL_CUDA_TEST_RANKS
  # racecheck is slow: the kernels that share memory within a block (CUB, the reductions)
  step racecheck "${SQUALL_RACECHECK_S:-50}" "$sanitizer" --tool racecheck --error-exitcode 9 "$tests" \
    "${SQUALL_RACECHECK_CASES:--tc=*random-k*,*PowerSGD*,*write_selected*}"
fi
if [[ -x $dir/squall_cuda_ipc_bench ]]; then
  step ipc-bench-2 90 "$dir/squall-run" -n 2 "$dir/squall_cuda_ipc_bench"
  step ipc-bench-4 120 "$dir/squall-run" -n 4 "$dir/squall_cuda_ipc_bench"
  # Processes sharing one GPU are time-sliced unless the MPS server runs them as one context:
  # the same benchmark under a private MPS daemon (a user process; the GPU's settings stay
  # as they are), stopped afterwards.
  if [[ ${SQUALL_GPU_MPS:-1} == 1 ]] && command -v nvidia-cuda-mps-control >/dev/null; then
    export CUDA_MPS_PIPE_DIRECTORY=/tmp/squall-mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/squall-mps-log
    mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
    if nvidia-cuda-mps-control -d; then
      step ipc-bench-mps-2 40 "$dir/squall-run" -n 2 "$dir/squall_cuda_ipc_bench"
      step ipc-bench-mps-4 50 "$dir/squall-run" -n 4 "$dir/squall_cuda_ipc_bench"
      echo quit | nvidia-cuda-mps-control
      cp "$CUDA_MPS_LOG_DIRECTORY/control.log" "$logs/mps-control.log" 2>/dev/null
    fi
    unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
  fi
fi
for f in "$logs"/*.log; do
  echo "== $(basename "$f"): last lines"
  tail -25 "$f"
done
printf '%s\n' "${summary[@]}"
