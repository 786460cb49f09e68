#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# squall-run and signals (issue 15, item 6): SIGTERM, SIGINT and SIGHUP sent to squall-run reach
# every rank and squall-run exits with 128 + the signal; SIGKILL of squall-run ends its ranks
# through their parent-death signal. Each rank records its pid, then sleeps; afterwards none
# of them may be alive (a zombie left to an init that does not reap counts as ended).
#   squall_run_signals.sh path/to/squall-run
set -u
run="$1"
dir="$(mktemp -d)"
trap 'for f in "$dir"/rank*; do [ -f "$f" ] && kill -9 "$(cat "$f")" 2>/dev/null; done; rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

alive() {  # pid: running, and not a zombie
  [ -r "/proc/$1/stat" ] || return 1
  state="$(sed 's/.*) //' "/proc/$1/stat" | cut -d' ' -f1)"
  [ "$state" != "Z" ]
}

for sig in TERM INT HUP KILL; do
  rm -f "$dir"/rank*
  "$run" -n 3 sh -c "echo \$\$ > $dir/rank\$SQUALL_RANK.tmp && mv $dir/rank\$SQUALL_RANK.tmp $dir/rank\$SQUALL_RANK && exec sleep 300" &
  launcher=$!
  i=0
  while [ "$(ls "$dir" | grep -c '^rank[0-9]*$')" -lt 3 ]; do
    i=$((i + 1)); [ $i -gt 200 ] && fail "$sig: the ranks did not start"
    sleep 0.05
  done
  kill -s "$sig" "$launcher"
  wait "$launcher"
  status=$?
  case "$sig" in
    TERM) want=143 ;; INT) want=130 ;; HUP) want=129 ;; KILL) want=137 ;;
  esac
  [ "$status" -eq "$want" ] || fail "$sig: squall-run exited with $status, not $want"
  i=0
  for f in "$dir"/rank0 "$dir"/rank1 "$dir"/rank2; do
    pid="$(cat "$f")"
    while alive "$pid"; do
      i=$((i + 1)); [ $i -gt 100 ] && fail "$sig: rank $(basename "$f") (pid $pid) still runs"
      sleep 0.05
    done
  done
  echo "ok: SIG$sig, squall-run status $status, every rank ended"
done
