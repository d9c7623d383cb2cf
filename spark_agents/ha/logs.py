"""Reading a task's progress from Spark's checkpoint logs: the last committed batch, its
watermark, and the stream position its batches have taken.

Spark writes, per micro-batch N, `offsets/N` before running it (line 1 `v1`, line 2 the
batch's metadata with `batchWatermarkMs`, the watermark the batch evicts state with, then
one line per source, `{"seq": n}` for the JetStream source: `spark_agents.checkpoint.processed_seq`)
and `commits/N` once its output is written.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path



@dataclass(frozen=True)
class BatchOffsets:
    """What `offsets/N` says about batch N.

    Attributes:
        batch_id: N.
        watermark_ms: the event-time watermark the batch used (ms since the epoch; 0 before the first).
    """

    batch_id: int
    watermark_ms: int


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
    return BatchOffsets(batch_id, int(meta.get("batchWatermarkMs", 0)))
