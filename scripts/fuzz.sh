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
fail=0
for exe in "$dir"/fuzz/fuzz_*; do
  [ -x "$exe" ] || continue
  name=$(basename "$exe"); name=${name#fuzz_}
  work="$dir/fuzz-corpus/$name"
  mkdir -p "$work"
  seeds=()
  [ -d "fuzz/corpus/$name" ] && seeds+=("fuzz/corpus/$name")
  # Regressions first: every input that once crashed must pass.
  if [ -d "fuzz/regressions/$name" ] && [ -n "$(ls -A "fuzz/regressions/$name")" ]; then
    if ! "$exe" -runs=0 "fuzz/regressions/$name"/* >"$dir/fuzz-artifacts/$name.regressions.log" 2>&1; then
      echo "fuzz: $name: a regression input fails again (log: $dir/fuzz-artifacts/$name.regressions.log)"
      fail=1
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
    fail=1
  fi
done
exit $fail
