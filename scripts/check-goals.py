"""The goals the benchmarks' JSON reports say they met, and those they missed.

Each benchmark (`bpm bench NAME --json`) reports its goals in its own JSON: `goal_met` or
`NAME_goal_met` (one goal), or a mapping under `goal` or `goals` of each goal to true, false or null (null: the goal
does not apply to that case, such as a detection time for a mode that detects nothing). This
prints one line a goal and exits 1 when any was missed, 2 when a file is unreadable or reports
no goal at all while `--require` names it.
    usage: python scripts/check-goals.py [--require NAME.json ...] FILE.json ...
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path


def goals(value: object, path: str = "") -> Iterator[tuple[str, bool | None]]:
    """(where, met) for every goal in a benchmark's JSON, wherever it sits."""
    if isinstance(value, dict):
        for key, item in value.items():
            where = f"{path}.{key}" if path else key
            if key.endswith("goal_met") and (item is None or isinstance(item, bool)):
                yield f"{path}.{key}" if path else key, item
            elif key in ("goal", "goals") and isinstance(item, dict) and all(v is None or isinstance(v, bool) for v in item.values()):
                for name, met in item.items():
                    yield f"{where}.{name}", met
            else:
                yield from goals(item, where)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            label = item.get("mode") or item.get("name") if isinstance(item, dict) else None
            yield from goals(item, f"{path}[{label or i}]")


def main(argv: list[str]) -> int:
    required = set()
    files = []
    args = iter(argv)
    for arg in args:
        if arg == "--require":
            required.add(next(args))
        else:
            files.append(Path(arg))
    missed = status = 0
    for file in files:
        try:
            found = list(goals(json.loads(file.read_text())))
        except (OSError, ValueError) as exc:
            print(f"{file.name}: unreadable ({exc})")
            status = 2
            continue
        if not found:
            print(f"{file.name}: reports no goal")
            status = max(status, 2 if file.name in required else 0)
        for where, met in found:
            word = "not applicable" if met is None else "met" if met else "MISSED"
            print(f"{file.name}: {where}: {word}")
            missed += met is False
    if missed:
        print(f"{missed} goal(s) missed")
        status = max(status, 1)
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
