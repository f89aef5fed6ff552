# kernels/spu/spu_toolchain.cmake: finds spu-gcc for CELLSHARD_SPU=ON and
# stops with a clear message when it is absent. Usable in script mode:
#   cmake -P kernels/spu/spu_toolchain.cmake
find_program(SPU_GCC NAMES spu-gcc spu-elf-gcc
  HINTS $ENV{CELL_TOP}/bin $ENV{PS3DEV}/spu/bin /opt/cell/toolchain/bin /usr/local/ps3dev/spu/bin)
if(NOT SPU_GCC)
  message(FATAL_ERROR
    "CELLSHARD_SPU=ON needs spu-gcc, the Cell SPU cross compiler, and none was found "
    "(searched PATH, $CELL_TOP/bin, $PS3DEV/spu/bin, /opt/cell/toolchain/bin). "
    "GCC dropped the SPU port in GCC 10, so no current distribution ships it. "
    "Get it from the IBM Cell SDK 3.1 (spu-gcc 4.x, /opt/cell/toolchain) or build it with "
    "ps3toolchain (https://github.com/ps3dev/ps3toolchain, gives $PS3DEV/spu/bin/spu-gcc), "
    "then pass -DSPU_GCC=/path/to/spu-gcc or put it on PATH. "
    "Without it, configure with -DCELLSHARD_SPU=OFF: the same SPU source is still compiled "
    "and tested on this host through kernels/spu/host/.")
endif()
