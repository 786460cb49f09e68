#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# examples/mpi_error.cpp under mpiexec, 3 ranks (issue 15, item 11): rank 2 skips the
# allreduce; ranks 0 and 1 must get timeout_error naming the peer at the 2-s deadline and end
# the job with MPI_Abort. Passes if the job ends non-zero within 30 s and the error names a
# peer (without the abort the job exits 0: this test fails).
#   mpi_error.sh path/to/mpiexec path/to/squall-mpi-error
set -u
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
out="$(mktemp)"
trap 'rm -f "$out"' EXIT
start=$(date +%s)
"$1" --oversubscribe -n 3 "$2" > "$out" 2>&1
status=$?
took=$(( $(date +%s) - start ))
cat "$out"
[ "$status" -ne 0 ] || { echo "FAIL: the job exited 0"; exit 1; }
[ "$took" -le 30 ] || { echo "FAIL: the job took $took s"; exit 1; }
grep -q "timeout.*peer\|peer [0-9].*did not complete\|(rank [01], peer [0-9])" "$out" ||
  { echo "FAIL: no error naming a peer"; exit 1; }
echo "PASS: ended with status $status after $took s"
