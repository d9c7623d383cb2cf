"""Retention of a participant's input stream: kept while a consumer still needs it, trimmed on acknowledgement.

The key-value bucket `ACKS` on the participant's own server holds, per consumer (a task at a
participant: a task, its passive replica, the origin keeping what upstream backup may
replay), the key groups it reads (an input and a prefix, `bpm.keygroups`) and the stream sequence up
to which it needs nothing more. An acknowledgement never moves back (compare-and-set on
the entry's revision). `trim` purges, per key group, the messages at or below the
smallest acknowledgement of the consumers that read that group, and nothing of a group
no consumer reads: what nobody has claimed yet stays.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import nats

from bpm.keygroups import MAIN, check_input, check_prefix, groups, subject
from bpm.names import check_name
from spark_agents.broker.stream import Broker
from spark_agents.broker.subjects import INPUT

BUCKET = "ACKS"


@dataclass(frozen=True)
class Ack:
    prefix: str
    seq: int  # every message up to this sequence is no longer needed (0: all are)
    input: str = MAIN


class Retention:
    """The acknowledgements of `participant`'s input stream on its broker (`broker`: the owner's connection)."""

    def __init__(self, broker: Broker, participant: str) -> None:
        self.broker = broker
        self.participant = participant

        async def bucket():
            try:
                return await broker.js.key_value(BUCKET)
            except nats.js.errors.BucketNotFoundError:
                return await broker.js.create_key_value(bucket=BUCKET, history=1)

        self.kv = broker.call(bucket())

    def _get(self, consumer: str) -> tuple[Ack | None, int]:
        async def get():
            try:
                return await self.kv.get(check_name(consumer, "consumer name"))
            except (nats.js.errors.KeyNotFoundError, nats.js.errors.KeyDeletedError):
                return None  # never registered, or released

        entry = self.broker.call(get())
        if entry is None or entry.value is None:
            return None, 0
        body = json.loads(entry.value)
        return Ack(body["prefix"], body["seq"], body.get("input", MAIN)), entry.revision

    def register(self, consumer: str, prefix: str, input: str = MAIN) -> None:
        """`consumer` reads the key groups `prefix` of input `input`: hold all of them until its first acknowledgement."""
        self._set(consumer, Ack(check_prefix(prefix), 0, check_input(input)), only_up=False)

    def ack(self, consumer: str, prefix: str, seq: int, input: str = MAIN) -> None:
        """`consumer` needs nothing up to sequence `seq` of key groups `prefix` of input
        `input` any more (never moves back)."""
        if seq < 0:
            raise ValueError(f"a stream sequence is not negative: {seq}")
        self._set(consumer, Ack(check_prefix(prefix), seq, check_input(input)), only_up=True)

    def _set(self, consumer: str, ack: Ack, *, only_up: bool, attempts: int = 20) -> None:
        value = json.dumps({"prefix": ack.prefix, "seq": ack.seq, "input": ack.input}).encode()
        for _ in range(attempts):
            current, revision = self._get(consumer)
            if (current is not None and only_up and (current.prefix, current.input) == (ack.prefix, ack.input)
                    and current.seq >= ack.seq):
                return
            try:
                if revision:
                    self.broker.call(self.kv.update(consumer, value, last=revision))
                else:
                    self.broker.call(self.kv.create(consumer, value))
                return
            except nats.js.errors.KeyWrongLastSequenceError:
                continue  # another write came first: read it again
        raise RuntimeError(f"the acknowledgement of {consumer} kept changing under {attempts} attempts to set it")

    def release(self, consumer: str) -> None:
        """Forget `consumer`: it holds nothing back any more."""
        self.broker.call(self.kv.purge(check_name(consumer, "consumer name")))

    def _consumers(self) -> list[str]:
        """The consumers with an entry in the bucket, released ones included (their entry is a purge marker).

        Read from the bucket's stream state, not `KeyValue.keys()`: that watches the bucket with
        an ordered consumer and can report no keys when the server pushed them before the
        watcher counted what it had received."""
        info = self.broker.call(self.broker.js.stream_info(f"KV_{BUCKET}", subjects_filter=f"$KV.{BUCKET}.>"))
        return sorted(s.removeprefix(f"$KV.{BUCKET}.") for s in (info.state.subjects or {}))

    def acks(self) -> dict[str, Ack]:
        out = {}
        for consumer in self._consumers():
            ack, _ = self._get(consumer)
            if ack is not None:
                out[consumer] = ack
        return out

    def floors(self) -> dict[tuple[str, int], int]:
        """Per (input, key group) that some consumer reads, the sequence up to which nobody needs it."""
        floors: dict[tuple[str, int], int] = {}
        for ack in self.acks().values():
            for g in groups(ack.prefix):
                floors[ack.input, g] = min(floors.get((ack.input, g), ack.seq), ack.seq)
        return floors

    def trim(self) -> dict[tuple[str, int], int]:
        """Purge every key group below its floor; returns the floors purged to."""
        floors = {share: seq for share, seq in self.floors().items() if seq > 0}
        for (input, g), seq in sorted(floors.items()):
            self.broker.call(self.broker.js.purge_stream(INPUT, seq=seq + 1, subject=subject(self.participant, g, input)))
        return floors
