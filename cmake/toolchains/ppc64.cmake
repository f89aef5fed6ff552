# cmake/toolchains/ppc64.cmake: 64-bit big-endian PowerPC, the instruction set
# of the PS3's PPE (Debian's powerpc64-linux-gnu cross compiler; ppc64 is not
# an official Debian architecture, so only the CAF-free layers build for it:
# -DCELLSHARD_CAF=OFF -DCELLSHARD_BLAS=OFF). CELLSHARD_SYSROOT holds only
# architecture-independent headers (xxhash.h, Catch2, nlohmann-json).
set(CELLSHARD_CROSS_TRIPLE powerpc64-linux-gnu)
set(CELLSHARD_CROSS_PROCESSOR ppc64)
set(CELLSHARD_CROSS_QEMU qemu-ppc64-static)
include(${CMAKE_CURRENT_LIST_DIR}/linux-cross.cmake)
