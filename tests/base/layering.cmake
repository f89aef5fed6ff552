# tests/base/layering.cmake: the layers include only what is below them
# (DESIGN.md): kernels/ and model/ know nothing of CAF; supervision/ knows
# nothing of models (no model/, topologies/ or actors/ header).
function(check_folder folder pattern why)
  file(GLOB_RECURSE files ${SOURCE_DIR}/${folder}/*.hpp ${SOURCE_DIR}/${folder}/*.cpp)
  foreach(f IN LISTS files)
    file(STRINGS ${f} hits REGEX "^[ \t]*#[ \t]*include[ \t]*[<\"](${pattern})")
    if(hits)
      message(SEND_ERROR "${f}: ${why}: ${hits}")
    endif()
  endforeach()
endfunction()
check_folder(base "caf/|model/|kernels/|topologies/|supervision/|actors/" "base/ depends on nothing")
check_folder(kernels "caf/|model/|topologies/|supervision/|actors/" "kernels/ is the bottom layer")
check_folder(model "caf/|topologies/|supervision/|actors/" "model/ knows nothing of CAF or topologies")
check_folder(supervision "model/|topologies/|actors/|kernels/" "supervision/ knows nothing of models")

# One launcher: every child process is started by base/spawn.hpp's
# spawn_child (parent-death kill, descriptors closed); no other fork/exec.
file(GLOB_RECURSE sources ${SOURCE_DIR}/*.cpp ${SOURCE_DIR}/*.hpp)
foreach(f IN LISTS sources)
  if(f MATCHES "/build[^/]*/|/base/spawn.hpp$|/fuzz/")
    continue()
  endif()
  file(STRINGS ${f} hits REGEX "(^|[^a-z_])(fork|vfork|execv|execvp|execve|posix_spawn)[ \t]*\\(")
  foreach(line IN LISTS hits)
    if(NOT line MATCHES "^[ \t]*//")  # a comment may name them
      message(SEND_ERROR "${f}: starts a process itself; use spawn_child (base/spawn.hpp): ${line}")
    endif()
  endforeach()
endforeach()

# One integer parser: integers in flags, specs, file fields, daemon lines and
# ids files go through base/parse.hpp (whole string, fits the type, no sign
# surprises), not the stoi/atoi/strtol family, which skip spaces, take signs
# and suffixes, or throw. examples/ is exempt: it builds against the installed
# package, which does not install base/parse.hpp.
foreach(f IN LISTS sources)
  if(f MATCHES "/build[^/]*/|/fuzz/|/examples/")
    continue()
  endif()
  file(STRINGS ${f} hits REGEX "(^|[^a-z_])(stoi|stol|stoll|stoul|stoull|atoi|atol|atoll|strtol|strtoul|strtoll|strtoull)[ \t]*\\(")
  foreach(line IN LISTS hits)
    if(NOT line MATCHES "^[ \t]*//")
      message(SEND_ERROR "${f}: parses an integer itself; use parse_uint (base/parse.hpp): ${line}")
    endif()
  endforeach()
endforeach()
