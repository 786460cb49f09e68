#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# interpose_lammps.sh MPIEXEC RANKS LIB INPUT
# Runs LAMMPS (Debian's lmp) on INPUT under MPIEXEC twice, without and with LIB
# (libsquall_mpi.so) preloaded into the ranks, SQUALL_MPI_MIN_BYTES=0 and
# SQUALL_MPI_COLLECTIVES=all (so squall takes every call it can, LAMMPS's small double sums and
# broadcasts included), and fails unless squall took calls and every
# thermo value of the two runs agrees to a relative 1e-6 (printed with 8 digits; the sums of a
# few doubles are in practice bitwise alike, and the test says when they are).
set -eu
mpiexec=$1 ranks=$2 lib=$(realpath "$3") input=$(realpath "$4")
flags=""
if "$mpiexec" --version 2>&1 | grep -q "Open MPI\|OpenRTE"; then flags="--oversubscribe"; fi
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
cd "$out"
"$mpiexec" -n "$ranks" $flags lmp -in "$input" -log none -echo none >plain.txt
"$mpiexec" -n "$ranks" $flags env LD_PRELOAD="$lib" SQUALL_MPI_MIN_BYTES=0 SQUALL_MPI_COLLECTIVES=all SQUALL_MPI_STATS=1 \
  lmp -in "$input" -log none -echo none >squall.txt 2>stats.txt
# The thermo table: from the "Step ..." header to the "Loop time" line.
thermo() { awk '/^ *Step /{on=1} /^Loop time/{on=0} on' "$1"; }
thermo plain.txt >plain.thermo
thermo squall.txt >squall.thermo
if ! grep -Eq "MPI_Allreduce +squall +[1-9]" stats.txt; then
  echo "interpose_lammps: squall took no MPI_Allreduce:" >&2
  cat stats.txt >&2
  exit 1
fi
rows=$(wc -l <plain.thermo)
if [ "$rows" -lt 3 ] || [ "$rows" -ne "$(wc -l <squall.thermo)" ]; then
  echo "interpose_lammps: thermo tables differ in length ($rows rows without squall)" >&2
  exit 1
fi
if cmp -s plain.thermo squall.thermo; then
  echo "interpose_lammps: $rows thermo rows, bitwise the same with libsquall_mpi.so"
  grep -E "MPI_(Allreduce|Bcast)" stats.txt
  exit 0
fi
paste -d'\n' plain.thermo squall.thermo | awk '
  NR % 2 == 1 { n = split($0, a); next }
  {
    split($0, b)
    for (i = 1; i <= n; i++) {
      if (a[i] == b[i]) continue
      d = a[i] - b[i]; d = d < 0 ? -d : d
      m = a[i] < 0 ? -a[i] : a[i]
      if (d > 1e-6 * m) { print "interpose_lammps: " a[i] " against " b[i] > "/dev/stderr"; bad = 1 }
    }
  }
  END { exit bad }'
echo "interpose_lammps: $rows thermo rows, within a relative 1e-6 with libsquall_mpi.so"
