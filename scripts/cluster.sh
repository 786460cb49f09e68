#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# An emulated cluster on this machine (issue 16): N hosts, each a Linux network namespace with
# its own host name, joined by veth pairs to a bridge in a switch namespace of their own, every
# link shaped in both directions with tc (a token bucket; optional delay), so a host can
# neither send nor receive faster than its link. Nothing touches the machine's own network:
# the bridge lives in the switch namespace and the addresses (10.213.0.0/24 by default) exist
# only inside these namespaces. Needs root (ip netns, tc, unshare).
#
#   scripts/cluster.sh up [-n HOSTS] [--rate RATE] [--delay DELAY] [--mtu BYTES]
#                                                     (default 4 hosts, 1gbit, no delay, 1500)
#   scripts/cluster.sh run [-n RANKS] [--per-host K] [--] COMMAND...  Open MPI across the hosts
#   scripts/cluster.sh exec HOST COMMAND...                          one command on host HOST
#   scripts/cluster.sh status
#   scripts/cluster.sh down                          removes everything `up` made; always safe
#
# RATE and DELAY are tc's units (1gbit, 10gbit, 100mbit; 0ms, 1ms). SQUALL_CLUSTER (default
# "sqc") prefixes every name, so two clusters can coexist: namespaces sqc-sw and sqc-h0..,
# state in /run/squall-cluster/sqc, name resolution in /etc/netns/sqc-h*/hosts (ip netns exec
# binds it over /etc/hosts inside the namespace only).
#
# `run` starts mpirun on host 0 and the other hosts' Open MPI daemons through a launch agent
# that enters the host's namespace instead of ssh (Open MPI's mpirun cannot place local ranks
# into other namespaces by itself: its daemons are reached over TCP, so each namespace must be
# a host of the hostfile); Open MPI's TCP traffic, daemons and ranks, is bound to the emulated
# network, shared memory (vader) only between ranks of one host. Every rank sees its host's
# name (gethostname), so squall's node discovery finds the emulated hosts.
# Ranks are not bound to cores (--bind-to none): every emulated host believes it owns all of
# the machine's cores, so Open MPI's default binding put each host's first rank on core 0, and
# two busy-polling ranks of two hosts shared one core (a ping-pong took 4 ms, a time slice).
set -Eeuo pipefail

prefix=${SQUALL_CLUSTER:-sqc}
subnet=${SQUALL_CLUSTER_SUBNET:-10.213.0}
state=/run/squall-cluster/$prefix
switch=$prefix-sw

die() {
  echo "cluster.sh: $*" >&2
  exit 2
}

usage() {
  sed -n '3,28p' "$0" | sed 's/^# \{0,1\}//'
  exit 2
}

need_root() {
  [ "$(id -u)" = 0 ] || die "needs root (ip netns, tc): run it as root"
  for tool in ip tc unshare; do
    command -v "$tool" >/dev/null || die "needs '$tool' (Debian: iproute2, util-linux)"
  done
}

host_ns() { echo "$prefix-h$1"; }

# The token bucket of one link direction on `dev` in namespace `ns`: the bucket holds 250 us
# of the rate, at least 128 KiB, so no burst outruns the link by much (1 ms at 1 Gbit/s), and
# packets wait at most 50 ms for tokens. With a bucket of 16 KiB the timer wake-ups of the
# shaping cost so much CPU that 4 hosts at 1 Gbit/s saturated both cores of a 2-core machine
# (softirq) and a ring allreduce ran at a third of the rate; at 128 KiB the cores are two
# thirds idle. With a delay, netem delays first.
shape() {
  local ns=$1 dev=$2 rate=$3 delay=$4
  local bits
  bits=$(rate_bits "$rate")
  local burst=$((bits / 8 / 4000))
  [ "$burst" -ge 131072 ] || burst=131072
  if [ "$delay" != 0 ] && [ "$delay" != 0ms ]; then
    ip netns exec "$ns" tc qdisc add dev "$dev" root handle 1: netem delay "$delay"
    ip netns exec "$ns" tc qdisc add dev "$dev" parent 1:1 handle 10: tbf rate "$rate" \
      burst "$burst" latency 50ms
  else
    ip netns exec "$ns" tc qdisc add dev "$dev" root tbf rate "$rate" burst "$burst" latency 50ms
  fi
}

