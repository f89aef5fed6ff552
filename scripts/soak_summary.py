#!/usr/bin/env python3
"""Summary of a soak (scripts/soak.sh): reads OUTDIR/batch-K.{meta,json,log,rc},
writes OUTDIR/summary.md and prints the total number of runs.

A batch with a chaos --json file is counted from it. A batch without one (its
chaos process was ended by the batch's time bound, or failed to start) is
counted from its log's per-run lines; its planned runs that have no line are
counted as hung when the batch's time bound ended it, else (chaos exited with an
error before its runs, e.g. its fault-free reference run failed) as failed with a
clear error: no runs are counted for it, the batch is counted in its own column.
Restarts of healthy nodes: fault records (restarts or moves the runtime
decided) of a placement index that none of that run's planned faults named.
"""
import glob
import json
import os
import re
import sys

out = sys.argv[1]
started = sys.argv[2] if len(sys.argv) > 2 else "?"
rows = {}
line_re = re.compile(r"^(\d+)\s+.*\s(ok|DIVERGED|hung|failed)\s")


def row(name):
    return rows.setdefault(name, {"batches": 0, "runs": 0, "diverged": 0, "hung": 0, "failed": 0,
                                  "healthy_restarts": 0, "killed_batches": 0, "reference_failed": 0})


for meta_path in sorted(glob.glob(os.path.join(out, "batch-*.meta")),
                        key=lambda p: int(re.search(r"batch-(\d+)", p).group(1))):
    base = meta_path[:-len(".meta")]
    if not os.path.exists(base + ".rc"):
        continue  # still running
    meta = json.load(open(meta_path))
    name = meta["config"] + (" +busy" if meta["busy"] else "")
    r = row(name)
    t = row("total")
    r["batches"] += 1
    t["batches"] += 1
    planned = None
    m = re.search(r"--runs (\d+)", meta.get("flags", ""))
    if os.path.exists(base + ".json") and os.path.getsize(base + ".json") > 0:
        j = json.load(open(base + ".json"))
        counts = {"runs": j["runs"], "diverged": j["diverged_runs"], "hung": j["hung_runs"],
                  "failed": j["failed_runs"], "healthy_restarts": 0}
        for d in j.get("details", []):
            planned_nodes = set()
            for p in d.get("plan", []):
                pm = re.search(r"node=(\d+)", str(p))
                if pm:
                    planned_nodes.add(int(pm.group(1)))
            for f in d.get("faults", []):
                restarted = f.get("moved_to_node", -1) not in (-1, None) or \
                    str(f.get("kind", "")).startswith("node-") or f.get("kind") == "exit"
                if restarted and f.get("node") not in planned_nodes:
                    counts["healthy_restarts"] += 1
    else:
        counts = {"runs": 0, "diverged": 0, "hung": 0, "failed": 0, "healthy_restarts": 0}
        log = open(base + ".log", errors="replace").read() if os.path.exists(base + ".log") else ""
        for line in log.splitlines():
            lm = line_re.match(line)
            if not lm:
                continue
            counts["runs"] += 1
            kind = {"ok": None, "DIVERGED": "diverged", "hung": "hung", "failed": "failed"}[lm.group(2)]
            if kind:
                counts[kind] += 1
        per_batch = int(os.environ.get("SOAK_RUNS_PER_BATCH", "10"))
        missing = max(0, per_batch - counts["runs"])
        rc = open(base + ".rc").read().strip()
        if rc in ("124", "137"):  # ended by the batch's time bound: its unfinished runs hung
            counts["runs"] += missing
            counts["hung"] += missing
            r["killed_batches"] += 1
            t["killed_batches"] += 1
        else:  # chaos ended with an error before its runs (its fault-free reference failed): no runs
            r["reference_failed"] += 1
            t["reference_failed"] += 1
    for k, v in counts.items():
        r[k] += v
        t[k] += v

t = row("total")
with open(os.path.join(out, "summary.md"), "w") as f:
    f.write("| configuration | batches | runs | diverged | hung | failed with a clear error | "
            "restarts of healthy nodes | batches ended by the time bound | batches whose chaos failed before its runs |\n")
    f.write("|---|---:|---:|---:|---:|---:|---:|---:|---:|\n")
    for name in sorted(k for k in rows if k != "total") + ["total"]:
        r = rows[name]
        f.write(f"| {name} | {r['batches']} | {r['runs']} | {r['diverged']} | {r['hung']} | {r['failed']} | "
                f"{r['healthy_restarts']} | {r['killed_batches']} | {r['reference_failed']} |\n")
    f.write(f"\nStarted {started}.\n\nSoak: {t['runs']} chaos runs, {t['diverged']} diverged, {t['hung']} hung\n")
print(t["runs"])
