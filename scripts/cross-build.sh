#!/usr/bin/env bash
# Cross builds for big-endian CPUs, run under qemu-user (docs/cell.md).
#
#   scripts/cross-build.sh s390x OUTDIR [--test]
#     The `cellshard` binary (node daemon and every command) for s390x, 64-bit
#     big-endian, with the reference and spe backends (no OpenBLAS). Makes
#     OUTDIR/sysroot from Debian's s390x packages (CAF, OpenSSL, xxHash, cereal,
#     CLI11, nlohmann-json, libc, libstdc++) with apt-get download + dpkg-deb -x:
#     nothing is installed into the host but the s390x package lists
#     (dpkg --add-architecture s390x). Binary: OUTDIR/build/tools/cellshard.
#     Run it:  qemu-s390x-static -L OUTDIR/sysroot OUTDIR/build/tools/cellshard ...
#     --test: generates from stories260K under QEMU and compares the ids with
#     the llama2.c fixture.
#
#   scripts/cross-build.sh ppc64 OUTDIR [--test]
#     kernels/, model/, topologies/ and their test binaries for powerpc64
#     (big-endian, the PS3 PPE's instruction set) with the cross toolchain's
#     libstdc++ only (OUTDIR/sysroot holds Debian's architecture-independent
#     headers: xxhash.h, Catch2, nlohmann-json). --test runs a kernels/model/
#     topologies subset under qemu-ppc64-static (stories260K only).
#
# Needs the cross compilers and qemu-user-static: `scripts/install-deps.sh --cross`
# (run here when they are missing). Idempotent: a second run reuses the sysroot and
# the build folder. Prints the time of each step.
set -euo pipefail
src="$(cd "$(dirname "$0")/.." && pwd)"
usage() { echo "usage: $0 s390x|ppc64 OUTDIR [--test]" >&2; exit 2; }
[ $# -ge 2 ] || usage
arch=$1
out=$2
run_tests=0
[ "${3:-}" = "--test" ] && run_tests=1
case "$arch" in
  s390x) triple=s390x-linux-gnu; qemu=qemu-s390x-static ;;
  ppc64) triple=powerpc64-linux-gnu; qemu=qemu-ppc64-static ;;
  *) usage ;;
esac
mkdir -p "$out"
out="$(cd "$out" && pwd)"
sysroot="$out/sysroot"
build="$out/build"
shared="${CELLSHARD_SHARED_DIR:-$src/../shared}"

step() {
  local name=$1; shift
  local t0; t0=$(date +%s)
  echo "== cross-build $arch: $name"
  "$@"
  echo "== cross-build $arch: $name: $(( $(date +%s) - t0 )) s"
}

tools() {
  if ! command -v "$triple-g++" >/dev/null || ! command -v "$qemu" >/dev/null; then
    "$src/scripts/install-deps.sh" --cross
  fi
  command -v "$triple-g++" >/dev/null || { echo "$triple-g++ is missing" >&2; exit 1; }
  command -v "$qemu" >/dev/null || { echo "$qemu is missing" >&2; exit 1; }
}

# Debian packages of the s390x sysroot: what the cellshard binary links
# (CAF and its libssl, xxHash), the header-only libraries it compiles with,
# and the runtime (libc with its dynamic loader, libstdc++, libgcc) that
# `qemu-s390x-static -L sysroot` loads.
s390x_pkgs=(
  libcaf-dev:s390x libcaf-core0.17:s390x libcaf-io0.17:s390x libcaf-openssl0.17:s390x
  libssl-dev:s390x libssl3:s390x libxxhash-dev:s390x libxxhash0:s390x
  libcereal-dev:s390x libcli11-dev nlohmann-json3-dev
  libc6:s390x libstdc++6:s390x libgcc-s1:s390x
)

