"""One scenario played by live agents (stepped against the real registry app) and by the
simulator: both drive the same state machines (`bpm.agent.machine` for the mechanism,
`bpm.ha.machine` for high availability), so they make the same movements, in the same
order, at the same prices, fail the same tasks over to the same participants when one
fails, and end at the same loads."""

from __future__ import annotations

import pytest

from bpm.costs import MM1Cost
from bpm.negotiation import Task
from bpm.sim.federation import Federation
from tests.spark_agents.stepped import stepped_federation
from tests.spark_agents.test_agent import TASK_LOAD, SteppedHost, _round
from tests.spark_agents.test_agent_ha import Fences, SteppedHAHost

COST = dict(a=0.25, c=1.0)  # threshold 0.5 at price 1
TASKS = {"a": 12, "b": 1, "c": 3, "d": 0}
# A sheds to B and C; C, full, passes load on to D, which is cheaper.
CONTRACTS = [("a", "b", 1.0, 1.3), ("a", "c", 1.0, 1.3), ("c", "d", 0.6, 0.9)]


def _live(tmp_path, settle_s: float = 0.0, rounds: int = 20) -> tuple[list[tuple], dict[str, float]]:
    settings = {name: {"settle_s": settle_s} for name in TASKS}
    with stepped_federation(tmp_path, lambda now: SteppedHost(MM1Cost(**COST)), settings=settings) as (operator, agents, add, clock):
        for name, count in TASKS.items():
            add(name, count)
        for a, b, low, high in CONTRACTS:
            proposed = agents[a].client.propose(b, low, high, 30.0)
            agents[b].client.contract_action(proposed["id"], "accept")
        for _ in range(rounds):
            _round(agents, clock)
        moves: dict[int, list] = {}
        for m in sorted(operator.movements(), key=lambda m: m["id"]):
            moves.setdefault(m["offer_id"], [m["from"], m["to"], 0, m["price"]])[2] += 1
        loads = {p["name"]: p["load"] for p in operator.participants()}
    return [tuple(v) for _, v in sorted(moves.items())], loads


def _simulated(settle_s: float = 0.0, rounds: int = 20) -> tuple[list[tuple], dict[str, float]]:
    sim = Federation(period_s=1.0, record=True, settle_s=settle_s)
    for name, count in TASKS.items():
        sim.add_participant(name, MM1Cost(**COST), reference_price=1.0)
        sim.add_tasks(name, [Task(f"{name}.p{i}", TASK_LOAD, name) for i in range(count)])
    for a, b, low, high in CONTRACTS:
        sim.add_contract(a, b, low, high, min_duration_s=30.0)
    sim.run(max_rounds=rounds)
    moves = [(e.origin, e.host, e.tasks, e.price) for e in sim.events if e.kind == "move"]
    return moves, {p.name: p.load for p in sim.participants}


def test_live_agents_and_the_simulator_make_the_same_movements(tmp_path):
    live_moves, live_loads = _live(tmp_path)
    sim_moves, sim_loads = _simulated()
    assert len(live_moves) >= 2, "the scenario moves load more than once"
    assert [m[:3] for m in live_moves] == [m[:3] for m in sim_moves]
    assert [m[3] for m in live_moves] == pytest.approx([m[3] for m in sim_moves])
    assert live_loads == pytest.approx(sim_loads)


def test_with_settling_on_both_sides_live_agents_and_the_simulator_still_make_the_same_movements(tmp_path):
    """Each waits after its tasks change (3 s), behind the same gate of the same machine; the
    live agents begin later (their own tasks' starts are changes too), the decisions are alike."""
    live_moves, live_loads = _live(tmp_path, settle_s=3.0, rounds=30)
    sim_moves, sim_loads = _simulated(settle_s=3.0, rounds=30)
    assert len(live_moves) >= 4, "the scenario moves load more than once"
    assert [m[:3] for m in live_moves] == [m[:3] for m in sim_moves]
    assert [m[3] for m in live_moves] == pytest.approx([m[3] for m in sim_moves])
    assert live_loads == pytest.approx(sim_loads)


def _moves(events) -> list[tuple]:
    return [(e.origin, e.host, e.tasks, e.price) for e in events if e.kind == "move"]


def test_live_agents_and_the_simulator_fail_the_same_tasks_over(tmp_path):
    """b fails after the load settled: a fails b's tasks over to itself (upstream backup, the
    contracts' mode), then sheds again; the simulator decides the same."""
    fences = Fences()
    with stepped_federation(tmp_path, lambda now: SteppedHAHost(fences, now)) as (operator, agents, add, clock):
        for name, count in TASKS.items():
            add(name, count)
        for a, b, low, high in CONTRACTS:
            proposed = agents[a].client.propose(b, low, high, 30.0, ha_mode="upstream_backup")
            agents[b].client.contract_action(proposed["id"], "accept")
        for _ in range(20):
            _round(agents, clock)
        before = {t["name"] for t in operator.tasks(host="b") if t["origin"] == "a"}
        live = {name: agent for name, agent in agents.items() if name != "b"}  # b's process is gone
        for _ in range(25):
            _round(live, clock)
        failed_over = sorted((f["task"], f["from_host"], f["to_host"], f["mode"]) for f in operator.failovers())
        live_after = [(m["from"], m["to"], m["price"]) for m in sorted(operator.movements(), key=lambda m: m["id"])
                      if m["started_at"] >= max(f["detected_at"] for f in operator.failovers())]
        loads = {p["name"]: p["load"] for p in operator.participants() if p["name"] != "b"}

    sim = Federation(period_s=1.0, record=True)
    for name, count in TASKS.items():
        sim.add_participant(name, MM1Cost(**COST), reference_price=1.0)
        sim.add_tasks(name, [Task(f"{name}.p{i}", TASK_LOAD, name) for i in range(count)])
    for a, b, low, high in CONTRACTS:
        sim.add_contract(a, b, low, high, min_duration_s=30.0, ha_mode="upstream_backup")
    sim.run(max_rounds=20)
    moved_before = len(sim.events)
    sim_before = {t for t in sim.participants[sim.index["b"]].hosted}
    assert sim.fail("b") == len(before)
    sim.run(max_rounds=25)
    sim_failed_over = sorted((e.by, e.host, e.origin, "upstream_backup") for e in sim.events if e.kind == "failover")
    assert before, "a had moved tasks to b"
    # Which of a's identical tasks an offer names differs (the registry sorts them by name); the decisions do not.
    assert [f[1:] for f in failed_over] == [f[1:] for f in sim_failed_over] == [("b", "a", "upstream_backup")] * len(before)
    assert {f[0] for f in failed_over} == {f"a.{n}" for n in before}
    assert {f[0] for f in sim_failed_over} == sim_before
    sim_after = _moves(sim.events[moved_before:])
    assert [m[:2] for m in live_after] == [m[:2] for m in sim_after], "after the failover a sheds again, alike"
    assert [m[2] for m in live_after] == pytest.approx([m[3] for m in sim_after])
    assert loads == pytest.approx({p.name: p.load for p in sim.participants if p.name != "b"})
