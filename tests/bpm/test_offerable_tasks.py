"""Which tasks an agent may offer: its own running here and, passing load on, others' without HA."""

from __future__ import annotations

from bpm.federation.views import MIN_TASK_LOAD, offerable_tasks


def task(id, origin, host, name=None, ha_mode="none"):
    return {"id": id, "name": name or f"p{id}", "origin": origin, "host": host, "ha_mode": ha_mode}


TASKS = [
    task(1, "b", "b"),  # own, here
    task(2, "b", "c"),  # own, away
    task(3, "a", "b"),  # a's, hosted here
    task(4, "a", "b", ha_mode="passive_standby"),  # a's, hosted here, replicated
    task(5, "b", "b"),  # own, here, not measured yet
    task(6, "a", "b"),  # a's, registry says here, not started yet
]
MEASURED = {"b.p1": 0.2, "b.p2": 0.2, "a.p3": 0.1, "a.p4": 0.1, "b.p5": MIN_TASK_LOAD / 2}
RUNNING = {"b.p1", "a.p3", "a.p4", "b.p5"}


def test_own_tasks_running_here_with_a_measured_load():
    assert [(t.id, t.origin) for t in offerable_tasks("b", TASKS, MEASURED, RUNNING)] == [("1", "b")]


def test_passing_on_adds_hosted_tasks_without_an_ha_mode_and_keeps_their_origin():
    tasks = offerable_tasks("b", TASKS, MEASURED, RUNNING, pass_on=True)
    assert [(t.id, t.origin, t.load) for t in tasks] == [("1", "b", 0.2), ("3", "a", 0.1)]
