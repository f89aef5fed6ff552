#!/usr/bin/env bash
# Installs every Debian package cellshard's build, tests and examples need.
# Idempotent, and quiet when everything is already present. Needs root (or sudo).
# --cross adds the big-endian cross toolchains and qemu-user (scripts/cross-build.sh,
# docs/cell.md); the target libraries are not installed into the host: cross-build.sh
# downloads and unpacks them into its own sysroot.
set -euo pipefail
cross=0
[ "${1:-}" = "--cross" ] && cross=1
pkgs=(
  build-essential cmake pkg-config git
  libcaf-dev libssl-dev          # CAF 0.17.6 (core, io, openssl)
  libopenblas-dev                # blas backend
  libcereal-dev libxxhash-dev    # checkpoints and digests
  catch2                         # tests (Catch2 v2)
  libcli11-dev nlohmann-json3-dev libspdlog-dev libfmt-dev
  libicu-dev                     # Unicode categories of the GGUF BPE pre-tokenizers
  libbenchmark-dev               # micro-benchmarks
  gnuplot-nox                    # plots
  iproute2 iperf3                # network-namespace lab (ip netns, tc) and its shaping check
  clang-14 libclang-rt-14-dev libfuzzer-14-dev  # the ASan+UBSan build and the fuzzers (scripts/sanitize.sh, fuzz.sh)
  python3                        # scripts/soak_summary.py, scripts/exactness.sh
  libcpp-httplib-dev             # cellshard serve's HTTP server (a compiled library, with OpenSSL 3)
  curl chromium                  # serve's tests: curl as a client, the page in headless Chromium
)
# The serve tests' Node.js clients (OpenAI SDK, playwright-core) need node and
# npm; Debian's packages only when no node is installed (a newer one may be).
command -v npm >/dev/null || pkgs+=(nodejs npm)
if [ $cross -eq 1 ]; then
  pkgs+=(
    g++-s390x-linux-gnu          # s390x: 64-bit big-endian, with Debian packages of CAF for it
    g++-powerpc64-linux-gnu      # ppc64: the PS3 PPE's instruction set, big-endian
    qemu-user-static             # runs both on this host
  )
fi
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
echo "installing: ${missing[*]}"
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
