# cmake/CellshardDiscoverTests.cmake: registers every Catch2 test case of one
# test executable with ctest, with its label (script mode, run after the
# executable is built; Catch2's own catch_discover_tests cannot give one
# executable's cases different labels).
#
# Labels partition the suite (README "Tests"): `unit` (no process started, no
# wall clock), `inproc` (actors on the real scheduler, real time), `processes`
# (starts processes: the cellshard binary, daemons), `slow` (over about a
# minute; CI leaves them out). A case takes the executable's label unless it
# carries the tag [inproc], [processes] or [slow] (slow wins, then processes).
#
# Every test fails when its output says "No test cases matched" (a name that
# does not select its own case), and a name holding ';' stops the build: ctest
# would split it into two tests that each match nothing.
#
# Inputs (-D): EXE, LABEL, WORKING_DIR, CTEST_FILE, ENV (one VAR=VALUE), TIMEOUT,
# SLOW_TIMEOUT (of the cases labelled slow), EXTRA_LABELS (more labels for every
# case, e.g. `cross`; may be empty).
set(groups
  "~[inproc]~[processes]~[slow]|${LABEL}"
  "[inproc]~[processes]~[slow]|inproc"
  "[processes]~[slow]|processes"
  "[slow]|slow")
set(script "")
set(all "")
foreach(group IN LISTS groups)
  string(REPLACE "|" ";" parts "${group}")
  list(GET parts 0 spec)
  list(GET parts 1 label)
  set(timeout ${TIMEOUT})
  set(labels ${label} ${EXTRA_LABELS})
  if(label STREQUAL "slow")
    set(timeout ${SLOW_TIMEOUT})
  endif()
  execute_process(COMMAND "${EXE}" "${spec}" --list-test-names-only
    OUTPUT_VARIABLE out RESULT_VARIABLE rc WORKING_DIRECTORY "${WORKING_DIR}")
  if(rc LESS 0 OR NOT rc MATCHES "^[0-9]+$")
    message(FATAL_ERROR "${EXE} --list-test-names-only failed: ${rc}\n${out}")
  endif()
  string(REPLACE ";" "<semicolon>" out "${out}")
  string(REPLACE "\n" ";" lines "${out}")
  foreach(name IN LISTS lines)
    if(name STREQUAL "")
      continue()
    endif()
    if(name MATCHES "<semicolon>")
      string(REPLACE "<semicolon>" ";" name "${name}")
      message(FATAL_ERROR "${EXE}: the test case \"${name}\" has a ';' in its name: "
        "ctest would split it into two tests that run nothing. Rename it.")
    endif()
    # Catch2 reads ',' '[' ']' '\' in a test spec; escape them so the name
    # selects exactly its own case.
    string(REPLACE "\\" "\\\\" spec_name "${name}")
    foreach(c , [ ])
      string(REPLACE "${c}" "\\${c}" spec_name "${spec_name}")
    endforeach()
    string(APPEND script
      "add_test([==[${name}]==] [==[${EXE}]==] [==[${spec_name}]==])\n"
      "set_tests_properties([==[${name}]==] PROPERTIES WORKING_DIRECTORY [==[${WORKING_DIR}]==]"
      " LABELS \"${labels}\" ENVIRONMENT [==[${ENV}]==] TIMEOUT ${timeout}"
      " FAIL_REGULAR_EXPRESSION \"No test cases matched\")\n")
  endforeach()
endforeach()
file(WRITE "${CTEST_FILE}" "${script}")
