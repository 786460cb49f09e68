#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# A shared-memory job started by mpiexec whose rank 1 fails before it attaches (issue 15, item
# 4): mpiexec then kills the other ranks, none of which can unlink the segment rank 0 made;
# rank 0's reaper must remove it. Rank 0 records the job id its name derives from
# (shm_job::from_environment: "ompi-<job id>"); afterwards /dev/shm must not hold that name.
#   shm_startup_mpiexec.sh path/to/mpiexec path/to/squall-hello
set -u
mpiexec="$1"
hello="$2"
dir="$(mktemp -d)"
trap 'rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

for trial in 1 2 3; do
  rm -f "$dir/job"
  "$mpiexec" --oversubscribe -n 3 sh -c "
    if [ \"\$OMPI_COMM_WORLD_LOCAL_RANK\" = 1 ]; then sleep 1; exit 3; fi
    if [ \"\$OMPI_COMM_WORLD_LOCAL_RANK\" = 0 ]; then
      echo \"\${OMPI_MCA_ess_base_jobid:-\$PMIX_NAMESPACE}\" > $dir/job
    fi
    exec $hello" > "$dir/out" 2>&1
  status=$?
  [ "$status" -ne 0 ] || fail "trial $trial: mpiexec exited 0 although rank 1 failed"
  [ -s "$dir/job" ] || fail "trial $trial: rank 0 did not record its job id"
  name="/dev/shm/squall-$(id -u)-ompi-$(cat "$dir/job")"
  i=0
  while [ -e "$name" ]; do
    i=$((i + 1)); [ $i -gt 20 ] && fail "trial $trial: $name left behind"
    sleep 0.05
  done
  echo "trial $trial: mpiexec exited $status, $name removed"
done
echo "PASS"
