"""Processes of a local federation: the registry, one agent per participant, and paced input.

Every process is started in its own process group and stopped by `close()`, which the
demo calls on the way out, on errors and on Ctrl-C alike.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from bpm.client import RegistryClient
from bpm.processes import wait_http
from bpm.streams.feed import Feeder
from bpm.streams.partitioned import PartitionedStream
from bpm.zeek.conn import Conn, write_tsv
from bpm.zeek.definitions import QueryParams

BPM = str(Path(sys.executable).with_name("bpm"))


class PacedInput:
    """Feeds recorded connections into a participant's stream in event-time order, at `speedup`
    times real time, and keeps the fed connections as a Zeek log for the reference run."""

    def __init__(self, stream: PartitionedStream, conns: list[Conn], params: QueryParams, speedup: float, log_path: Path) -> None:
        self.feeder = Feeder(stream, params)
        self.conns = sorted(conns, key=lambda c: c.ts)
        self.speedup = speedup
        self.log_path = log_path
        self.fed = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"feed-{stream.root.name}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        if not self.conns:
            return
        t0, ts0 = time.time(), self.conns[0].ts
        while not self._stop.is_set() and self.fed < len(self.conns):
            now_ts = ts0 + (time.time() - t0) * self.speedup
            while self.fed < len(self.conns) and self.conns[self.fed].ts <= now_ts:
                self.feeder.add(self.conns[self.fed])
                self.fed += 1
            self.feeder.flush()
            self._stop.wait(0.5)

    def close(self) -> Path:
        """Stop feeding, close every window of the stream, and write what was fed as a Zeek log."""
        self._stop.set()
        self._thread.join(timeout=10)
        self.feeder.close()
        with self.log_path.open("w") as out:
            write_tsv(self.conns[: self.fed], out)
        return self.log_path


@dataclass
class Federation:
    """A registry and its agents as local processes (SQLite, Spark local, 127.0.0.x)."""

    workdir: Path
    registry_port: int = 8700
    admin_key: str = "demo-operator-key"
    processes: dict[str, subprocess.Popen] = field(default_factory=dict)
    keys: dict[str, str] = field(default_factory=dict)
    endpoints: dict[str, str] = field(default_factory=dict)

    @property
    def registry_url(self) -> str:
        return f"http://127.0.0.1:{self.registry_port}"

    def _spawn(self, name: str, args: list[str], env: dict | None = None) -> tuple[subprocess.Popen, Path]:
        log = self.workdir / "logs" / f"{name}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("w") as out:
            process = subprocess.Popen(
                args, cwd=self.workdir, env={**os.environ, **(env or {})}, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        self.processes[name] = process
        return process, log

    def start_registry(self) -> None:
        db = self.workdir / "registry.db"
        process, log = self._spawn(
            "registry",
            [BPM, "registry", "serve", "--database-url", f"sqlite:///{db}", "--port", str(self.registry_port), "--log-level", "warning"],
            {"BPM_ADMIN_KEY": self.admin_key},
        )
        wait_http(self.registry_url + "/healthz", process, log, 60)

    def operator(self) -> RegistryClient:
        return RegistryClient(self.registry_url, self.admin_key)

    def client(self, name: str) -> RegistryClient:
        return RegistryClient(self.registry_url, self.keys[name])

    def register(self, name: str, address: str, port: int) -> None:
        endpoint = f"http://{address}:{port}"
        with self.operator() as operator:
            self.keys[name] = operator.add_participant(name, endpoint)["api_key"]
        self.endpoints[name] = endpoint

    def contract(self, a: str, b: str, price: float, spread: float, min_duration_s: float) -> dict:
        with self.client(a) as ca, self.client(b) as cb:
            proposed = ca.propose(b, price, price * (1 + spread), min_duration_s)
            return cb.contract_action(proposed["id"], "accept")

    def start_agent(self, name: str, address: str, port: int, stream: Path | None, partitions: str, options: list[str]) -> None:
        args = [
            BPM, "agent", "run", "--name", name, "--registry", self.registry_url, "--host", address, "--port", str(port),
            "--key", self.keys[name], "--workdir", str(self.workdir / "agents" / name), "--output", str(self.workdir / "output"),
            *(["--stream", str(stream), "--partitions", partitions] if partitions else []), *options,
        ]
        self._spawn(name, args)

    def wait_agent(self, name: str, timeout_s: float = 180) -> None:
        log = self.workdir / "logs" / f"{name}.log"
        wait_http(self.endpoints[name] + "/healthz", self.processes[name], log, timeout_s)

    def add_task(self, name: str, task: str, input_uri: str, params: dict) -> dict:
        response = httpx.post(self.endpoints[name] + "/tasks", json={"name": task, "input_uri": input_uri, "params": params}, timeout=30)
        response.raise_for_status()
        return response.json()

    def close(self) -> None:
        """Stop every process: agents first (they stop their tasks at batch boundaries), then the registry."""
        order = [n for n in self.processes if n != "registry"] + (["registry"] if "registry" in self.processes else [])
        for name in order:
            _signal_group(self.processes[name], signal.SIGTERM)
        deadline = time.monotonic() + 60
        for name in order:
            process = self.processes[name]
            try:
                process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _signal_group(process, signal.SIGKILL)
                process.wait()
        self.processes.clear()


def _signal_group(process: subprocess.Popen, sig: int) -> None:
    if process.poll() is None:
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            pass
