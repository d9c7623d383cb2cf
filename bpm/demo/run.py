"""The four phases of the Borealis load-management demonstration, on a live local federation.

1. Three participants with identical contracts and uneven load (A carries most tasks).
2. A sheds load to B and C until the allocation is acceptable.
3. Load rises at B (it takes on new queries): the federation is overloaded.
4. D joins with a contract to C at 0.8 p; load flows C to D and B to C until acceptable.

Loads are measured by each agent on its Spark; the decisions are `bpm.negotiation`'s.
At the end the input is closed, every task drains, and the federation's alerts are
compared with `bpm pipeline run` over exactly what was fed: lost and duplicate results.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from bpm.demo.federation import BPM, Federation, PacedInput
from bpm.negotiation import is_acceptable
from bpm.streams.partitioned import PartitionedStream
from bpm.zeek.definitions import QueryParams, ResultRow
from bpm.zeek.generator import TrafficProfile, generate
from bpm.zeek.results import read_outputs


@dataclass(frozen=True)
class Member:
    name: str
    address: str
    partitions: int  # partitions of its input stream
    initial: int  # how many of them are its tasks from the start
    seed: int


MEMBERS = (
    Member("a", "127.0.0.2", 6, 6, 11),
    Member("b", "127.0.0.3", 4, 2, 12),
    Member("c", "127.0.0.4", 2, 2, 13),
    Member("d", "127.0.0.5", 0, 0, 14),
)


@dataclass
class DemoSettings:
    """Knobs of the demo; the defaults fit a 2-core machine in well under 10 minutes.

    Attributes:
        price: the contracts' reference price p (ranges [p, p(1 + spread)]); D's contract is at 0.8 p.
        mm1_scale: a in the agents' M/M/1 cost a*u/(1-u); the threshold at price p is 1 - sqrt(a/p).
        rate: connections per second in each participant's traffic.
        phase_timeout_s: the longest a phase waits for an acceptable allocation.
    """

    workdir: Path
    port: int = 8700
    agent_port: int = 9100
    window_s: int = 10
    lateness_s: int = 5
    min_connections: int = 20
    min_ports: int = 5
    trigger_s: float = 2.0
    period_s: float = 3.0
    tick_s: float = 1.0
    sample_s: float = 2.0
    price: float = 1.0
    spread: float = 0.1
    min_duration_s: float = 15.0
    mm1_scale: float = 0.36
    rate: float = 40.0
    speedup: float = 1.0
    settle_s: float = 20.0
    phase_timeout_s: float = 120.0
    poll_s: float = 2.0


@dataclass
class Phase:
    name: str
    started_s: float
    ended_s: float = 0.0
    acceptable: bool = False
    loads: dict[str, float] = field(default_factory=dict)
    thresholds: dict[str, float] = field(default_factory=dict)

    def to_json(self) -> dict:
        return {
            "name": self.name,
            "acceptable": self.acceptable,
            "started_s": round(self.started_s, 1),
            "ended_s": round(self.ended_s, 1),
            "loads": {k: round(v, 4) for k, v in self.loads.items()},
            "thresholds": {k: round(v, 4) for k, v in self.thresholds.items()},
        }


class Demo:
    """Runs the phases; `view` (if given) is called with the current state after every poll."""

    def __init__(self, settings: DemoSettings, view: Callable[[dict], None] | None = None, say: Callable[[str], None] = print) -> None:
        self.s = settings
        self.params = QueryParams(settings.window_s, settings.min_connections, settings.min_ports, settings.lateness_s)
        self.fed = Federation(settings.workdir, registry_port=settings.port)
        self.view = view
        self.say = say
        self.inputs: dict[str, PacedInput] = {}
        self.phases: list[Phase] = []
        self.timeline: list[dict] = []
        self.t0 = time.time()
        self.state: dict = {}
        self._members = {m.name: m for m in MEMBERS}

    # Setup

    def _stream(self, member: Member) -> Path:
        return self.s.workdir / "streams" / member.name

    def _agent_options(self) -> list[str]:
        s = self.s
        return [
            "--spark-master", "local[1]", "--cores", "1", "--window", str(s.window_s), "--lateness", str(s.lateness_s),
            "--min-connections", str(s.min_connections), "--min-ports", str(s.min_ports),
            "--trigger", str(s.trigger_s), "--period", str(s.period_s), "--tick", str(s.tick_s), "--sample", str(s.sample_s),
            "--cost-model", "mm1", "--mm1-scale", str(s.mm1_scale),
        ]

    def _join(self, member: Member) -> None:
        self.fed.register(member.name, member.address, self.s.agent_port)
        stream = None
        if member.partitions:
            stream = self._stream(member)
            created = PartitionedStream.create(stream, member.partitions)
            traffic = generate(TrafficProfile(duration_s=1800, rate=self.s.rate, sources=150, scanners=3), seed=member.seed)
            paced = PacedInput(created, traffic, self.params, self.s.speedup, self.s.workdir / "input" / f"{member.name}.log")
            paced.log_path.parent.mkdir(parents=True, exist_ok=True)
            self.inputs[member.name] = paced
        initial = f"0-{member.initial - 1}" if member.initial else ""
        self.fed.start_agent(member.name, member.address, self.s.agent_port, stream, initial, self._agent_options())

    # Observation

    def poll(self) -> dict:
        with self.fed.operator() as operator:
            participants = operator.participants()
            movements = operator.movements()
            ledger = operator.ledger()
        now = time.time() - self.t0
        for p in participants:
            if p["load"] is not None:
                self.timeline.append({"t": round(now, 2), "participant": p["name"], "load": p["load"], "threshold": p["threshold"]})
        self.state = {"t": now, "participants": participants, "movements": movements, "ledger": ledger, "phase": self.phases[-1].name if self.phases else "setup", "registry": self.fed.registry_url}
        if self.view:
            self.view(self.state)
        return self.state

    def _measured(self, state: dict, names: list[str]) -> tuple[dict[str, float], dict[str, float]]:
        loads, thresholds = {}, {}
        for p in state["participants"]:
            if p["name"] in names and p["load"] is not None and p["threshold"] is not None:
                loads[p["name"]], thresholds[p["name"]] = p["load"], p["threshold"]
        return loads, thresholds

    def _phase(self, name: str, names: list[str], *, until_acceptable: bool, hold_s: float) -> Phase:
        """Poll until the allocation of `names` is acceptable twice in a row (or the timeout), at least `hold_s`."""
        phase = Phase(name, time.time() - self.t0)
        self.phases.append(phase)
        self.say(f"phase: {name}")
        started = time.monotonic()
        streak = 0
        while True:
            state = self.poll()
            loads, thresholds = self._measured(state, names)
            ok = len(loads) == len(names) and is_acceptable(list(loads.values()), list(thresholds.values()))
            streak = streak + 1 if ok else 0
            phase.loads, phase.thresholds, phase.acceptable = loads, thresholds, ok
            elapsed = time.monotonic() - started
            if elapsed >= hold_s and (not until_acceptable or streak >= 2):
                break
            if elapsed >= self.s.phase_timeout_s:
                break
            time.sleep(self.s.poll_s)
        phase.ended_s = time.time() - self.t0
        self.say(f"  {'acceptable' if phase.acceptable else 'not acceptable'}: loads {_fmt(phase.loads)} thresholds {_fmt(phase.thresholds)}")
        return phase

    def _wait_measured(self, names: list[str], timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            loads, _ = self._measured(self.poll(), names)
            if len(loads) == len(names) and all(v > 0 for v in loads.values()):
                return
            time.sleep(self.s.poll_s)
        raise TimeoutError(f"no measured load from {names} after {timeout_s:.0f} s; see {self.s.workdir / 'logs'}")

    # The run

    def run(self) -> dict:
        s = self.s
        try:
            self.say(f"registry on {self.fed.registry_url} (admin UI at {self.fed.registry_url}/, operator key {self.fed.admin_key})")
            self.fed.start_registry()
            first = [self._members[n] for n in ("a", "b", "c")]
            self._setup_first(first)
            self._phase("1 uneven load: A carries most tasks", ["a", "b", "c"], until_acceptable=False, hold_s=0)
            self._phase("2 A sheds load to B and C", ["a", "b", "c"], until_acceptable=True, hold_s=s.settle_s)
            b = self._members["b"]
            for k in range(b.initial, b.partitions):
                self.fed.add_task("b", f"p{k}", str((self._stream(b) / f"partition={k}").resolve()), self._task_params())
            self._phase("3 load rises at B: the federation is overloaded", ["a", "b", "c"], until_acceptable=False, hold_s=s.settle_s)
            d = self._members["d"]
            self._join(d)
            self.fed.contract("c", "d", 0.8 * s.price, s.spread, s.min_duration_s)
            self.fed.wait_agent("d")
            self._phase("4 D joins (contract with C at 0.8 p): load flows B to C and C to D", ["a", "b", "c", "d"], until_acceptable=True, hold_s=s.settle_s)
            return self._finish()
        finally:
            for paced in self.inputs.values():
                if not paced.feeder.closed:
                    paced.close()
            self.fed.close()

    def _task_params(self) -> dict:
        return {**self.params.to_dict(), "trigger_s": self.s.trigger_s}

    def _setup_first(self, members: list[Member]) -> None:
        s = self.s
        for m in members:
            self._join(m)
        for a, b in (("a", "b"), ("a", "c"), ("b", "c")):
            self.fed.contract(a, b, s.price, s.spread, s.min_duration_s)
        for m in members:
            self.fed.wait_agent(m.name)
        for paced in self.inputs.values():
            paced.start()
        self.say("agents up; input flowing")
        self._wait_measured([m.name for m in members], 180)

    # Drain and compare

    def _finish(self) -> dict:
        self.say("closing the input and draining every task")
        logs = {name: paced.close() for name, paced in self.inputs.items()}
        self._drain(timeout_s=180)
        state = self.poll()
        expected = self._reference(logs)
        tasks = {name: [f"{name}.p{k}" for k in range(self._members[name].partitions)] for name in logs}
        lost = duplicate = 0
        output_rows = 0
        for name, rows in expected.items():
            out = read_outputs(self.s.workdir / "output", tasks[name])
            lost += len(out.lost(rows))
            duplicate += len(out.duplicates)
            output_rows += len(out.rows)
        ledger = state["ledger"]
        return {
            "phases": [p.to_json() for p in self.phases],
            "movements": state["movements"],
            "payments": {"balances": ledger["balances"], "total_paid": sum(b["paid"] for b in ledger["balances"]), "total_earned": sum(b["earned"] for b in ledger["balances"])},
            "expected_results": sum(len(r) for r in expected.values()),
            "output_results": output_rows,
            "lost_results": lost,
            "duplicate_results": duplicate,
            "fed_connections": {name: paced.fed for name, paced in self.inputs.items()},
            "timeline": self.timeline,
            "elapsed_s": round(time.time() - self.t0, 1),
            "workdir": str(self.s.workdir),
        }

    def _drain(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        quiet = 0
        while time.monotonic() < deadline:
            pending = 0
            for name in self.fed.endpoints:
                try:
                    status = httpx.get(self.fed.endpoints[name] + "/status", timeout=10).json()
                except httpx.HTTPError:
                    continue
                host = status.get("last_report", {}).get("details", {}).get("host", {})
                pending += sum(t["backlog_files"] for t in host.get("tasks", []))
            quiet = quiet + 1 if pending == 0 else 0
            if quiet >= 3:
                return
            self.poll()
            time.sleep(self.s.poll_s)
        self.say(f"tasks still had input after {timeout_s:.0f} s; results compared as they are")

    def _reference(self, logs: dict[str, Path]) -> dict[str, list[ResultRow]]:
        """`bpm pipeline run` over exactly what each participant's stream received."""
        expected = {}
        for name, log in logs.items():
            self.say(f"reference: bpm pipeline run {log.name}")
            result = subprocess.run(
                [
                    BPM, "pipeline", "run", str(log), "--window", str(self.s.window_s), "--lateness", str(self.s.lateness_s),
                    "--min-connections", str(self.s.min_connections), "--min-ports", str(self.s.min_ports), "--master", "local[2]", "--json",
                ],
                capture_output=True, text=True, timeout=600, check=True, cwd=self.s.workdir,
            )
            expected[name] = [ResultRow.from_json(json.loads(line)) for line in result.stdout.splitlines() if line.strip()]
        return expected


def _fmt(values: dict[str, float]) -> str:
    return ", ".join(f"{k}={v:.2f}" for k, v in sorted(values.items()))