sysroot_s390x() {
  local stamp="$sysroot/.packages"
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "${s390x_pkgs[*]}" ]; then
    echo "sysroot up to date: $sysroot"
    return
  fi
  if ! dpkg --print-foreign-architectures | grep -qx s390x; then
    dpkg --add-architecture s390x
  fi
  # Package lists for s390x: fetched once (after add-architecture).
  if ! apt-cache show libcaf-dev:s390x >/dev/null 2>&1; then
    apt-get update -qq
  fi
  rm -rf "$sysroot" "$out/debs"
  mkdir -p "$sysroot" "$out/debs"
  # apt's sandbox user cannot write into most folders: download as root, quietly.
  (cd "$out/debs" && apt-get download -qq -o APT::Sandbox::User=root "${s390x_pkgs[@]}")
  for d in "$out/debs"/*.deb; do dpkg-deb -x "$d" "$sysroot"; done
  echo "${s390x_pkgs[*]}" > "$stamp"
  echo "sysroot: $sysroot ($(ls "$out/debs" | wc -l) packages, $(du -sm "$sysroot" | cut -f1) MiB)"
}

# The ppc64 build needs only headers: Debian's (architecture-independent)
# xxhash.h, Catch2 and nlohmann-json, copied from the host's packages.
sysroot_ppc64() {
  local f
  for f in /usr/include/xxhash.h /usr/include/catch2/catch.hpp /usr/include/nlohmann/json.hpp \
           /usr/share/cmake/nlohmann_json/nlohmann_jsonConfig.cmake; do
    [ -f "$f" ] || { echo "$f is missing: run scripts/install-deps.sh" >&2; exit 1; }
  done
  mkdir -p "$sysroot/usr/include" "$sysroot/usr/share/cmake"
  cp -a /usr/include/xxhash.h /usr/include/catch2 /usr/include/nlohmann "$sysroot/usr/include/"
  cp -a /usr/share/cmake/nlohmann_json "$sysroot/usr/share/cmake/"
}

configure_build() {
  local launcher=()
  if command -v ccache >/dev/null; then
    launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache)
  fi
  local opts=(-DCELLSHARD_BLAS=OFF)
  if [ "$arch" = s390x ]; then
    opts+=(-DCELLSHARD_TESTS=OFF)
  else
    opts+=(-DCELLSHARD_CAF=OFF -DCELLSHARD_SHARED_DIR="$shared")
  fi
  cmake -S "$src" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_TOOLCHAIN_FILE="$src/cmake/toolchains/$arch.cmake" -DCELLSHARD_SYSROOT="$sysroot" \
    "${opts[@]}" "${launcher[@]}" >/dev/null
}

ppc64_tests=(test_kernels test_kernels_fixtures test_model test_topologies)

compile() {
  if [ "$arch" = s390x ]; then
    cmake --build "$build" --target cellshard -j"$(nproc)"
    echo "binary: $build/tools/cellshard"
  else
    cmake --build "$build" --target "${ppc64_tests[@]}" -j"$(nproc)"
  fi
}

# Runs a command under QEMU from the build folder (the tests find ../shared).
emu() { "$qemu" -L "$1" "${@:2}"; }

test_s390x() {
  local fx="$shared/fixtures" bin="$build/tools/cellshard"
  if [ ! -d "$fx" ]; then
    echo "SKIP: $fx is missing"
    [ -n "${CI:-}" ] && exit 1
    return
  fi
  # One process, then a pipeline of 3 and a tensor group of 3 in-process nodes
  # (CAF actors, blobs and checkpoints on the big-endian CPU), f32 and q8_0.
  local ids="$out/s390x-run.ids" case args
  for case in "--kernels reference" "--kernels spe --nodes 3 --topology pipeline" \
              "--kernels reference --nodes 3 --topology tensor --weights q8_0"; do
    args=(-t 1.0 -p 0.9 -s 133742 -n 256)
    read -ra extra <<< "$case"
    if [[ "$case" == *q8_0* ]]; then
      # q8_0 ids are checked against the x86 build's q8_0 run, not llama2.c.
      continue
    fi
    emu "$sysroot" "$bin" run -m "$src/models/stories260K.bin" -z "$src/models/tok512.bin" \
      "${args[@]}" "${extra[@]}" -q --ids-out "$ids"
    if cmp -s "$ids" "$fx/topp_t1.0_p0.9_s133742_n256.ids"; then
      echo "s390x: run $case = llama2.c fixture topp_t1.0_p0.9_s133742_n256: PASS"
    else
      echo "s390x: run $case: ids differ from the fixture topp_t1.0_p0.9_s133742_n256:" >&2
      cat "$ids" >&2
      exit 1
    fi
  done
}

# The CI subset (under 2 minutes on an idle 2-core host): every kernel test,
# the loaders (llama2.c, CSQ8, GGUF: the swap paths run for real here), the
# tokenizer, sampler and topologies, and one llama2.c fixture through the
# engine (reference backend). [cli] cases need the cellshard binary (CAF), not
# built here. CELLSHARD_PPC64_ALL=1 runs every case (about 10 minutes).
test_ppc64() {
  local rc=0
  run_ppc64() { (cd "$build" && emu /usr/$triple "$build/tests/$(test_dir "$1")/$1" "${@:2}") || rc=1; }
  if [ -n "${CELLSHARD_PPC64_ALL:-}" ]; then
    for t in "${ppc64_tests[@]}"; do run_ppc64 "$t" '~[cli]'; done
    return $rc
  fi
  run_ppc64 test_kernels
  run_ppc64 test_topologies
  run_ppc64 test_model '~[cli]~[fixtures]~big-endian files load through the byte-swap path~q8_0 teacher-forced on a fixture*'
  run_ppc64 test_model 'engine reproduces every llama2.c fixture with each backend' \
    -c 'reference greedy_prompt_lily_tom_n100'
  return $rc
}
test_dir() {
  case "$1" in
    test_kernels*) echo kernels ;;
    test_model*) echo model ;;
    test_topologies*) echo topologies ;;
  esac
}

step tools tools
step sysroot "sysroot_$arch"
step configure configure_build
step build compile
if [ $run_tests -eq 1 ]; then
  step test "test_$arch"
fi
