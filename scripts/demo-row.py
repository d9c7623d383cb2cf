"""One Markdown table row of docs/benchmarks.md, "Demo runs", from a demo report
(`bpm demo --headless --json`): its time, where the time went (s: before phase 1 / each
phase / drain and comparison), each phase's verdict and loads, A's tasks moved in phase 2,
movements, movements passed on by a host that was not the task's origin and the most
movements of one task, lost and duplicated results.
    usage: python scripts/demo-row.py REPORT.json LABEL
"""

import collections
import json
import sys

from bpm.clock import seconds
from bpm_app.demo.outcomes import verdict

try:
    r = json.load(open(sys.argv[1]))
except ValueError:
    print(f"| {sys.argv[2]} | failed |" + " |" * 9)  # the row's other cells, empty
    raise SystemExit


def phase(p):
    return f"{verdict(p)}: " + ", ".join(f"{v:.2f}" for _, v in sorted(p["loads"].items()))


movements = r["movements"]
to_d = sum(1 for m in movements if m["to"] == "d")
passed_on = sum(1 for m in movements if m["from"] != m["origin"])
most = max(collections.Counter(m["task_id"] for m in movements).values(), default=0)
# Where the time went, in seconds: until phase 1 began (the hosts, the JVMs, the tasks' starts),
# each phase, and from the end of the last phase to the report (the drain and the comparison).
ps = r["phases"]
spent = "/".join(f"{s:.0f}" for s in [ps[0]["started_s"], *(p["ended_s"] - p["started_s"] for p in ps), r["elapsed_s"] - ps[-1]["ended_s"]])
# A's tasks moved while phase 2 ran (the poster's phase 2: A sheds to B and C), by the movements' start
t0 = seconds(r["started_at"])
two = ps[1]
a_sheds = sum(1 for m in movements if m["from"] == "a" and two["started_s"] <= seconds(m["started_at"]) - t0 < two["ended_s"])
cells = [sys.argv[2], f"{r['elapsed_s'] / 60:.1f} min", spent, *(phase(p) for p in ps), str(a_sheds),
         f"{len(movements)} ({to_d} to D)", f"{passed_on} / {most}",
         f"{r['lost_results']} / {r['duplicate_results']} of {r['expected_results']}"]
print("| " + " | ".join(cells) + " |", flush=True)
