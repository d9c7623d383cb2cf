"""The HA roles of a task on a participant: its host's periodic duties, the passive backup,
the active replica, and the takeover after the host failed.

| mode | the host, every interval | the second participant | takeover (new epoch) |
|---|---|---|---|
| none | acknowledges the stream after its committed batches | nothing (a warm host) | fresh checkpoint from the newest input |
| upstream_backup | acknowledges where a replay must start (`upstream.py`) | nothing | fresh checkpoint, replay from the acknowledged position |
| passive_standby | packs a delta, ships it, acknowledges the copy's position | applies deltas (`PassiveBackup`) | restart from the last copy, replay since |
| active_standby | acknowledges after its committed batches | runs the task, output held back (`start_replica`) | promote the replica's output |

Every writer goes through the task's output fence (`spark_agents.ha.fence`), so a replay or a
replica never writes a window twice and the failed host, should it come back, is refused.
The stream's acknowledgements are per consumer (a task at a participant,
`consumer_name`): the new host first acknowledges where it starts, then releases the failed
host's consumer, so nothing it needs is trimmed in between.

The stream is a `TaskInput` (`spark_agents.broker.inputs`): a task's key groups of its origin's
broker stream; a position is a stream sequence, read after.

These are building blocks: who fails over, to whom and at which epoch is the registry's
and `bpm.ha.decisions`' business; how bytes travel (HTTP between agents, a socket in the
benchmark) is the caller's (`ship`).
"""

from __future__ import annotations

import logging
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bpm.ha.decisions import HA_MODES
from bpm.query import Params, Query
from spark_agents.ha.delta import Applied, DeltaRefused, DeltaShipper, applied_copy, apply_delta
from spark_agents.ha.fence import FencedSink

if TYPE_CHECKING:
    from spark_agents.broker.inputs import TaskInput

log = logging.getLogger("bpm.ha")


def consumer_name(task_id: str, participant: str) -> str:
    """The stream consumer of one task at one participant."""
    return f"{task_id}.{participant}"


def check_mode(mode: str) -> str:
    if mode not in HA_MODES:
        raise ValueError(f"unknown HA mode {mode!r}; one of {', '.join(HA_MODES)}")
    return mode


