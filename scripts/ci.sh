#!/usr/bin/env bash
# The whole test run, as README's test command and CI run it: install what is missing, build,
# then the ctest suite without the `slow` label. Prints the time of each phase.
# Further phases (cross builds, ...) are added here, each with its time.
set -euo pipefail
cd "$(dirname "$0")/.."
# CPU-seconds (user + sys) of this script's finished children, from /proc: the
# CPU a phase used, which depends much less than its wall time on what else
# runs on the machine (a background job's CPU counts in the phase during which
# it ends: the s390x build's usually lands in `build` or `test`).
tck=$(getconf CLK_TCK)
children_cpu() { awk -v t="$tck" '{ sub(/^.*\) /, ""); printf "%.0f", ($14 + $15) / t }' /proc/$$/stat; }
phase() {
  local name=$1; shift
  local t0 c0; t0=$(date +%s); c0=$(children_cpu)
  echo "== phase $name"
  "$@"
  echo "== phase $name: $(( $(date +%s) - t0 )) s ($(( $(children_cpu) - c0 )) CPU-s; load $(cut -d' ' -f1-3 /proc/loadavg))"
}
phase install scripts/install-deps.sh
phase cross-deps scripts/install-deps.sh --cross
# Background builds. Each test phase runs one test at a time and leaves most
# of the second core idle (the gcc test phase: ~340 CPU-s in ~460 s of wall
# time), so the builds that later phases need start here, in the background at
# the lowest CPU priority (nice 19: they take only what the gcc build and the
# tests leave idle), each in its own process group (stopped with this script
# when a phase fails), and the phase that needs one waits for it (its wall time
# is then the wait). CELLSHARD_CI_BACKGROUND=0 builds each in its own phase as
# before (for timing one build alone).
# - the s390x daemon (issue #24, docs/cell.md): a cold cross build of
#   `cellshard` needs ~400-965 CPU-s; CELLSHARD_CI_S390X=0 leaves it out;
# - the sanitizer tree (clang-14, ASan + UBSan, ~1,300 CPU-s cold);
# - the powerpc64 (PS3 PPE) build of kernels/model/topologies and its tests.
s390x=${CELLSHARD_CI_S390X:-1}
background=${CELLSHARD_CI_BACKGROUND:-1}
mkdir -p build-cross build-logs
declare -A bg_pid bg_t0 bg_log
bg_start() {  # NAME LOG COMMAND...: start COMMAND in the background
  local name=$1 log=$2; shift 2
  CELLSHARD_JOBS=$(nproc) setsid nice -n 19 "$@" > "$log" 2>&1 &
  bg_pid[$name]=$!; bg_t0[$name]=$(date +%s); bg_log[$name]=$log
  echo "== background: $name (pid $!, log $log)"
}
bg_wait() {  # NAME: wait for it; its log's tail when it failed
  local name=$1 rc=0
  wait "${bg_pid[$name]}" || rc=$?
  echo "$name background: $(( $(date +%s) - bg_t0[$name] )) s of wall time in all, exit $rc"
  [ $rc -eq 0 ] || { tail -50 "${bg_log[$name]}"; return $rc; }
}
bg_stop() { local p; for p in "${bg_pid[@]}"; do kill -TERM -- -"$p" 2>/dev/null || true; done; }
trap bg_stop EXIT
[ "$s390x" = 1 ] && bg_start s390x build-cross/s390x-build.log \
  scripts/cross-build.sh s390x build-cross/s390x
if [ "$background" = 1 ]; then
  bg_start sanitize build-logs/sanitize-build.log scripts/sanitize.sh build
  bg_start ppc64 build-logs/ppc64-build.log scripts/cross-build.sh ppc64 build-cross/ppc64
fi
# Without debug information (the same -O2 code): about 40% less compile time
# on a CAF unit than README's RelWithDebInfo build (CMakeLists.txt,
# CELLSHARD_FAST_COMPILE; docs/reliability.md "CI time").
# CELLSHARD_FAST_COMPILE=0 builds README's way instead.
phase build env CELLSHARD_FAST_COMPILE="${CELLSHARD_FAST_COMPILE:-1}" scripts/build.sh
phase test bash -c 'cd build && ctest --output-on-failure -LE slow'
# The sanitizer build (clang-14, ASan + UBSan, only the targets it needs), the
# unit and in-process tests under it, then every fuzzer for a few seconds.
if [ "$background" = 1 ]; then
  phase sanitize-build bg_wait sanitize
else
  phase sanitize-build scripts/sanitize.sh build
fi
phase sanitize-test scripts/sanitize.sh test
phase fuzz env FUZZ_NO_BUILD=1 scripts/fuzz.sh "${CELLSHARD_FUZZ_SECONDS:-5}"
# Big-endian CPUs under QEMU (issue #24, docs/cell.md): the powerpc64 (PS3 PPE) build of
# kernels/model/topologies and a subset of their tests (`cross-build.sh ppc64 OUT --test-all`
# runs every case); then the s390x daemon: the [checkpoint] cases and three generations
# under QEMU (`cross-build.sh s390x OUT --test`, its build already done) and the mixed
# x86/s390x cluster tests (`ctest -L cross`).
[ "$background" = 1 ] && phase cross-ppc64-wait bg_wait ppc64
phase cross-ppc64 scripts/cross-build.sh ppc64 build-cross/ppc64 --test
if [ "$s390x" = 1 ]; then
  phase cross-s390x-wait bg_wait s390x
  phase cross-s390x-test bash -c 'scripts/cross-build.sh s390x build-cross/s390x --test &&
    cd build && CELLSHARD_CROSS_S390X=$PWD/../build-cross/s390x ctest --output-on-failure -L cross'
fi
