#!/usr/bin/env bash
# Run `bpm demo --headless --json` N times in a row, each fresh (its own work and report
# folders under OUT), and print one Markdown table row per run: its time, where the time
# went (s: before phase 1 / each phase / drain and comparison), each phase's verdict and
# loads, A's tasks moved in phase 2, movements, lost and duplicated results. The rows go into
# docs/benchmarks.md, "Demo runs".
#   usage: scripts/demo-runs.sh N OUT
set -euo pipefail
runs=${1:?usage: scripts/demo-runs.sh N OUT}
out=${2:?usage: scripts/demo-runs.sh N OUT}
bpm="$(cd "$(dirname "$0")/.." && pwd)/.venv/bin/bpm"
mkdir -p "$out"
for i in $(seq 1 "$runs"); do
    run="$out/run-$i"
    rm -rf "$run" && mkdir -p "$run"
    echo "demo run $i of $runs: $run" >&2
    "$bpm" demo --headless --json --workdir "$run/work" --report "$run/report" > "$run/report.json" 2> "$run/demo.log" || echo "run $i failed (exit $?); see $run/demo.log" >&2
    "$(dirname "$bpm")/python" - "$run/report.json" "$i" <<'PY'
import json, sys
try:
    r = json.load(open(sys.argv[1]))
except ValueError:
    print(f"| {sys.argv[2]} | failed | | | | | | | |")
    raise SystemExit
from bpm_app.demo.run import verdict
def phase(p):
    return f"{verdict(p)}: " + ", ".join(f"{v:.2f}" for _, v in sorted(p["loads"].items()))
to_d = sum(1 for m in r["movements"] if m["to"] == "d")
# Where the time went, in seconds: until phase 1 began (the hosts, the JVMs, the tasks' starts),
# each phase, and from the end of the last phase to the report (the drain and the comparison).
ps = r["phases"]
spent = "/".join(f"{s:.0f}" for s in [ps[0]["started_s"], *(p["ended_s"] - p["started_s"] for p in ps), r["elapsed_s"] - ps[-1]["ended_s"]])
# A's tasks moved while phase 2 ran (the poster's phase 2: A sheds to B and C), by the movements' start
from bpm.federation.views import seconds
t0 = seconds(r["started_at"])
two = ps[1]
a_sheds = sum(1 for m in r["movements"] if m["from"] == "a" and two["started_s"] <= seconds(m["started_at"]) - t0 < two["ended_s"])
cells = [sys.argv[2], f"{r['elapsed_s'] / 60:.1f} min", spent, *(phase(p) for p in ps), str(a_sheds),
         f"{len(r['movements'])} ({to_d} to D)", f"{r['lost_results']} / {r['duplicate_results']} of {r['expected_results']}"]
print("| " + " | ".join(cells) + " |", flush=True)
PY
done
