#!/usr/bin/env bash
# The whole test run, as README's test command and CI run it: install what is missing, build,
# then the ctest suite without the `slow` label. Prints the time of each phase.
# Further phases (cross builds, ...) are added here, each with its time.
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
# The sanitizer build (clang-14, ASan + UBSan, only the targets it needs), the
# unit and in-process tests under it, then every fuzzer for a few seconds.
phase sanitize-build scripts/sanitize.sh build
phase sanitize-test scripts/sanitize.sh test
phase fuzz env FUZZ_NO_BUILD=1 scripts/fuzz.sh "${CELLSHARD_FUZZ_SECONDS:-5}"
# Big-endian CPUs under QEMU (issue #24, docs/cell.md): the powerpc64 (PS3 PPE) build of
# kernels/model/topologies and a subset of their tests (`cross-build.sh ppc64 OUT --test-all`
# runs every case). CELLSHARD_CI_S390X=1 adds the s390x daemon build and the mixed x86/s390x
# cluster tests (`ctest -L cross`): off by default, a cold s390x build of the whole binary
# does not fit the phase budget on 2 cores (docs/cell.md has the times).
phase cross-deps scripts/install-deps.sh --cross
phase cross-ppc64 scripts/cross-build.sh ppc64 build-cross/ppc64 --test
if [ "${CELLSHARD_CI_S390X:-0}" = 1 ]; then
  phase cross-s390x-build scripts/cross-build.sh s390x build-cross/s390x --test
  phase cross-s390x-test bash -c 'cd build && CELLSHARD_CROSS_S390X=$PWD/../build-cross/s390x ctest --output-on-failure -L cross'
fi
