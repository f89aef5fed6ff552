# tests/test_registry.cmake (ctest `test_registry`): the suite's registry is
# whole and every entry runs something.
#  1. every registered test carries exactly one of the labels unit, inproc,
#     processes, slow (README "Tests");
#  2. every Catch2 case of every test executable (EXES lists them) is
#     registered with ctest;
#  3. each registered Catch2 test's argument selects exactly its own case: a
#     name that ctest split (a ';') or that Catch2 reads as a pattern would
#     otherwise pass with "No test cases matched".
# Inputs (-D): CTEST, BINARY_DIR, EXES.
cmake_minimum_required(VERSION 3.19)  # string(JSON), IN_LIST
execute_process(COMMAND ${CTEST} --show-only=json-v1 WORKING_DIRECTORY ${BINARY_DIR}
  OUTPUT_VARIABLE json RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "ctest --show-only failed (${rc})")
endif()
file(STRINGS ${EXES} exes)
set(failures 0)
macro(fail text)
  message(SEND_ERROR "${text}")
  math(EXPR failures "${failures} + 1")
endmacro()

string(JSON ntests LENGTH "${json}" tests)
math(EXPR last "${ntests} - 1")
set(registered "")   # "exe|name" pairs
foreach(i RANGE ${last})
  string(JSON name GET "${json}" tests ${i} name)
  # 1. labels
  set(labels "")
  string(JSON nprops ERROR_VARIABLE noprops LENGTH "${json}" tests ${i} properties)
  if(NOT noprops)
    math(EXPR plast "${nprops} - 1")
    foreach(p RANGE ${plast})
      string(JSON pname GET "${json}" tests ${i} properties ${p} name)
      if(pname STREQUAL "LABELS")
        string(JSON nl LENGTH "${json}" tests ${i} properties ${p} value)
        math(EXPR llast "${nl} - 1")
        foreach(l RANGE ${llast})
          string(JSON label GET "${json}" tests ${i} properties ${p} value ${l})
          list(APPEND labels ${label})
        endforeach()
      endif()
    endforeach()
  endif()
  set(kinds ${labels})
  list(FILTER kinds INCLUDE REGEX "^(unit|inproc|processes|slow)$")
  list(LENGTH kinds nkinds)
  if(NOT nkinds EQUAL 1)
    string(REPLACE ";" "," shown "${labels}")
    fail("test \"${name}\": labels [${shown}], expected exactly one of unit, inproc, processes, slow")
  endif()
  # 3. a Catch2 test selects exactly its own case
  string(JSON ncmd ERROR_VARIABLE nocmd LENGTH "${json}" tests ${i} command)
  if(nocmd OR ncmd LESS 2)
    continue()
  endif()
  string(JSON exe GET "${json}" tests ${i} command 0)
  if(NOT exe IN_LIST exes)
    continue()
  endif()
  string(JSON arg GET "${json}" tests ${i} command 1)
  execute_process(COMMAND ${exe} ${arg} --list-test-names-only OUTPUT_VARIABLE out)
  string(STRIP "${out}" out)
  if(NOT out STREQUAL name)
    fail("test \"${name}\" (${exe}): its argument \"${arg}\" selects [${out}], not exactly its own case")
  endif()
  list(APPEND registered "${exe}|${name}")
endforeach()

# 2. every case registered
foreach(exe IN LISTS exes)
  if(NOT EXISTS ${exe})
    fail("${exe} is not built")
    continue()
  endif()
  execute_process(COMMAND ${exe} --list-test-names-only OUTPUT_VARIABLE out)
  string(REPLACE ";" "\\;" out "${out}")
  string(REPLACE "\n" ";" cases "${out}")
  foreach(c IN LISTS cases)
    if(NOT c STREQUAL "" AND NOT "${exe}|${c}" IN_LIST registered)
      fail("${exe}: the case \"${c}\" is not registered with ctest (or selects more than itself)")
    endif()
  endforeach()
endforeach()
list(LENGTH registered nreg)
if(failures GREATER 0)
  message(FATAL_ERROR "${failures} problem(s) in the test registry")
endif()
message(STATUS "${ntests} tests, each with one label; ${nreg} Catch2 cases, each registered and selecting itself")
