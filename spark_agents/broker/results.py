"""A task's results on its origin's broker, written through an epoch fence the broker enforces.

The origin's server keeps the stream `RESULTS` (subjects `out.<origin>.<task>`). A task's
subject holds, in order, *claims*, *batches* and *progress* marks: a claim says that an
epoch holds the task's output from now on; a batch carries the results of one micro-batch
(`bpm.results.Result.to_wire`), its writer's epoch and the time of the newest result written
so far; a progress mark says that every result of its `closed_us` time or before is out
(`FencedSink.closed_through`), results or none. Every publish names the sequence
of the last message it expects on the subject (`Nats-Expected-Last-Subject-Sequence`), so
the broker itself refuses a write that something else preceded: a compare-and-set.

`BrokerFence` has the `OutputFence` interface (`state`, `check`, `claim`, `write`) and
its rule (`spark_agents.ha.fence.unwritten`): a writer of epoch e claims before it writes,
is refused when a newer epoch has claimed, and writes only the results after the newest
one written. A host that lost its task and writes late finds a newer
claim ahead of it: the broker refuses its publish and the writer raises `FencedError`.
Replays, restarts and promoted replicas write each result once.

A claim's epoch is written by the claiming host, so the fence does not take it on trust: a
claim newer than the writer's own epoch counts only up to the newest epoch the registry has
given the task (`registry_epoch`, asked then, after the claim was read). Epochs only grow
and a host learns its epoch from the registry before it claims, so a claim beyond the
registry's newest is no placement at all: a host that claimed an epoch of 10^9 while it held
the task jams nobody, and the registry's newest host claims over it.

A batch's `written_us` is written by its host too: one that held the task could write a
time years ahead, and every later host would drop every result as written. No result is
final before the watermark reaches its time (`bpm.query`), and the watermark never passes
the newest event time the task's input holds, which only the origin's feeder writes (its
ticks and end-of-input marks), less the query's lateness: a `written_us` past that
(`final_bound`, read of the task's key groups then) is no writing at all. The fence then
counts nothing as written: the new writer writes every result it computes, and a result
the jamming host had written may come twice, which a reader tells by its key; nothing is
lost. A `written_us` within the bound drops only results that were final while the jamming
host held the task, which it could have left unwritten anyway. (A feeder restarted on older
input than it fed before can make an honest fence look forged, with the same outcome.)

Partners read the fence as the last message of their task's subject only (JetStream's
direct get with the subject in the request's own subject, `partner_user`), never another
message of the stream by its sequence.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import nats
from nats.js.api import StorageType, StreamConfig

from bpm.results import OutputSet, Result
from spark_agents.broker.stream import Broker
from spark_agents.broker.subjects import RESULTS, results_subject
from spark_agents.ha.fence import FencedError, FencedSink, FenceState, unwritten

if TYPE_CHECKING:
    from spark_agents.broker.source import JetStreamInput

_WRONG_LAST_SEQUENCE = 10071
log = logging.getLogger(__name__)


def ensure_results(broker: Broker) -> None:
    """Create the results stream on this server if it does not exist."""

    async def ensure() -> None:
        try:
            await broker.js.stream_info(RESULTS)
        except nats.js.errors.NotFoundError:
            await broker.js.add_stream(StreamConfig(name=RESULTS, subjects=["out.>"], storage=StorageType.FILE, allow_direct=True))
            return
        info = await broker.js.stream_info(RESULTS)
        if not info.config.allow_direct:  # made before partners read their fence by direct get
            info.config.allow_direct = True
            await broker.js.update_stream(info.config)

    broker.call(ensure())


# task key -> the newest epoch the registry has given the task (None: it does not know the task)
RegistryEpoch = Callable[[str], "int | None"]
# The newest time a result of the task can be final at, microseconds (None: nothing bounds it): `final_bound`.
FinalBound = Callable[[], "int | None"]


def final_bound(source: JetStreamInput, lateness_s: int) -> FinalBound:
    """The bound of the results of a task over `source` whose query's watermark delay is
    `lateness_s`: the newest event time its key groups hold less that delay."""

    def bound() -> int | None:
        end = source.newest_time_us()
        return None if end is None else end - lateness_s * 1_000_000

    return bound


class Ceiling:
    """A `FinalBound` read again only when a time passes the one read before (the bound only
    grows): a writer's times stay below it, and one read serves until the input moves on."""

    def __init__(self, read: FinalBound) -> None:
        self.read = read
        self.value: int | None = None  # the newest bound read (None: none yet)

    def passed_by(self, time_us: int) -> bool:
        """Whether `time_us` lies past the bound (False while nothing bounds it: no input yet, or trimmed)."""
        if self.value is not None and time_us <= self.value:
            return False
        bound = self.read()
        if bound is None:
            return False
        self.value = bound if self.value is None else max(self.value, bound)
        return time_us > self.value


class BrokerFence:
    """Task `task_id`'s output fence on its origin's broker (`broker`: a connection to it; the
    origin makes the results stream if it is not there, a partner finds it made).

    `registry_epoch` bounds the claims this fence believes, and `bound` the time written
    (`final_bound`; see the module text); without them every claim and time is believed, as
    in a test with no registry.
    """

    def __init__(self, broker: Broker, task_id: str, registry_epoch: RegistryEpoch | None = None,
                 bound: FinalBound | None = None) -> None:
        self.broker = broker
        self.task_id = task_id
        self.subject = results_subject(task_id)
        self.registry_epoch = registry_epoch
        self.ceiling = None if bound is None else Ceiling(bound)
        if broker.user == task_id.partition(".")[0]:
            ensure_results(broker)

    def _last(self) -> tuple[FenceState, int]:
        """The fence as the subject's last message says, and that message's sequence (0: none)."""

        async def last():
            try:
                return await self.broker.js.get_last_msg(RESULTS, self.subject, direct=True)
            except nats.js.errors.NotFoundError:
                return None

        msg = self.broker.call(last())
        if msg is None:
            return FenceState(None, None), 0
        body = json.loads(msg.data)
        return FenceState(body["epoch"], self._believed(body["written_us"], body["epoch"])), msg.seq

    def _believed(self, written_us: int | None, epoch: int | None) -> int | None:
        """`written_us`, or None when it lies past the newest time a result can be final at (`bound`)."""
        if written_us is None or self.ceiling is None or not self.ceiling.passed_by(written_us):
            return written_us
        log.warning("task %s: epoch %s wrote results up to %d us, past the newest time its input lets a result be final at "
                    "(%d us): nothing counts as written", self.task_id, epoch, written_us, self.ceiling.value)
        return None

    def state(self) -> FenceState:
        return self._last()[0]

    def check(self, epoch: int) -> None:
        """Raise `FencedError` if a newer epoch than `epoch` holds the output."""
        self._check(self.state(), epoch)

    def _check(self, current: FenceState, epoch: int) -> None:
        if current.epoch is None or current.epoch <= epoch:
            return
        newest = None if self.registry_epoch is None else self.registry_epoch(self.task_id)
        holder = current.epoch if newest is None else min(current.epoch, newest)
        if holder > epoch:
            raise FencedError(f"task {self.task_id}: epoch {epoch} is fenced; epoch {holder} holds its output")

    def _publish(self, body: dict, after: int) -> int | None:
        """Publish `body` if the subject's last message is still `after`; its sequence, or None if something came first."""
        headers = {"Nats-Expected-Last-Subject-Sequence": str(after)}
        try:
            return self.broker.call(self.broker.js.publish(self.subject, json.dumps(body).encode(), stream=RESULTS, headers=headers)).seq
        except nats.js.errors.APIError as exc:
            if exc.err_code == _WRONG_LAST_SEQUENCE:
                return None
            raise

    def claim(self, epoch: int) -> FenceState:
        """Make `epoch` the holder of the output (refused when a newer one holds it); returns the fence."""
        while True:
            current, seq = self._last()
            self._check(current, epoch)
            if self._publish({"kind": "claim", "epoch": epoch, "written_us": current.written_us}, seq) is not None:
                return FenceState(epoch, current.written_us)

    def _held(self, epoch: int) -> tuple[FenceState, int]:
        """The fence and its last message's sequence once `epoch` holds the output (claimed
        here if it does not yet); FencedError when a newer epoch does."""
        while True:
            current, seq = self._last()
            self._check(current, epoch)
            if current.epoch == epoch:
                return current, seq
            self.claim(epoch)

    def write(self, epoch: int, batch_id: int, rows: Iterable[Result], run: str) -> tuple[int | None, int]:
        """Publish the results not written yet as one batch of writer `run` at `epoch`.

        Returns the batch's sequence (None when no row was new) and how many rows were
        dropped as already written. Raises `FencedError` when a newer epoch holds the output.
        """
        rows = list(rows)
        while True:
            current, seq = self._held(epoch)
            fresh = unwritten(rows, current.written_us)
            if not fresh:
                return None, len(rows)
            newest = max([r.time_us for r in fresh] + ([current.written_us] if current.written_us is not None else []))
            body = {"kind": "batch", "epoch": epoch, "written_us": newest, "batch_id": batch_id, "run": run, "rows": [r.to_wire() for r in fresh]}
            published = self._publish(body, seq)
            if published is not None:
                return published, len(rows) - len(fresh)
            # Something was published first: a newer claim (fenced, at the next check) or our own
            # publish whose acknowledgement was lost (then its rows are written and drop out).


    def progress(self, epoch: int, closed_us: int) -> None:
        """Publish that every result of time `closed_us` or before has been written, at `epoch` (refused like a write)."""
        while True:
            current, seq = self._held(epoch)
            body = {"kind": "progress", "epoch": epoch, "written_us": current.written_us, "closed_us": closed_us}
            if self._publish(body, seq) is not None:
                return


