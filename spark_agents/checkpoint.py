"""Reading a task's position and watermark from its checkpoint, and handing a checkpoint over.

Spark's file source logs, per source batch, the files it took (`<checkpoint>/sources/0/<n>`,
compacted every few batches into `<n>.compact`). Stream files are named by position, so the
highest position in the log is the last file the task has taken.

The offset log (`<checkpoint>/offsets/<n>`) records the event-time watermark batch n ran
with; batch n has completed when `<checkpoint>/commits/<n>` exists.
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


def _metadata(path: Path) -> dict:
    """The JSON line after the version line of an offset or commit log entry."""
    lines = path.read_text(encoding="utf-8").splitlines()
    return json.loads(lines[1]) if len(lines) > 1 and lines[1].startswith("{") else {}


def _newest_completed(root: Path) -> tuple[dict, dict] | None:
    """The offset-log and commit-log metadata of the newest completed batch."""
    try:
        committed = [int(p.name) for p in (root / "commits").iterdir() if p.name.isdigit()]
        if not committed:
            return None
        n = max(committed)
        return _metadata(root / "offsets" / str(n)), _metadata(root / "commits" / str(n))
    except FileNotFoundError:  # no checkpoint yet, or maintenance purged it after a newer batch ran
        return None


def committed_watermark_ms(checkpoint_dir: str | Path) -> int | None:
    """The watermark (epoch ms) of the newest completed batch: every window ending by then has
    been emitted. None before the first completed batch."""
    newest = _newest_completed(Path(checkpoint_dir))
    return None if newest is None else newest[0].get("batchWatermarkMs")


def owes_watermark_batch(checkpoint_dir: str | Path) -> bool:
    """True when the newest completed batch moved the watermark on and no batch has run with it yet.

    Spark runs that batch (with no new data) only after a batch of the same run: a query
    restarted from this checkpoint waits for new input before it emits the windows the new
    watermark closes. At the end of the input there is none, so stop such a task only after it.
    """
    newest = _newest_completed(Path(checkpoint_dir))
    if newest is None:
        return False
    offsets, commit = newest
    return commit.get("nextBatchWatermarkMs", 0) > offsets.get("batchWatermarkMs", 0)


def hand_over(checkpoint_dir: str | Path, destination: str | Path) -> Path:
    """Copy a stopped task's checkpoint to `destination` (which must not exist yet), where another host resumes it."""
    destination = Path(destination)
    if destination.exists():
        raise FileExistsError(f"{destination} exists; a checkpoint is handed over into a new folder")
    shutil.copytree(checkpoint_dir, destination)
    return destination
