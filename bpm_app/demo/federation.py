"""Processes of a local federation: the registry, one agent per participant, and the log replayers.

Each participant, and the registry, is a host of its own (`spark_agents.hosts.Hosts`): a
network namespace with its own address, a CPU quota and a folder, where this machine
allows them, else a loopback address of its own. Every process of a participant (its agent,
with its Spark and its broker, and the replayer of its traffic) starts inside its host.
`close()`, which the demo calls on the way out, on errors and on Ctrl-C alike, stops them and
removes the hosts.
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
from typing import TYPE_CHECKING

import httpx

from bpm_http.client import RegistryClient
from bpm_app.processes import wait_http
from spark_agents.hosts import Host, Hosts
from spark_agents.runtime import KEY_FILE
from spark_agents.settings import AgentSettings
from spark_agents.tls import Peers, kept_certificate

if TYPE_CHECKING:
    from bpm_app.demo.queries import DemoQuery

BPM = str(Path(sys.executable).with_name("bpm"))
# The kinds of record an agent's log line begins with that say what it decided (`Agent.note`).
DECISION_KINDS = ("offer.", "movement.", "task.", "failover.", "ha.", "replica.", "agent.error", "contract.")


@dataclass
class Federation:
    """A registry and its agents as local processes (SQLite, Spark local), each in a host of its
    own (`hosts`; by default loopback addresses sharing the machine's CPUs)."""

    workdir: Path
    registry_port: int = 8700
    admin_key: str = "demo-operator-key"
    hosts: Hosts = None  # type: ignore[assignment]
    processes: dict[str, subprocess.Popen] = field(default_factory=dict)
    endpoints: dict[str, str] = field(default_factory=dict)
    keys: dict[str, str] = field(default_factory=dict)  # each participant's key, as the operator registered it
    peers: Peers = None  # type: ignore[assignment]  # the agents' TLS, as the registry lists their certificates

    REGISTRY = "registry"  # the registry's host

    def __post_init__(self) -> None:
        if self.hosts is None:
            self.hosts = Hosts(self.workdir / "hosts", None, None)
        if self.peers is None:
            self.peers = Peers(self._participant, insecure=True)  # an agent started --insecure is asked in plain HTTP

    def _participant(self, name: str) -> dict:
        with self.operator() as operator:
            return operator.participant(name)

    def agent_get(self, name: str, path: str, timeout_s: float = 10.0) -> httpx.Response:
        """GET `path` of participant `name`'s agent, over TLS pinned to the certificate it registered."""
        endpoint = self.peers.endpoint(name)
        return self.peers.client(endpoint).get(endpoint + path, timeout=timeout_s)

    @property
    def registry_url(self) -> str:
        """The registry's URL, on its host's address (`start_registry` makes the host)."""
        return f"http://{self.hosts.hosts[self.REGISTRY].address}:{self.registry_port}"

    def host(self, name: str, cpus: float | None = None) -> Host:
        """Participant `name`'s host (made once), with a quota of `cpus` CPUs where quotas can be made."""
        return self.hosts.add(name, cpus)

    def _spawn(self, name: str, host: str, args: list[str], env: dict | None = None, stdin: int | None = None) -> tuple[subprocess.Popen, Path]:
        """Start process `name` inside `host`, its output in the run's log folder (after what
        an earlier process of that name wrote: a host restarted after a crash keeps its past)."""
        log = self.workdir / "logs" / f"{name}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        inherited = {k: v for k, v in os.environ.items() if k != "BPM_ADMIN_KEY"}  # the operator's key only where given
        with log.open("a") as out:
            process = self.hosts.popen(host, args, env={**inherited, **(env or {})}, stdout=out, stderr=subprocess.STDOUT, stdin=stdin,
                                       text=stdin is not None)
        self.processes[name] = process
        return process, log

    def start_registry(self) -> None:
        host = self.hosts.add(self.REGISTRY)
        _require_free(host, self.registry_port)
        db = host.folder / "registry.db"
        process, log = self._spawn(
            "registry", self.REGISTRY,
            [BPM, "registry", "serve", "--database-url", f"sqlite:///{db}", "--host", host.address, "--port", str(self.registry_port),
             "--log-level", "warning"],
            {"BPM_ADMIN_KEY": self.admin_key},
        )
        wait_http(self.registry_url + "/healthz", process, log, 60)

    def operator(self) -> RegistryClient:
        return RegistryClient(self.registry_url, self.admin_key)

    def _agent_workdir(self, name: str) -> Path:
        return self.hosts.hosts[name].folder / "agent"

    def broker_certificate_file(self, name: str) -> Path | None:
        """Where participant `name`'s agent keeps the certificate it and its broker serve
        (`spark_agents.tls.own_certificate`); None for an agent in plain text."""
        if self.endpoints[name].startswith("http://"):
            return None
        return kept_certificate(self._agent_workdir(name))

    def participant(self, name: str) -> RegistryClient:
        """The registry as participant `name`: with the key the operator registered it with, or
        the one its agent keeps since it rotated it."""
        kept = self._agent_workdir(name) / KEY_FILE
        return RegistryClient(self.registry_url, kept.read_text().strip() if kept.exists() else self.keys[name])

    def start_agent(self, name: str, port: int, settings: dict[str, object], env: dict[str, str] | None = None) -> Path:
        """`bpm agent run --config FILE` inside host `name`, listening on its address: FILE, in
        the host's folder, holds `settings` (`spark_agents.settings.AgentSettings` by name: its
        input, tasks, contracts, ...) and its place in the federation. The operator registers
        the participant on its first start and hands its agent only its own key (`BPM_KEY`),
        never the operator's; the agent measures its load against its host's CPU quota where it
        has one. Returns FILE."""
        host = self.hosts.hosts[name]
        _require_free(host, port)
        config = host.folder / "agent.toml"
        config.write_text(AgentSettings(name=name, registry=self.registry_url, host=host.address, port=port,
                                        workdir=self._agent_workdir(name), **settings).toml())
        self.endpoints[name] = f"{'http' if settings.get('insecure') else 'https'}://{host.address}:{port}"
        if name not in self.keys:
            with self.operator() as operator:
                self.keys[name] = operator.add_participant(name, self.endpoints[name])["api_key"]
        self._spawn(name, name, [BPM, "agent", "run", "--config", str(config)], {"BPM_KEY": self.keys[name], **(env or {})})
        return config

    def wait_agent(self, name: str, timeout_s: float = 180, on_wait: Callable[[], None] | None = None) -> None:
        log = self.workdir / "logs" / f"{name}.log"
        wait_http(self.endpoints[name] + "/healthz", self.processes[name], log, timeout_s, on_wait=on_wait,
                  get=lambda _: self.agent_get(name, "/healthz", 1.0))

    def generate_traffic(self, name: str, duration_s: float, rate: float, sources: int, scanners: int, seed: int,
                         shared_scanners: int = 0, shared_seed: int = 0, timeout_s: float = 300) -> Callable[[], Path]:
        """Start `bpm generate-traffic`: the participant's recorded connections (a Zeek conn.log),
        in its host's folder (with `shared_scanners` probing every participant generated with
        the same `shared_seed`). Returns a function that waits for it and gives the log."""
        log = self.hosts.hosts[name].folder / "traffic" / f"{name}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        process = subprocess.Popen(
            [BPM, "generate-traffic", str(log), "--duration", str(duration_s), "--rate", str(rate), "--sources", str(sources),
             "--scanners", str(scanners), "--seed", str(seed), "--shared-scanners", str(shared_scanners), "--shared-seed", str(shared_seed)],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=self.workdir,
        )

        def generated() -> Path:
            try:
                _, errors = process.communicate(timeout=timeout_s)
            finally:
                if process.poll() is None:
                    process.kill()
                    process.wait()
            if process.returncode != 0:
                raise RuntimeError(f"bpm generate-traffic for {name} failed (exit {process.returncode}): {errors.strip()[-500:]}")
            return log

        return generated

    def start_replay(self, name: str, log: Path, target: list[str], env: dict[str, str], query: DemoQuery, speedup: float,
                     feed: list[str], host: str | None = None, amplify: int = 1) -> Path:
        """`bpm replay` of `log` into the participant's stream (`target`: its options) at recorded
        time x speedup, as records of `query` (the network-monitoring query: a Zeek log, each
        connection `amplify` times from distinct sources; another: JSON lines), feeding the key
        groups of the prefixes `feed` and later those `feed_more` names, in host `host`
        (default: the participant's); returns where the fed log will be."""
        if query.zeek:
            fed = log.with_name(f"{name}.fed.log")
            records = ["--window", str(query.align_s), "--lateness", str(query.lateness_s), "--amplify", str(amplify)]
        else:
            fed = log.with_name(f"{name}.fed.jsonl")
            records = ["--query", query.reference, *(o for p in query.param_args() for o in ("--param", p)), "--format", "jsonl"]
        self._spawn(
            f"replay-{name}", host or name,
            [BPM, "replay", str(log), *target, "--rate", "0", "--speedup", str(speedup), *records, "--fed-log", str(fed),
             *(o for prefix in feed for o in ("--feed", prefix)), "--feed-from-stdin"],
            env, stdin=subprocess.PIPE,
        )
        return fed

    def feed_more(self, name: str, prefixes: list[str]) -> None:
        """The replayer of `name`'s stream feeds the key groups of `prefixes` too from now on."""
        stdin = self.processes[f"replay-{name}"].stdin
        stdin.write("".join(f"{prefix}\n" for prefix in prefixes))
        stdin.flush()

    def replaying(self, name: str) -> bool:
        """Whether `name`'s replayer runs (it was started and not stopped)."""
        return f"replay-{name}" in self.processes

    def end_replay(self, name: str) -> subprocess.Popen:
        """Tell `name`'s replayer to stop, without waiting: it closes the stream (every window
        ends) and writes what it fed, then exits (`stop_replay` waits for that)."""
        process = self.processes[f"replay-{name}"]
        _signal_group(process, signal.SIGTERM)
        return process

    def stop_replay(self, name: str, timeout_s: float = 180) -> None:
        """Stop a replayer (`end_replay`) and wait until it has written what it fed."""
        process = self.end_replay(name)
        del self.processes[f"replay-{name}"]
        process.wait(timeout=timeout_s)
        if process.returncode != 0:
            raise RuntimeError(f"the replayer of {name} failed (exit {process.returncode}); see {self.workdir / 'logs' / f'replay-{name}.log'}")

    def decisions(self, lines: int = 40) -> str:
        """The tail of each agent's log as far as it records decisions (offers made, refused and
        not made, movements, tasks started and stopped, failovers, splits): why a run ended as it
        did, for a person reading a run that missed its goal."""
        out = []
        for log in sorted((self.workdir / "logs").glob("*.log")):
            if log.stem in self.endpoints:
                kept = [line for line in log.read_text(errors="replace").splitlines() if any(f" {k}" in line for k in DECISION_KINDS)]
                out += [f"--- {log.name}", *kept[-lines:]]
        return "\n".join(out)

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
            self.peers.close()
            self.hosts.close()
            for sig, handler in previous.items():
                signal.signal(sig, handler)


def _require_free(host: Host, port: int) -> None:
    """Refuse to start on a loopback address in use: a server left over from another run would
    answer in its place. (A host with a namespace of its own is new: nothing listens there.)"""
    import socket

    if host.namespace:
        return
    with socket.socket() as sock:
        # As the servers themselves bind: connections of a run that just ended (TIME_WAIT) do
        # not hold the port, a server listening on it does.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host.address, port))
        except OSError as exc:
            raise RuntimeError(f"{host.address}:{port} is in use ({exc.strerror}); is another demo running? Stop it or pass --port") from None


def _signal_group(process: subprocess.Popen, sig: int) -> None:
    """`sig` to the process's group (it leads one: `start_new_session`), also after the leader
    has exited: its children (an agent's JVM) may still be there."""
    try:
        os.killpg(process.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass
