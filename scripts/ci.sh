#!/usr/bin/env bash
# The whole test run, as README's test command and CI run it: install what is missing, build,
# then the ctest suite without the `slow` label. Prints the time of each phase.
# Further phases (sanitizers, fuzzers, cross builds) are added here, each with its time.
set -euo pipefail
cd "$(dirname "$0")/.."
phase() {
  local name=$1; shift
  local t0; t0=$(date +%s)
  echo "== phase $name"
  "$@"
  echo "== phase $name: $(( $(date +%s) - t0 )) s"
}
phase install scripts/install-deps.sh
phase build scripts/build.sh
phase test bash -c 'cd build && ctest --output-on-failure -LE slow'
