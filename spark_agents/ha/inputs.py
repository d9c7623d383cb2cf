"""A task's input as the HA roles see it: what a query reads, where a restart may start, the
stream's acknowledgements, and the task's output fence. One interface, two data planes.

| | stream folder (`PartitionInput`) | broker stream (`KeyGroupsInput`) |
|---|---|---|
| what the query reads | one partition folder | key groups of the origin's JetStream stream (`JetStreamInput`) |
| a position | the first file still needed | the sequence read up to: a restart reads after it |
| acknowledgements | the folder's `_acks` | the origin's `ACKS` bucket (`spark_agents.broker.retention`) |
| output fence | `_fence.json` in the output folder | the results subject on the origin's broker (`BrokerFence`) |

On the broker, only the origin writes its acknowledgements: a task at the origin acks
through its own `Retention`; a partner hosting the task sends its acknowledgement to the
origin's agent (`POST /broker/{task}/ack`, on the registry's `stream` token) and reads no
acknowledgement back (`acked` is None: a takeover there replays what the stream retains,
and the fence drops what was written). Which consumers the origin keeps is the origin's
business (`spark_agents.agent.Agent.retained`).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from bpm.zeek.definitions import QueryParams
from spark_agents.ha.fence import FencedSink
from spark_agents.ha.upstream import processed_ack_position, processed_ack_seq, replay_seq, upstream_ack_position

if TYPE_CHECKING:
    from spark_agents.broker.retention import Retention
    from spark_agents.broker.source import JetStreamInput
    from spark_agents.streams import PartitionedStream


class TaskInput(Protocol):
    def register(self, consumer: str) -> None: ...
    def ack(self, consumer: str, position: int) -> None: ...
    def acked(self, consumer: str) -> int | None: ...
    def release(self, consumer: str) -> None: ...
    def trim(self) -> None: ...
    def newest(self) -> int: ...
    def processed(self, checkpoint_dir: Path) -> int | None: ...
    def replay_from(self, checkpoint_dir: Path, params: QueryParams) -> int | None: ...
    def sink(self, output_dir: Path, task_id: str, epoch: int | None) -> FencedSink: ...
    def start(self, host: Any, task_id: str, checkpoint_dir: Path | None, params: QueryParams, trigger_s: float | None,
              sink: FencedSink, position: int | None = None) -> None: ...


@dataclasses.dataclass
class PartitionInput:
    """Partition `partition` of the stream folder `root` (opened at first use)."""

    root: str | Path
    partition: int

    @functools.cached_property
    def stream(self) -> PartitionedStream:
        from spark_agents.streams import PartitionedStream

        return PartitionedStream(self.root)

    def register(self, consumer: str) -> None:
        self.stream.register(consumer, [self.partition])

    def ack(self, consumer: str, position: int) -> None:
        self.stream.ack(consumer, self.partition, position)

    def acked(self, consumer: str) -> int | None:
        return self.stream.acks().get(consumer, {}).get(self.partition)

    def release(self, consumer: str) -> None:
        self.stream.release(consumer)

    def trim(self) -> None:
        self.stream.trim()

    def newest(self) -> int:
        return self.stream.next_position(self.partition)

    def processed(self, checkpoint_dir: Path) -> int | None:
        return processed_ack_position(checkpoint_dir)

    def replay_from(self, checkpoint_dir: Path, params: QueryParams) -> int | None:
        return upstream_ack_position(self.stream, self.partition, checkpoint_dir, params.window_s)

    def sink(self, output_dir: Path, task_id: str, epoch: int | None) -> FencedSink:
        return FencedSink(output_dir, task_id, epoch)

    def start(self, host: Any, task_id: str, checkpoint_dir: Path | None, params: QueryParams, trigger_s: float | None,
              sink: FencedSink, position: int | None = None) -> None:
        host.start_task(task_id, self.stream.partition_path(self.partition), checkpoint_dir, params, trigger_s, sink=sink,
                        start_position=position)


class Acks(Protocol):
    def register(self, consumer: str) -> None: ...
    def ack(self, consumer: str, seq: int) -> None: ...
    def acked(self, consumer: str) -> int | None: ...
    def release(self, consumer: str) -> None: ...
    def trim(self) -> None: ...


@dataclasses.dataclass
class OwnAcks:
    """The acknowledgements of key groups `prefix` on the origin's own `Retention` (at the origin)."""

    retention: Retention
    prefix: str

    def register(self, consumer: str) -> None:
        if consumer not in self.retention.acks():
            self.retention.register(consumer, self.prefix)

    def ack(self, consumer: str, seq: int) -> None:
        self.retention.ack(consumer, self.prefix, seq)

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
class KeyGroupsInput:
    """A task's key groups of its origin's broker stream, read as `source` says."""

    source: JetStreamInput
    acks: Acks

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
        return self.source.last_seq()

    def processed(self, checkpoint_dir: Path) -> int | None:
        return processed_ack_seq(checkpoint_dir)

    def replay_from(self, checkpoint_dir: Path, params: QueryParams) -> int | None:
        return replay_seq(checkpoint_dir, params.window_s, params.lateness_s)

    def sink(self, output_dir: Path, task_id: str, epoch: int | None) -> FencedSink:
        from spark_agents.broker.results import broker_sink

        return broker_sink(self.source.connection(), task_id, epoch)

    def start(self, host: Any, task_id: str, checkpoint_dir: Path | None, params: QueryParams, trigger_s: float | None,
              sink: FencedSink, position: int | None = None) -> None:
        source = self.source if position is None else dataclasses.replace(self.source, start_seq=position)
        host.start_task(task_id, source, checkpoint_dir, params, trigger_s, sink=sink)
