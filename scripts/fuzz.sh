#!/usr/bin/env bash
# Runs every libFuzzer target of fuzz/ for SECONDS each (default 5), starting
# from the seed corpus in fuzz/corpus/<target>/ (new inputs go to
# build-asan/fuzz-corpus/<target>/, never into the repository). Builds the
# fuzzers first (scripts/sanitize.sh build) unless FUZZ_NO_BUILD=1.
# A crash, a sanitizer report or a failed property leaves its input in
# build-asan/fuzz-artifacts/ and fails the script; make it a regression test
# (fuzz/regressions/<target>/, replayed by every run of this script).
#
#   scripts/fuzz.sh [SECONDS]
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-5}
dir=build-asan
[ "${FUZZ_NO_BUILD:-0}" = 1 ] || scripts/sanitize.sh build >/dev/null
mkdir -p "$dir/fuzz-artifacts"
export ASAN_OPTIONS=abort_on_error=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
# fuzz_one EXE: the target's regressions, then SECONDS of fuzzing; prints one line (more on failure).
fuzz_one() {
  local exe=$1 name work seeds=() t0 runs rc=0
  name=$(basename "$exe"); name=${name#fuzz_}
  work="$dir/fuzz-corpus/$name"
  mkdir -p "$work"
  [ -d "fuzz/corpus/$name" ] && seeds+=("fuzz/corpus/$name")
  # Regressions first: every input that once crashed must pass.
  if [ -d "fuzz/regressions/$name" ] && [ -n "$(ls -A "fuzz/regressions/$name")" ]; then
    if ! "$exe" -runs=0 "fuzz/regressions/$name"/* >"$dir/fuzz-artifacts/$name.regressions.log" 2>&1; then
      echo "fuzz: $name: a regression input fails again (log: $dir/fuzz-artifacts/$name.regressions.log)"
      rc=1
    fi
  fi
  t0=$(date +%s)
  if "$exe" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len=65536 \
      -artifact_prefix="$dir/fuzz-artifacts/$name-" "$work" "${seeds[@]}" >"$dir/fuzz-artifacts/$name.log" 2>&1; then
    runs=$(grep -oE '#[0-9]+' "$dir/fuzz-artifacts/$name.log" | tail -1 | tr -d '#')
    echo "fuzz: $name ok: ${runs:-0} inputs in $(( $(date +%s) - t0 )) s"
  else
    echo "fuzz: $name FAILED (log: $dir/fuzz-artifacts/$name.log):"
    grep -E 'ERROR|SUMMARY|FUZZ_CHECK|Test unit written' "$dir/fuzz-artifacts/$name.log" | head -5
    rc=1
  fi
  return $rc
}
# FUZZ_JOBS=N (scripts/ci.sh: the number of cores): N targets at a time, each
# one process on one core; each target's lines are printed in the targets'
# order once all have ended.
jobs=${FUZZ_JOBS:-1}
out=$(mktemp -d)
fail=0
running=0
i=0
exes=()
for exe in "$dir"/fuzz/fuzz_*; do
  [ -x "$exe" ] && exes+=("$exe")
done
for exe in "${exes[@]}"; do
  if [ "$running" -ge "$jobs" ]; then
    wait -n || fail=1
    running=$((running - 1))
  fi
  fuzz_one "$exe" > "$out/$i" 2>&1 &
  running=$((running + 1))
  i=$((i + 1))
done
while [ "$running" -gt 0 ]; do
  wait -n || fail=1
  running=$((running - 1))
done
for ((k = 0; k < i; k++)); do cat "$out/$k"; done
rm -rf "$out"
exit $fail
