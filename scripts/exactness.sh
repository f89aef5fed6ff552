#!/usr/bin/env bash
# The exactness contract, measured (issue #21; docs/reliability.md): on a
# stories15m-shaped synthetic model (synth --config stories15m --seq-len 512,
# the 32000-token tokenizer.bin), sampled with -t 0.8 -p 0.9 -n 150 for seeds
# 1..5, which paths print exactly what llama2.c's run.c prints (built here from
# ../shared/peers/llama2.c with `gcc -O3 run.c -lm`, in a temporary folder),
# and for the others, the first position where their ids leave the reference
# backend's (which matches run.c).
#
#   scripts/exactness.sh [OUTDIR]     (default build/exactness; prints a markdown table)
#
# Extra paths: EXACT_PATHS="name|flags;name|flags". Seeds: EXACT_SEEDS="1 2 3 4 5".
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-build/exactness}
bin=${CELLSHARD_BIN:-build/tools/cellshard}
shared=${CELLSHARD_SHARED:-../shared}
seeds=${EXACT_SEEDS:-1 2 3 4 5}
steps=${EXACT_STEPS:-150}
mkdir -p "$out"
tok="$shared/models/tokenizer.bin"
[ -f "$tok" ] || { echo "exactness: $tok missing" >&2; exit 1; }
[ -f "$shared/peers/llama2.c/run.c" ] || { echo "exactness: $shared/peers/llama2.c/run.c missing" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
gcc -O3 "$shared/peers/llama2.c/run.c" -lm -o "$tmp/runc"
model="$out/stories15m-512.bin"
[ -f "$model" ] || "$bin" synth --config stories15m --seq-len 512 -s 15 -o "$model" 2>/dev/null

default_paths="reference|--kernels reference;blas|--kernels blas;spe|--kernels spe"
default_paths+=";pipeline:3 reference|--kernels reference --nodes 3"
default_paths+=";pipeline:3 blas|--kernels blas --nodes 3"
default_paths+=";tensor:3 reference|--kernels reference --nodes 3 --topology tensor"
default_paths+=";tensor:3 blas|--kernels blas --nodes 3 --topology tensor"
default_paths+=";hybrid:3x2 reference|--kernels reference --nodes 6 --topology hybrid:3x2"
IFS=';' read -r -a paths <<< "${EXACT_PATHS:-$default_paths}"

for s in $seeds; do
  "$tmp/runc" "$model" -z "$tok" -t 0.8 -p 0.9 -n "$steps" -s "$s" > "$out/runc-$s.txt" 2>/dev/null
done

echo "| path | identical to run.c (seeds $seeds) | first differing position per seed (vs the reference backend) |"
echo "|---|---:|---|"
for entry in "${paths[@]}"; do
  name=${entry%%|*}
  flags=${entry#*|}
  tag=$(echo "$name" | tr ' :' '__')
  same=0; n=0; firsts=""
  for s in $seeds; do
    # shellcheck disable=SC2086
    "$bin" run -m "$model" -z "$tok" -t 0.8 -p 0.9 -n "$steps" -s "$s" $flags \
      --ids-out "$out/$tag-$s.ids" > "$out/$tag-$s.txt" 2>"$out/$tag-$s.err"
    n=$((n + 1))
    if cmp -s "$out/$tag-$s.txt" "$out/runc-$s.txt"; then same=$((same + 1)); fi
    if [ -f "$out/reference-$s.ids" ]; then
      first=$(python3 -c '
import sys
a = open(sys.argv[1]).read().strip().split(","); b = open(sys.argv[2]).read().strip().split(",")
i = 0
while i < len(a) and i < len(b) and a[i] == b[i]: i += 1
print("-" if a == b else i)' "$out/$tag-$s.ids" "$out/reference-$s.ids")
      firsts+="${firsts:+, }$first"
    fi
  done
  echo "| $name | $same/$n | $firsts |"
done
