# cmake/toolchains/linux-cross.cmake: shared part of the big-endian cross
# toolchain files (s390x.cmake, ppc64.cmake); scripts/cross-build.sh uses them.
# Expects CELLSHARD_CROSS_TRIPLE (Debian's GNU triplet), CELLSHARD_CROSS_PROCESSOR
# and CELLSHARD_CROSS_QEMU (the qemu-user binary) set by the including file.
#
# CELLSHARD_SYSROOT (cache variable or environment variable): a folder made of
# Debian packages for the target unpacked with dpkg-deb -x (libraries under
# usr/lib/<triplet>, headers under usr/include). It is searched before the
# cross toolchain's own folder /usr/<triplet>; nothing of the host's /usr is.
# The compiler keeps its own libc and libstdc++ (from the cross toolchain).
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR ${CELLSHARD_CROSS_PROCESSOR})
set(CMAKE_C_COMPILER ${CELLSHARD_CROSS_TRIPLE}-gcc)
set(CMAKE_CXX_COMPILER ${CELLSHARD_CROSS_TRIPLE}-g++)

if(NOT CELLSHARD_SYSROOT AND DEFINED ENV{CELLSHARD_SYSROOT})
  set(CELLSHARD_SYSROOT "$ENV{CELLSHARD_SYSROOT}")
endif()
# try_compile projects re-read this file: hand them the sysroot too.
list(APPEND CMAKE_TRY_COMPILE_PLATFORM_VARIABLES CELLSHARD_SYSROOT)

set(CMAKE_FIND_ROOT_PATH ${CELLSHARD_SYSROOT} /usr/${CELLSHARD_CROSS_TRIPLE})
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)

if(CELLSHARD_SYSROOT)
  # pkg-config reads the target's .pc files only, with paths under the sysroot.
  set(ENV{PKG_CONFIG_DIR} "")
  set(ENV{PKG_CONFIG_LIBDIR}
    "${CELLSHARD_SYSROOT}/usr/lib/${CELLSHARD_CROSS_TRIPLE}/pkgconfig:${CELLSHARD_SYSROOT}/usr/share/pkgconfig")
  set(ENV{PKG_CONFIG_SYSROOT_DIR} "${CELLSHARD_SYSROOT}")
  # The linker follows DT_NEEDED of the sysroot's libraries (libcaf_openssl
  # needs libssl.so.3) into the sysroot.
  set(_rl "-Wl,-rpath-link,${CELLSHARD_SYSROOT}/usr/lib/${CELLSHARD_CROSS_TRIPLE}")
  string(APPEND _rl " -Wl,-rpath-link,${CELLSHARD_SYSROOT}/lib/${CELLSHARD_CROSS_TRIPLE}")
  set(CMAKE_EXE_LINKER_FLAGS_INIT "${_rl}")
  # Debian's multiarch headers (openssl/opensslconf.h) live in usr/include/<triplet>.
  set(CMAKE_C_FLAGS_INIT "-isystem ${CELLSHARD_SYSROOT}/usr/include/${CELLSHARD_CROSS_TRIPLE}")
  set(CMAKE_CXX_FLAGS_INIT "-isystem ${CELLSHARD_SYSROOT}/usr/include/${CELLSHARD_CROSS_TRIPLE}")
  set(CMAKE_SHARED_LINKER_FLAGS_INIT "${_rl}")
endif()

# Test discovery (catch_discover_tests) and ctest run target binaries under
# qemu-user; -L points it at the sysroot's dynamic loader and libraries.
find_program(CELLSHARD_QEMU ${CELLSHARD_CROSS_QEMU})
if(CELLSHARD_QEMU)
  if(CELLSHARD_SYSROOT AND EXISTS "${CELLSHARD_SYSROOT}/lib")
    set(CMAKE_CROSSCOMPILING_EMULATOR ${CELLSHARD_QEMU} -L ${CELLSHARD_SYSROOT})
  else()
    set(CMAKE_CROSSCOMPILING_EMULATOR ${CELLSHARD_QEMU} -L /usr/${CELLSHARD_CROSS_TRIPLE})
  endif()
endif()
