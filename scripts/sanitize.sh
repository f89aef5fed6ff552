#!/usr/bin/env bash
# The sanitizer build and run (issue #21): one clang-14 build in build-asan/
# with AddressSanitizer + UndefinedBehaviorSanitizer (and libFuzzer coverage
# instrumentation, so the same objects serve the fuzzers of fuzz/), then the
# unit and in-process tests under it. A sanitizer report fails the run.
#
#   scripts/sanitize.sh [build|test|all]      (default: all)
#
# Only the targets this run needs are built: the test executables below and
# the fuzzers (scripts/fuzz.sh runs them); not the `cellshard` binary, whose
# [processes] cases the run leaves out (tests/actors/CMakeLists.txt).
# SANITIZE_JOBS sets the build's parallelism (default: every core).
set -euo pipefail
cd "$(dirname "$0")/.."
what=${1:-all}
dir=build-asan
# Every Catch2 executable with cases labelled `unit` or `inproc` (README
# "Tests"): kernels, model, GGUF, MoE, journal format, topologies, planner,
# base, supervision, the actor library's unit tests (test_actors_unit) and
# its in-process clusters, serve's unit tests, the public API, the kernel
# bench smoke test. The test phase checks this list against build/ (CI's gcc
# tree) when it exists, so a new executable cannot be left out silently.
tests=(test_kernels test_kernels_fixtures test_model test_journal_format test_gguf_model test_moe
       test_topologies test_planner test_planner_sim test_planner_calibrate test_base supervision_tests
       test_actors_unit test_serve_unit test_kernels_bench test_api test_actors_gguf test_actors
       test_resilience)
build_targets=(fuzzers "${tests[@]}")

if [ "$what" = build ] || [ "$what" = all ]; then
  launcher=()
  command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
  cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_COMPILER=clang++-14 \
    -DCELLSHARD_SANITIZE=ON -DCELLSHARD_FUZZ=ON "${launcher[@]}" >/dev/null
  cmake --build "$dir" -j"${SANITIZE_JOBS:-$(nproc)}" --target "${build_targets[@]}"
fi

if [ "$what" = test ] || [ "$what" = all ]; then
  # detect_leaks=0: CAF's scheduler threads keep objects alive at exit by
  # design; leaks of our own code are covered by the fuzzers (which keep
  # LeakSanitizer on).
  export ASAN_OPTIONS=detect_leaks=0:abort_on_error=1:detect_stack_use_after_return=0
  export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
  export OPENBLAS_NUM_THREADS=1
  fail=0
  if [ -f build/CTestTestfile.cmake ]; then
    # The executables of build/'s unit and inproc cases, each must be in the list above.
    for exe in $( (cd build && ctest -N -V -L '^(unit|inproc)$') |
                  sed -n 's|^[0-9]*: Test command: \([^ ]*\).*|\1|p' | sort -u); do
      case $exe in "$PWD"/build/tests/*) ;; *) continue ;; esac  # cmake -P, compiler checks
      name=$(basename "$exe")
      if [[ " ${tests[*]} " != *" $name "* ]]; then
        echo "sanitize: $name has unit/inproc cases in build/ but is not in scripts/sanitize.sh's list" >&2
        fail=1
      fi
    done
  fi
  cd "$dir"
  # run_one NAME: one executable, its cases tagged [slow] and the process tests left out.
  run_one() {
    local t=$1 exe t0 rc=0
    exe=$(find tests -type f -name "$t" -perm -u+x | head -1)
    [ -n "$exe" ] || { echo "sanitize: $t not built" >&2; return 1; }
    t0=$(date +%s)
    "$exe" '~[slow]' '~[processes]' --order decl || rc=1
    [ $rc -eq 0 ] || echo "sanitize: $t FAILED" >&2
    echo "sanitize: $t $(( $(date +%s) - t0 )) s"
    return $rc
  }
  lanes=${SANITIZE_LANES:-1}
  if [ "$lanes" -le 1 ]; then
    for t in "${tests[@]}"; do run_one "$t" || fail=1; done
    exit $fail
  fi
  # SANITIZE_LANES=N (scripts/ci.sh: 2): N executables at a time, each lane a
  # list of its own, longest first into the lane with the least so far. The
  # weights are wall seconds of each executable in a cold CI's sanitizer run
  # (docs/reliability.md "CI time"; unlisted ones count 4 s). The executables
  # share nothing but the CPU: each in-process cluster has its own actor
  # system, ports are not used. A lane's output is printed when it ends.
  declare -A weight=([test_actors]=154 [test_resilience]=62 [test_model]=57 [test_gguf_model]=37)
  declare -a lane_list lane_sum
  for ((l = 0; l < lanes; l++)); do lane_list[l]=""; lane_sum[l]=0; done
  for t in $(for t in "${tests[@]}"; do echo "${weight[$t]:-4} $t"; done | sort -k1,1nr -k2 | cut -d' ' -f2); do
    best=0
    for ((l = 1; l < lanes; l++)); do
      [ "${lane_sum[l]}" -lt "${lane_sum[best]}" ] && best=$l
    done
    lane_list[best]+=" $t"
    lane_sum[best]=$(( lane_sum[best] + ${weight[$t]:-4} ))
  done
  logs=$(mktemp -d)
  pids=()
  for ((l = 0; l < lanes; l++)); do
    echo "sanitize: lane $l:${lane_list[l]}"
    ( rc=0; for t in ${lane_list[l]}; do run_one "$t" || rc=1; done; exit $rc ) > "$logs/$l" 2>&1 &
    pids[l]=$!
  done
  for ((l = 0; l < lanes; l++)); do
    wait "${pids[l]}" || fail=1
    echo "== sanitize lane $l:"; cat "$logs/$l"
  done
  rm -rf "$logs"
  exit $fail
fi
