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
# The s390x daemon (issue #24, docs/cell.md): a cold cross build of the whole
# `cellshard` binary needs ~16 min of CPU (965 CPU-s measured, docs/cell.md),
# about 8 min at -j2 on 2 idle cores: more than the budget leaves as a
# phase of its own. It runs in the background from here until the cross
# phases, which wait for it (`cross-s390x-wait`: the wall time it adds); in a
# session of its own (setsid), so with autogroup scheduling its nice 19 ranks
# it only against itself and it takes a fair share of the CPU: cold, it ends
# inside the build phase (docs/reliability.md "CI time"). CELLSHARD_CI_S390X=0
# leaves it out.
s390x=${CELLSHARD_CI_S390X:-1}
# Background jobs, each the leader of its own process group: stopped with the script.
bg_groups=()
trap 'for g in "${bg_groups[@]}"; do kill -TERM -- -"$g" 2>/dev/null || true; done' EXIT
if [ "$s390x" = 1 ]; then
  mkdir -p build-cross
  s390x_t0=$(date +%s)
  # Its own process group, stopped with it when a phase fails.
  CELLSHARD_JOBS=$(nproc) setsid nice -n 19 scripts/cross-build.sh s390x build-cross/s390x \
    > build-cross/s390x-build.log 2>&1 &
  s390x_pid=$!
  bg_groups+=("$s390x_pid")
  echo "== background: s390x cross build (pid $s390x_pid, log build-cross/s390x-build.log)"
fi
# Without debug information (the same -O2 code): about 40% less compile time
# on a CAF unit than README's RelWithDebInfo build (CMakeLists.txt,
# CELLSHARD_FAST_COMPILE; docs/reliability.md "CI time").
# CELLSHARD_FAST_COMPILE=0 builds README's way instead.
phase build env CELLSHARD_FAST_COMPILE="${CELLSHARD_FAST_COMPILE:-1}" scripts/build.sh
# The sanitizer build (clang-14, ASan + UBSan, only the targets it needs), then
# the powerpc64 build, in the background from here: the gcc test phase runs
# one test at a time and left most of a core idle (340 CPU-s in 461 s of wall
# time, docs/reliability.md "CI time"). Both run in one session of their own
# (setsid), so with the kernel's autogroup scheduling the tests and these
# builds get a fair share of the CPU each (nice would not rank them across
# sessions). The sanitize-build and cross-ppc64 phases wait for each (with a
# deadline). CELLSHARD_CI_BACKGROUND=0 runs them in their phases instead.
background=${CELLSHARD_CI_BACKGROUND:-1}
logs=build-ci
if [ "$background" = 1 ]; then
  mkdir -p "$logs"
  rm -f "$logs"/asan-build.rc "$logs"/ppc64-build.rc
  setsid bash -c "scripts/sanitize.sh build > $logs/asan-build.log 2>&1; echo \$? > $logs/asan-build.rc
    scripts/cross-build.sh ppc64 build-cross/ppc64 > $logs/ppc64-build.log 2>&1; echo \$? > $logs/ppc64-build.rc" &
  bg_groups+=("$!")
  echo "== background: sanitizer build, then powerpc64 build (pid $!, logs $logs/)"
fi
# wait_build NAME: waits (at most 90 min) for the background build NAME to end; its exit code.
wait_build() {
  local rc_file="$logs/$1.rc" deadline=$(( $(date +%s) + 5400 ))
  while [ ! -f "$rc_file" ]; do
    [ "$(date +%s)" -lt "$deadline" ] || { echo "$1: not done after 90 min" >&2; return 1; }
    sleep 2
  done
  local rc; rc=$(cat "$rc_file")
  echo "$1: exit $rc (log $logs/$1.log)"
  [ "$rc" = 0 ] || { tail -50 "$logs/$1.log"; return 1; }
}
phase test bash -c 'cd build && ctest --output-on-failure -LE slow'
# The unit and in-process tests under the sanitizers, two executables at a
# time (SANITIZE_LANES), then every fuzzer for a few seconds, one per core.
if [ "$background" = 1 ]; then
  phase sanitize-build wait_build asan-build
else
  phase sanitize-build scripts/sanitize.sh build
fi
phase sanitize-test env SANITIZE_LANES="${SANITIZE_LANES:-$(nproc)}" scripts/sanitize.sh test
phase fuzz env FUZZ_NO_BUILD=1 FUZZ_JOBS="${FUZZ_JOBS:-$(nproc)}" scripts/fuzz.sh "${CELLSHARD_FUZZ_SECONDS:-5}"
# Big-endian CPUs under QEMU (issue #24, docs/cell.md): the powerpc64 (PS3 PPE) build of
# kernels/model/topologies and a subset of their tests (`cross-build.sh ppc64 OUT --test-all`
# runs every case); then the s390x daemon: the [checkpoint] cases and three generations
# under QEMU (`cross-build.sh s390x OUT --test`, its build already done) and the mixed
# x86/s390x cluster tests (`ctest -L cross`).
ppc64_phase() {
  if [ "$background" = 1 ]; then wait_build ppc64-build; fi
  scripts/cross-build.sh ppc64 build-cross/ppc64 --test
}
phase cross-ppc64 ppc64_phase
if [ "$s390x" = 1 ]; then
  s390x_wait() {
    local rc=0
    wait "$s390x_pid" || rc=$?
    grep '^== cross-build' build-cross/s390x-build.log || true
    echo "s390x background build: $(( $(date +%s) - s390x_t0 )) s of wall time in all, exit $rc"
    [ $rc -eq 0 ] || { tail -50 build-cross/s390x-build.log; return $rc; }
  }
  phase cross-s390x-wait s390x_wait
  phase cross-s390x-test bash -c 'scripts/cross-build.sh s390x build-cross/s390x --test &&
    cd build && CELLSHARD_CROSS_S390X=$PWD/../build-cross/s390x ctest --output-on-failure -L cross'
fi
