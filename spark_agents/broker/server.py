"""A participant's NATS server with JetStream: its own address, storage folder and users.

Each participant runs its own broker (Debian's `nats-server`): its input stream and what it
keeps are in its own storage folder, on its own host, and nobody reads them but through
the server, as a user the server knows. `NatsServer` writes the server's configuration,
starts it, waits until it answers its health check with JetStream on, and stops it (also
when the `with` block fails).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from bpm.names import check_name
from spark_agents.credentials import write_private

if TYPE_CHECKING:
    from spark_agents.tls import OwnCertificate

_SUBJECT_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.-_~*>$")


class BrokerError(RuntimeError):
    """The broker could not be started or used; the message says why."""


def binary() -> str:
    """The `nats-server` program (Debian installs it in /usr/sbin)."""
    found = shutil.which("nats-server") or shutil.which("nats-server", path="/usr/sbin:/usr/local/sbin")
    if found is None:
        raise BrokerError("nats-server is not installed: run scripts/install-system-deps.sh (Debian package nats-server)")
    return found


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port of `host` that nothing listens on now, held back from other choosers until
    a server binds it.

    A port that is merely free can be chosen again, by another process of the same machine
    (a parallel test worker, another benchmark), before the server it was chosen for binds
    it; both servers then get one port, and the loser's callers talk to the winner. So the
    port is left with a connection to itself in TIME_WAIT: for about a minute the kernel
    gives it to no `bind` of port 0 and to no outgoing connection, while a server that
    binds it by number with SO_REUSEADDR (uvicorn, nats-server, Python's HTTP servers) may.
    """
    with socket.socket() as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((host, 0))
        listener.listen(1)
        address = listener.getsockname()
        with socket.create_connection(address[:2]):
            accepted, _ = listener.accept()
            accepted.close()  # the side that closes first holds TIME_WAIT, on the port chosen
        return address[1]


def _die_with_parent() -> None:
    """In the server's process before it runs: it gets SIGTERM when the process that started
    it dies, even by SIGKILL, so that no broker outlives its participant's agent."""
    import ctypes

    PR_SET_PDEATHSIG = 1
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def _subjects(subjects: Sequence[str]) -> str:
    for s in subjects:
        if not s or not set(s) <= _SUBJECT_CHARS:
            raise BrokerError(f"bad subject {s!r} in a permission")
    return "[" + ", ".join(f'"{s}"' for s in subjects) + "]"


def _path(path: Path) -> str:
    """`path`, absolute, as a configuration's quoted string holds it."""
    text = str(Path(path).resolve())
    if any(c in text for c in '"\\$\n'):
        raise BrokerError(f"{text}: a path the broker's configuration cannot quote")
    return text


def check_password(password: str) -> str:
    """`password` if a server's configuration can hold it as it is, else BrokerError."""
    if not password.replace("-", "").replace("_", "").isalnum():
        raise BrokerError("a broker password is letters, digits, '-' and '_'")
    return password


@dataclass(frozen=True)
class User:
    """A user of the server and what it may publish and subscribe to (NATS subjects, wildcards allowed)."""

    name: str
    password: str
    publish: tuple[str, ...] = (">",)
    subscribe: tuple[str, ...] = (">",)

    def conf(self) -> str:
        check_name(self.name, "user name")
        check_password(self.password)
        return (f'{{user: "{self.name}", password: "{self.password}", permissions: '
                f"{{publish: {{allow: {_subjects(self.publish)}}}, subscribe: {{allow: {_subjects(self.subscribe)}}}}}}}")


class _PortTaken(BrokerError):
    """The server could not listen: another process holds its port."""


MONITOR_HOST = "127.0.0.1"