# tc's rate units as bits per second: 1gbit, 10gbit, 100mbit, 500kbit, 1000000bit.
rate_bits() {
  local r=$1 n unit
  n=${r%%[a-z]*}
  unit=${r#"$n"}
  [[ "$n" =~ ^[0-9]+$ ]] || die "rate '$r': a whole number with a unit (1gbit, 10gbit, 100mbit)"
  case "$unit" in
    gbit) echo $((n * 1000000000)) ;;
    mbit) echo $((n * 1000000)) ;;
    kbit) echo $((n * 1000)) ;;
    bit) echo "$n" ;;
    *) die "rate '$r': the unit must be gbit, mbit, kbit or bit" ;;
  esac
}

cmd_down() {
  need_root
  local n=0
  [ -f "$state/hosts" ] && n=$(cat "$state/hosts")
  # Processes still in a namespace first (an interrupted run), then the namespaces: deleting a
  # namespace removes its veth ends, and the switch's with it.
  local ns
  for ns in $(ip netns list | awk '{print $1}' | grep -E "^$prefix-(sw|h[0-9]+)$" || true); do
    local pids
    pids=$(ip netns pids "$ns" 2>/dev/null || true)
    [ -z "$pids" ] || kill -9 $pids 2>/dev/null || true
    ip netns delete "$ns" 2>/dev/null || true
    rm -rf "/etc/netns/$ns"
  done
  local i
  for ((i = 0; i < n; ++i)); do rm -rf "/etc/netns/$(host_ns "$i")"; done
  rm -rf "$state"
}

cmd_up() {
  need_root
  local hosts=4 rate=1gbit delay=0 mtu=1500
  while [ $# -gt 0 ]; do
    case "$1" in
      -n) hosts=$2; shift 2 ;;
      --rate) rate=$2; shift 2 ;;
      --delay) delay=$2; shift 2 ;;
      --mtu) mtu=$2; shift 2 ;;
      *) die "up: unknown argument '$1'" ;;
    esac
  done
  [[ "$hosts" =~ ^[0-9]+$ ]] && [ "$hosts" -ge 1 ] && [ "$hosts" -le 200 ] ||
    die "up: -n must be a number of hosts from 1 to 200, not '$hosts'"
  rate_bits "$rate" >/dev/null
  [[ "$mtu" =~ ^[0-9]+$ ]] && [ "$mtu" -ge 576 ] && [ "$mtu" -le 65000 ] ||
    die "up: --mtu must be a number of bytes from 576 to 65000, not '$mtu'"
  [ ! -d "$state" ] || die "cluster '$prefix' is up already (scripts/cluster.sh down first)"
  # Whatever fails from here on, nothing stays behind.
  trap 'echo "cluster.sh: up failed; removing what it made" >&2; trap - ERR; cmd_down; exit 1' \
    ERR INT TERM
  mkdir -p "$state"
  echo "$hosts" >"$state/hosts"
  echo "$rate" >"$state/rate"
  echo "$delay" >"$state/delay"
  echo "$mtu" >"$state/mtu"
  ip netns add "$switch"
  ip -n "$switch" link set lo up
  ip -n "$switch" link add br0 type bridge
  ip -n "$switch" link set br0 up
  local i hosts_file="$state/etc_hosts"
  {
    echo "127.0.0.1 localhost"
    for ((i = 0; i < hosts; ++i)); do echo "$subnet.$((i + 1)) $(host_ns "$i")"; done
  } >"$hosts_file"
  for ((i = 0; i < hosts; ++i)); do
    local ns
    ns=$(host_ns "$i")
    ip netns add "$ns"
    mkdir -p "/etc/netns/$ns"
    cp "$hosts_file" "/etc/netns/$ns/hosts"
    ip -n "$ns" link set lo up
    ip link add "p$i" netns "$switch" type veth peer name eth0 netns "$ns"
    ip -n "$switch" link set "p$i" mtu "$mtu"
    ip -n "$ns" link set eth0 mtu "$mtu"
    ip -n "$switch" link set "p$i" master br0
    ip -n "$switch" link set "p$i" up
    ip -n "$ns" addr add "$subnet.$((i + 1))/24" dev eth0
    ip -n "$ns" link set eth0 up
    shape "$ns" eth0 "$rate" "$delay"      # what the host sends
    shape "$switch" "p$i" "$rate" "$delay" # what it receives
  done
  # The launch agent: Open MPI calls it as it would call ssh (host, then the command line).
  cat >"$state/agent" <<AGENT
