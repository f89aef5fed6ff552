#!/usr/bin/env bash
# Cross builds for big-endian CPUs, run under qemu-user (docs/cell.md).
#
#   scripts/cross-build.sh s390x OUTDIR [--test|--test-all]
#     The `cellshard` binary with `run` and `node` (CELLSHARD_DAEMON_ONLY) for s390x, 64-bit
#     big-endian, with the reference and spe backends (no OpenBLAS). Makes
#     OUTDIR/sysroot from Debian's s390x packages (CAF, OpenSSL, xxHash, cereal,
#     CLI11, nlohmann-json, ICU, cpp-httplib, libc, libstdc++) with apt-get
#     download + dpkg-deb -x:
#     nothing is installed into the host but the s390x package lists
#     (dpkg --add-architecture s390x). Binary: OUTDIR/build/tools/cellshard.
#     Run it:  qemu-s390x-static -L OUTDIR/sysroot OUTDIR/build/tools/cellshard ...
#     Also builds supervision_checkpoint_tests (supervision_tests' checkpoint
#     archive cases alone: tests/supervision/checkpoint_test.cpp).
#     --test (or --test-all): the [checkpoint] cases under QEMU, then three
#     generations from stories260K (one node, in-process pipeline of 3, tensor
#     group of 3) against the llama2.c fixture's ids. The mixed x86/s390x
#     cluster is tests/net/test_cross.cpp (ctest -L cross, docs/cell.md).
#
#   scripts/cross-build.sh ppc64 OUTDIR [--test|--test-all]
#     kernels/, model/, topologies/ and their test binaries for powerpc64
#     (big-endian, the PS3 PPE's instruction set) with the cross toolchain's
#     libstdc++ only (OUTDIR/sysroot holds Debian's architecture-independent
#     headers: xxhash.h, Catch2, nlohmann-json). --test runs a kernels/model/
#     topologies subset under qemu-ppc64-static (stories260K only; what CI
#     runs); --test-all runs every case that needs neither CAF nor ICU
#     (many minutes under QEMU).
#
# Needs the cross compilers and qemu-user-static: `scripts/install-deps.sh --cross`
# (run here when they are missing). Idempotent: a second run reuses the sysroot and
# the build folder. Prints the time of each step.
set -euo pipefail
src="$(cd "$(dirname "$0")/.." && pwd)"
usage() { echo "usage: $0 s390x|ppc64 OUTDIR [--test|--test-all]" >&2; exit 2; }
[ $# -ge 2 ] || usage
arch=$1
out=$2
run_tests=0
case "${3:-}" in
  "") ;;
  --test) run_tests=1 ;;
  --test-all) run_tests=all ;;
  *) usage ;;
esac
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
  libicu-dev:s390x libicu72:s390x
  libcpp-httplib-dev:s390x libcpp-httplib0.11:s390x libbrotli-dev:s390x libbrotli1:s390x
  zlib1g-dev:s390x zlib1g:s390x
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
  # Catch2 v2 (the checkpoint-format tests run under QEMU): the host's
  # header-only package, compiled for the target with its single header.
  cp -a /usr/include/catch2 "$sysroot/usr/include/"
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
    # Only `run` and `node` in the executable: what the tests run on it.
    opts+=(-DCELLSHARD_SHARED_DIR="$shared" -DCELLSHARD_DAEMON_ONLY=ON)
  else
    opts+=(-DCELLSHARD_CAF=OFF -DCELLSHARD_ICU=OFF -DCELLSHARD_SHARED_DIR="$shared")
  fi
  # -O2 without debug info: a third less compile and link time than
  # RelWithDebInfo on this 2-core host, and the same code.
  cmake -S "$src" -B "$build" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_FLAGS_RELEASE="-O2 -DNDEBUG" \
    -DCMAKE_TOOLCHAIN_FILE="$src/cmake/toolchains/$arch.cmake" -DCELLSHARD_SYSROOT="$sysroot" \
    "${opts[@]}" "${launcher[@]}" >/dev/null
}

ppc64_tests=(test_kernels test_topologies test_journal_format test_model test_gguf_model)

compile() {
  if [ "$arch" = s390x ]; then
    cmake --build "$build" --target cellshard supervision_checkpoint_tests -j"${CELLSHARD_JOBS:-$(nproc)}"
    echo "binary: $build/tools/cellshard"
  else
    local targets=("${ppc64_tests[@]}")
    [ "$run_tests" = all ] && targets+=(test_kernels_fixtures)
    cmake --build "$build" --target "${targets[@]}" -j"${CELLSHARD_JOBS:-$(nproc)}"
  fi
}

# Runs a command under QEMU from the build folder (the tests find ../shared).
emu() { "$qemu" -L "$1" "${@:2}"; }

