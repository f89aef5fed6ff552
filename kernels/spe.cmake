# kernels/spe.cmake (included by kernels/CMakeLists.txt): the spe and
# spu-host backends, the MFC model, and the host builds of the SPU program.
list(APPEND KERNEL_SOURCES
  dma.cpp
  spe.cpp
  spe_program.cpp
  spu/host/spu_host.cpp
  spu/host/spu_program.cpp)
list(APPEND KERNEL_HEADERS dma.hpp spe.hpp)

# The SPU source includes <spu_mfcio.h> / <spu_intrinsics.h>; on a host these
# resolve to the emulation in spu/host/ for the two files that compile it.
set_source_files_properties(spe_program.cpp spu/host/spu_program.cpp spu/host/spu_host.cpp
  PROPERTIES INCLUDE_DIRECTORIES ${CMAKE_CURRENT_SOURCE_DIR}/spu/host)

add_subdirectory(spu)