#!/bin/sh
# Open MPI's launch agent for cluster '$prefix': runs a command line on an emulated host.
host=\$1
shift
exec ip netns exec "\$host" unshare --uts sh -c 'hostname "\$0" && exec sh -c "\$1"' "\$host" "\$*"
AGENT
  chmod +x "$state/agent"
  trap - ERR INT TERM
  echo "cluster '$prefix' up: $hosts hosts $(host_ns 0)..$(host_ns $((hosts - 1))), $subnet.1-$hosts," \
    "links $rate each way, delay $delay, mtu $mtu"
}

cmd_exec() {
  need_root
  [ -d "$state" ] || die "cluster '$prefix' is not up (scripts/cluster.sh up)"
  [ $# -ge 2 ] || die "exec: a host number and a command"
  local ns
  ns=$(host_ns "$1")
  shift
  ip netns list | grep -q "^$ns\b" || die "exec: no host '$ns'"
  exec ip netns exec "$ns" unshare --uts sh -c 'hostname "$0" && exec "$@"' "$ns" "$@"
}

cmd_run() {
  need_root
  [ -d "$state" ] || die "cluster '$prefix' is not up (scripts/cluster.sh up)"
  local hosts per_host=1 ranks=""
  hosts=$(cat "$state/hosts")
  while [ $# -gt 0 ]; do
    case "$1" in
      -n) ranks=$2; shift 2 ;;
      --per-host) per_host=$2; shift 2 ;;
      --) shift; break ;;
      *) break ;;
    esac
  done
  [ $# -ge 1 ] || die "run: no command"
  [[ "$per_host" =~ ^[1-9][0-9]*$ ]] || die "run: --per-host must be a positive number"
  [ -n "$ranks" ] || ranks=$((hosts * per_host))
  [[ "$ranks" =~ ^[1-9][0-9]*$ ]] && [ "$ranks" -le $((hosts * per_host)) ] ||
    die "run: -n $ranks ranks do not fit $hosts hosts x $per_host"
  local i
  : >"$state/hostfile"
  for ((i = 0; i < hosts; ++i)); do echo "$(host_ns "$i") slots=$per_host" >>"$state/hostfile"; done
  local mpirun=${SQUALL_CLUSTER_MPIRUN:-mpirun.openmpi}
  command -v "$mpirun" >/dev/null || die "run: needs Open MPI's $mpirun (Debian: openmpi-bin)"
  # A run interrupted here leaves daemons in the namespaces: `down` kills them; so does this.
  trap 'for ((i = 0; i < hosts; ++i)); do pids=$(ip netns pids "$(host_ns "$i")" || true); [ -z "$pids" ] || kill $pids 2>/dev/null || true; done' INT TERM
  local rc=0
  OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
    ip netns exec "$(host_ns 0)" unshare --uts sh -c 'hostname "$0" && exec "$@"' "$(host_ns 0)" \
    "$mpirun" --hostfile "$state/hostfile" -n "$ranks" --map-by "ppr:$per_host:node" \
    --mca plm_rsh_agent "$state/agent" \
    --mca oob_tcp_if_include "$subnet.0/24" --mca btl_tcp_if_include "$subnet.0/24" \
    --mca btl self,vader,tcp --bind-to none \
    -x OMPI_ALLOW_RUN_AS_ROOT -x OMPI_ALLOW_RUN_AS_ROOT_CONFIRM "$@" || rc=$?
  trap - INT TERM
  return "$rc"
}

cmd_status() {
  if [ ! -d "$state" ]; then
    echo "cluster '$prefix' is down"
    return 0
  fi
  echo "cluster '$prefix': $(cat "$state/hosts") hosts, links $(cat "$state/rate")," \
    "delay $(cat "$state/delay"), mtu $(cat "$state/mtu" 2>/dev/null || echo 1500)"
  ip netns list | grep -E "^$prefix-" || true
}

[ $# -ge 1 ] || usage
verb=$1
shift
case "$verb" in
  up) cmd_up "$@" ;;
  down) cmd_down ;;
  run) cmd_run "$@" ;;
  exec) cmd_exec "$@" ;;
  status) cmd_status ;;
  -h | --help | help) usage ;;
  *) die "unknown command '$verb' (up, run, exec, status, down)" ;;
esac