class PrimaryDuties:
    """What the host of a task does for its HA mode, every `interval_s` (see the module table).

    `ship(data)` sends a passive-standby delta to the backup and returns once the backup
    applied it (raising if it did not); the delta counts as copied, and the stream is
    acknowledged, only then. `step()` runs one round (the agent may call it from its own
    loop); `start()` runs rounds on a thread until `stop()`.

    Attributes:
        acked: the position last acknowledged (None: none yet).
        rounds, failures: rounds run and rounds that failed (`last_error` says why).
        shipped_bytes: bytes of deltas the backup confirmed.
        cpu_s: CPU seconds the rounds used in this process (their thread's clock).
        paused: while set, the thread skips its rounds (a benchmark compares the host with and without them).
    """

    def __init__(self, host: Any, task_id: str, mode: str, stream: TaskInput, consumer: str, *,
                 query: Query, params: Params, interval_s: float = 2.0, ship: Callable[[bytes], Any] | None = None) -> None:
        self.host, self.task_id, self.mode = host, task_id, check_mode(mode)
        self.stream, self.consumer = stream, consumer
        self.query, self.params, self.interval_s, self.ship = query, params, interval_s, ship
        if mode == "passive_standby" and ship is None:
            raise ValueError("passive standby needs a way to ship deltas to the backup")
        self.shipper = DeltaShipper(self.checkpoint_dir) if mode == "passive_standby" else None
        self.acked: int | None = None
        self.rounds = self.failures = self.shipped_bytes = 0
        self.cpu_s = 0.0
        self.last_error: str | None = None
        self.paused = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def checkpoint_dir(self) -> Path:
        return next(t.checkpoint_dir for t in self.host.tasks() if t.task_id == self.task_id)

    def step(self) -> int | None:
        """One round: copy (passive standby), then acknowledge; returns the position acknowledged."""
        began = time.thread_time()
        try:
            return self._step()
        finally:
            self.cpu_s += time.thread_time() - began

    def _step(self) -> int | None:
        checkpoint = self.checkpoint_dir
        if self.shipper is not None:
            assert self.ship is not None
            delta = self.shipper.pack()
            self.ship(delta.data)
            self.shipper.confirm(delta)
            self.shipped_bytes += len(delta.data)
            position = delta.ack_position
        elif self.mode == "upstream_backup":
            position = self.stream.replay_from(checkpoint, self.query, self.params)
        else:
            position = self.stream.processed(checkpoint)
        if position is not None and position != self.acked:
            self.stream.ack(self.consumer, position)
            self.acked = position
        self.rounds += 1
        return position

    def start(self) -> PrimaryDuties:
        self.stream.register(self.consumer)

        def loop() -> None:
            while not self._stop.wait(self.interval_s):
                if self.paused.is_set():
                    continue
                try:
                    self.step()
                except Exception as exc:  # noqa: BLE001 - a round that fails is retried next interval
                    self.failures += 1
                    self.last_error = f"{type(exc).__name__}: {exc}"
                    log.warning("HA duties of %s: %s", self.task_id, self.last_error)

        self._thread = threading.Thread(target=loop, name=f"bpm-ha-{self.task_id}", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread.is_alive():
            self._thread.join(timeout=self.interval_s + 30)


class PassiveBackup:
    """The backup participant's copy of a task's checkpoint under passive standby.

    Attributes:
        backup_dir: the copy (a restartable checkpoint after every applied delta).
        applied: what the last applied delta left (None: none yet).
        promoted: whether the copy became the live checkpoint (it then refuses deltas).
        cpu_s: CPU seconds spent applying deltas (the applying thread's clock).
    """

    def __init__(self, backup_dir: str | Path) -> None:
        self.backup_dir = Path(backup_dir)
        self.applied: Applied | None = applied_copy(self.backup_dir)
        self.promoted = False
        self.cpu_s = 0.0
        self._lock = threading.Lock()

    def apply(self, data: bytes) -> Applied:
        """Apply a delta from the primary (refused once promoted, or when older than the copy)."""
        with self._lock:
            if self.promoted:
                raise DeltaRefused(f"{self.backup_dir} was promoted; it takes no more deltas")
            began = time.thread_time()
            try:
                self.applied = apply_delta(data, self.backup_dir)
            finally:
                self.cpu_s += time.thread_time() - began
            return self.applied

    def promote(self) -> Path:
        """Stop taking deltas; the copy is now the task's checkpoint."""
        with self._lock:
            self.promoted = True
            self.backup_dir.mkdir(parents=True, exist_ok=True)
            return self.backup_dir


def start_primary(host: Any, task_id: str, stream: TaskInput, epoch: int, query: Query, params: Params, *,
                  trigger_s: float | None = 1.0, checkpoint_dir: str | Path | None = None,
                  start_position: int | None = None) -> FencedSink:
    """Start the task as its host at `epoch`, writing through the output fence; returns its sink."""
    sink = stream.sink(task_id, epoch, query.lateness_s(params))
    stream.start(host, task_id, checkpoint_dir, query, params, trigger_s, sink, start_position)
    return sink


def start_replica(host: Any, task_id: str, stream: TaskInput, query: Query, params: Params, *,
                  trigger_s: float | None = 1.0, checkpoint_dir: str | Path | None = None) -> FencedSink:
    """Start an active-standby replica: the same query on the same input, its output held back.

    A replica started with the primary reads the stream from the start. One started later
    (repair) must start from a copy of the live task's checkpoint (a delta cut, or a
    handover pack) in `checkpoint_dir`, and its consumer must be registered before that
    copy is taken, so that the stream keeps what the copy has not read.
    """
    sink = stream.sink(task_id, None, query.lateness_s(params))
    stream.start(host, task_id, checkpoint_dir, query, params, trigger_s, sink)
    return sink


@dataclass(frozen=True)
class Takeover:
    """What a takeover did.

    Attributes:
        mode: the task's HA mode.
        epoch: the epoch the new host writes at.
        start_position: where the new host reads the stream from (None: from its checkpoint).
        checkpoint_dir: the new host's checkpoint.
        sink: the new host's output sink.
        promoted_rows: rows an active replica wrote at once from what it held back.
        started_s: how long the takeover took (the task's start or the replica's promotion).
    """

    mode: str
    epoch: int
    start_position: int | None
    checkpoint_dir: Path | None
    sink: FencedSink
    promoted_rows: int
    started_s: float


def take_over(host: Any, task_id: str, mode: str, *, epoch: int, stream: TaskInput, consumer: str,
              failed_consumer: str | None, query: Query, params: Params, trigger_s: float | None = 1.0,
              checkpoint_dir: str | Path | None = None, backup: PassiveBackup | None = None,
              replica: FencedSink | None = None) -> Takeover:
    """Take the task over from its failed host, at the new `epoch` (see the module table).

    - none: a fresh checkpoint (the folder `checkpoint_dir` is emptied) reading from the
      stream's next position: what was in flight is lost;
    - upstream_backup: a fresh checkpoint reading from the failed host's acknowledged position
      (the whole retained stream where that is not known here: the fence drops what was written);
    - passive_standby: `backup`'s copy becomes the checkpoint; the stream since its cut is replayed;
    - active_standby: `replica` (the running replica's sink) takes the output over at once.
    """
    check_mode(mode)
    began = time.perf_counter()
    start: int | None = None
    promoted = 0
    folder: Path | None = None
    if mode == "active_standby":
        if replica is None:
            raise ValueError("active standby takes over with the replica's sink")
        promoted = replica.promote(epoch)
        sink = replica
    else:
        if mode == "passive_standby":
            if backup is None:
                raise ValueError("passive standby takes over from the backup's copy")
            folder = backup.promote()
            applied = backup.applied
            start = applied.ack_position if applied is not None else None
            if start is None:  # no copy of any batch: the copy is an empty checkpoint, replay what the failed host kept
                start = stream.acked(failed_consumer or "") or 0
        else:
            folder = Path(checkpoint_dir) if checkpoint_dir is not None else host.work_dir / "checkpoints" / task_id
            shutil.rmtree(folder, ignore_errors=True)
            if mode == "none":
                start = stream.newest()
            else:
                start = stream.acked(failed_consumer or "") or 0
        stream.ack(consumer, start)
        sink = stream.sink(task_id, epoch, query.lateness_s(params))
        sink.fence.claim(epoch)  # fence the failed host before anything else runs
        restart_from_copy = mode == "passive_standby" and backup is not None and backup.applied is not None
        stream.start(host, task_id, folder, query, params, trigger_s, sink, None if restart_from_copy else start)
    if failed_consumer is not None and failed_consumer != consumer:
        stream.release(failed_consumer)
    return Takeover(mode, epoch, start, folder, sink, promoted, time.perf_counter() - began)
