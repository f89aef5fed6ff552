#!/usr/bin/env bash
# lab.sh up 2 then down: the daemons run in their namespaces, the shaping is
# verified, and afterwards no namespace, link or daemon is left. Skipped (77)
# where namespaces cannot be created (not root), except that CI runs as root.
set -u
src=$1 bin=$2 shared=$3
export CELLSHARD_BIN=$bin CELLSHARD_MODELS=$shared/models CELLSHARD_LAB=$(mktemp -d)/lab
if ! ip netns add cslab-probe 2>/dev/null; then
  echo "skipped: cannot create network namespaces here (needs root)"; exit 77
fi
ip netns del cslab-probe
if [ ! -f "$shared/models/stories260K.bin" ]; then
  if [ -n "${CI:-}" ]; then echo "FAIL: ../shared is missing and CI is set"; exit 1; fi
  echo "skipped: ../shared/models not found"; exit 77
fi
fail() { echo "FAIL: $*"; bash "$src/scripts/lab.sh" down >/dev/null 2>&1; exit 1; }
# One retry: a busy machine can fail the shaping check or a start-up deadline.
out=$(bash "$src/scripts/lab.sh" up 2 --rate 100mbit 2>&1) ||
  out=$(bash "$src/scripts/lab.sh" up 2 --rate 100mbit 2>&1) || fail "up failed: $out"
echo "$out"
echo "$out" | grep -q "link check: measured" || fail "no measured link check"
[ "$(ip netns list | grep -c '^cslab-')" -eq 2 ] || fail "expected 2 namespaces"
[ "$(ip netns pids cslab-0 | wc -l)" -ge 1 ] || fail "no daemon in cslab-0"
bash "$src/scripts/lab.sh" down || fail "down failed"
left_ns=$(ip netns list | grep -c '^cslab-' || true)
left_links=$(ip -o link show | grep -c 'cslab-' || true)
left_procs=$(pgrep -f "node --listen 10.231.0." | wc -l)
[ "$left_ns" -eq 0 ] || fail "$left_ns namespaces left"
[ "$left_links" -eq 0 ] || fail "$left_links links left"
[ "$left_procs" -eq 0 ] || fail "$left_procs daemons left"
echo "lab up/down: nothing left behind"
# --cpu with --nice: each daemon runs at that nice value, in a cgroup with its
# quota and the CFS weight of a nice -10 task (v1: 1024 x 1.25^10 = 9536).
out=$(bash "$src/scripts/lab.sh" up 2 --rate 100mbit --cpu 25 --nice -10 2>&1) ||
  out=$(bash "$src/scripts/lab.sh" up 2 --rate 100mbit --cpu 25 --nice -10 2>&1) || fail "up --nice failed: $out"
echo "$out"
pid=$(head -1 "$CELLSHARD_LAB/pids")
ni=$(ps -o ni= -p "$pid" | tr -d ' ')
[ "$ni" = "-10" ] || fail "daemon $pid runs at nice '$ni', expected -10"
if [ -f /sys/fs/cgroup/cgroup.controllers ]; then
  w=$(cat /sys/fs/cgroup/cslab-0/cpu.weight.nice); [ "$w" = "-10" ] || fail "cpu.weight.nice $w, expected -10"
  q=$(cat /sys/fs/cgroup/cslab-0/cpu.max); [ "$q" = "2500 10000" ] || fail "cpu.max '$q', expected 2500 10000"
else
  w=$(cat /sys/fs/cgroup/cpu/cslab-0/cpu.shares); [ "$w" = "9536" ] || fail "cpu.shares $w, expected 9536"
  q=$(cat /sys/fs/cgroup/cpu/cslab-0/cpu.cfs_quota_us); [ "$q" = "2500" ] || fail "cfs_quota_us $q, expected 2500"
fi
grep -qx "$pid" "$( [ -f /sys/fs/cgroup/cgroup.controllers ] && echo /sys/fs/cgroup/cslab-0 || echo /sys/fs/cgroup/cpu/cslab-0)/cgroup.procs" ||
  fail "daemon $pid is not in its cgroup"
bash "$src/scripts/lab.sh" up 2 --nice -30 >/dev/null 2>&1 && fail "--nice -30 accepted"
bash "$src/scripts/lab.sh" down || fail "down failed"
left=$(ls -d /sys/fs/cgroup/cslab-* /sys/fs/cgroup/cpu/cslab-* 2>/dev/null | wc -l)
[ "$left" -eq 0 ] || fail "$left cgroups left"
echo "lab up --cpu --nice: daemons at nice -10 in weighted cgroups, nothing left behind"
