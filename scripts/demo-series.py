"""The demo series' pass criterion: every run loses and duplicates nothing, and at least
PERCENT % of the runs keep every promise of the poster's phases (`bpm_app.demo.outcomes`).
Prints each run's misses; exits 1 when the series fails.
    usage: python scripts/demo-series.py [--pass-percent PERCENT] REPORT.json ...
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

from bpm_app.demo.outcomes import poster_misses


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pass-percent", type=float, default=80.0)
    parser.add_argument("reports", nargs="+", type=Path)
    args = parser.parse_args()
    kept = exact = 0
    for path in args.reports:
        try:
            report = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            print(f"{path}: no report ({exc}): the run failed")
            continue
        misses = poster_misses(report)
        exact += report["lost_results"] == 0 and report["duplicate_results"] == 0
        kept += not misses
        print(f"{path}: " + ("every promise kept" if not misses else "; ".join(misses)) + f" ({report['elapsed_s'] / 60:.1f} min)")
    runs = len(args.reports)
    need = math.ceil(runs * args.pass_percent / 100)
    ok = exact == runs and kept >= need
    print(f"{kept} of {runs} runs kept every promise (at least {need} wanted); {exact} of {runs} lost and duplicated nothing: "
          + ("passed" if ok else "FAILED"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
