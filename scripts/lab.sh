#!/usr/bin/env bash
# The weak-node lab: N network namespaces joined by veth pairs and a bridge on
# a private subnet used only inside them (10.231.0.0/24), each node's link
# shaped with tc tbf (netem is not available on these machines), a cellshard
# node daemon in every namespace, and the front end on the bridge.
#
#   scripts/lab.sh up N [--rate 1gbit] [--profile ps3] [--cpu PCT] [--threads T] [--nice N]
#                                                         create, start the daemons, verify the shaping
#   scripts/lab.sh run [run's flags...]                   cellshard run --cluster <the lab's cluster.json> ...
#   scripts/lab.sh status                                 what is up
#   scripts/lab.sh down                                   remove everything (idempotent)
#
# Needs root (ip netns, tc) and iperf3 (scripts/install-deps.sh). The shaping
# is measured with a bounded iperf3 transfer before `up` returns, and `up`
# fails when the measured rate is more than 10% off. An interrupted `up`
# tears down what it made. State lives in $CELLSHARD_LAB (default /tmp/cellshard-lab).
#
# --cpu PCT caps each daemon at PCT% of one core (a cgroup of its own: cpu.max
# on cgroup v2, cpu.cfs_quota_us on v1; 10 ms periods), the way a weak node's compute is
# capped (issue #25), so 8 daemons on 2 cores measure the links and the
# protocol rather than the contention; --threads T is the daemons' kernel
# threads (default 1 with --cpu).
#
# --nice N (-20..19, e.g. -10) runs the daemons and the iperf3 check at that
# scheduling priority: under `nice -n N`, and with --cpu their cgroups get the
# CFS weight of a nice-N task (cpu.weight.nice on v2; cpu.shares =
# 1024 x 1.25^-N on v1), since a task's nice counts only against the tasks of
# its own cgroup. It makes other runnable processes (builds, tests) yield the
# CPU to the daemons sooner; it does not cap those processes, and does not
# protect against memory-bandwidth and cache contention, processes at the same
# or a higher priority, or kernel work (softirqs of the veth/tc links run on
# whatever core is interrupted). The quota still caps each daemon.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
BIN=${CELLSHARD_BIN:-$ROOT/build/tools/cellshard}
LAB=${CELLSHARD_LAB:-/tmp/cellshard-lab}
MODELS=${CELLSHARD_MODELS:-$ROOT/../shared/models}
PREFIX=cslab
BRIDGE=${PREFIX}-br
SUBNET=10.231.0
PORT=7000

die() { echo "lab.sh: $*" >&2; exit 1; }

# The cgroup of daemon $1 with a quota of $2 % of one core; prints its
# cgroup.procs path. cgroup v2 (cpu.max) or v1 (cpu.cfs_quota_us).
cg_make() {
  local name=$PREFIX-$1 pct=$2 nice=${3:-} dir
  if [ -f /sys/fs/cgroup/cgroup.controllers ]; then
    dir=/sys/fs/cgroup/$name
    mkdir -p "$dir" || return 1
    echo "$((pct * 100)) 10000" > "$dir/cpu.max" || return 1
    if [ -n "$nice" ]; then echo "$nice" > "$dir/cpu.weight.nice" || return 1; fi
  elif [ -d /sys/fs/cgroup/cpu ]; then
    dir=/sys/fs/cgroup/cpu/$name
    mkdir -p "$dir" || return 1
    echo 10000 > "$dir/cpu.cfs_period_us" && echo "$((pct * 100))" > "$dir/cpu.cfs_quota_us" || return 1
    if [ -n "$nice" ]; then
      awk -v n="$nice" 'BEGIN{printf "%d\n", 1024 * 1.25 ^ (-n)}' > "$dir/cpu.shares" || return 1
    fi
  else
    return 1
  fi
  echo "$dir/cgroup.procs"
}
cg_remove_all() {
  local d
  for d in /sys/fs/cgroup/$PREFIX-* /sys/fs/cgroup/cpu/$PREFIX-*; do
    [ -d "$d" ] && rmdir "$d" 2>/dev/null || true
  done
}

