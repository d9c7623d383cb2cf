"""Processes of a local federation: the registry, one agent per participant, and the log replayers.

Every process is started in its own process group and stopped by `close()`, which the
demo calls on the way out, on errors and on Ctrl-C alike. Given `CpuHosts`, each agent
runs in a cgroup of its own with the participant's CPU quota (`spark_agents.hosts`), which
`close()` removes too.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from bpm_http.client import RegistryClient
from bpm_app.processes import wait_http
from spark_agents.hosts import CpuHosts
from spark_agents.runtime import KEY_FILE

BPM = str(Path(sys.executable).with_name("bpm"))


@dataclass
class Federation:
    """A registry and its agents as local processes (SQLite, Spark local, 127.0.0.x), each
    agent with a CPU quota of its own where `hosts` is given."""

    workdir: Path
    registry_port: int = 8700
    admin_key: str = "demo-operator-key"
    hosts: CpuHosts | None = None
    processes: dict[str, subprocess.Popen] = field(default_factory=dict)
    endpoints: dict[str, str] = field(default_factory=dict)

    @property
    def registry_url(self) -> str:
        return f"http://127.0.0.1:{self.registry_port}"

    def _spawn(self, name: str, args: list[str], env: dict | None = None, cpus: float | None = None) -> tuple[subprocess.Popen, Path]:
        """Start a process in its own session; with `cpus` and hosts, inside `name`'s cgroup with that quota."""
        log = self.workdir / "logs" / f"{name}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        inside = {}
        if cpus is not None and self.hosts is not None:
            self.hosts.add(name, cpus)
            inside = self.hosts.popen_kwargs(name)
        with log.open("w") as out:
            process = subprocess.Popen(
                args, cwd=self.workdir, env={**os.environ, **(env or {})}, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                **inside,
            )
        self.processes[name] = process
        return process, log

    def start_registry(self) -> None:
        _require_free("127.0.0.1", self.registry_port)
        db = self.workdir / "registry.db"
        process, log = self._spawn(
            "registry",
            [BPM, "registry", "serve", "--database-url", f"sqlite:///{db}", "--port", str(self.registry_port), "--log-level", "warning"],
            {"BPM_ADMIN_KEY": self.admin_key},
        )
        wait_http(self.registry_url + "/healthz", process, log, 60)

    def operator(self) -> RegistryClient:
        return RegistryClient(self.registry_url, self.admin_key)

    def _agent_workdir(self, name: str) -> Path:
        return self.workdir / "agents" / name

    def participant(self, name: str) -> RegistryClient:
        """The registry as participant `name`, with the key its agent got when it registered itself."""
        return RegistryClient(self.registry_url, (self._agent_workdir(name) / KEY_FILE).read_text().strip())

    def start_agent(self, name: str, address: str, port: int, options: list[str], env: dict[str, str] | None = None,
                    cpus: float | None = None) -> None:
        """`bpm agent run` with `options` (its input, tasks, contracts, ...): the agent registers
        itself with the operator key on its first run; with `cpus`, it runs (its Spark and its
        broker too) under that CPU quota and measures its load against it."""
        _require_free(address, port)
        args = [
            BPM, "agent", "run", "--name", name, "--registry", self.registry_url, "--host", address, "--port", str(port),
            "--workdir", str(self._agent_workdir(name)), *options,
        ]
        self.endpoints[name] = f"http://{address}:{port}"
        self._spawn(name, args, {"BPM_ADMIN_KEY": self.admin_key, **(env or {})}, cpus=cpus)

    def wait_agent(self, name: str, timeout_s: float = 180, on_wait: Callable[[], None] | None = None) -> None:
        log = self.workdir / "logs" / f"{name}.log"
        wait_http(self.endpoints[name] + "/healthz", self.processes[name], log, timeout_s, on_wait=on_wait)

    def generate_traffic(self, name: str, duration_s: float, rate: float, sources: int, scanners: int, seed: int) -> Path:
        """`bpm generate-traffic`: the participant's recorded connections (a Zeek conn.log)."""
        log = self.workdir / "input" / f"{name}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [BPM, "generate-traffic", str(log), "--duration", str(duration_s), "--rate", str(rate), "--sources", str(sources),
             "--scanners", str(scanners), "--seed", str(seed)],
            check=True, capture_output=True, timeout=300, cwd=self.workdir,
        )
        return log

    def start_replay(self, name: str, log: Path, target: list[str], env: dict[str, str], window_s: int, lateness_s: int, speedup: float) -> Path:
        """`bpm replay` into the participant's stream (`target`: its options) at recorded time x
        speedup; returns where the fed log will be."""
        fed = log.with_name(f"{name}.fed.log")
        self._spawn(
            f"replay-{name}",
            [BPM, "replay", str(log), *target, "--rate", "0", "--speedup", str(speedup),
             "--window", str(window_s), "--lateness", str(lateness_s), "--fed-log", str(fed)],
            env,
        )
        return fed

    def stop_replay(self, name: str, timeout_s: float = 60) -> None:
        """Stop a replayer: it closes the stream (every window ends) and writes what it fed."""
        process = self.processes.pop(f"replay-{name}")
        _signal_group(process, signal.SIGTERM)
        process.wait(timeout=timeout_s)
        if process.returncode != 0:
            raise RuntimeError(f"the replayer of {name} failed (exit {process.returncode}); see {self.workdir / 'logs' / f'replay-{name}.log'}")

    def add_task(self, name: str, task: str, input_uri: str, params: dict) -> dict:
        key = (self._agent_workdir(name) / KEY_FILE).read_text().strip()  # only the participant's own key adds its tasks
        response = httpx.post(
            self.endpoints[name] + "/tasks", json={"name": task, "input_uri": input_uri, "params": params},
            headers={"Authorization": f"Bearer {key}"}, timeout=30,
        )
        response.raise_for_status()
        return response.json()

    def close(self) -> None:
        """Stop every process: agents first (they stop their tasks at batch boundaries), then the registry.

        SIGTERM goes to each process alone, as `docker stop` does: an agent's JVM, in the same
        process group, would otherwise stop Spark before the agent stops its queries. What is
        left of a group afterwards (or a process that outlives the timeout) is killed, and so is
        whatever is left in the participants' cgroups, which are then removed. A second Ctrl-C
        or SIGTERM while this runs does not cut it short: it would leave processes behind.
        """
        shield = threading.current_thread() is threading.main_thread()
        previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGINT, signal.SIGTERM)} if shield else {}
        try:
            order = [n for n in self.processes if n != "registry"] + (["registry"] if "registry" in self.processes else [])
            for name in order:
                if self.processes[name].poll() is None:
                    self.processes[name].send_signal(signal.SIGTERM)
            deadline = time.monotonic() + 60
            for name in order:
                process = self.processes[name]
                try:
                    process.wait(timeout=max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    pass
                _signal_group(process, signal.SIGKILL)
                process.wait()
            self.processes.clear()
        finally:
            if self.hosts is not None:
                self.hosts.close()
            for sig, handler in previous.items():
                signal.signal(sig, handler)


def _require_free(address: str, port: int) -> None:
    """Refuse to start on an address in use: a server left over from another run would answer in its place."""
    import socket

    with socket.socket() as sock:
        # As the servers themselves bind: connections of a run that just ended (TIME_WAIT) do
        # not hold the port, a server listening on it does.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((address, port))
        except OSError as exc:
            raise RuntimeError(f"{address}:{port} is in use ({exc.strerror}); is another demo running? Stop it or pass --port") from None


def _signal_group(process: subprocess.Popen, sig: int) -> None:
    """`sig` to the process's group (it leads one: `start_new_session`), also after the leader
    has exited: its children (an agent's JVM) may still be there."""
    try:
        os.killpg(process.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass
