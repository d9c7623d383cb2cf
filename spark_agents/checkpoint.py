"""Reading a task's position and watermark from its checkpoint, and what of it a restart reads.

The offset log (`<checkpoint>/offsets/<n>`) records the event-time watermark batch n ran
with and the source's offset (the broker stream sequence it reads up to,
`spark_agents.broker.source`); batch n has completed when `<checkpoint>/commits/<n>` exists.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

def processed_seq(checkpoint_dir: str | Path, batch_id: int | None = None) -> int | None:
    """The stream sequence up to which the task's JetStream source has planned its
    reads, as of batch `batch_id` (default the newest planned batch): its offset-log entry's
    source offset (`{"seq": n}`, `spark_agents.broker.source`)."""
    log = Path(checkpoint_dir) / "offsets"
    try:
        ids = _batch_ids(log) if batch_id is None else [batch_id]
        if not ids:
            return None
        lines = (log / str(ids[-1])).read_text(encoding="utf-8").splitlines()
        offset = json.loads(lines[2])
    except (FileNotFoundError, IndexError, ValueError):
        return None
    if isinstance(offset, str):  # a source offset may be logged as a JSON string
        offset = json.loads(offset)
    seq = offset.get("seq") if isinstance(offset, dict) else None
    return seq if isinstance(seq, int) else None


def _metadata(path: Path) -> dict:
    """The JSON line after the version line of an offset or commit log entry."""
    lines = path.read_text(encoding="utf-8").splitlines()
    return json.loads(lines[1]) if len(lines) > 1 and lines[1].startswith("{") else {}


def _batch_ids(log: Path) -> list[int]:
    """The batch ids of an offset or commit log's entries, oldest first (none without the folder)."""
    return sorted(int(p.name) for p in log.glob("*") if p.name.isdigit())


def _newest_completed(root: Path) -> tuple[dict, dict] | None:
    """The offset-log and commit-log metadata of the newest completed batch."""
    try:
        committed = _batch_ids(root / "commits")
        if not committed:
            return None
        n = committed[-1]
        return _metadata(root / "offsets" / str(n)), _metadata(root / "commits" / str(n))
    except FileNotFoundError:  # no checkpoint yet, or maintenance purged it after a newer batch ran
        return None


def batch_watermark_ms(checkpoint_dir: str | Path, batch_id: int) -> int | None:
    """The watermark (epoch ms) batch `batch_id` runs with, from its offset-log entry (written
    before the batch runs): windows ending before it are emitted in that batch or earlier."""
    try:
        watermark = _metadata(Path(checkpoint_dir) / "offsets" / str(batch_id)).get("batchWatermarkMs")
    except (FileNotFoundError, ValueError):
        return None
    return watermark if isinstance(watermark, int) else None


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


_VERSIONED = re.compile(r"^(\d+)\.(delta|snapshot)$")


def restart_files(checkpoint_dir: str | Path) -> list[Path]:
    """The files of a stopped task's checkpoint that a restart from it reads, relative to it.

    What a restart needs: the offset-log entries from the one before the newest commit on
    (Spark reads the one before the newest offset; the newest may be a batch planned and not
    completed, and a passive-standby copy cut at the newest commit, `spark_agents.ha.delta`,
    restarts from that commit, so it needs the entry before it), and the newest commit; per state-store partition, the newest
    snapshot of a version up to the one after the last completed batch, and the versions
    after it (all of them when there is no such snapshot); every other file (query id,
    state schema). Hadoop's checksum files (`.<name>.crc`, verified only where they exist)
    and temporary files of interrupted writes are left out. What is left out is history
    Spark would otherwise keep for 100 batches: about ten files per batch, each of which
    costs its receiver a file creation, while the handover pauses the task.
    """
    root = Path(checkpoint_dir)
    committed = _batch_ids(root / "commits")
    newest_state = committed[-1] + 1 if committed else None
    keep: list[Path] = []
    for folder, _, names in os.walk(root):
        here = Path(folder)
        relative = here.relative_to(root)
        files = [n for n in names if not n.endswith((".crc", ".tmp"))]
        if relative.parts in (("offsets",), ("commits",)):
            ids = _batch_ids(here)
            if relative.parts == ("commits",):
                newest = ids[-1:]
            else:
                first = ids[-2] if len(ids) >= 2 else 0
                if committed:
                    first = min(first, committed[-1] - 1)
                newest = [k for k in ids if k >= first]
            files = [n for n in files if not n.isdigit()] + [str(k) for k in newest]
        elif len(relative.parts) == 3 and relative.parts[0] == "state":
            versions = {n: _VERSIONED.match(n) for n in files}
            snapshots = [int(m.group(1)) for m in versions.values()
                         if m and m.group(2) == "snapshot" and (newest_state is None or int(m.group(1)) <= newest_state)]
            if snapshots:
                files = [n for n, m in versions.items() if not m or int(m.group(1)) >= max(snapshots)]
        keep += [relative / n for n in files]
    return sorted(keep)
