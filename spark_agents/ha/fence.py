"""The output fence: a task's output takes each window once, and only from the task's current epoch.

A task's fence is kept where its results go, on its origin's broker
(`spark_agents.broker.results.BrokerFence`): the newest epoch that claimed the task's output
and the end of the newest window written, changed only by compare-and-set. A writer of epoch e:

- claims the output before its first write: it is refused (`FencedError`) when a newer
  epoch holds it;
- writes a batch only if no newer epoch claimed the output meanwhile, and only the rows of
  windows that end after the newest one written; the same conditional write advances the fence.

Why this is exact: in append mode each window's rows come in one micro-batch, and windows
close in the order of their ends (the watermark never moves back and drops rows older than
itself), so "ends after the newest window written" is precisely "not written yet". A
replay (passive standby's restart from its last copy, upstream backup's rebuild from the
acknowledged position) or a promoted replica re-emits windows that are already out, and
the fence drops them. Windows that a replay sees only in part (upstream backup starts in
the middle of windows that already closed) count at most what the whole window counted, so
any alert they raise was raised by the whole window and is already out too. A host that
comes back after its task failed over holds an older epoch and is refused.

Each batch carries the epoch and a random name of its writer: a task restarted with a
fresh checkpoint numbers its batches from 0 again, and the reader tells its batches apart.
"""

from __future__ import annotations

import secrets
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

from bpm.zeek.definitions import ResultRow


def unwritten(rows: Iterable[ResultRow], after: int | None) -> list[ResultRow]:
    """The rows of windows that end after `after`, the end of the newest window written (None: nothing written)."""
    return [r for r in rows if after is None or r.window_end > after]


class FencedError(RuntimeError):
    """A write or claim from an epoch older than the one that holds the task's output."""


@dataclass(frozen=True)
class FenceState:
    """What a task's fence says.

    Attributes:
        epoch: the newest epoch that claimed the output (None: none yet).
        window_end: end of the newest window written (epoch seconds; None: nothing written).
    """

    epoch: int | None = None
    window_end: int | None = None


class Fence(Protocol):
    def state(self) -> FenceState: ...
    def check(self, epoch: int) -> None: ...
    def claim(self, epoch: int) -> FenceState: ...
    def write(self, epoch: int, batch_id: int, rows: Iterable[ResultRow], run: str) -> tuple[int | None, int]: ...
    def progress(self, epoch: int, closed: int) -> None: ...


class FencedSink:
    """A task's sink under high availability (`start_query(..., sink=...)`).

    As a primary (an epoch given) it writes every batch through the task's `fence`.
    As a standby (epoch None, an active-standby replica) it holds its rows back, dropping
    those the primary has written already, until `promote(epoch)`: then it claims the
    output, writes what it holds of windows the primary never wrote, and goes on as the
    primary. A fenced write raises `FencedError`, which fails the query: a host that lost
    its task stops. `fence`: the task's fence (`spark_agents.broker.results.BrokerFence`).

    Attributes:
        epoch: the epoch it writes at (None while standby).
        run: this writer's name in its batches.
        written: rows written; dropped: rows left out as already written.
        held: rows held back, per batch id (standby only).
        batches: the fence's sequence of each batch it wrote.
        closed: the end of the newest window it said was closed (`closed_through`).
        until_s: where the task's span of event time ends (a split or merge handed its key
            groups over at that window start, `spark_agents.regrain`): the rows of windows
            starting there or later are another task's, and are left out. A query that read
            rows past it before its input was ended holds them in its state; they never
            reach the output.
    """

    def __init__(self, fence: Fence, epoch: int | None, run: str | None = None) -> None:
        self.fence = fence
        self.epoch = epoch
        self.run = run or secrets.token_hex(4)
        self.written = 0
        self.dropped = 0
        self.held: dict[int, list[ResultRow]] = {}
        self.batches: list[int] = []
        self.closed: int | None = None
        self.until_s: int | None = None
        self._claimed = False
        self._lock = threading.Lock()

    @property
    def standby(self) -> bool:
        return self.epoch is None

    def __call__(self, batch_id: int, rows: list[ResultRow]) -> None:
        with self._lock:
            if self.until_s is not None:
                rows = [r for r in rows if r.window_start < self.until_s]
            if self.epoch is None:
                self._hold(batch_id, rows)
            else:
                self._write(batch_id, rows)

    def _write(self, batch_id: int, rows: list[ResultRow]) -> None:
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

    def closed_through(self, window_end: int) -> None:
        """Say, through the fence, that every window ending by `window_end` has been written
        (a primary's, once per newly closed window; a standby says nothing)."""
        with self._lock:
            if self.epoch is None or (self.closed is not None and window_end <= self.closed):
                return
            if not self._claimed:
                self.fence.claim(self.epoch)
                self._claimed = True
            self.fence.progress(self.epoch, window_end)
            self.closed = window_end

    def _hold(self, batch_id: int, rows: list[ResultRow]) -> None:
        after = self.fence.state().window_end
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
