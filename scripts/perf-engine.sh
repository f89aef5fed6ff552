#!/usr/bin/env bash
# Single-thread decode speed of `cellshard run` on a synthetic stories110m
# model for each kernel backend, with weight bytes read per token and the
# effective GB/s. Usage: scripts/perf-engine.sh [BUILD_DIR] [STEPS]
set -euo pipefail
build=${1:-build}
steps=${2:-64}
bin=$build/tools/cellshard
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$bin" synth --config stories110m -s 1 -o "$work/s110m.bin" 2>/dev/null
# A 32000-entry tokenizer is needed to run it: the byte-level one is built in
# for the synthetic default only, so reuse llama2.c's when present.
tok=${CELLSHARD_MODELS:-../shared/models}/tokenizer.bin
[ -f "$tok" ] || { echo "need tokenizer.bin (32000 tokens) at $tok" >&2; exit 1; }
# Weights read per token: every layer matrix + norms + the classifier (the
# shared embedding table), 4 bytes each; the embedding row lookup is negligible.
bytes=$(( (12*(768+2*768*768+2*768*768+768+3*768*2048) + 32000*768 + 768) * 4 ))
printf "%-10s %10s %14s %10s\n" backend tok/s bytes/token GB/s
for k in reference blas ${EXTRA_BACKENDS:-}; do
  tps=$(OPENBLAS_NUM_THREADS=1 "$bin" run -m "$work/s110m.bin" -z "$tok" -n "$steps" -t 0 -q \
        --kernels "$k" --blas-threads 1 2>&1 | sed -n 's/achieved tok\/s: //p')
  gbs=$(awk -v t="$tps" -v b="$bytes" 'BEGIN{printf "%.2f", t*b/1e9}')
  printf "%-10s %10.2f %14d %10s\n" "$k" "$tps" "$bytes" "$gbs"
done
