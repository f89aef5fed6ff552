#!/usr/bin/env bash
# Calibrates the planner on node daemons in the lab (issue #25): N network
# namespaces with tc-shaped links (scripts/lab.sh), each daemon capped at a
# share of one core (a weak node), two synthetic models that split 8 ways:
# lab8.bin (dense: 8 layers, 8 KV heads) swept with `cellshard sweep
# --cluster` over 1, 2, 4 and 8 daemons as a pipeline, a tensor group and
# hybrid groups, and labmoe8.gguf (8 experts, top 2) over the runtime's expert
# placement on 2, 4 and 8 daemons (one stage shard + N-1 expert nodes), at
# 1 Gbit/s and 100 Mbit/s, batch 1 and 8. Then `cellshard plan --calibrate`
# fits the planner's constants (one per mechanism, expert dispatch/combine
# included) and `--holdout` reports how well a fit on part of the grid
# predicts the rest.
#
#   scripts/calibrate-lab.sh [OUTDIR]     (default docs/data/lab)
#
# Writes OUTDIR/lab-raw.csv (every run's sweep row, with the columns `run`
# (1..R) and `started` (UTC)), OUTDIR/lab-calibration.csv (one row per point:
# the median of its runs in every measured column, plus runs, tpot_min_ms,
# tpot_max_ms, spread = max/min TPOT (the decode's mean time between a
# sequence's tokens, batch x 1000 / decode_tokens_per_s, as the fit uses it)
# and comm_share_min/max (of
# decode_comm_share: sweep's decode-only columns); its first line
# "# host: X GB/s, C cores" describes one capped node: the read bandwidth
# measured here times the CPU share, and how many capped nodes the cores run
# at once; the other '#' lines name the runs), OUTDIR/lab-spread.txt (the
# points by spread), OUTDIR/holdout-every4.json and OUTDIR/holdout-nodes8.json
# (nodes8: the lab's size; plan --json with the held-out predictions; .txt: what plan printed), the
# models' shapes for the planner (lab8.config.json, labmoe8.config.json: plan
# finds STEM.config.json beside the CSV), the plots of each sweep (first
# run) and failed.txt: the runs that failed (not in the CSVs; empty when none).
# With the default OUTDIR it also regenerates docs/kimi-k3-on-100k-ps3.md
# (the command at its top, --calibrate-context STEPS/2: 24 by default).
# Needs root (ip netns, tc, cgroups), iperf3, gnuplot, python3 and a build.
# Takes about 8 minutes per repeat on 2 idle cores (estimate: docs/planner.md).
# Environment:
#   CELLSHARD_LAB_CPU     percent of a core per daemon (default 25)
#   CELLSHARD_LAB_RATES   links (default "1gbit 100mbit")
#   CELLSHARD_LAB_STEPS   positions per run (default 48)
#   CELLSHARD_LAB_NODES   node counts (default 1,2,4,8; the last is the lab's size)
#   CELLSHARD_LAB_REPEAT  runs of every sweep (default 1); the fit and the
#                         hold-out use each point's median, lab-raw.csv keeps all
#   CELLSHARD_LAB_MOE     0: no mixture-of-experts sweep (default 1)
#   CELLSHARD_LAB_NICE    e.g. -10: the daemons (their cgroups' CFS weight too)
#                         and the sweep front end at that priority (lab.sh --nice:
#                         what it does and does not protect against)
#   CELLSHARD_LAB_TOPOLOGIES  lab8.bin's placements (default
#                         pipeline,tensor,hybrid:2x2,hybrid:2x4)
#   CELLSHARD_LAB_BATCHES batch sizes (default 1,8)
#   CELLSHARD_LAB_MERGE=1 rerun part of the grid (e.g. after a runtime fix,
#                         with the two variables above and CELLSHARD_LAB_MOE=0):
#                         the new runs replace the same points' rows in
#                         OUTDIR/lab-raw.csv, the others stay; the medians,
#                         the fit and the report are made again from all
#                         rows, and lab-calibration.csv keeps the first
#                         runs' host line and names the rerun below it
#   CELLSHARD_LAB_FIT_ONLY=1  no runs: the fit, the hold-out files and (default
#                         OUTDIR) the report again from OUTDIR/lab-calibration.csv
#                         as it is (steps and node counts from its '# runs' line),
#                         e.g. after a change to the planner's model
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
B=${CELLSHARD_BIN:-$ROOT/build/tools/cellshard}
M=${CELLSHARD_MODELS:-$ROOT/../shared/models}
OUT=${1:-docs/data/lab}
CPU=${CELLSHARD_LAB_CPU:-25}
RATES=${CELLSHARD_LAB_RATES:-"1gbit 100mbit"}
STEPS=${CELLSHARD_LAB_STEPS:-48}
GRID=${CELLSHARD_LAB_NODES:-1,2,4,8}
NODES=${GRID##*,}
REPEAT=${CELLSHARD_LAB_REPEAT:-1}
MOE=${CELLSHARD_LAB_MOE:-1}
NICE=${CELLSHARD_LAB_NICE:-}
FIT_ONLY=${CELLSHARD_LAB_FIT_ONLY:-0}
TOPOS=${CELLSHARD_LAB_TOPOLOGIES:-pipeline,tensor,hybrid:2x2,hybrid:2x4}
BATCHES=${CELLSHARD_LAB_BATCHES:-1,8}
MERGE=${CELLSHARD_LAB_MERGE:-0}
[[ $REPEAT =~ ^[1-9][0-9]*$ ]] || { echo "calibrate-lab.sh: CELLSHARD_LAB_REPEAT must be a positive integer" >&2; exit 2; }
[ -z "$NICE" ] || [[ $NICE =~ ^-?[0-9]+$ ]] || { echo "calibrate-lab.sh: CELLSHARD_LAB_NICE must be an integer (-20..19)" >&2; exit 2; }
NICER=()
LABNICE=()
if [ -n "$NICE" ]; then NICER=(nice -n "$NICE"); LABNICE=(--nice "$NICE"); fi
# The expert placement's node counts: those of the grid with 2 or more.
MOE_GRID=$(echo "$GRID" | tr ',' '\n' | awk '$1 >= 2' | paste -sd, -)
[ -x "$B" ] || { echo "calibrate-lab.sh: no binary at $B (scripts/build.sh)" >&2; exit 1; }
[ -f "$M/tok512.bin" ] && [ -f "$M/stories260K.bin" ] || { echo "calibrate-lab.sh: no models in $M" >&2; exit 1; }
CSV="$OUT/lab-calibration.csv"
RAW="$OUT/lab-raw.csv"
if [ "$FIT_ONLY" = 1 ]; then
  [ -f "$CSV" ] || { echo "calibrate-lab.sh: CELLSHARD_LAB_FIT_ONLY=1: no $CSV to fit" >&2; exit 1; }
  # The runs' steps and node counts, as the CSV's header names them.
  STEPS=$(sed -n 's/^# runs .*CELLSHARD_LAB_STEPS=\([0-9]*\).*/\1/p' "$CSV" | head -1)
  GRID=$(sed -n 's/^# runs .*CELLSHARD_LAB_NODES=\([0-9,]*\).*/\1/p' "$CSV" | head -1)
  [ -n "$STEPS" ] && [ -n "$GRID" ] || { echo "calibrate-lab.sh: $CSV names no CELLSHARD_LAB_STEPS/NODES" >&2; exit 1; }
  NODES=${GRID##*,}
else
mkdir -p "$OUT"
: > "$OUT/failed.txt"
TMP=$(mktemp -d)
cleanup() { scripts/lab.sh down >/dev/null 2>&1 || true; rm -rf "$TMP"; }
trap cleanup EXIT

# The daemons find models by file name in their --models folder.
mkdir -p "$TMP/models"
ln -s "$(readlink -f "$M/stories260K.bin")" "$TMP/models/stories260K.bin"
ln -s "$(readlink -f "$M/tok512.bin")" "$TMP/models/tok512.bin"
"$B" synth --config custom --dim 512 --hidden 1376 --layers 8 --heads 8 --kv-heads 8 --vocab 512 --seq-len 256 \
  -s 8 -o "$TMP/models/lab8.bin" >/dev/null
# The same shape for the planner (a Hugging Face style config.json).
cat > "$OUT/lab8.config.json" <<'JSON'
{"hidden_size": 512, "intermediate_size": 1376, "num_hidden_layers": 8, "num_attention_heads": 8,
 "num_key_value_heads": 8, "vocab_size": 512, "max_position_embeddings": 256, "tie_word_embeddings": true,
 "torch_dtype": "float32"}
JSON
# A mixture of experts that splits 8 ways: 8 experts (top 2) of 512 units,
# dim 256, 8 layers, 8 KV heads (105 MiB in f32), and its shape for the planner.
"$B" synth --config custom --dim 256 --hidden 512 --layers 8 --heads 8 --kv-heads 8 --vocab 512 --seq-len 256 \
  --experts 8 --experts-used 2 -s 8 -o "$TMP/models/labmoe8.gguf" >/dev/null
cat > "$OUT/labmoe8.config.json" <<'JSON'
{"hidden_size": 256, "moe_intermediate_size": 512, "num_hidden_layers": 8, "num_attention_heads": 8,
 "num_key_value_heads": 8, "vocab_size": 512, "max_position_embeddings": 256, "tie_word_embeddings": true,
 "num_experts": 8, "num_experts_per_tok": 2, "torch_dtype": "float32"}
JSON

# One capped node: the read bandwidth measured here x the CPU share; the
# cores run floor(cores x 100 / CPU) such nodes at once.
BW=$("$B" plan -m stories260k --hardware host --nodes 1 --baseline none --json - 2>/dev/null |
  python3 -c 'import json,sys; print(json.load(sys.stdin)["hardware_detail"]["mem_bandwidth_gbs"])')
CORES=$(nproc)
NODE_BW=$(python3 -c "print(round($BW * $CPU / 100, 3))")
PAR=$((CORES * 100 / CPU))

START=$(date -u +%Y-%m-%dT%H:%MZ)
: > "$TMP/raw.csv"
: > "$TMP/links.txt"
# sweep MODEL_FILE NAME NODES TOPOLOGIES RATE RUN: one sweep over the lab's
# daemons; its rows go to the raw CSV with the run and its start.
sweep() {
  local model=$1 name=$2 nodes=$3 topos=$4 rate=$5 run=$6 dir="$TMP/sweep-$2-$5-$6" started
  started=$(date -u +%H:%M:%S)
  echo "== $name at $rate, run $run of $REPEAT ($started UTC)" >&2
  # (stderr through tee, stdout as it is; pipefail gives the sweep's status)
  { ${NICER[@]+"${NICER[@]}"} "$B" sweep --cluster /tmp/cellshard-lab/cluster.json --cluster-link "$rate:50us" \
    -m "$TMP/models/$model" -z "$TMP/models/tok512.bin" -n "$STEPS" --nodes "$nodes" --topology "$topos" \
    --batch "$BATCHES" --out "$dir" $([ "$run" -eq 1 ] || echo --no-plots) 2>&1 1>&3 | tee "$dir.err" >&2; } 3>&1 ||
    echo "calibrate-lab.sh: some points of $name at $rate (run $run) failed; they are listed in $OUT/failed.txt" >&2
  sed -n '/point(s) failed/,$p' "$dir.err" | sed "s/^/$rate run $run: /" >> "$OUT/failed.txt"
  # sweep lists a point whose daemon was given up on a loaded host among the
  # points the model cannot be split into (2026-12-02, load 11): a failure too.
  sed -n '/point(s) the model cannot be split into/,/point(s) failed/p' "$dir.err" |
    grep -E 'given up|silent|unreachable|timed out' | sed "s/^/$rate run $run: /" >> "$OUT/failed.txt" || true
  [ -f "$dir/sweep.csv" ] || return 0
  [ -s "$TMP/raw.csv" ] || echo "$(head -1 "$dir/sweep.csv"),run,started" > "$TMP/raw.csv"
  tail -n +2 "$dir/sweep.csv" | sed "s/\$/,$run,${started}Z/" >> "$TMP/raw.csv"
  if [ "$run" -eq 1 ]; then
    for p in latency throughput comm_share bytes_per_token; do
      # lab_RATE_PLOT.png (lab8, as before) and labmoe8_RATE_PLOT.png
      [ -f "$dir/$p.png" ] && cp "$dir/$p.png" "$OUT/${name/#lab8/lab}_${rate}_$p.png"
    done
  fi
  return 0
}
for rate in $RATES; do
  echo "== lab at $rate, $NODES daemons at $CPU% of a core${NICE:+, nice $NICE}" >&2
  CELLSHARD_MODELS=$TMP/models scripts/lab.sh up "$NODES" --rate "$rate" --cpu "$CPU" ${LABNICE[@]+"${LABNICE[@]}"} |
    tee -a "$TMP/links.txt" >&2
  for ((run = 1; run <= REPEAT; run++)); do
    sweep lab8.bin lab8 "$GRID" "$TOPOS" "$rate" "$run"
    if [ "$MOE" != 0 ] && [ -n "$MOE_GRID" ]; then sweep labmoe8.gguf labmoe8 "$MOE_GRID" expert "$rate" "$run"; fi
  done
  scripts/lab.sh down >/dev/null
done
END=$(date -u +%Y-%m-%dT%H:%MZ)
[ -s "$TMP/raw.csv" ] || { echo "calibrate-lab.sh: no run succeeded" >&2; exit 1; }
if [ "$MERGE" = 1 ]; then
  [ -f "$RAW" ] && [ -f "$CSV" ] || { echo "calibrate-lab.sh: CELLSHARD_LAB_MERGE=1 needs $RAW and $CSV" >&2; exit 1; }
  grep '^#' "$CSV" | grep -v '^# each row' > "$TMP/header.txt"
  # The points rerun replace their earlier rows; the others stay.
  python3 - "$RAW" "$TMP/raw.csv" <<'PY'
import csv, sys
old_path, new_path = sys.argv[1], sys.argv[2]
key = ("model", "topology", "nodes", "link", "batch", "reduce")
with open(old_path) as f:
    old = list(csv.DictReader(f))
with open(new_path) as f:
    new = list(csv.DictReader(f))
cols = list(old[0].keys())
redo = {tuple(r[c] for c in key) for r in new}
kept = [r for r in old if tuple(r[c] for c in key) not in redo]
with open(old_path, "w") as f:
    w = csv.DictWriter(f, fieldnames=cols, lineterminator="\n", extrasaction="ignore")
    w.writeheader()
    w.writerows(kept + new)
print("calibrate-lab.sh: %d point(s) rerun (%d rows replace %d), %d rows kept" %
      (len(redo), len(new), len(old) - len(kept), len(kept)), file=sys.stderr)
PY
else
  cp "$TMP/raw.csv" "$RAW"
fi

# One row per point: the median of its runs (noise on a shared host only
# adds time, but a median is what a repeat-robust fit needs), and its spread.
{
  if [ "$MERGE" = 1 ]; then
    cat "$TMP/header.txt"
    echo "# rerun $START - $END UTC on $(git rev-parse --short HEAD 2>/dev/null || echo unknown), replacing these points' rows: CELLSHARD_LAB_MERGE=1 CELLSHARD_LAB_TOPOLOGIES=$TOPOS CELLSHARD_LAB_BATCHES=$BATCHES CELLSHARD_LAB_NODES=$GRID CELLSHARD_LAB_MOE=$MOE CELLSHARD_LAB_CPU=$CPU CELLSHARD_LAB_STEPS=$STEPS CELLSHARD_LAB_REPEAT=$REPEAT CELLSHARD_LAB_NICE=${NICE:-none} CELLSHARD_LAB_RATES=\"$RATES\" scripts/calibrate-lab.sh (host read bandwidth $BW GB/s then; load after: $(cut -d' ' -f1-3 /proc/loadavg))"
    sed 's/^/# rerun: /' "$TMP/links.txt"
  else
    echo "# host: $NODE_BW GB/s, $PAR cores"
    echo "# $NODES node daemons in network namespaces (scripts/lab.sh), each capped at $CPU% of a core (cgroup)${NICE:+, nice $NICE};"
    echo "# host read bandwidth $BW GB/s measured by plan --hardware host before the runs; load (1, 5, 15 min) when the runs ended: $(cut -d' ' -f1-3 /proc/loadavg)"
    echo "# runs $START - $END UTC on $(git rev-parse --short HEAD 2>/dev/null || echo unknown): CELLSHARD_LAB_CPU=$CPU CELLSHARD_LAB_STEPS=$STEPS CELLSHARD_LAB_NODES=$GRID CELLSHARD_LAB_REPEAT=$REPEAT CELLSHARD_LAB_NICE=${NICE:-none} CELLSHARD_LAB_RATES=\"$RATES\" scripts/calibrate-lab.sh"
    echo "# cellshard sweep --cluster LAB -n $STEPS --batch $BATCHES, per link: -m lab8.bin (dim 512, 8 layers, 8 KV heads, f32) --nodes $GRID --topology $TOPOS$([ "$MOE" != 0 ] && echo "; -m labmoe8.gguf (dim 256, 8 layers, 8 experts top 2, f32) --nodes $MOE_GRID --topology expert")"
    sed 's/^/# /' "$TMP/links.txt"
  fi
  echo "# each row: the median of its point's $REPEAT run(s) in $(basename "$RAW") (runs, TPOT min/max, spread = max/min)"
} > "$CSV"
python3 - "$RAW" "$OUT/lab-spread.txt" >> "$CSV" <<'PY'
import csv, statistics, sys
raw, spread_out = sys.argv[1], sys.argv[2]
with open(raw) as f:
    rows = list(csv.DictReader(f))
cols = [c for c in rows[0].keys() if c not in ("run", "started")]
key_cols = ("model", "topology", "nodes", "link", "batch", "reduce")
num_cols = [c for c in cols if c not in key_cols and c not in ("stages", "tp")]
points = {}
for r in rows:
    points.setdefault(tuple(r[c] for c in key_cols), []).append(r)
out = csv.writer(sys.stdout, lineterminator="\n")
out.writerow(cols + ["runs", "tpot_min_ms", "tpot_max_ms", "spread", "comm_share_min", "comm_share_max"])
lines = []
for k, rs in points.items():
    med = {c: statistics.median(float(r[c]) for r in rs) for c in num_cols}
    # TPOT as the fit uses it (plan_calibrate.hpp measured_tpot_ms): the
    # decode's mean time between a sequence's tokens, else the p50
    t = [int(r["batch"]) * 1000.0 / float(r["decode_tokens_per_s"])
         if float(r.get("decode_tokens_per_s") or 0) > 0 else float(r["tpot_ms_p50"]) for r in rs]
    # the decode's comm share (what the planner predicts) when the sweep wrote it
    cs = [float(r.get("decode_comm_share") or r["comm_share"]) for r in rs]
    out.writerow([("%.6g" % med[c]) if c in med else rs[0][c] for c in cols] +
                 [len(rs), "%.6g" % min(t), "%.6g" % max(t), "%.4f" % (max(t) / min(t)), "%.4f" % min(cs), "%.4f" % max(cs)])
    lines.append((max(t) / min(t), "%-14s %-11s %2s nodes %-13s batch %-2s runs %d: TPOT %s ms (spread %.2fx), comm share %.2f-%.2f" %
                  (k[0], k[1], k[2], k[3], k[4], len(rs), " ".join("%.3g" % v for v in t), max(t) / min(t), min(cs), max(cs))))
with open(spread_out, "w") as f:
    f.write("# points by TPOT spread (max/min over their runs), from %s\n" % raw)
    for _, l in sorted(lines, reverse=True):
        f.write(l + "\n")
PY
head -5 "$OUT/lab-spread.txt" >&2
fi  # FIT_ONLY

echo "== fit and held-out validation" >&2
for rule in every:4 "nodes:$NODES"; do
  name=holdout-${rule/:/}
  "$B" plan -m "$OUT/lab8.config.json" --nodes 1 --baseline none --calibrate "$CSV" --calibrate-context $((STEPS / 2)) \
    --holdout "$rule" --json "$OUT/$name.json" > "$OUT/$name.txt"
  grep -E "^(calibration|held-out)" "$OUT/$name.txt" >&2
done
echo "wrote $CSV, $RAW, $OUT/lab-spread.txt and $OUT/holdout-*.json" >&2
# The Kimi K3 report is calibrated on the committed lab rows: regenerate it
# (its own command, at its top) when they are the ones just written.
if [ "$OUT" = docs/data/lab ]; then
  echo "== docs/kimi-k3-on-100k-ps3.md" >&2
  "$B" plan --model kimi-k3 --hardware ps3 --nodes 100000 --batch 256 --calibrate "$CSV" \
    --calibrate-model "$OUT/lab8.config.json" --calibrate-context $((STEPS / 2)) --holdout every:4 \
    --simulate --sim-hours 4 --report docs/kimi-k3-on-100k-ps3.md >/dev/null
  grep -E "^Largest held-out error" docs/kimi-k3-on-100k-ps3.md >&2
fi
