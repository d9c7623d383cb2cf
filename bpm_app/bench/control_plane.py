"""N live agents against one registry, with a simulated Spark host: what the control plane costs.

Each agent is the real `spark_agents.agent.Agent` (its state machine and its effects on
the registry) over a `SimulatedHost` that runs no JVM: its tasks' loads follow a slow
wave of their own, so that participants rise over their thresholds and fall back, and
offers and movements keep flowing. Handovers are real calls between agents in this
process (a registry-signed token, the checkpoint packed and unpacked). Agents tick on a
shared schedule run by a pool of threads; a tick that starts after its due time is late
by the difference. Every HTTP request an agent makes goes through one counting transport.
With an HA mode (`ha_mode`), the contracts carry it and the agents run their HA duties:
replicas are placed and dropped in the registry as tasks move, while the simulated host
runs no replica and ships no delta (there is no data to copy).

With several processes (`processes`), the agents are split into blocks, one per process, so
that the agents' own CPU (the state machine, JSON, httpx) is not one interpreter's: each
process registers its block's participants and their contracts, a ring within the block
(handovers stay calls in its process), warms its agents up and keeps them ticking, and once
every block is warm the counted run begins in all at once; the figures add up over the
processes. The registry's CPU and its counts
of offers and movements are read around that common run.
"""

from __future__ import annotations

import dataclasses
import math
import multiprocessing
import re
import random
import statistics
import threading
import time
import traceback
from collections import Counter
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from bpm.costs import MM1Cost
from bpm_app.bench.blocks import collect, stop
from bpm.costs.base import CostFunction
from bpm_http.client import RegistryClient
from spark_agents.agent import Agent, AgentConfig, OwnTask


class CountingTransport(httpx.BaseTransport):
    """One connection pool for every agent; counts requests (by method and path, ids left
    out: `GET /offers/{id}`) and server errors."""

    def __init__(self, connections: int) -> None:
        self._inner = httpx.HTTPTransport(limits=httpx.Limits(max_connections=connections, max_keepalive_connections=connections))
        self._lock = threading.Lock()
        self.requests = 0
        self.server_errors = 0
        self.by_route: Counter[str] = Counter()

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = self._inner.handle_request(request)
        route = request.method + " " + re.sub(r"/(\d+|cp[0-9a-f]{6}-\d+)(?=/|$)", "/{id}", request.url.path.removeprefix("/api/v1"))
        with self._lock:
            self.requests += 1
            self.server_errors += response.status_code >= 500
            self.by_route[route] += 1
        return response

    def close(self) -> None:
        self._inner.close()


@dataclass
class SimulatedHost:
    """A participant's Spark, simulated: each running task's load is its base load times a
    wave of the participant's (period `wave_s`, phase of its own, on `clock`: seconds since
    the run began), measured at once."""

    cost: CostFunction
    base: Mapping[str, float]
    phase: float
    wave_s: float
    amplitude: float
    clock: Callable[[], float] = time.monotonic
    _running: dict[str, Path] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def start_task(self, task_id: str, source: Any, checkpoint_dir: Path, params: Mapping[str, Any], epoch: int = 0, query: str | None = None) -> None:
        checkpoint_dir.mkdir(parents=True, exist_ok=True)
        (checkpoint_dir / "offsets").write_text(task_id)
        with self._lock:
            self._running[task_id] = checkpoint_dir

    def stop_task(self, task_id: str) -> Path:
        with self._lock:
            return self._running.pop(task_id)

    def end_output(self, task_id: str, until_s: int | None) -> None:
        pass  # a simulated task writes no output

    def running(self) -> set[str]:
        with self._lock:
            return set(self._running)

    def starting(self) -> set[str]:
        return set()

    def loads(self) -> dict[str, float]:
        factor = 1.0 + self.amplitude * math.sin(2 * math.pi * self.clock() / self.wave_s + self.phase)
        return {key: self.base.get(key, 0.05) * factor for key in self.running()}

    def rising(self) -> set[str]:
        return set()  # a simulated task's load is what it is from its start

    def cost_function(self) -> CostFunction:
        return self.cost

    def status(self) -> dict[str, Any]:
        return {"simulated": True, "tasks": len(self._running)}

    # HA: the registry side runs for real; here nothing is copied or replayed.

    def ha_start_duties(self, task_id: str, *args: Any, **kwargs: Any) -> None:
        pass

    def ha_stop_duties(self, task_id: str, release: bool) -> None:
        pass

    def ha_duties_status(self, task_id: str) -> dict[str, Any]:
        return {}

    def ha_start_replica(self, task_id: str, *args: Any, **_: Any) -> None:
        pass

    def ha_stop_replica(self, task_id: str) -> None:
        pass

    def ha_take_over(self, task_id: str, mode: str, *, checkpoint_dir: Path, params: Mapping[str, Any], **_: Any) -> dict[str, Any]:
        self.start_task(task_id, None, checkpoint_dir, params)
        return {"start_position": None, "promoted_rows": 0}

    def ha_first_output(self, task_id: str, since: float) -> float | None:
        return since if task_id in self.running() else None


@dataclass
class Settings:
    agents: int
    seconds: float
    tasks: int = 5
    partners: int = 2  # contracts proposed by each participant (to the next ones on a ring): 2 x this per participant
    tick_s: float = 0.5
    heartbeat_s: float = 1.0
    warmup_s: float = 10.0  # run before counting: agents read everything once, then only changes
    period_s: float = 7.0
    threads: int = 32  # per process
    processes: int = 1
    load_factor: float = 0.8  # mean load over threshold
    skew: float = 0.0  # even participants carry load_factor x (1 + skew), odd ones x (1 - skew)
    amplitude: float = 0.5
    wave_s: float = 120.0
    seed: int = 0
    ha_mode: str = "none"  # the contracts' HA mode; any other than "none" runs the agents' HA duties


def run(url: str, admin_key: str, s: Settings, workdir: Path, progress: Callable[[str, int, int], None] = lambda phase, done, total: None,
        server_cpu: Callable[[], float | None] = lambda: None) -> dict:
    """Register the participants and their contracts, run the agents for `s.seconds` in
    `s.processes` processes, and report what the control plane cost."""
    rng = random.Random(s.seed)
    run_id = f"{rng.randrange(16**6):06x}"
    names = [f"cp{run_id}-{i}" for i in range(s.agents)]
    count = min(s.processes, s.agents)
    blocks = [names[k * s.agents // count:(k + 1) * s.agents // count] for k in range(count)]
    context = multiprocessing.get_context("spawn")  # the parent holds threads and sockets: no fork
    messages, go = context.Queue(), context.Event()
    workers = [context.Process(target=_block, args=(url, admin_key, s, k, block, workdir, messages, go), name=f"bpm-agents-{k}", daemon=True)
               for k, block in enumerate(blocks)]
    operator = RegistryClient(url, admin_key, timeout=60.0)
    totals = {"participants": s.agents, "contracts": sum(len(_ring(len(block), s.partners)) for block in blocks), "agents": s.agents}
    shown: dict[str, dict[int, int]] = {}  # per phase, per block: done

    def show(k: int, what: str, payload: Any) -> None:
        """A block's progress, shown for all of them."""
        if what != "progress":
            return
        phase, done, total = payload
        shown.setdefault(phase, {})[k] = done
        if phase in totals:
            progress(phase, sum(shown[phase].values()), totals[phase])
        else:  # seconds, the same for every block: as far as the slowest
            progress(phase, min(shown[phase].values()) if len(shown[phase]) == len(workers) else 0, total)

    def until(kind: str) -> list[dict]:
        """Show the blocks' progress until each has sent a message of `kind`; their payloads."""
        return collect(messages, workers, kind, "the agents", show)

    try:
        for worker in workers:
            worker.start()
        pairs = sum(until("warm"), [])
        counts_before, cpu_before = _counts(operator), server_cpu()
        go.set()
        parts = until("result")
        cpu_after = server_cpu()
        counts_after = _counts(operator)
    finally:
        stop(workers, go)
        operator.close()
    agent_s = s.agents * s.seconds
    registry_cpu = None if cpu_before is None or cpu_after is None else cpu_after - cpu_before
    lateness = sorted(x for part in parts for x in part["lateness"])
    durations = [x for part in parts for x in part["durations"]]
    requests = sum(part["requests"] for part in parts)
    routes = sum((Counter(part["routes"]) for part in parts), Counter())
    return {
        "agents": s.agents,
        "seconds": s.seconds,
        "load_factor": s.load_factor,
        "skew": s.skew,
        "tasks_per_agent": s.tasks,
        "contracts": len(pairs),
        "tick_s": s.tick_s,
        "heartbeat_s": s.heartbeat_s,
        "warmup_s": s.warmup_s,
        "period_s": s.period_s,
        "threads": s.threads,
        "processes": count,
        "ha_mode": s.ha_mode,
        "ticks": len(lateness),
        "tick_lateness_p50_s": round(statistics.median(lateness), 3) if lateness else None,
        "tick_lateness_p99_s": round(lateness[min(len(lateness) - 1, int(0.99 * len(lateness)))], 3) if lateness else None,
        "tick_duration_p50_s": round(statistics.median(durations), 4) if durations else None,
        "requests_per_agent_s": round(requests / agent_s, 2),
        "requests_per_agent_s_by_route": {route: round(n / agent_s, 3) for route, n in routes.most_common()},
        "registry_cpu_s_per_agent_s": None if registry_cpu is None else round(registry_cpu / agent_s, 4),
        "offers_per_s": round((counts_after[0] - counts_before[0]) / s.seconds, 2),
        "movements_per_s": round((counts_after[1] - counts_before[1]) / s.seconds, 2),
        "movements_before": counts_before[1],  # made in the warm-up, before anything was counted
        "errors": sum(part["errors"] for part in parts),
        "server_errors": sum(part["server_errors"] for part in parts),
        # Steps that lost a race with a change not read yet (a 409): the agent reads again, not an error.
        "races": sum(part["races"] for part in parts),
    }


def _block(url: str, admin_key: str, s: Settings, k: int, names: list[str], workdir: Path, messages: Any, go: Any) -> None:
    """Block `k` of the agents, in a process of its own (see the module text): sends ("warm",
    its contracts) once its agents are warm and ticks them on until `go` is set (the other
    blocks may still be setting up: an agent that stopped would miss its heartbeats and be
    counted failed), then runs them for `s.seconds` and sends ("result", its figures)."""

    def progress(phase: str, done: int, total: int) -> None:
        messages.put((k, "progress", (phase, done, total)))

    try:
        transport = CountingTransport(s.threads + 8)
        agents, pairs = _set_up(url, admin_key, s, names, random.Random(s.seed + k), workdir, transport, progress)
        if s.warmup_s > 0:
            _schedule(list(agents.values()), dataclasses.replace(s, seconds=s.warmup_s), lambda phase, done, total: progress("warm-up", done, total))
        messages.put((k, "warm", pairs))
        _schedule(list(agents.values()), s, progress, stop=go)
        errors_before, races_before = sum(a.errors for a in agents.values()), sum(a.races.count for a in agents.values())
        requests_before, server_errors_before, routes_before = transport.requests, transport.server_errors, Counter(transport.by_route)
        lateness, durations = _schedule(list(agents.values()), s, progress)
        messages.put((k, "result", {
            "lateness": lateness, "durations": durations,
            "requests": transport.requests - requests_before,
            "routes": dict(transport.by_route - routes_before),
            "errors": sum(a.errors for a in agents.values()) - errors_before + transport.server_errors - server_errors_before,
            "server_errors": transport.server_errors - server_errors_before,
            "races": sum(a.races.count for a in agents.values()) - races_before,
        }))
        transport.close()
    except Exception:
        messages.put((k, "error", traceback.format_exc()))


def _set_up(url: str, admin_key: str, s: Settings, names: list[str], rng: random.Random, workdir: Path, transport: CountingTransport,
            progress: Callable[[str, int, int], None]) -> tuple[dict[str, Agent], list[tuple[str, str]]]:
    """Register `names` and their contracts (each with the next `s.partners` on a ring of
    them) and connect their agents, over simulated hosts; the agents and the pairs."""
    operator = RegistryClient(url, admin_key, transport=transport, timeout=60.0)
    cost = MM1Cost.with_threshold(0.63, 1.0)
    agents: dict[str, Agent] = {}

    def fetch(endpoint: str, key: str, epoch: int, token: str) -> bytes:
        return agents[endpoint.rsplit("/", 1)[-1]].release_to_caller(token, key, epoch)

    keys = {}
    for i, name in enumerate(names):
        keys[name] = operator.add_participant(name, f"http://127.0.0.1:1/{name}")["api_key"]
        progress("participants", i + 1, len(names))
    pairs = [(names[i], names[j]) for i, j in _ring(len(names), s.partners)]
    for done, (a, b) in enumerate(pairs, 1):
        proposed = RegistryClient(url, keys[a], transport=transport).propose(b, 1.0, 1.2, 30.0, ha_mode=s.ha_mode)
        RegistryClient(url, keys[b], transport=transport).contract_action(proposed["id"], "accept")
        progress("contracts", done, len(pairs))
    operator.close()
    t0 = time.monotonic()
    for i, name in enumerate(names):
        share = s.load_factor * (1 + s.skew if int(name.rsplit("-", 1)[1]) % 2 == 0 else 1 - s.skew) * 0.63 / s.tasks
        base = {f"{name}.t{k}": share * rng.uniform(0.5, 1.5) for k in range(s.tasks)}
        host = SimulatedHost(cost, base, rng.uniform(0, 2 * math.pi), s.wave_s, s.amplitude, clock=lambda: time.monotonic() - t0)
        config = AgentConfig(
            name=name, workdir=workdir / name, endpoint=f"http://127.0.0.1:1/{name}",
            tasks=[OwnTask(f"t{k}", "") for k in range(s.tasks)],  # no input: the hosts are simulated
            period_s=s.period_s, tick_s=s.tick_s, heartbeat_s=s.heartbeat_s, reference_price=1.0, ha=s.ha_mode != "none",
            warmup_s=0.0, settle_s=0.0,  # the benchmark warms up itself (--warmup); its hosts are simulated
            insecure=True,  # its endpoint is no server: simulated hosts hand over in process (`fetch`)
        )
        agent = Agent(config, RegistryClient(url, keys[name], transport=transport, timeout=60.0), host, fetch=fetch)
        agent.connect()
        agents[name] = agent
        progress("agents", i + 1, len(names))
    return agents, pairs


def _ring(n: int, partners: int) -> list[tuple[int, int]]:
    """The contracts of `n` participants on a ring, each with the next `partners`: index pairs."""
    return sorted({tuple(sorted((i, (i + k) % n))) for i in range(n) for k in range(1, partners + 1) if n > k})


def _dues(first: float, end: float, every: float) -> list[float]:
    """The due times from `first` up to `end`, every `every` seconds."""
    return [first + k * every for k in range(max(0, math.ceil((end - first) / every)))]


def _counts(operator: RegistryClient) -> tuple[int, int]:
    return len(operator.offers()), len(operator.movements())


def _schedule(agents: list[Agent], s: Settings, progress: Callable[[str, int, int], None], stop: Any = None) -> tuple[list[float], list[float]]:
    """Tick every agent every `tick_s` for `seconds` on a pool of threads, each thread taking
    its share of the agents in turn, their first ticks spread over one interval. A tick that
    starts after its due time is late by the difference, and its agent's next tick is due
    one interval after the one it missed: a control plane that cannot keep up shows as
    lateness that grows. The run ends on time; ticks still due then count as late by the
    time left. With `stop` (an event), the run ends once it is set instead, and counts
    nothing of the ticks still due. Returns each tick's lateness and duration."""
    lateness: list[float] = []
    durations: list[float] = []
    lock = threading.Lock()
    start = time.monotonic() + 1.0
    end = math.inf if stop is not None else start + s.seconds

    with ThreadPoolExecutor(max_workers=s.threads, thread_name_prefix="bpm-agent") as pool:
        step = s.tick_s / max(len(agents), 1)
        groups = [agents[i::s.threads] for i in range(min(s.threads, len(agents)))]

        def run_group(group: list[Agent], base: float) -> None:
            due = {id(a): start + base + k * step * s.threads for k, a in enumerate(group)}
            while stop is None or not stop.is_set():
                agent = min(group, key=lambda a: due[id(a)])
                when = due[id(agent)]
                if when >= end:
                    return
                now = time.monotonic()
                if now >= end:  # the run is over: a tick still due was late by the rest of the run
                    with lock:
                        lateness.extend(end - d for a in group for d in _dues(due[id(a)], end, s.tick_s))
                    return
                if now < when:
                    time.sleep(when - now)
                began = time.monotonic()
                agent.tick()
                finished = time.monotonic()
                with lock:
                    lateness.append(max(0.0, began - when))
                    durations.append(finished - began)
                due[id(agent)] = when + s.tick_s

        futures = [pool.submit(run_group, group, g * step) for g, group in enumerate(groups)]
        while not all(f.done() for f in futures):
            if stop is None:
                progress("running", int(min(s.seconds, max(0.0, time.monotonic() - start))), int(s.seconds))
            time.sleep(0.5)
        for f in futures:
            f.result()
    return lateness, durations