down() {
  if [ -f "$LAB/pids" ]; then
    while read -r pid; do kill -9 "$pid" 2>/dev/null || true; done < "$LAB/pids"
  fi
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep "^${PREFIX}-" || true); do
    # Anything still running inside the namespace goes with it.
    for pid in $(ip netns pids "$ns" 2>/dev/null || true); do kill -9 "$pid" 2>/dev/null || true; done
    ip netns del "$ns" 2>/dev/null || true
  done
  for link in $(ip -o link show 2>/dev/null | awk -F': ' '{print $2}' | cut -d@ -f1 | grep "^${PREFIX}-" || true); do
    ip link del "$link" 2>/dev/null || true
  done
  cg_remove_all
  rm -rf "$LAB"
}

up() {
  local n=$1; shift
  local rate=1gbit profile=host cpu="" threads="" nice=""
  while [ $# -gt 0 ]; do
    case $1 in
      --rate) rate=$2; shift 2 ;;
      --profile) profile=$2; shift 2 ;;
      --cpu) cpu=$2; shift 2 ;;
      --threads) threads=$2; shift 2 ;;
      --nice) nice=$2; shift 2 ;;
      *) die "up: unknown option $1" ;;
    esac
  done
  [[ $n =~ ^[0-9]+$ ]] && [ "$n" -ge 2 ] && [ "$n" -le 64 ] || die "up: N must be 2..64"
  [ -z "$cpu" ] || { [[ $cpu =~ ^[0-9]+$ ]] && [ "$cpu" -ge 1 ] && [ "$cpu" -le 100 ]; } || die "up: --cpu PCT must be 1..100"
  [ -z "$threads" ] || { [[ $threads =~ ^[0-9]+$ ]] && [ "$threads" -ge 1 ]; } || die "up: --threads T must be >= 1"
  [ -z "$nice" ] || { [[ $nice =~ ^-?[0-9]+$ ]] && [ "$nice" -ge -20 ] && [ "$nice" -le 19 ]; } || die "up: --nice N must be -20..19"
  if [ -n "$cpu" ] && [ -z "$threads" ]; then threads=1; fi
  local nicer=()
  if [ -n "$nice" ]; then nicer=(nice -n "$nice"); fi
  [ "$(id -u)" -eq 0 ] || die "needs root (ip netns, tc)"
  command -v iperf3 >/dev/null || die "needs iperf3 (scripts/install-deps.sh)"
  [ -x "$BIN" ] || die "no cellshard binary at $BIN (scripts/build.sh)"
  [ -f "$MODELS/stories260K.bin" ] || die "no model files in $MODELS (set CELLSHARD_MODELS)"
  down
  mkdir -p "$LAB"
  trap 'echo "lab.sh: interrupted, tearing down" >&2; down; exit 130' INT TERM
  trap 'rc=$?; if [ $rc -ne 0 ]; then down; fi' EXIT
  ip link add "$BRIDGE" type bridge
  ip addr add "$SUBNET.1/24" dev "$BRIDGE"
  ip link set "$BRIDGE" up
  for ((i = 0; i < n; i++)); do
    local ns=$PREFIX-$i host=$PREFIX-v$i peer=$PREFIX-p$i ip=$SUBNET.$((10 + i))
    ip netns add "$ns"
    ip link add "$host" type veth peer name "$peer"
    ip link set "$peer" netns "$ns"
    ip link set "$host" master "$BRIDGE"
    ip link set "$host" up
    ip netns exec "$ns" ip link set lo up
    ip netns exec "$ns" ip addr add "$ip/24" dev "$peer"
    ip netns exec "$ns" ip link set "$peer" up
    # The node's outgoing link, and the bridge's link towards the node.
    ip netns exec "$ns" tc qdisc add dev "$peer" root tbf rate "$rate" burst 64kb latency 50ms
    tc qdisc add dev "$host" root tbf rate "$rate" burst 64kb latency 50ms
  done
  # Verify the shaping before anything else: a bounded transfer node 1 -> node 0
  # (2 s; up to 3 attempts, since the machine may be busy).
  local target
  target=$(echo "$rate" | awk '{v=$1+0; u=tolower($1); if (u ~ /gbit/) v*=1e9; else if (u ~ /mbit/) v*=1e6; else if (u ~ /kbit/) v*=1e3; print v}')
  local measured="" ok=0
  for attempt in 1 2 3; do
    ${nicer[@]+"${nicer[@]}"} ip netns exec "$PREFIX-0" iperf3 -s -1 -B "$SUBNET.10" -p 5201 >/dev/null 2>&1 &
    local srv=$!
    measured=""
    for _ in $(seq 1 50); do  # wait for the server, at most 5 s
      if ${nicer[@]+"${nicer[@]}"} ip netns exec "$PREFIX-1" iperf3 -c "$SUBNET.10" -p 5201 -t 2 -J > "$LAB/iperf.json" 2>/dev/null; then
        # (|| true: under pipefail a report without the field must not end the script)
        measured=$( (grep -m1 -A8 '"sum_received"' "$LAB/iperf.json" | grep bits_per_second | tr -dc '0-9.') || true)
        break
      fi
      sleep 0.1
    done
    kill "$srv" 2>/dev/null || true
    wait "$srv" 2>/dev/null || true
    [ -n "$measured" ] || continue
    echo "link check: measured $(awk -v m="$measured" 'BEGIN{printf "%.1f", m/1e6}') Mbit/s, target $(awk -v t="$target" 'BEGIN{printf "%.1f", t/1e6}') Mbit/s (attempt $attempt)"
    if awk -v m="$measured" -v t="$target" 'BEGIN{d=m/t-1; if (d<0) d=-d; exit (d>0.1)}'; then ok=1; break; fi
  done
  [ -n "$measured" ] || die "could not measure the link (iperf3 between $PREFIX-1 and $PREFIX-0 failed)"
  [ "$ok" -eq 1 ] || die "the shaped rate is more than 10% off its target: the limit is not in effect"
  echo "$measured" > "$LAB/measured_bps"
  # A node daemon in every namespace.
  : > "$LAB/pids"
  local json='{"nodes": ['
  for ((i = 0; i < n; i++)); do
    local ns=$PREFIX-$i ip=$SUBNET.$((10 + i))
    # The lab's namespaces are private to this machine, so its daemons run plain
    # (--insecure: a plain daemon otherwise binds loopback only); use
    # `cellshard certs` and --tls-* for links anyone else can reach.
    local procs=/dev/null
    if [ -n "$cpu" ]; then procs=$(cg_make "$i" "$cpu" "$nice") || die "cannot make a cgroup with a CPU quota (cgroup v1 or v2 cpu controller)"; fi
    # The shell joins the cgroup, then becomes the daemon (exec keeps the pid);
    # before `ip netns exec`, which mounts the namespace's own /sys.
    CS_PROCS=$procs bash -c 'echo $$ > "$CS_PROCS"; exec "$@"' lab-node ${nicer[@]+"${nicer[@]}"} ip netns exec "$ns" \
      "$BIN" node --listen "$ip:$PORT" --insecure --profile "$profile" --models "$MODELS" -q \
      ${threads:+--threads "$threads"} > "$LAB/node$i.out" 2> "$LAB/node$i.err" &
    echo $! >> "$LAB/pids"
    if [ "$i" -gt 0 ]; then json+=', '; fi
    json+="{\"host\": \"$ip\", \"port\": $PORT, \"profile\": \"$profile\"}"
  done
  json+=']}'
  for ((i = 0; i < n; i++)); do  # each daemon says `listening` first; wait at most 10 s
    for _ in $(seq 1 100); do grep -q '^listening' "$LAB/node$i.out" 2>/dev/null && break; sleep 0.1; done
    grep -q '^listening' "$LAB/node$i.out" || die "node $i did not start: $(cat "$LAB/node$i.err")"
  done
  echo "$json" > "$LAB/cluster.json"
  echo "$n" > "$LAB/nodes"
  trap - INT TERM EXIT
  echo "lab up: $n nodes on $SUBNET.0/24 at $rate${cpu:+, each daemon capped at $cpu% of a core}${nice:+, nice $nice}; cluster file $LAB/cluster.json"
}

case ${1:-} in
  up) shift; [ $# -ge 1 ] || die "usage: lab.sh up N [--rate R] [--profile P] [--cpu PCT] [--threads T] [--nice N]"; up "$@" ;;
  run) shift; [ -f "$LAB/cluster.json" ] || die "the lab is not up (lab.sh up N)"; exec "$BIN" run --cluster "$LAB/cluster.json" "$@" ;;
  status)
    ip netns list | grep "^$PREFIX-" || echo "no lab namespaces"
    [ -f "$LAB/cluster.json" ] && cat "$LAB/cluster.json" || true ;;
  down) down; echo "lab down" ;;
  *) echo "usage: lab.sh up N [--rate R] [--profile P] [--cpu PCT] [--threads T] [--nice N] | run ARGS | status | down" >&2; exit 2 ;;
esac
