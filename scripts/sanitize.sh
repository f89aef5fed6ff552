#!/usr/bin/env bash
# The sanitizer build and run (issue #21): one clang-14 build in build-asan/
# with AddressSanitizer + UndefinedBehaviorSanitizer (and libFuzzer coverage
# instrumentation, so the same objects serve the fuzzers of fuzz/), then the
# unit and in-process tests under it. A sanitizer report fails the run.
#
#   [SANITIZE_FULL=1] scripts/sanitize.sh [build|test|all]      (default: all)
#
# Only the targets this run needs are built (the CAF-heavy process tests are
# not): the test executables below and the fuzzers (scripts/fuzz.sh runs them).
set -euo pipefail
cd "$(dirname "$0")/.."
what=${1:-all}
dir=build-asan
# Test executables whose cases are unit or in-process tests (no daemons, no
# network namespaces). When the ctest labels `unit` and `inproc` exist, the
# run selects by label instead.
# Default (CI): the tests and fuzzers that need no actor library, whose ASan
# build was measured; SANITIZE_FULL=1 adds the actor-level ones (test_model and
# test_bad_inputs run the binary, test_actors is CAF-heavy: a long build).
tests=(test_kernels test_journal_format test_topologies)
fuzzers=(fuzz_llama2c_loader fuzz_q8_reader fuzz_gguf fuzz_tokenizer fuzz_journal fuzz_faults
         fuzz_checkpoint_archive fuzz_cli_values)
build_targets=("${tests[@]}" "${fuzzers[@]}")
if [ "${SANITIZE_FULL:-0}" = 1 ]; then
  tests+=(test_model test_bad_inputs test_planner supervision_tests test_actors)
  build_targets=(cellshard fuzzers "${tests[@]}")
fi

if [ "$what" = build ] || [ "$what" = all ]; then
  launcher=()
  command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
  cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_COMPILER=clang++-14 \
    -DCELLSHARD_SANITIZE=ON -DCELLSHARD_FUZZ=ON "${launcher[@]}" >/dev/null
  cmake --build "$dir" -j"$(nproc)" --target "${build_targets[@]}"
fi

if [ "$what" = test ] || [ "$what" = all ]; then
  # detect_leaks=0: CAF's scheduler threads keep objects alive at exit by
  # design; leaks of our own code are covered by the fuzzers (which keep
  # LeakSanitizer on).
  export ASAN_OPTIONS=detect_leaks=0:abort_on_error=1:detect_stack_use_after_return=0
  export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
  export OPENBLAS_NUM_THREADS=1
  cd "$dir"
  if [ "${SANITIZE_FULL:-0}" = 1 ] && ctest -N -L '^(unit|inproc)$' 2>/dev/null | grep -q 'Total Tests: [1-9]'; then
    ctest --output-on-failure -L '^(unit|inproc)$' -LE slow
  else
    fail=0
    for t in "${tests[@]}"; do
      exe=$(find tests -type f -name "$t" -perm -u+x | head -1)
      [ -n "$exe" ] || { echo "sanitize: $t not built" >&2; fail=1; continue; }
      t0=$(date +%s)
      # Catch2 tags: leave out the cases tagged [slow] and the process tests.
      if ! "$exe" '~[slow]' '~[processes]' --order decl; then
        echo "sanitize: $t FAILED" >&2
        fail=1
      fi
      echo "sanitize: $t $(( $(date +%s) - t0 )) s"
    done
    exit $fail
  fi
fi
