"""The output fence: a task's output takes each result once, and only from the task's current epoch.

A task's fence is kept where its results go, on its origin's broker
(`spark_agents.broker.results.BrokerFence`): the newest epoch that claimed the task's output
and the time of the newest result written (its `result_time`, `bpm.results.Result.time_us`),
changed only by compare-and-set. A writer of epoch e:

- claims the output before its first write: it is refused (`FencedError`) when a newer
  epoch holds it;
- writes a batch only if no newer epoch claimed the output meanwhile, and only the results
  whose time is after the newest one written; the same conditional write advances the fence.

Why this is exact: in append mode a result comes out in the micro-batch whose watermark
passes its time (`bpm.query`: what makes a query movable), so the results of one time come
in one batch, and batches come in the order of their times (the watermark never moves back
and drops rows older than itself): "after the newest time written" is precisely "not
written yet". A replay (passive standby's restart from its last copy, upstream backup's
rebuild from the acknowledged position) or a promoted replica re-emits results that are
already out, and the fence drops them. A host that comes back after its task failed over
holds an older epoch and is refused.

Each batch carries the epoch and a random name of its writer: a task restarted with a
fresh checkpoint numbers its batches from 0 again, and the reader tells its batches apart.
"""

from __future__ import annotations

import secrets
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

from bpm.results import Result


def unwritten(rows: Iterable[Result], after_us: int | None) -> list[Result]:
    """The results after `after_us`, the time of the newest one written (None: nothing written)."""
    return [r for r in rows if after_us is None or r.time_us > after_us]


class FencedError(RuntimeError):
    """A write or claim from an epoch older than the one that holds the task's output."""


@dataclass(frozen=True)
class FenceState:
    """What a task's fence says.

    Attributes:
        epoch: the newest epoch that claimed the output (None: none yet).
        written_us: the time of the newest result written (microseconds since the epoch;
            None: nothing written).
    """

    epoch: int | None = None
    written_us: int | None = None


class Fence(Protocol):
    def state(self) -> FenceState: ...
    def check(self, epoch: int) -> None: ...
    def claim(self, epoch: int) -> FenceState: ...
    def write(self, epoch: int, batch_id: int, rows: Iterable[Result], run: str) -> tuple[int | None, int]: ...
    def progress(self, epoch: int, closed_us: int) -> None: ...


class FencedSink:
    """A task's sink under high availability (`start_query(..., sink=...)`).

    As a primary (an epoch given) it writes every batch through the task's `fence`.
    As a standby (epoch None, an active-standby replica) it holds its rows back, dropping
    those the primary has written already, until `promote(epoch)`: then it claims the
    output, writes the results it holds that the primary never wrote, and goes on as the
    primary. A fenced write raises `FencedError`, which fails the query: a host that lost
    its task stops. `fence`: the task's fence (`spark_agents.broker.results.BrokerFence`).

    Attributes:
        epoch: the epoch it writes at (None while standby).
        run: this writer's name in its batches.
        written: rows written; dropped: rows left out as already written.
        held: rows held back, per batch id (standby only).
        batches: the fence's sequence of each batch it wrote.
        closed: the newest time through which it said every result is out (`closed_through`).
        until_s: where the task's span of event time ends (a split or merge handed its key
            groups over then, at a multiple of the query's `align`, `spark_agents.regrain`):
            the results after it are another task's, and are left out. A query that read
            rows past it before its input was ended holds them in its state; they never
            reach the output.
    """

    def __init__(self, fence: Fence, epoch: int | None, run: str | None = None) -> None:
        self.fence = fence
        self.epoch = epoch
        self.run = run or secrets.token_hex(4)
        self.written = 0
        self.dropped = 0
        self.held: dict[int, list[Result]] = {}
        self.batches: list[int] = []
        self.closed: int | None = None
        self.until_s: int | None = None
        self._claimed = False
        self._lock = threading.Lock()

    @property
    def standby(self) -> bool:
        return self.epoch is None

    def __call__(self, batch_id: int, rows: list[Result]) -> None:
        with self._lock:
            if self.until_s is not None:
                until_us = self.until_s * 1_000_000
                rows = [r for r in rows if r.time_us <= until_us]
            if self.epoch is None:
                self._hold(batch_id, rows)
            else:
                self._write(batch_id, rows)

    def _write(self, batch_id: int, rows: list[Result]) -> None:
        assert self.epoch is not None
        if not rows:
            # Nothing to write, but a host that lost its task should learn it at its first batch.
            self.fence.check(self.epoch)
            return
        if not self._claimed:
            # A new writer looks at the files themselves once, even at an epoch already claimed.
            self.fence.claim(self.epoch)
            self._claimed = True
        seq, dropped = self.fence.write(self.epoch, batch_id, rows, self.run)
        self.dropped += dropped
        if seq is not None:
            self.written += len(rows) - dropped
            self.batches.append(seq)

    def closed_through(self, time_us: int) -> None:
        """Say, through the fence, that every result of time `time_us` or before has been
        written (a primary's, when that time moved on; a standby says nothing)."""
        with self._lock:
            if self.epoch is None or (self.closed is not None and time_us <= self.closed):
                return
            if not self._claimed:
                self.fence.claim(self.epoch)
                self._claimed = True
            self.fence.progress(self.epoch, time_us)
            self.closed = time_us

    def _hold(self, batch_id: int, rows: list[Result]) -> None:
        after = self.fence.state().written_us
        if rows:
            self.held[batch_id] = rows
        if after is not None:
            for held_id in list(self.held):
                kept = unwritten(self.held[held_id], after)
                self.dropped += len(self.held[held_id]) - len(kept)
                if kept:
                    self.held[held_id] = kept
                else:
                    del self.held[held_id]

    def promote(self, epoch: int) -> int:
        """Take the output over at `epoch`: claim it, write the held rows it still lacks; returns rows written."""
        with self._lock:
            before = self.written
            self.fence.claim(epoch)
            self.epoch, self._claimed = epoch, True
            held, self.held = self.held, {}
            for batch_id in sorted(held):
                self._write(batch_id, held[batch_id])
            return self.written - before