@dataclass
class NatsServer:
    """One participant's broker.

    Attributes:
        name: the server's name (the participant's).
        store_dir: where JetStream keeps the streams; the server's log and configuration go beside it.
        host, port: where clients connect; `http_port` serves the health check on the
            loopback address only (`MONITOR_HOST`): its pages (`/varz`, `/connz`) describe
            the server's clients and configuration to whoever asks, so no partner may reach it.
        users: who may connect, and to what.
        max_store_bytes: the file storage JetStream may use.
        free_ports: the ports were chosen free (`on_free_ports`): when another process binds
            one first, between the choice and the server's start, `start` chooses again.
        tls: the certificate it serves TLS with, to every client (`spark_agents.tls`: a
            client pins `tls.pem`); None: plain text.
    """

    name: str
    store_dir: Path
    port: int
    http_port: int
    users: Sequence[User]
    host: str = "127.0.0.1"
    max_store_bytes: int = 2 << 30
    process: subprocess.Popen | None = None
    free_ports: bool = False
    tls: OwnCertificate | None = None

    @classmethod
    def on_free_ports(cls, name: str, store_dir: Path, users: Sequence[User], host: str = "127.0.0.1",
                      tls: OwnCertificate | None = None) -> NatsServer:
        """A server on two ports that nothing listens on now (benchmarks, tests)."""
        return cls(name, store_dir, port=free_port(host), http_port=free_port(MONITOR_HOST), users=users, host=host, free_ports=True, tls=tls)

    @property
    def url(self) -> str:
        return f"nats://{self.host}:{self.port}"

    @property
    def monitor_url(self) -> str:
        """The health check's base URL, reachable from this machine (or host) only."""
        return f"http://{MONITOR_HOST}:{self.http_port}"

    @property
    def config_path(self) -> Path:
        return self.store_dir.parent / f"{self.store_dir.name}.conf"

    @property
    def log_path(self) -> Path:
        return self.store_dir.parent / f"{self.store_dir.name}.log"

    def config(self) -> str:
        users = ",\n      ".join(u.conf() for u in self.users)
        tls = ""
        if self.tls is not None:
            cert, key = _path(self.tls.cert_file), _path(self.tls.key_file)
            tls = f'tls {{\n  cert_file: "{cert}"\n  key_file: "{key}"\n  timeout: 5\n}}\n'
        return tls + f"""server_name: "{check_name(self.name, 'server name')}"
listen: "{self.host}:{self.port}"
http: "{MONITOR_HOST}:{self.http_port}"
jetstream {{
  store_dir: "{self.store_dir}"
  max_memory_store: 64MB
  max_file_store: {self.max_store_bytes}
}}
accounts {{
  BPM {{
    jetstream: enabled
    users: [
      {users}
    ]
  }}
}}
"""

    def start(self, timeout_s: float = 20.0) -> NatsServer:
        for _ in range(2 if self.free_ports else 0):
            try:
                return self._start(timeout_s)
            except _PortTaken:
                self.port, self.http_port = free_port(self.host), free_port(MONITOR_HOST)
        return self._start(timeout_s)

    def _start(self, timeout_s: float) -> NatsServer:
        import httpx

        self.store_dir.mkdir(parents=True, exist_ok=True)
        write_private(self.config_path, self.config())  # it holds the users' passwords: never readable by others, not even at first
        logged = self.log_path.stat().st_size if self.log_path.exists() else 0
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen([binary(), "-c", str(self.config_path)], stdout=log, stderr=subprocess.STDOUT,
                                            start_new_session=True, preexec_fn=_die_with_parent)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                said = self.log_path.read_bytes()[logged:].decode(errors="replace")
                error = _PortTaken if "address already in use" in said else BrokerError
                raise error(f"nats-server {self.name} exited with {self.process.returncode}: {said[-2000:]}")
            try:
                if httpx.get(f"{self.monitor_url}/healthz", timeout=1.0).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        self.stop()
        raise BrokerError(f"nats-server {self.name} did not become healthy within {timeout_s:g} s; see {self.log_path}")

    def reload(self, users: Sequence[User], timeout_s: float = 10.0) -> None:
        """New users and permissions, applied by the running server without a restart; returns
        once the server says it has loaded them (its `config_load_time` moved on)."""
        self.users = list(users)
        write_private(self.config_path, self.config())
        if self.process is None or self.process.poll() is not None:
            return
        before = self._config_load_time()
        os.kill(self.process.pid, signal.SIGHUP)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._config_load_time() not in (before, None):
                return
            time.sleep(0.01)
        raise BrokerError(f"nats-server {self.name} did not load its new configuration within {timeout_s:g} s; see {self.log_path}")

    def _config_load_time(self) -> str | None:
        import httpx

        try:
            return httpx.get(f"{self.monitor_url}/varz", timeout=1.0).json().get("config_load_time")
        except (httpx.HTTPError, ValueError):
            return None

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=10)

    def __enter__(self) -> NatsServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
