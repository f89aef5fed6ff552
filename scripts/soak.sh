#!/usr/bin/env bash
# Soak (issue #21): many `cellshard chaos` batches across topologies, fault
# kinds and node kinds (in-process nodes and node daemons in processes), a
# part of them with a busy loop on every core, until TARGET runs are done or
# MINUTES have passed, whichever comes first. Not part of CI.
#
#   scripts/soak.sh [MINUTES] [TARGET] [OUTDIR]     (defaults: 120 1000 build/soak)
#
# Every batch writes OUTDIR/batch-K.json (chaos --json) and OUTDIR/batch-K.log;
# after each batch OUTDIR/summary.md is rewritten: runs, diverged, hung, failed
# with a clear error, restarts of healthy nodes, per configuration and in total,
# and the line `Soak: N chaos runs, D diverged, H hung`.
# A restart of a healthy node is a fault record (a restart or move decided by
# the runtime) of a placement index that no planned fault of that run named.
# Each chaos run has its own deadline (--deadline) past which it counts as hung;
# each batch is also bounded by `timeout`, and a batch killed by it counts its
# unfinished runs as hung.
set -euo pipefail
cd "$(dirname "$0")/.."
minutes=${1:-120}
target=${2:-1000}
out=${3:-build/soak}
bin=${CELLSHARD_BIN:-build/tools/cellshard}
model=${SOAK_MODEL:-models/stories260K.bin}
tok=${SOAK_TOKENIZER:-models/tok512.bin}
runs_per_batch=${SOAK_RUNS_PER_BATCH:-10}
steps=${SOAK_STEPS:-48}
mkdir -p "$out"
[ -x "$bin" ] || { echo "soak: $bin not built (scripts/build.sh)" >&2; exit 1; }
# A private copy of the binary, so a rebuild during the soak does not change it.
cp "$bin" "$out/cellshard"
bin="$out/cellshard"

# Configurations: name | chaos flags. Kinds: every kind chaos knows for
# in-process nodes; over processes also SIGKILL and SIGSTOP of daemons.
configs=(
  "pipeline-inproc|--nodes 4 --spares 2 --topology pipeline"
  "tensor-inproc|--nodes 2 --spares 2 --topology tensor"
  "hybrid-inproc|--nodes 4 --spares 2 --topology hybrid:2x2"
  "pipeline-2faults|--nodes 4 --spares 3 --topology pipeline --faults-per-run 2"
  "pipeline-processes|--processes 3 --spares 2 --topology pipeline"
  "tensor-processes|--processes 2 --spares 2 --topology tensor"
)

busy_pids=()
start_busy() {
  for _ in $(seq "$(nproc)"); do
    ( end=$((SECONDS + 600)); while [ $SECONDS -lt $end ]; do :; done ) &
    busy_pids+=($!)
  done
}
stop_busy() {
  for p in "${busy_pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${busy_pids[@]}"; do wait "$p" 2>/dev/null || true; done
  busy_pids=()
}
trap stop_busy EXIT

t_end=$((SECONDS + minutes * 60))
total=0
k=0
start_date=$(date -u +%Y-%m-%dT%H:%MZ)
echo "$start_date" > "$out/started"
while [ $total -lt "$target" ] && [ $SECONDS -lt $t_end ]; do
  cfg=${configs[$((k % ${#configs[@]}))]}
  name=${cfg%%|*}
  flags=${cfg#*|}
  busy=0
  # Every third round of configurations runs with a busy loop on every core.
  [ $(( (k / ${#configs[@]}) % 3 )) -eq 2 ] && busy=1
  [ $busy -eq 1 ] && start_busy
  left=$(( t_end - SECONDS ))
  [ $left -lt 60 ] && left=60
  limit=$(( runs_per_batch * 60 < left ? runs_per_batch * 60 : left ))
  echo "{\"config\": \"$name\", \"busy\": $busy, \"flags\": \"$flags\"}" > "$out/batch-$k.meta"
  set +e
  # shellcheck disable=SC2086
  timeout -k 10 "$limit" "$bin" chaos -m "$model" -z "$tok" -n "$steps" -t 0.8 -p 0.9 -s $((k + 1)) \
    --seed $((1000 + k)) --runs "$runs_per_batch" --deadline 60 $flags --json "$out/batch-$k.json" \
    > "$out/batch-$k.log" 2>&1
  rc=$?
  set -e
  echo "$rc" > "$out/batch-$k.rc"
  [ $busy -eq 1 ] && stop_busy
  k=$((k + 1))
  total=$(python3 scripts/soak_summary.py "$out" "$start_date")
  echo "soak: batch $k ($name, busy $busy) exit $rc; $total runs so far"
done
python3 scripts/soak_summary.py "$out" "$start_date" >/dev/null
cat "$out/summary.md"