def broker_sink(broker: Broker, task_id: str, epoch: int | None, registry_epoch: RegistryEpoch | None = None,
                bound: FinalBound | None = None) -> FencedSink:
    """Task `task_id`'s sink writing through its fence on its origin's broker (`broker`: a
    connection to it) at `epoch`; None: an active-standby replica's, its rows held back.
    `registry_epoch`: what bounds the claims the fence believes (`BrokerFence`)."""
    return FencedSink(BrokerFence(broker, task_id, registry_epoch, bound), epoch)


@dataclass(frozen=True)
class ResultBatch:
    """One batch of a task's results as its origin's broker holds it."""

    seq: int
    epoch: int
    batch_id: int
    rows: list[Result]
    at: float = 0.0  # when the broker stored it (seconds since the epoch)


def read_messages(broker: Broker, task_id: str, after: int = 0) -> list[tuple[int, dict, float]]:
    """Every message (claim, batch, progress) on task `task_id`'s results subject after stream
    sequence `after`, in order: (sequence, body, when the broker stored it)."""
    from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

    subject = results_subject(task_id)
    start = {"deliver_policy": DeliverPolicy.BY_START_SEQUENCE, "opt_start_seq": after + 1} if after else {"deliver_policy": DeliverPolicy.ALL}

    async def fetch_all() -> list[tuple[int, bytes, float]]:
        js = broker.js
        try:
            info = await js.add_consumer(RESULTS, ConsumerConfig(filter_subject=subject, ack_policy=AckPolicy.NONE, inactive_threshold=30.0,
                                                                mem_storage=True, **start))
        except nats.js.errors.NotFoundError:
            return []
        out: list[tuple[int, bytes, float]] = []
        pending = info.num_pending
        if pending:
            sub = await js.pull_subscribe_bind(info.name, stream=RESULTS)
            while pending:
                for msg in await sub.fetch(min(256, pending), timeout=10):
                    out.append((msg.metadata.sequence.stream, msg.data, msg.metadata.timestamp.timestamp()))
                    pending = msg.metadata.num_pending
            await sub.unsubscribe()
        await js.delete_consumer(RESULTS, info.name)
        return out

    return [(seq, json.loads(data), at) for seq, data, at in broker.read(fetch_all)]


def closed_through(broker: Broker, task_id: str, after: int = 0) -> tuple[int, int | None]:
    """(the newest sequence read, the newest time through which task `task_id`'s progress
    marks after sequence `after` say every result is out, microseconds; None when none
    does): read on from `after` next time."""
    messages = read_messages(broker, task_id, after)
    closed = [body["closed_us"] for _, body, _ in messages if body.get("kind") == "progress"]
    return (messages[-1][0] if messages else after), max(closed, default=None)


def read_results(broker: Broker, task_id: str, after: int = 0) -> list[ResultBatch]:
    """Every batch task `task_id` has written after stream sequence `after`, in order."""
    return [ResultBatch(seq, body["epoch"], body["batch_id"], [Result.from_wire(r) for r in body["rows"]], at)
            for seq, body, at in read_messages(broker, task_id, after) if body["kind"] == "batch"]


def broker_outputs(broker: Broker, tasks: Iterable[str]) -> OutputSet:
    """Every batch the given tasks have written on this broker, merged (`bpm.results.OutputSet`)."""
    merged = OutputSet()
    for task in tasks:
        for batch in read_results(broker, task):
            merged.add(batch.rows)
    return merged
