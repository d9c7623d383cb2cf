"""A small federation played through the registry's API, for the UI's screenshots.

The registry runs in this process (uvicorn in a thread) with a stepped clock, so half an
hour of heartbeats, negotiations, offers and movements takes seconds. Every record is
made through the JSON API with the participants' own keys, as live agents would make it.
The offer rule here is a plain stand-in for the agents (offer the smallest task at home
to the cheapest partner with room when over threshold; accept when the price covers the
marginal cost of taking it); it only has to produce believable records.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path

from bpm import certificates
from bpm_http.client import RegistryClient, RegistryError
from tests.conftest import free_port

ADMIN_KEY = "ui-operator-key"
STEP_S = 5.0
OFFER_EVERY_STEPS = 6
REFERENCE_PRICE = 1.2


@dataclass
class SteppedClock:
    """The registry's clock: moved forward by the scenario, frozen in between."""

    now: datetime

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


@dataclass
class InProcessRegistry:
    url: str
    admin_key: str
    clock: SteppedClock


@contextmanager
def in_process_registry(workdir: Path, clock: SteppedClock) -> Iterator[InProcessRegistry]:
    """The real registry app on a SQLite file, served by uvicorn in a thread."""
    import uvicorn

    from api.app import create_app
    from api.settings import Settings

    settings = Settings(database_url=f"sqlite:///{workdir / 'registry.db'}")
    app = create_app(settings, admin_key=ADMIN_KEY, clock=clock)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the in-process registry did not start")
        time.sleep(0.05)
    try:
        yield InProcessRegistry(f"http://127.0.0.1:{port}", ADMIN_KEY, clock)
    finally:
        server.should_exit = True
        thread.join(timeout=10)


@dataclass
class Member:
    """One participant of the scenario: its key, tasks at home and demand over time."""

    name: str
    threshold: float
    peak: float  # demand multiplier at the peak
    peak_at_s: float
    joins_at_s: float = 0.0
    task_loads: list[float] = field(default_factory=list)
    client: RegistryClient | None = None
    task_ids: list[int] = field(default_factory=list)

    def demand(self, t: float) -> float:
        """Demand rises to the peak and falls again, like a working day compressed."""
        return 0.75 + (self.peak - 0.75) * math.exp(-(((t - self.peak_at_s) / 420.0) ** 2))

    def cost_scale(self) -> float:
        # D(u) = c u / (1 - u) has marginal cost c / (1 - u)^2: choose c so it equals the reference price at the threshold.
        return REFERENCE_PRICE * (1 - self.threshold) ** 2

    def marginal(self, load: float, delta: float) -> float:
        u = min(max(load, 0.0), 0.98)
        u2 = min(max(load + delta, 0.0), 0.98)
        c = self.cost_scale()
        if u2 == u:
            return c / (1 - u) ** 2
        return abs(c * u2 / (1 - u2) - c * u / (1 - u)) / abs(u2 - u)


MEMBERS = [
    Member("alpha", threshold=0.70, peak=1.4, peak_at_s=1550, task_loads=[0.13, 0.12, 0.14, 0.11, 0.12, 0.10]),
    Member("bravo", threshold=0.65, peak=1.2, peak_at_s=1650, task_loads=[0.14, 0.12, 0.13, 0.11]),
    Member("charlie", threshold=0.75, peak=0.95, peak_at_s=900, task_loads=[0.12, 0.10, 0.11]),
    Member("delta", threshold=0.70, peak=0.9, peak_at_s=1500, joins_at_s=720, task_loads=[0.09, 0.08]),
]


def play(url: str, clock: SteppedClock, duration_s: float = 1800.0) -> dict:
    """Play the scenario against the registry at `url`; returns the participants' keys."""
    members = {m.name: Member(**{k: v for k, v in vars(m).items() if k not in ("client", "task_ids")}) for m in MEMBERS}
    operator = RegistryClient(url, ADMIN_KEY)
    keys: dict[str, str] = {}
    base: dict[int, float] = {}  # task id -> load at demand 1.0
    origin_of: dict[int, str] = {}

    def join(m: Member) -> None:
        address = f"127.0.0.{2 + len(keys)}"
        keys[m.name] = operator.add_participant(m.name, f"https://{address}:9100")["api_key"]
        m.client = RegistryClient(url, keys[m.name])
        m.client.register_certificate(m.name, certificates.self_signed(m.name, [address])[0].decode())  # as its agent does at start
        for i, load in enumerate(m.task_loads):
            task = m.client.register_task(f"{m.name}-conn-p{i}", load=load, input_uri=f"nats://{address}:4222/{m.name}", params={"partition": i, "partitions": len(m.task_loads)})
            m.task_ids.append(task["id"])
            base[task["id"]] = load
            origin_of[task["id"]] = m.name

    alpha, bravo, charlie, delta = (members[n] for n in ("alpha", "bravo", "charlie", "delta"))
    for m in (alpha, bravo, charlie):
        join(m)

    # Negotiations before the day starts: one refusal, one counter-proposal, three contracts.
    cheap = bravo.client.propose("alpha", 0.5, 0.7, 60)
    alpha.client.contract_action(cheap["id"], "reject")
    ab = alpha.client.propose("bravo", 0.9, 1.4, 60)
    bravo.client.contract_action(ab["id"], "accept")
    ac = alpha.client.propose("charlie", 1.2, 1.8, 90)
    charlie.client.counter(ac["id"], 1.4, 2.0, 90)
    alpha.client.contract_action(ac["id"], "accept")
    bc = bravo.client.propose("charlie", 1.0, 1.5, 60, ha_mode="passive_standby")
    charlie.client.contract_action(bc["id"], "accept")

    steps = int(duration_s / STEP_S)
    for step in range(steps + 1):
        t = step * STEP_S
        if not delta.client and t >= delta.joins_at_s:
            join(delta)
            dc = delta.client.propose("charlie", 0.8, 1.2, 60)
            charlie.client.contract_action(dc["id"], "accept")
        if delta.client and step == int((delta.joins_at_s + 300) / STEP_S):
            db = delta.client.propose("bravo", 0.6, 0.9, 60)
            bravo.client.counter(db["id"], 0.9, 1.1, 60)
            delta.client.propose("alpha", 2.0, 2.5, 120, ha_mode="active_standby")
        tasks = operator.tasks()
        loads = {n: 0.0 for n in members}
        per_task: dict[str, list[dict]] = {n: [] for n in members}
        for task in tasks:
            load = round(base[task["id"]] * members[origin_of[task["id"]]].demand(t), 4)
            loads[task["host"]] += load
            per_task[task["host"]].append({"task_id": task["id"], "load": load})
        last = step == steps
        for m in members.values():
            # charlie misses its last heartbeat: the registry suspects it.
            if not m.client or (last and m.name == "charlie"):
                continue
            load = round(loads[m.name], 4)
            m.client.heartbeat(
                m.name,
                {
                    "load": load,
                    "threshold": m.threshold,
                    "marginal_cost": {"shed": round(m.marginal(load, -0.1), 3), "take": round(m.marginal(load, 0.1), 3)},
                    "tasks": per_task[m.name],
                },
            )
        if step % OFFER_EVERY_STEPS == 0 and not last:
            _negotiate(members, tasks, loads, operator)
        if not last:
            clock.advance(STEP_S)
    for m in members.values():
        if m.client:
            m.client.close()
    operator.close()
    return keys


def _negotiate(members: dict[str, Member], tasks: list[dict], loads: dict[str, float], operator: RegistryClient) -> None:
    """Over threshold: offer the smallest task at home to the partner with room; end movements no longer needed."""
    contracts = operator.contracts(state="active")
    for m in members.values():
        if not m.client:
            continue
        if loads[m.name] < m.threshold - 0.12:
            for movement in operator.movements(participant=m.name, state="active"):
                if movement["origin"] == m.name:
                    try:
                        m.client.end_movement(movement["id"])
                        break
                    except RegistryError:
                        continue  # still inside the contract's minimum duration
            continue
        if loads[m.name] <= m.threshold:
            continue
        home = sorted((t for t in tasks if t["origin"] == m.name and not t["away"]), key=lambda t: t["load"])
        if not home:
            continue
        task = home[0]
        partners = []
        for c in contracts:
            if m.name not in (c["proposer"], c["counterparty"]):
                continue
            other = members[c["counterparty"] if c["proposer"] == m.name else c["proposer"]]
            partners.append((c["price_min"], c, other))
        for _, contract, other in sorted(partners, key=lambda x: x[0]):
            room = loads[other.name] + task["load"]
            price = round(min(max(m.marginal(loads[m.name], -task["load"]) * 0.9, contract["price_min"]), contract["price_max"]), 2)
            offer = m.client.offer(contract["id"], [task["id"]], price)
            take = other.marginal(loads[other.name], task["load"])
            if other.client and room <= other.threshold and take < price:
                other.client.accept_offer(offer["id"])
                loads[m.name] -= task["load"]
                loads[other.name] += task["load"]
                break
            if other.client:
                reason = f"taking {task['load']:.2f} would cost {take:.2f} per unit, above the price {price:g}" if take >= price else f"no room: load would reach {room:.2f} over threshold {other.threshold:.2f}"
                other.client.reject_offer(offer["id"], reason)
