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
# Test executables run under the sanitizers. Default (CI): every `unit` test
# that needs no actor library (kernels, model, GGUF, MoE, journal format,
# topologies, planner, base, supervision on CAF's test_coordinator).
# SANITIZE_FULL=1 adds the actor library's unit and in-process tests (a long
# clang build of the CAF-heavy actor code; docs/reliability.md has the times).
tests=(test_kernels test_kernels_fixtures test_model test_journal_format test_gguf_model test_moe
       test_topologies test_planner test_planner_sim test_planner_calibrate test_base supervision_tests)
fuzzers=(fuzz_llama2c_loader fuzz_q8_reader fuzz_gguf fuzz_tokenizer fuzz_journal fuzz_faults
         fuzz_checkpoint_archive fuzz_cli_values fuzz_blob fuzz_cluster_file)
build_targets=("${tests[@]}" "${fuzzers[@]}")
if [ "${SANITIZE_FULL:-0}" = 1 ]; then
  tests+=(test_actors_unit test_resilience test_actors_gguf test_actors)
  build_targets=(fuzzers "${tests[@]}")
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
