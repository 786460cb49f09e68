#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Two squall-bench binaries (before and after a change) run alternately on the same arguments,
# R times each, and each size's median time side by side: on a noisy machine the only fair
# comparison is one run beside the other. Prints per size the two medians, before/after (> 1:
# after is faster), Open MPI's median from the same runs, and each binary's range.
#
#   scripts/bench-ab.sh [-r R] BEFORE AFTER [squall-bench arguments...]
#   e.g. scripts/bench-ab.sh -r 5 /tmp/old/build/release/bench/squall-bench \
#            build/release/bench/squall-bench -n 2 --op allgather -t direct -b 4K -e 64K -f 4
#
# Use one fixed topology (-t): the medians are per size, across every row of that size.
set -euo pipefail
repeats=3
if [[ "${1:-}" == "-r" ]]; then
  repeats=$2
  shift 2
fi
if [[ $# -lt 2 ]]; then
  sed -n '3,12p' "$0" >&2
  exit 2
fi
before=$1
after=$2
shift 2
for binary in "$before" "$after"; do
  [[ -x "$binary" ]] || { echo "bench-ab.sh: $binary is not an executable" >&2; exit 2; }
done
if [[ $(id -u) == 0 ]]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
rows=$(mktemp)
trap 'rm -f "$rows"' EXIT
for ((r = 0; r < repeats; ++r)); do
  for which in before after; do
    binary=$before
    [[ $which == after ]] && binary=$after
    # the data rows: size count type topology time_us ... mpi_us (column 9, "-" without MPI)
    "$binary" "$@" | awk -v which="$which" '!/^#/ && NF >= 9 { print which, $1, $5, $9 }' >>"$rows"
  done
done
/usr/bin/python3 - "$rows" <<'PY'
import collections, statistics, sys

times = collections.defaultdict(list)
mpi = collections.defaultdict(list)
for line in open(sys.argv[1]):
    which, size, t, m = line.split()
    times[(int(size), which)].append(float(t))
    if m.replace(".", "", 1).isdigit():
        mpi[int(size)].append(float(m))
sizes = sorted({size for size, _ in times})
print(f"{'size':>10} {'before us':>10} {'after us':>10} {'before/after':>12} {'MPI us':>9}"
      f"  (before min-max, after min-max)")
for size in sizes:
    b, a = times[(size, "before")], times[(size, "after")]
    if not b or not a:
        continue
    mb, ma = statistics.median(b), statistics.median(a)
    m = f"{statistics.median(mpi[size]):9.1f}" if mpi[size] else f"{'-':>9}"
    print(f"{size:>10} {mb:10.1f} {ma:10.1f} {mb / ma:12.2f} {m}"
          f"  ({min(b):.1f}-{max(b):.1f}, {min(a):.1f}-{max(a):.1f})")
PY