test_s390x() {
  local fx="$shared/fixtures" bin="$build/tools/cellshard" rc=0
  if [ ! -d "$fx" ]; then
    echo "SKIP: $fx is missing"
    [ -n "${CI:-}" ] && exit 1
    return
  fi
  # The checkpoint archive format (supervision/checkpoint.hpp) on the
  # big-endian CPU: the same fixed little-endian bytes as on x86, its XXH64
  # trailer, deltas and the file-backed store.
  (cd "$build" && emu "$sysroot" "$build/tests/supervision/supervision_checkpoint_tests" '[checkpoint]') || rc=1
  # Whole generations on the big-endian CPU: one process, then a pipeline of
  # 3 and a tensor group of 3 in-process nodes (CAF actors, blobs and KV
  # checkpoints), each against the llama2.c fixture's ids.
  local case name=topp_t1.0_p0.9_s133742_n256 t0
  for case in "--kernels reference" "--nodes 3 --topology pipeline --kernels spe" \
              "--nodes 3 --topology tensor"; do
    read -ra extra <<< "$case"
    t0=$(date +%s%N)
    if emu "$sysroot" "$bin" run -m "$src/models/stories260K.bin" -z "$src/models/tok512.bin" \
         -t 1.0 -p 0.9 -s 133742 -n 256 "${extra[@]}" -q --expect-ids "$fx/$name.ids" >/dev/null; then
      echo "s390x: run $case = llama2.c fixture $name: PASS ($(( ($(date +%s%N) - t0) / 1000000 )) ms)"
    else
      echo "s390x: run $case: ids differ from the llama2.c fixture $name: FAIL" >&2
      rc=1
    fi
  done
  return $rc
}

# The CI subset (--test; 1-2 minutes of QEMU on this 2-core host): every
# kernel test, topologies, the journal format, the loaders (llama2.c, CSQ8,
# GGUF metadata and tensors: their byte-swap paths run for real here), the
# tokenizer and sampler, and one llama2.c fixture through the engine from the
# .bin and from stories260K.gguf. Left out: [cli] cases (they run the
# cellshard binary, which needs CAF: not built for ppc64), the BPE tokenizer
# cases (ICU: not built for ppc64), and the long cases that --test-all runs
# (every fixture with every backend, test_kernels_fixtures, q8_0 over a whole
# fixture, the rest of test_gguf_model, chunked prefill against one position
# at a time on every backend and format: byte-order free arithmetic, and most
# of this subset's QEMU time: test_model's part took 151 s with it in session
# 9's CI, 59 s without it at ~3x that run's load).
# (Catch2 ANDs its arguments; within one argument a name pattern runs to its end.)
no_icu=('~Llama 3 BPE GGUF vocabulary passes*' '~GGUF Llama 3 BPE*' '~GGUF tokenizer bad inputs*'
        '~a small byte-level BPE*' '~qwen2 and gpt-2 pre-tokenizers*')
test_ppc64() {
  local rc=0 t0
  run_ppc64() {
    t0=$(date +%s)
    (cd "$build" && emu /usr/$triple "$build/tests/$(test_dir "$1")/$1" "${@:2}") || rc=1
    echo "ppc64: $1 ${2:-}: $(( $(date +%s) - t0 )) s"
  }
  if [ "$run_tests" = all ]; then
    for t in "${ppc64_tests[@]}" test_kernels_fixtures; do
      case "$t" in
        test_model) run_ppc64 "$t" '~[cli]' "${no_icu[@]}" ;;
        *) run_ppc64 "$t" ;;
      esac
    done
    return $rc
  fi
  run_ppc64 test_kernels
  # Left out here (--test-all runs them): the two cases that quantize
  # llama2-small to q4_K and q6_K and place it (105 s of QEMU in a cold CI,
  # against 0.3 s for the other 41 cases of test_topologies).
  run_ppc64 test_topologies '~tensor:2 on a q4_K GGUF*' '~tensor:3 on a q6_K GGUF*'
  run_ppc64 test_journal_format
  # [manifest] and [slice_cache] (issue #17) run here: slices of a file the
  # big-endian CPU converts, manifests of the file's own bytes.
  run_ppc64 test_model '~[cli]~[fixtures]~[prefill]' "${no_icu[@]}" \
    '~q8_0 teacher-forced on a fixture*' \
    '~big-endian files load through the byte-swap path'  # a 200-token run; the gguf one below is short
  run_ppc64 test_model 'engine reproduces every llama2.c fixture with each backend' \
    -c 'reference greedy_prompt_lily_tom_n100'
  run_ppc64 test_gguf_model 'gguf model: every llama2.c fixture from stories260K.gguf with --ctx 512' \
    -c 'reference greedy_prompt_lily_tom_n100'
  # (A ',' in a Catch2 argument separates patterns: the name's start and a '*'.)
  run_ppc64 test_gguf_model 'gguf model: stories260K.gguf config*'
  run_ppc64 test_gguf_model 'gguf model: a byte-swapped file loads (big-endian host path)'
  # GGUF tensors converted in place on the big-endian CPU, digest of the file's bytes.
  run_ppc64 test_gguf_model 'gguf model: a file of the other byte order is converted in place*'
  return $rc
}
test_dir() {
  case "$1" in
    test_kernels*) echo kernels ;;
    test_model*|test_journal*|test_gguf*) echo model ;;
    test_topologies*) echo topologies ;;
  esac
}

step tools tools
step sysroot "sysroot_$arch"
step configure configure_build
step build compile
if [ "$run_tests" != 0 ]; then
  step test "test_$arch"
fi
