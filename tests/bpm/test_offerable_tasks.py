"""Which tasks an agent may offer: its own running here and, passing load on, others' without
HA, under contracts without HA (`bpm.negotiation.not_offerable`, the registry's rule too)."""

from __future__ import annotations

import pytest

from bpm.costs import MM1Cost
from bpm.keygroups import MAIN
from bpm.federation.views import MIN_TASK_LOAD, offerable_tasks, passing_load, reconcile, split_groups
from bpm.negotiation import Contract, choose_offer, not_offerable


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


def test_passing_on_adds_hosted_tasks_with_their_origin_and_effective_ha_mode():
    tasks = offerable_tasks("b", TASKS, MEASURED, RUNNING, pass_on=True, modes={"a.p3": "none"})
    assert [(t.id, t.origin, t.load, t.ha_mode) for t in tasks] == [("1", "b", 0.2, "none"), ("3", "a", 0.1, "none"), ("4", "a", 0.1, "passive_standby")]


def test_a_hosted_task_is_passed_on_only_without_replicas_and_never_back_to_its_origin():
    def why(origin, task_mode="none", contract_mode="none", partner="c"):
        return not_offerable(me="b", partner=partner, origin=origin, task_mode=task_mode, contract_id="9", contract_mode=contract_mode)

    assert why("b") is None and why("b", "passive_standby", "active_standby") is None, "own tasks go under any contract"
    assert why("a") is None
    assert "keeps HA replicas" in why("a", task_mode="passive_standby")
    assert "contract #9 replicates" in why("a", contract_mode="upstream_backup")
    assert "belongs to a" in why("a", partner="a")
    tasks = offerable_tasks("b", TASKS, MEASURED, RUNNING, pass_on=True)
    cost = MM1Cost(a=0.25, c=1.0)
    with_ha = Contract("1", "c", 0.5, 1.0, ha_mode="passive_standby")
    offer = choose_offer(load=1.0, cost=cost, tasks=tasks, contracts=[with_ha], me="b")
    assert offer is not None and offer.task_ids == ("1",), "under an HA contract only b's own task"
    offer = choose_offer(load=1.0, cost=cost, tasks=tasks, contracts=[Contract("2", "c", 0.5, 1.0)], me="b")
    assert offer is not None and set(offer.task_ids) == {"1", "3"}, "without HA, a's plain task too, never its replicated one"


def test_own_tasks_over_key_groups_may_split_and_those_that_handed_them_over_neither_move_nor_split():
    stream = "nats://10.0.0.1:4222/b"
    tasks = [
        {**task(1, "b", "b", "g0"), "input_uri": f"{stream}/0"},
        {**task(2, "b", "b", "g10-1"), "input_uri": f"{stream}/10", "from_tasks": [7], "since_s": 60},
        {**task(3, "b", "b", "g11-1"), "input_uri": f"{stream}/11", "from_tasks": [7], "since_s": 60},
        {**task(7, "b", "b", "g1"), "input_uri": f"{stream}/1", "until_s": 60},  # ending: its halves took over
        {**task(8, "a", "b", "g"), "input_uri": "nats://10.0.0.2:4222/a"},  # a's: its key groups are a's to split
        {**task(9, "b", "b", "g-2"), "input_uri": stream, "from_tasks": [2, 3], "since_s": 120, "retired": True},
        # The halves of a task over another input of b's stream (`--queries`).
        {**task(10, "b", "b", "s-g0-5"), "input_uri": f"{stream}/s/0", "from_tasks": [5], "since_s": 60},
        {**task(11, "b", "b", "s-g1-5"), "input_uri": f"{stream}/s/1", "from_tasks": [5], "since_s": 60},
    ]
    running = {"b.g0", "b.g10-1", "b.g11-1", "b.g1", "a.g", "b.g-2", "b.s-g0-5", "b.s-g1-5"}
    measured = dict.fromkeys(running, 0.1)
    offered = offerable_tasks("b", tasks, measured, running, pass_on=True)
    assert [(t.id, t.input, t.groups) for t in offered] == [("1", MAIN, "0"), ("2", MAIN, "10"), ("3", MAIN, "11"), ("8", MAIN, None),
                                                            ("10", "s", "0"), ("11", "s", "1")]
    assert split_groups("b", tasks) == ((MAIN, "1"), ("s", "")), "the halves of g1 and of s may merge back; a merge's task is no half"
    catching_up = {**measured, "b.g1": 0.4}
    assert passing_load("b", tasks, catching_up, fixed_cost=0.05) == pytest.approx(0.35), \
        "only the ended g1 passes (a retired task runs nowhere), down to its fixed cost"
    assert passing_load("b", tasks, {**catching_up, "b.g1": 0.03}, fixed_cost=0.05) == 0.0
    assert passing_load("c", tasks, catching_up) == 0.0, "not c's"
    plan = reconcile("b", tasks, running, [])
    assert plan.stop == ("b.g-2",) and plan.start == (), "a retired task runs nowhere"


def test_an_offer_as_the_host_sees_it_carries_each_task_s_query_as_the_registry_records_it():
    from bpm.federation.views import offer_view, task_query

    records = [{"id": 1, "query": "sensors", "query_digest": "7d41f04a01b0a5f0"}, {"id": 2, "query": None, "query_digest": None}, {"id": 3}]
    assert [task_query(r) for r in records] == [("sensors", "7d41f04a01b0a5f0"), None, None]
    offer = offer_view({"contract_id": 4, "from": "a", "task_ids": [1, 2], "caps": [1.0, 1.0]}, {"price_min": 0.5, "price_max": 1.0},
                       {1: 0.1, 2: 0.2}, {1: "a", 2: "a"}, {r["id"]: task_query(r) for r in records})
    assert [t.query for t in offer.tasks] == [("sensors", "7d41f04a01b0a5f0"), None]


def test_the_host_weighs_an_offered_task_at_the_larger_of_the_load_the_offer_declares_and_the_registry_last_heard():
    """The registry holds the offerer's last heartbeat, which may be sampled between batches
    (0.54 for a task the offerer priced at 0.687): weighed at 0.54, a host at 0.3 would take
    the whole task; weighed as offered, it refuses, and the offerer splits it instead."""
    from bpm.federation.views import offer_view
    from bpm.negotiation import evaluate_offer

    cost = MM1Cost(a=0.1, c=1.0)
    contract = {"price_min": 1.0, "price_max": 2.0}
    base = {"contract_id": 4, "from": "e", "task_ids": [1], "caps": [1.2]}
    heard = {1: 0.54}
    assert offer_view(base, contract, heard).tasks[0].load == 0.54, "an offer without declared loads is weighed as the registry heard"
    declared = offer_view({**base, "loads": [0.687]}, contract, heard)
    assert declared.tasks[0].load == 0.687
    assert offer_view({**base, "loads": [0.3]}, contract, heard).tasks[0].load == 0.54, "declaring less than was heard makes no task smaller"
    assert evaluate_offer(load=0.3, cost=cost, offer=offer_view(base, contract, heard)).count == 1
    assert evaluate_offer(load=0.3, cost=cost, offer=declared).count == 0
