"""Where the demo's participants get their input and write their results: each its own broker
(the default), or the folder streams and the shared output folder, which the HA layer still
needs (`bpm demo --scenario failover`).

A participant's stream is split into `shares` equal parts (a power of two, `bpm.keygroups`);
each task queries one (`g<bits>` over a broker, `p<k>` over a folder). The demo starts
tasks over some of them, replays the participant's traffic into the whole stream, and in
the end compares the results of the queried shares with the plain computation over the
rows that fell in them.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterable
from pathlib import Path

from bpm.keygroups import PASSWORD_ENV, StreamLocation, groups, key_group, shares
from bpm.zeek.definitions import partition_of
from bpm.zeek.results import OutputSet, read_outputs

BROKER_PORT = 4222  # on each participant's own address; its health check on the next port


class BrokerInputs:
    """Every participant's stream and results on its own NATS server, which its agent runs."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.passwords: dict[str, str] = {}
        self.addresses: dict[str, str] = {}

    def password(self, name: str) -> str:
        return self.passwords.setdefault(name, secrets.token_urlsafe(16))

    def agent(self, name: str, address: str, count: int) -> tuple[list[str], dict[str, str]]:
        """`bpm agent run`'s options and environment for participant `name` at `address`
        with a stream of `count` shares (none: it runs no broker, and hosts others' tasks only)."""
        self.addresses[name] = address
        options = ["--broker-port", str(BROKER_PORT), "--broker-http-port", str(BROKER_PORT + 1), "--shares", str(count)] if count else []
        return options, {PASSWORD_ENV: self.password(name)}

    def replay(self, name: str, count: int) -> tuple[list[str], dict[str, str]]:
        """`bpm replay`'s options and environment that publish into `name`'s stream."""
        return ["--stream", self._location(name)], {PASSWORD_ENV: self.password(name)}

    def _location(self, name: str, prefix: str = "") -> str:
        return str(StreamLocation(f"nats://{self.addresses[name]}:{BROKER_PORT}", name, prefix))

    def tasks(self, count: int) -> list[str]:
        """The names of the tasks over the `count` shares of a stream, in order."""
        return [f"g{prefix}" for prefix in shares(count)] if count else []

    def input_uri(self, name: str, task: str) -> str:
        return self._location(name, task[1:])

    def selects(self, tasks: Iterable[str], count: int) -> Callable[[str], bool]:
        """Whether a row of a source prefix falls in one of `tasks`' shares."""
        chosen = {g for task in tasks for g in groups(task[1:])}
        return lambda prefix: key_group(prefix) in chosen

    def outputs(self, name: str, tasks: list[str]) -> OutputSet:
        """The results of `name`'s tasks, read from its broker (while its agent runs)."""
        from spark_agents.broker.results import broker_outputs
        from spark_agents.broker.stream import Broker

        with Broker(f"nats://{self.addresses[name]}:{BROKER_PORT}", name, self.password(name)) as broker:
            return broker_outputs(broker, [f"{name}.{task}" for task in tasks])


class FolderInputs:
    """Every participant's stream a folder of partitions, every result in one output folder."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir

    def _stream(self, name: str) -> Path:
        return self.workdir / "streams" / name

    def agent(self, name: str, address: str, count: int) -> tuple[list[str], dict[str, str]]:
        from spark_agents.streams.partitioned import PartitionedStream

        if count:
            PartitionedStream.create(self._stream(name), count)  # the replayer reopens it
        stream = ["--stream", str(self._stream(name))] if count else []
        return ["--output", str(self.workdir / "output"), *stream], {}

    def replay(self, name: str, count: int) -> tuple[list[str], dict[str, str]]:
        return ["--stream", str(self._stream(name)), "--partitions", str(count)], {}

    def tasks(self, count: int) -> list[str]:
        return [f"p{k}" for k in range(count)]

    def input_uri(self, name: str, task: str) -> str:
        return str((self._stream(name) / f"partition={task[1:]}").resolve())

    def selects(self, tasks: Iterable[str], count: int) -> Callable[[str], bool]:
        chosen = {int(task[1:]) for task in tasks}
        return lambda prefix: partition_of(prefix, count) in chosen

    def outputs(self, name: str, tasks: list[str]) -> OutputSet:
        return read_outputs(self.workdir / "output", [f"{name}.{task}" for task in tasks])
