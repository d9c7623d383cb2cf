"""Reading a task's progress from Spark's checkpoint logs: the last committed batch, its
watermark, and the stream position its batches have taken.

Spark writes, per micro-batch N, `offsets/N` before running it (line 1 `v1`, line 2 the
batch's metadata with `batchWatermarkMs`, the watermark the batch evicts state with, then
one line per source, `{"logOffset": L}` for the file source) and `commits/N` once its output
is written. The file source logs the files it took in `sources/0/L` (compacted into
`L.compact` every few entries); its log offsets are not batch ids, because a batch that
only moves the watermark reads no new file.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from spark_agents.checkpoint import processed_position


@dataclass(frozen=True)
class BatchOffsets:
    """What `offsets/N` says about batch N.

    Attributes:
        batch_id: N.
        watermark_ms: the event-time watermark the batch used (ms since the epoch; 0 before the first).
        log_offsets: per source, the file-source log entry the batch read up to (None for other sources).
    """

    batch_id: int
    watermark_ms: int
    log_offsets: tuple[int | None, ...]


def _numbered(folder: Path) -> list[int]:
    if not folder.is_dir():
        return []
    return sorted(int(p.name) for p in folder.iterdir() if p.name.isdigit())


def committed_batch(checkpoint_dir: str | Path) -> int | None:
    """The newest batch whose output is written (`commits/N`), None before the first."""
    batches = _numbered(Path(checkpoint_dir) / "commits")
    return batches[-1] if batches else None


def batch_offsets(checkpoint_dir: str | Path, batch_id: int) -> BatchOffsets:
    """The offsets entry of batch `batch_id`."""
    lines = (Path(checkpoint_dir) / "offsets" / str(batch_id)).read_text(encoding="utf-8").splitlines()
    meta = json.loads(lines[1]) if len(lines) > 1 and lines[1].startswith("{") else {}
    sources: list[int | None] = []
    for line in lines[2:]:
        try:
            sources.append(int(json.loads(line)["logOffset"]))
        except (ValueError, KeyError, TypeError):
            sources.append(None)
    return BatchOffsets(batch_id, int(meta.get("batchWatermarkMs", 0)), tuple(sources))


def committed_position(checkpoint_dir: str | Path) -> int | None:
    """The highest stream position that the task's committed batches have taken (None: none yet)."""
    batch = committed_batch(checkpoint_dir)
    if batch is None:
        return None
    offsets = batch_offsets(checkpoint_dir, batch)
    log_offset = offsets.log_offsets[0] if offsets.log_offsets else None
    if log_offset is None:
        return None
    return processed_position(checkpoint_dir, log_offset)
