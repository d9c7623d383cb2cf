"""Where the demo's participants get their input and write their results: each its own broker.

A participant's stream is split into `shares` equal parts (a power of two, `bpm.keygroups`);
each task queries one (`g<bits>`, the share's key-group prefix). The demo starts
tasks over some of them, replays the participant's traffic into the whole stream, and in
the end compares the results of the queried shares with the plain computation over the
rows that fell in them.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from bpm.keygroups import PASSWORD_ENV, StreamLocation, groups, shares
from bpm.results import OutputSet

if TYPE_CHECKING:
    from spark_agents.broker.stream import Broker

BROKER_PORT = 4222  # on each participant's own address; its health check on the next port


class BrokerInputs:
    """Every participant's stream and results on its own NATS server, which its agent runs
    over TLS with its own certificate.

    Attributes:
        certificate_file: where participant `name`'s agent keeps the certificate its broker
            serves, which `name`'s replayer pins (None: its broker speaks plain text).
        certificate: the certificate `name`'s broker serves, as the registry lists it (None:
            plain text), which the demo pins when it reads the results.
    """

    def __init__(self, workdir: Path, certificate_file: Callable[[str], Path | None] = lambda _: None,
                 certificate: Callable[[str], str | None] = lambda _: None) -> None:
        self.workdir = workdir
        self.passwords: dict[str, str] = {}
        self.addresses: dict[str, str] = {}
        self.certificate_file = certificate_file
        self.certificate = certificate

    def password(self, name: str) -> str:
        return self.passwords.setdefault(name, secrets.token_urlsafe(16))

    def agent(self, name: str, address: str, count: int) -> tuple[dict[str, object], dict[str, str]]:
        """`bpm agent run`'s settings (`spark_agents.settings.AgentSettings`) and environment for
        participant `name` at `address` with a stream of `count` shares (none: it runs no broker,
        and hosts others' tasks only)."""
        self.addresses[name] = address
        settings = {"broker_port": BROKER_PORT, "broker_http_port": BROKER_PORT + 1, "shares": count} if count else {}
        return settings, {PASSWORD_ENV: self.password(name)}

    def replay(self, name: str) -> tuple[list[str], dict[str, str]]:
        """`bpm replay`'s options and environment that publish into `name`'s stream."""
        cert = self.certificate_file(name)
        tls = ["--insecure"] if cert is None else ["--broker-cert", str(cert)]
        return ["--stream", self._location(name), *tls], {PASSWORD_ENV: self.password(name)}

    def _location(self, name: str, prefix: str = "") -> str:
        return str(StreamLocation(f"nats://{self.addresses[name]}:{BROKER_PORT}", name, prefix))

    def tasks(self, count: int) -> list[str]:
        """The names of the tasks over the `count` shares of a stream, in order."""
        return [f"g{prefix}" for prefix in shares(count)] if count else []

    def input_uri(self, name: str, task: str) -> str:
        return self._location(name, task[1:])

    def key_groups(self, tasks: Iterable[str]) -> set[int]:
        """The key groups of `tasks`' shares."""
        return {g for task in tasks for g in groups(task[1:])}

    def broker(self, name: str) -> Broker:
        """A connection to `name`'s broker as its owner (while its agent runs); close it after use."""
        from spark_agents.broker.stream import Broker

        return Broker(f"nats://{self.addresses[name]}:{BROKER_PORT}", name, self.password(name), tls=self.certificate(name))

    def outputs(self, name: str, tasks: list[str]) -> OutputSet:
        """The results of `name`'s tasks, read from its broker (while its agent runs)."""
        from spark_agents.broker.results import broker_outputs

        with self.broker(name) as broker:
            return broker_outputs(broker, [f"{name}.{task}" for task in tasks])
