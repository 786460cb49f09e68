#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# interpose_fortran.sh MPIEXEC RANKS LIB PROGRAM [nonblocking]
# Runs the Fortran PROGRAM (tests/interpose/fortran_collectives.F90) under MPIEXEC twice,
# without and with LIB (libsquall_mpi.so) preloaded, and fails unless both pass, print the
# same lines, and squall's stats (SQUALL_MPI_STATS) show that it took every allreduce,
# reduce_scatter_block, reduce_scatter, allgather, allgatherv and bcast of the preloaded run
# (with `nonblocking`, every one of their non-blocking forms and ibarrier too): Fortran's calls
# reach it.
set -eu
mpiexec=$1 ranks=$2 lib=$(realpath "$3") program=$4 nonblocking=${5:-}
calls="MPI_Allreduce MPI_Reduce_scatter_block MPI_Reduce_scatter MPI_Allgather MPI_Allgatherv MPI_Bcast"
if [ "$nonblocking" = nonblocking ]; then
  calls="$calls MPI_Iallreduce MPI_Ireduce_scatter_block MPI_Ireduce_scatter MPI_Iallgather"
  calls="$calls MPI_Iallgatherv MPI_Ibcast MPI_Ibarrier"
fi
flags=""
if "$mpiexec" --version 2>&1 | grep -q "Open MPI\|OpenRTE"; then flags="--oversubscribe"; fi
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
"$mpiexec" -n "$ranks" $flags "$program" >"$out/plain"
"$mpiexec" -n "$ranks" $flags env LD_PRELOAD="$lib" SQUALL_MPI_STATS=1 SQUALL_MPI_MIN_BYTES=4096 \
  SQUALL_MPI_IALLREDUCE_MIN_BYTES=4096 SQUALL_MPI_COLLECTIVES=all "$program" >"$out/squall" 2>"$out/stats"
grep -q "ok: iallgatherv" "$out/plain" || { echo "interpose_fortran: the plain run did not finish" >&2; exit 1; }
if ! cmp -s "$out/plain" "$out/squall"; then
  echo "interpose_fortran: the outputs differ with libsquall_mpi.so preloaded:" >&2
  diff "$out/plain" "$out/squall" | head -20 >&2
  exit 1
fi
for call in $calls; do
  if ! grep -Eq "^ +$call +squall +[1-9][0-9]* calls .* MPI +0 calls" "$out/stats"; then
    echo "interpose_fortran: squall did not take every Fortran $call:" >&2
    cat "$out/stats" >&2
    exit 1
  fi
done
echo "interpose_fortran: $(wc -l <"$out/plain") lines, the same with libsquall_mpi.so, which took every call"
