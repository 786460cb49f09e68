#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# interpose_run.sh MPIEXEC RANKS LIB PROGRAM [ARGS...]
# Runs PROGRAM under MPIEXEC twice, without and with LIB (libsquall_mpi.so) preloaded into the
# ranks (not into mpiexec), and fails unless both runs pass and print the same standard output.
# The preloaded run gets --expect-squall appended, so the program can check squall took calls.
set -eu
mpiexec=$1 ranks=$2 lib=$(realpath "$3")
shift 3
flags=""
if "$mpiexec" --version 2>&1 | grep -q "Open MPI\|OpenRTE"; then flags="--oversubscribe"; fi
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
"$mpiexec" -n "$ranks" $flags "$@" >"$out/plain"
"$mpiexec" -n "$ranks" $flags env LD_PRELOAD="$lib" "$@" --expect-squall >"$out/squall"
if ! cmp -s "$out/plain" "$out/squall"; then
  echo "interpose_run: the outputs differ with libsquall_mpi.so preloaded:" >&2
  diff "$out/plain" "$out/squall" | head -20 >&2
  exit 1
fi
echo "interpose_run: $(wc -l <"$out/plain") lines, the same with and without libsquall_mpi.so"
