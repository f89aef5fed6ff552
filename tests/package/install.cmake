# Installs the build tree into PREFIX (fresh), then checks what was installed
# under include/: the public headers include/cellshard/*.hpp and nothing else.
file(REMOVE_RECURSE ${PREFIX})
execute_process(COMMAND ${CMAKE_COMMAND} --install ${BINARY_DIR} --prefix ${PREFIX}
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "install failed (${rc}):\n${out}\n${err}")
endif()
file(GLOB_RECURSE installed RELATIVE ${PREFIX}/include ${PREFIX}/include/*)
if(NOT installed)
  message(FATAL_ERROR "nothing installed under ${PREFIX}/include")
endif()
foreach(f IN LISTS installed)
  if(NOT f MATCHES "^cellshard/[a-z_]+\\.hpp$")
    message(SEND_ERROR "installed ${f}: only include/cellshard/*.hpp (the public API) is installed")
  endif()
endforeach()
message(STATUS "installed headers: ${installed}")
