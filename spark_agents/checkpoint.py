"""Reading a task's position from its checkpoint, and handing a checkpoint over.

Spark's file source logs, per source batch, the files it took (`<checkpoint>/sources/0/<n>`,
compacted every few batches into `<n>.compact`). Stream files are named by position, so the
highest position in the log is the last file the task has taken.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

_STREAM_FILE = re.compile(r"/(\d{12})\.csv$")
_LOG = re.compile(r"^(\d+)(\.compact)?$")


def _log_files(checkpoint_dir: Path) -> dict[int, Path]:
    folder = checkpoint_dir / "sources" / "0"
    if not folder.is_dir():
        return {}
    found = {}
    for path in folder.iterdir():
        m = _LOG.match(path.name)
        if m:
            found[int(m.group(1))] = path
    return found


def processed_position(checkpoint_dir: str | Path, log_offset: int | None = None) -> int | None:
    """The highest stream position the task's file source has taken (up to `log_offset`, default the newest)."""
    logs = _log_files(Path(checkpoint_dir))
    if log_offset is not None:
        logs = {n: p for n, p in logs.items() if n <= log_offset}
    if not logs:
        return None
    newest = logs[max(logs)]
    best = None
    with newest.open(encoding="utf-8") as handle:
        for line in handle:
            if line.startswith("{"):
                m = _STREAM_FILE.search(json.loads(line).get("path", ""))
                if m:
                    best = max(best or 0, int(m.group(1)))
    return best


def hand_over(checkpoint_dir: str | Path, destination: str | Path) -> Path:
    """Copy a stopped task's checkpoint to `destination` (which must not exist yet), where another host resumes it."""
    destination = Path(destination)
    if destination.exists():
        raise FileExistsError(f"{destination} exists; a checkpoint is handed over into a new folder")
    shutil.copytree(checkpoint_dir, destination)
    return destination
