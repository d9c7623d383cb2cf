"""A StreamingQueryListener that records every finished micro-batch of the host's tasks."""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from datetime import datetime

from pyspark.sql.streaming import StreamingQueryListener

from spark_agents.metrics import BatchSample


class BatchRecorder(StreamingQueryListener):
    """Keeps the last `capacity` batch samples of every streaming query that has a name.

    Spark calls it on its listener thread; readers take a copy under the lock.

    Attributes:
        on_batch: optional callback with each new sample and the source's end offset (called outside the lock).
    """

    def __init__(self, capacity: int = 20_000, on_batch: Callable[[BatchSample, dict | None], None] | None = None) -> None:
        self._lock = threading.Lock()
        self._samples: deque[BatchSample] = deque(maxlen=capacity)
        self.on_batch = on_batch

    def onQueryStarted(self, event) -> None:  # noqa: N802 - Spark's method names
        pass

    def onQueryIdle(self, event) -> None:  # noqa: N802
        pass

    def onQueryTerminated(self, event) -> None:  # noqa: N802
        pass

    def onQueryProgress(self, event) -> None:  # noqa: N802
        progress = event.progress
        if not progress.name:
            return
        start = datetime.fromisoformat(progress.timestamp.replace("Z", "+00:00")).timestamp()
        sample = BatchSample(
            task_id=progress.name,
            batch_id=int(progress.batchId),
            start_s=start,
            duration_s=progress.durationMs.get("triggerExecution", 0) / 1000.0,
            rows=int(progress.numInputRows),
        )
        with self._lock:
            self._samples.append(sample)
        if self.on_batch is not None:
            sources = progress.sources
            self.on_batch(sample, _end_offset(sources[0].endOffset) if sources else None)

    def samples(self, since_s: float = 0.0) -> list[BatchSample]:
        """Samples of batches that ended after `since_s`, oldest first."""
        with self._lock:
            return [s for s in self._samples if s.end_s > since_s]


def _end_offset(offset) -> dict | None:
    import json

    if offset is None:
        return None
    if isinstance(offset, str):
        try:
            return json.loads(offset)
        except ValueError:
            return None
    return offset if isinstance(offset, dict) else None
