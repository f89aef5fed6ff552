# cmake/toolchains/s390x.cmake: IBM Z, 64-bit big-endian, an official Debian
# architecture (so CAF, OpenSSL, xxHash... exist as Debian packages for it).
# Use with -DCELLSHARD_SYSROOT=DIR (scripts/cross-build.sh s390x makes DIR).
set(CELLSHARD_CROSS_TRIPLE s390x-linux-gnu)
set(CELLSHARD_CROSS_PROCESSOR s390x)
set(CELLSHARD_CROSS_QEMU qemu-s390x-static)
include(${CMAKE_CURRENT_LIST_DIR}/linux-cross.cmake)
