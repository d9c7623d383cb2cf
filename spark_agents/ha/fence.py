"""The output fence: a task's output takes each window once, and only from the task's current epoch.

Per task, the output folder holds `_fence.json`: the newest epoch that claimed the task's
output and the end of the newest window written there (epoch seconds). A writer of epoch e:

- claims the output before its first write: it is refused (`FencedError`) when a newer
  epoch holds it; otherwise it records e and takes as the newest window the latest end in
  any batch file of the task (not only the fence's copy: a writer killed between writing a
  file and updating the fence leaves the fence one batch behind);
- writes a batch only while holding the folder's lock (`flock` on `_fence.lock`), after
  checking that no newer epoch claimed the output meanwhile, and only the rows of windows
  that end after the newest one written; then it advances the fence.

Why this is exact: in append mode each window's rows come in one micro-batch, and windows
close in the order of their ends (the watermark never moves back and drops rows older than
itself), so "ends after the newest window written" is precisely "not written yet". A
replay (passive standby's restart from its last copy, upstream backup's rebuild from the
acknowledged position) or a promoted replica re-emits windows that are already out, and
the fence drops them. Windows that a replay sees only in part (upstream backup starts in
the middle of windows that already closed) count at most what the whole window counted, so
any alert they raise was raised by the whole window and is already out too. A host that
comes back after its task failed over holds an older epoch and is refused.

Batch files carry the epoch and a random name of the writer (`bpm.zeek.results`): a task
restarted with a fresh checkpoint numbers its batches from 0 again and must never replace
an earlier file. The lock is a POSIX advisory lock, which a local or NFS folder offers; an
object store would need a conditional write (compare-and-set of the fence) instead.
"""

from __future__ import annotations

import fcntl
import json
import os
import secrets
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from bpm.zeek.definitions import ResultRow
from bpm.zeek.results import batch_files, read_batch, write_batch

FENCE_FILE = "_fence.json"
LOCK_FILE = "_fence.lock"


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


class OutputFence:
    """The fence of one task's output folder (see the module text)."""

    def __init__(self, output_dir: str | Path, task_id: str) -> None:
        self.output_dir = Path(output_dir)
        self.task_id = task_id
        self.folder = self.output_dir / task_id

    def state(self) -> FenceState:
        """The fence as last written (no lock: a reader may see it one batch behind)."""
        try:
            data = json.loads((self.folder / FENCE_FILE).read_text())
        except (OSError, ValueError):
            return FenceState()
        return FenceState(data.get("epoch"), data.get("window_end"))

    @contextmanager
    def _locked(self) -> Iterator[None]:
        self.folder.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.folder / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # closing releases the lock, as does the death of the process

    def _save(self, state: FenceState) -> None:
        target = self.folder / FENCE_FILE
        temp = target.with_name(f".{FENCE_FILE}.{os.getpid()}.{threading.get_ident()}.tmp")
        temp.write_text(json.dumps({"epoch": state.epoch, "window_end": state.window_end}))
        os.replace(temp, target)

    def _written_end(self) -> int | None:
        ends = [row.window_end for path in batch_files(self.folder) for row in read_batch(path)]
        return max(ends, default=None)

    def check(self, epoch: int) -> None:
        """Raise `FencedError` if a newer epoch than `epoch` holds the output (no lock: a cheap early check)."""
        self._check(self.state(), epoch)

    def _check(self, current: FenceState, epoch: int) -> None:
        if current.epoch is not None and current.epoch > epoch:
            raise FencedError(f"task {self.task_id}: epoch {epoch} is fenced; epoch {current.epoch} holds its output")

    def _claim_locked(self, epoch: int) -> FenceState:
        current = self.state()
        self._check(current, epoch)
        ends = [e for e in (current.window_end, self._written_end()) if e is not None]
        claimed = FenceState(epoch, max(ends, default=None))
        self._save(claimed)
        return claimed

    def claim(self, epoch: int) -> FenceState:
        """Make `epoch` the holder of the output (refused when a newer one holds it); returns the fence.

        Claiming fences every older epoch: their writes are refused from now on. The
        failover calls it for the new host before that host writes anything.
        """
        with self._locked():
            return self._claim_locked(epoch)

    def write(self, epoch: int, batch_id: int, rows: Iterable[ResultRow], run: str) -> tuple[Path | None, int]:
        """Write the rows of windows not written yet as one batch file of writer `run` at `epoch`.

        Returns the file (None when no row was new) and how many rows were dropped as
        already written. Raises `FencedError` when a newer epoch holds the output.
        """
        rows = list(rows)
        with self._locked():
            current = self.state()
            self._check(current, epoch)
            if current.epoch != epoch:
                current = self._claim_locked(epoch)
            after = current.window_end
            fresh = unwritten(rows, after)
            if not fresh:
                return None, len(rows)
            path = write_batch(self.output_dir, self.task_id, batch_id, fresh, epoch, run)
            self._save(FenceState(epoch, max([r.window_end for r in fresh] + ([after] if after is not None else []))))
            return path, len(rows) - len(fresh)


class FencedSink:
    """A task's sink under high availability (`start_query(..., sink=...)`).

    As a primary (an epoch given) it writes every batch through the task's `OutputFence`.
    As a standby (epoch None, an active-standby replica) it holds its rows back, dropping
    those the primary has written already, until `promote(epoch)`: then it claims the
    output, writes what it holds of windows the primary never wrote, and goes on as the
    primary. A fenced write raises `FencedError`, which fails the query: a host that lost
    its task stops. `fence` is the task's fence: its `OutputFence` in `output_dir` unless
    given (`spark_agents.broker.results.BrokerFence`: on the origin's broker).

    Attributes:
        epoch: the epoch it writes at (None while standby).
        run: this writer's name in its batch files.
        written: rows written; dropped: rows left out as already written.
        held: rows held back, per batch id (standby only).
    """

    def __init__(self, output_dir: str | Path, task_id: str, epoch: int | None, run: str | None = None, fence=None) -> None:
        self.fence = fence if fence is not None else OutputFence(output_dir, task_id)
        self.epoch = epoch
        self.run = run or secrets.token_hex(4)
        self.written = 0
        self.dropped = 0
        self.held: dict[int, list[ResultRow]] = {}
        self.files: list[Path] = []
        self._claimed = False
        self._lock = threading.Lock()

    @property
    def standby(self) -> bool:
        return self.epoch is None

    def __call__(self, batch_id: int, rows: list[ResultRow]) -> None:
        with self._lock:
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
        path, dropped = self.fence.write(self.epoch, batch_id, rows, self.run)
        self.dropped += dropped
        if path is not None:
            self.written += len(rows) - dropped
            self.files.append(path)

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
