#!/usr/bin/env bash
# Regenerates every figure and table of docs/experiments.md into
# docs/img/ (PNG) and docs/data/ (CSV, JSON). Needs a build (scripts/build.sh),
# gnuplot and python3, and the real model files in $CELLSHARD_MODELS
# (default ../shared/models). Takes about 11 minutes on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
B=build/tools/cellshard
M=${CELLSHARD_MODELS:-../shared/models}
IMG=docs/img
DATA=docs/data
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
mkdir -p "$IMG" "$DATA"

echo "== models" >&2
# 8 layers and 8 KV heads: both a pipeline and a tensor group can use 8 nodes.
$B synth --config custom --dim 256 --hidden 688 --layers 8 --heads 8 --kv-heads 8 --vocab 512 --seq-len 256 \
  -s 8 -o "$TMP/m8.bin"
# 64 layers and 64 KV heads for the 64-node points (small dims keep it in memory and time).
$B synth --config custom --dim 128 --hidden 256 --layers 64 --heads 64 --kv-heads 64 --vocab 512 --seq-len 128 \
  -s 64 -o "$TMP/m64.bin"

echo "== the 8-node experiment" >&2
$B sweep -m "$TMP/m8.bin" -z "$M/tok512.bin" -n 48 --nodes 1,2,4,8 --topology pipeline,tensor \
  --link 1gbit:100us,100mbit:100us --batch 1,8 --out "$TMP/eight"
cp "$TMP/eight/sweep.csv" "$DATA/eight_nodes.csv"
for p in latency throughput comm_share bytes_per_token; do cp "$TMP/eight/$p.png" "$IMG/eight_nodes_$p.png"; done

echo "== the sweep to 64 nodes" >&2
$B sweep -m "$TMP/m64.bin" -z "$M/tok512.bin" -n 12 --nodes 1,2,4,8,16,32,64 --topology pipeline,tensor \
  --reduce direct,scatter --out "$TMP/s64"
cp "$TMP/s64/sweep.csv" "$DATA/sweep64.csv"
for p in latency throughput comm_share bytes_per_token; do cp "$TMP/s64/$p.png" "$IMG/sweep64_$p.png"; done

echo "== recovery timeline: a crash and a freeze" >&2
$B run -m "$M/stories260K.bin" -z "$M/tok512.bin" -t 0 -n 200 --nodes 8 --profile ps3 \
  --fault crash:node=1:step=60 --fault silence:node=3:step=120 -q --json "$DATA/timeline.json" 2>/dev/null
python3 - "$DATA/timeline.json" "$TMP/timeline.dat" "$TMP/faults.dat" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
times = j["token_times_ms"]
first = len(j["ids"]) - len(times)  # position of the first timed token
with open(sys.argv[2], "w") as f:
    for i, t in enumerate(times):
        f.write(f"{first + i} {t}\n")
with open(sys.argv[3], "w") as f:
    for x in j["faults"]:
        pos = x["step"]
        t = times[max(0, min(len(times) - 1, pos - first))]
        f.write(f"{pos} {t} {x['kind']}:{x['detect_ms']:.1f}ms_detect+{x['recover_ms']:.2f}ms_recover\n")
PY
gnuplot <<GP
set terminal pngcairo size 900,520 noenhanced
set output '$IMG/recovery_timeline.png'
set title 'stories260K on 8 ps3 nodes: crash at position 60, freeze at 120'
set xlabel 'position'
set ylabel 'time since start (ms)'
set grid
set key left top
plot '$TMP/timeline.dat' using 1:2 with lines lw 2 title 'token delivered', \
     '$TMP/faults.dat' using 1:2 with points pt 7 ps 1.5 title 'fault', \
     '$TMP/faults.dat' using 1:2:3 with labels offset 1,-1 left font ',9' notitle
GP
echo "== recovery over processes: a SIGKILL and a SIGSTOP of node daemons" >&2
$B bench recovery --processes --repeat 5 -m "$M/stories260K.bin" -z "$M/tok512.bin" --out "$TMP/rproc" >/dev/null
cp "$TMP/rproc/recovery_timeline.png" "$IMG/recovery_processes_timeline.png"
cp "$TMP/rproc/recovery_processes.json" "$DATA/recovery_processes.json"
cp "$TMP/rproc/recovery_timeline.csv" "$DATA/recovery_processes_timeline.csv"
cp "$TMP/rproc/recovery_marks.csv" "$DATA/recovery_processes_marks.csv"
echo "wrote $IMG/*.png and $DATA/*" >&2
