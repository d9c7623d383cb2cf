"""Turning batch measurements into loads, utilisation and cost-model samples (pure functions).

Definitions (docs/pipeline.md, "Measuring load"):

* a task's busy time is the wall time of its micro-batches (Spark's `triggerExecution`);
* a task's load over an interval is its busy time inside the interval, divided by the
  interval's length and by the participant's cores: the share of the participant's
  processing capacity the task used;
* the participant's utilisation is the sum of its tasks' loads; the CPU time of the Spark
  driver process (and of this Python process, which runs `foreachBatch`) over the same
  interval, divided by the cores, cross-checks it where the process is local;
* the cost model is fitted to (utilisation, mean batch duration) pairs, one per interval.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass


@dataclass(frozen=True, slots=True)
class BatchSample:
    """One finished micro-batch of one task.

    Attributes:
        task_id: the task (the streaming query's name).
        batch_id: Spark's batch id.
        start_s: when the batch started (epoch seconds).
        duration_s: its wall time (Spark's `triggerExecution`).
        rows: input rows it read.
    """

    task_id: str
    batch_id: int
    start_s: float
    duration_s: float
    rows: int

    @property
    def end_s(self) -> float:
        return self.start_s + self.duration_s


@dataclass(frozen=True, slots=True)
class IntervalSample:
    """What one measuring interval saw on the participant.

    Attributes:
        start_s, end_s: the interval (epoch seconds).
        loads: load per task.
        utilisation: sum of the loads.
        cpu_utilisation: process CPU time over the interval / (length x cores), None where not measurable.
        mean_batch_s: mean duration of the batches that ended in the interval (None without batches).
        batches: how many batches ended in the interval.
        rows: input rows of those batches.
    """

    start_s: float
    end_s: float
    loads: dict[str, float]
    utilisation: float
    cpu_utilisation: float | None
    mean_batch_s: float | None
    batches: int
    rows: int

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def busy_seconds(samples: Iterable[BatchSample], start_s: float, end_s: float) -> dict[str, float]:
    """Per task, the part of its batches' wall time that falls inside [start_s, end_s)."""
    busy: dict[str, float] = {}
    for s in samples:
        overlap = min(s.end_s, end_s) - max(s.start_s, start_s)
        if overlap > 0:
            busy[s.task_id] = busy.get(s.task_id, 0.0) + overlap
    return busy


def task_loads(samples: Iterable[BatchSample], start_s: float, end_s: float, cores: int, tasks: Iterable[str] = ()) -> dict[str, float]:
    """Per task, busy seconds per wall-clock second over the participant's cores; listed tasks without batches get 0."""
    if end_s <= start_s:
        raise ValueError("the interval must have a positive length")
    if cores < 1:
        raise ValueError("cores must be at least 1")
    loads = {t: 0.0 for t in tasks}
    for task, busy in busy_seconds(samples, start_s, end_s).items():
        loads[task] = busy / (end_s - start_s) / cores
    return loads


def interval_sample(
    samples: Sequence[BatchSample], start_s: float, end_s: float, cores: int,
    tasks: Iterable[str] = (), cpu_seconds: float | None = None,
) -> IntervalSample:
    """Summarise one interval; `cpu_seconds` is the process CPU time measured over it, if any."""
    loads = task_loads(samples, start_s, end_s, cores, tasks)
    ended = [s for s in samples if start_s <= s.end_s < end_s]
    cpu = None if cpu_seconds is None else cpu_seconds / (end_s - start_s) / cores
    return IntervalSample(
        start_s, end_s, loads, sum(loads.values()), cpu,
        sum(s.duration_s for s in ended) / len(ended) if ended else None,
        len(ended), sum(s.rows for s in ended),
    )


def cost_samples(intervals: Iterable[IntervalSample]) -> tuple[list[float], list[float]]:
    """The (utilisation, mean batch duration) pairs the cost model is fitted to; intervals without batches are left out."""
    pairs = [(i.utilisation, i.mean_batch_s) for i in intervals if i.mean_batch_s is not None]
    return [p[0] for p in pairs], [p[1] for p in pairs]  # type: ignore[misc]


_CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def process_cpu_seconds(pid: int) -> float | None:
    """User plus system CPU seconds of a local process (from /proc), None where unreadable."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    # Fields after the command name: state is [0], utime is [11], stime is [12].
    return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS
