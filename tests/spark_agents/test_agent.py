"""The agent's control loop, stepped in one process against the real registry app.

The Spark side is replaced by a host that runs nothing but keeps a checkpoint file per
task and reports fixed loads, so that what is tested here is the loop: reconciliation,
checkpoint handover, offers, answers, ends, heartbeats and the records they leave.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from api.app import create_app
from api.migrate import upgrade
from bpm.client import RegistryClient
from bpm.costs import MM1Cost
from bpm.negotiation import is_acceptable
from bpm.settings import Settings
from spark_agents.agent import Agent, AgentConfig, OwnTask
from tests.api.conftest import Clock

TASK_LOAD = 0.12


class SteppedHost:
    """Runs no Spark: each started task bumps a counter in its checkpoint, like batches would."""

    def __init__(self, cost: MM1Cost) -> None:
        self._running: dict[str, Path] = {}
        self.cost = cost
        self.starts: list[tuple[str, int]] = []
        self.task_load: dict[str, float] = {}

    def start_task(self, task_id, input_path, checkpoint_dir, params):
        checkpoint_dir.mkdir(parents=True, exist_ok=True)
        state = checkpoint_dir / "batches"
        count = int(state.read_text()) if state.exists() else 0
        state.write_text(str(count + 1))
        self.starts.append((task_id, count))
        self._running[task_id] = checkpoint_dir

    def stop_task(self, task_id):
        return self._running.pop(task_id)

    def running(self):
        return set(self._running)

    def loads(self):
        return {key: self.task_load.get(key, TASK_LOAD) for key in self._running}

    def cost_function(self):
        return self.cost

    def status(self):
        return {"tasks": sorted(self._running)}


@pytest.fixture
def federation(tmp_path):
    database_url = f"sqlite:///{tmp_path / 'registry.db'}"
    upgrade(database_url)
    clock = Clock()
    app = create_app(Settings(database_url=database_url), admin_key="op", migrate=False, clock=clock)
    with TestClient(app) as http:
        transport = http._transport
        operator = RegistryClient("http://testserver", "op", transport=transport)
        agents: dict[str, Agent] = {}

        def fetch(endpoint, key, epoch, me):
            return agents[endpoint.rsplit("/", 1)[-1]].release(key, epoch, me)

        def add(name: str, tasks: int) -> Agent:
            key = operator.add_participant(name, f"http://127.0.0.2:9000/{name}")["api_key"]
            client = RegistryClient("http://testserver", key, transport=transport)
            config = AgentConfig(
                name=name,
                workdir=tmp_path / name,
                output_dir=tmp_path / "output",
                endpoint=f"http://127.0.0.2:9000/{name}",
                tasks=[OwnTask(f"p{i}", f"/streams/{name}/partition={i}") for i in range(tasks)],
                period_s=0.0,
                reference_price=1.0,
            )
            # Threshold of a*u/(1-u) at price 1 with a = 0.25: u = 1 - sqrt(0.25) = 0.5.
            agent = Agent(config, client, SteppedHost(MM1Cost(a=0.25, c=1.0)), clock=lambda: clock.now.timestamp(), fetch=fetch)
            agents[name] = agent
            agent.connect()
            return agent

        yield operator, agents, add, clock


def _contract(agents, a, b, price=1.0, duration=30.0):
    proposed = agents[a].client.propose(b, price, price * 1.1, duration)
    agents[b].client.contract_action(proposed["id"], "accept")


def _round(agents, clock, seconds=1.0):
    for agent in agents.values():
        agent.tick()
    clock.advance(seconds)


def test_overloaded_participant_sheds_until_acceptable(federation):
    operator, agents, add, clock = federation
    add("a", 9)  # 1.08 load against a 0.5 threshold: more than one partner can absorb
    add("b", 1)
    add("c", 1)
    _contract(agents, "a", "b")
    _contract(agents, "a", "c")
    for _ in range(12):
        _round(agents, clock)
    loads = {p["name"]: p["load"] for p in operator.participants()}
    thresholds = {p["name"]: p["threshold"] for p in operator.participants()}
    assert loads["a"] < 9 * TASK_LOAD, "load moved away from the overloaded participant"
    assert loads["b"] > TASK_LOAD and loads["c"] > TASK_LOAD, "both partners took load"
    assert is_acceptable(list(loads.values()), list(thresholds.values())), (loads, thresholds)
    # Every moved task resumed from the checkpoint its origin released, never from scratch.
    for name in ("b", "c"):
        moved = [(key, count) for key, count in agents[name].host.starts if key.startswith("a.")]
        assert moved and all(count == 1 for _, count in moved), moved
    ledger = operator.ledger()
    assert sum(b["balance"] for b in ledger["balances"]) == pytest.approx(0.0)
    assert {b["participant"]: b["balance"] < 0 for b in ledger["balances"]}["a"]
    kinds = {e["kind"] for e in operator.events(limit=500)}
    assert {"offer.made", "offer.accepted", "task.received"} <= kinds


def test_movement_ends_and_task_returns_with_its_checkpoint(federation):
    operator, agents, add, clock = federation
    add("a", 6)
    add("b", 0)
    _contract(agents, "a", "b", duration=5.0)
    for _ in range(4):
        _round(agents, clock)
    moved = operator.movements(state="active")
    assert moved, "a shed load to b"
    # The input of a's tasks at home dries up: their load falls and ending now pays for the origin.
    for key in agents["a"].host.running():
        agents["a"].host.task_load[key] = 0.01
    for _ in range(8):
        _round(agents, clock)
    ended = operator.movements(state="ended")
    assert ended, "the origin took its tasks back once hosting them was cheaper than paying"
    back = [(k, c) for k, c in agents["a"].host.starts if k == f"a.{ended[0]['task_name']}"]
    assert back[-1][1] == 2, "the task came back with the partner's checkpoint (started twice before)"


def test_a_failed_step_is_recorded_and_the_loop_goes_on(federation):
    operator, agents, add, clock = federation
    a = add("a", 1)

    def broken():
        raise RuntimeError("spark is gone")

    a.host.loads = broken
    a.tick()
    a.tick()
    assert a.errors >= 2 and a.steps == 2
    reported = [e for e in operator.events(kind="agent.error") if e["actor"] == "a"]
    assert reported and "spark is gone" in reported[0]["message"]
