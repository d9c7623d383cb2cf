"""A task's input as the HA roles see it: its key groups of its origin's JetStream stream
(`JetStreamInput`), where a restart may start (a position is the stream sequence read up to:
a restart reads after it), the stream's acknowledgements (the origin's `ACKS` bucket,
`spark_agents.broker.retention`), and the task's output fence (the results subject on the
origin's broker, `spark_agents.broker.results.BrokerFence`).

Only the origin writes its acknowledgements: a task at the origin acks through its own
`Retention` (`OwnAcks`); a partner hosting the task sends its acknowledgement to the
origin's agent (`SentAcks`: `POST /broker/{task}/ack`, on the registry's `stream` token) and
reads no acknowledgement back (`acked` is None: a takeover there replays what the stream
retains, and the fence drops what was written). Which consumers the origin keeps is the
origin's business (`spark_agents.agent.Agent.retained`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from bpm.keygroups import MAIN
from bpm.query import Params, Query
from spark_agents.broker.results import broker_sink, final_bound
from spark_agents.ha.fence import FencedSink
from spark_agents.ha.upstream import processed_ack_seq, replay_seq

if TYPE_CHECKING:
    from spark_agents.broker.results import RegistryEpoch
    from spark_agents.broker.retention import Retention
    from spark_agents.broker.source import JetStreamInput


class Acks(Protocol):
    def register(self, consumer: str) -> None: ...
    def ack(self, consumer: str, seq: int) -> None: ...
    def acked(self, consumer: str) -> int | None: ...
    def release(self, consumer: str) -> None: ...
    def trim(self) -> None: ...


@dataclasses.dataclass
class OwnAcks:
    """The acknowledgements of key groups `prefix` of input `input` on the origin's own `Retention` (at the origin)."""

    retention: Retention
    prefix: str
    input: str = MAIN

    def register(self, consumer: str) -> None:
        if consumer not in self.retention.acks():
            self.retention.register(consumer, self.prefix, self.input)

    def ack(self, consumer: str, seq: int) -> None:
        self.retention.ack(consumer, self.prefix, seq, self.input)

    def acked(self, consumer: str) -> int | None:
        ack = self.retention.acks().get(consumer)
        return None if ack is None else ack.seq

    def release(self, consumer: str) -> None:
        self.retention.release(consumer)

    def trim(self) -> None:
        self.retention.trim()


@dataclasses.dataclass
class SentAcks:
    """A partner's acknowledgements, sent to the origin's agent (`send(seq)`); the origin keeps
    and releases its consumers by what the registry says, so registering and releasing are
    the origin's, and nothing is read back."""

    send: Callable[[int], Any]

    def register(self, consumer: str) -> None:
        pass

    def ack(self, consumer: str, seq: int) -> None:
        self.send(seq)

    def acked(self, consumer: str) -> int | None:
        return None

    def release(self, consumer: str) -> None:
        pass

    def trim(self) -> None:
        pass


@dataclasses.dataclass
class TaskInput:
    """A task's key groups of its origin's broker stream, read as `source` says, acknowledged
    through `acks`; its fence believes claims up to what `registry_epoch` says
    (`spark_agents.broker.results.BrokerFence`)."""

    source: JetStreamInput
    acks: Acks
    registry_epoch: RegistryEpoch | None = None

    def register(self, consumer: str) -> None:
        self.acks.register(consumer)

    def ack(self, consumer: str, position: int) -> None:
        self.acks.ack(consumer, position)

    def acked(self, consumer: str) -> int | None:
        return self.acks.acked(consumer)

    def release(self, consumer: str) -> None:
        self.acks.release(consumer)

    def trim(self) -> None:
        self.acks.trim()

    def newest(self) -> int:
        return self.source.newest_seq()

    def processed(self, checkpoint_dir: Path) -> int | None:
        return processed_ack_seq(checkpoint_dir)

    def replay_from(self, checkpoint_dir: Path, query: Query, params: Params) -> int | None:
        """Where a replay with a fresh checkpoint rebuilds the task's state (`replay_seq`): its
        results are independent at multiples of the query's `align`; a query without one
        has state of any age, and is replayed from the start of what the stream keeps."""
        align = query.align_s(params)
        return None if align is None else replay_seq(checkpoint_dir, align, query.lateness_s(params))

    def sink(self, task_id: str, epoch: int | None, lateness_s: int) -> FencedSink:
        """The task's sink through the fence on its origin's broker (None: a standby's, held
        back), for a query of watermark delay `lateness_s` (`final_bound`)."""
        return broker_sink(self.source.connection(), task_id, epoch, self.registry_epoch, final_bound(self.source, lateness_s))

    def start(self, host: Any, task_id: str, checkpoint_dir: Path | None, query: Query, params: Params, trigger_s: float | None,
              sink: FencedSink, position: int | None = None) -> None:
        source = self.source if position is None else dataclasses.replace(self.source, start_seq=position)
        host.start_task(task_id, source, checkpoint_dir, query, params, trigger_s, sink=sink)
