from __future__ import annotations

from datetime import datetime

import pytest

from tests.api.test_ha import beat, silence


@pytest.fixture
def pair(registry):
    """a and b with an active contract at [1, 2] and 10 s minimum duration; a hosts three tasks."""
    a, b = registry.participant("a"), registry.participant("b")
    contract = registry.active_contract(a, "b", b, price_min=1.0, price_max=2.0, duration=10.0)
    tasks = [registry.task(a, f"t{i}", load=0.1 * (i + 1)) for i in range(3)]
    return a, b, contract, [t["id"] for t in tasks]


def _offer(registry, key, contract_id, task_ids, price=1.5, **extra):
    return registry.call("POST", "/offers", key, json={"contract_id": contract_id, "task_ids": task_ids, "price": price, **extra})


def test_offer_accept_moves_tasks_and_end_returns_them(registry, pair):
    a, b, contract, tasks = pair
    offer = _offer(registry, a, contract["id"], tasks[:2]).json()
    assert offer["state"] == "pending" and offer["from"] == "a" and offer["to"] == "b"
    accepted = registry.ok("POST", f"/offers/{offer['id']}/accept", b)
    assert accepted["state"] == "accepted" and len(accepted["movements"]) == 2
    moved = registry.ok("GET", "/tasks?host=b")
    assert [t["id"] for t in moved] == tasks[:2] and all(t["away"] and t["epoch"] == 1 for t in moved)
    movement = registry.ok("GET", f"/movements/{accepted['movements'][0]}", b)
    assert (movement["from"], movement["to"], movement["price"], movement["origin"]) == ("a", "b", 1.5, "a")
    assert movement["state"] == "active"
    registry.clock.advance(5)
    early = registry.call("POST", f"/movements/{movement['id']}/end", a)
    assert early.status_code == 409 and "5.0 s left" in early.json()["detail"]
    registry.clock.advance(5)
    ended = registry.ok("POST", f"/movements/{movement['id']}/end", b)
    assert ended["state"] == "ended"
    task = registry.ok("GET", f"/tasks/{movement['task_id']}")
    assert task["host"] == "a" and not task["away"] and task["epoch"] == 2
    assert registry.call("POST", f"/movements/{movement['id']}/end", a).status_code == 409


def test_subset_accept(registry, pair):
    a, b, contract, tasks = pair
    offer = _offer(registry, a, contract["id"], tasks).json()
    assert registry.call("POST", f"/offers/{offer['id']}/accept", b, json={"task_ids": [999]}).status_code == 422
    accepted = registry.ok("POST", f"/offers/{offer['id']}/accept", b, json={"task_ids": [tasks[2]]})
    assert accepted["accepted_task_ids"] == [tasks[2]]
    assert [t["id"] for t in registry.ok("GET", "/tasks?host=a")] == tasks[:2]


def test_offer_refusals(registry, pair):
    a, b, contract, tasks = pair
    c = registry.participant("c")
    c_task = registry.task(c, "ct")["id"]
    assert _offer(registry, a, contract["id"], tasks, price=2.5).status_code == 422
    assert _offer(registry, a, contract["id"], tasks, price=0.99).status_code == 422
    assert _offer(registry, a, contract["id"], []).status_code == 422
    assert _offer(registry, a, 999, tasks).status_code == 404
    assert _offer(registry, c, contract["id"], [c_task]).status_code == 404  # not c's contract
    assert _offer(registry, a, contract["id"], [c_task]).status_code == 409  # not a's task
    assert _offer(registry, a, contract["id"], [12345]).status_code == 404
    assert _offer(registry, None, contract["id"], tasks).status_code == 401
    offer = _offer(registry, a, contract["id"], tasks[:1]).json()
    second = _offer(registry, a, contract["id"], tasks[1:])
    assert second.status_code == 409 and second.json()["offer_id"] == offer["id"]
    assert registry.call("POST", f"/offers/{offer['id']}/accept", a).status_code == 403  # own offer
    assert registry.call("POST", f"/offers/{offer['id']}/accept", c).status_code == 403  # third party
    assert registry.call("POST", f"/offers/{offer['id']}/accept").status_code == 403  # operator is no party
    assert registry.call("POST", f"/offers/{offer['id']}/reject", a).status_code == 403


def test_first_decision_wins(registry, pair):
    a, b, contract, tasks = pair
    offer = _offer(registry, a, contract["id"], tasks[:1]).json()
    registry.ok("POST", f"/offers/{offer['id']}/reject", b, json={"reason": "too busy"})
    late = registry.call("POST", f"/offers/{offer['id']}/accept", b)
    assert late.status_code == 409 and late.json()["state"] == "rejected"
    assert registry.call("POST", f"/offers/{offer['id']}/reject", b).status_code == 409
    refusal = registry.ok("GET", "/events?kind=offer.rejected", a)[-1]
    assert "too busy" in refusal["message"]
    # After a refusal a new offer may be made.
    again = _offer(registry, a, contract["id"], tasks[:1]).json()
    registry.ok("POST", f"/offers/{again['id']}/accept", b)
    assert registry.call("POST", f"/offers/{again['id']}/accept", b).status_code == 409


def test_offer_expires_and_can_be_withdrawn(registry, pair):
    a, b, contract, tasks = pair
    offer = _offer(registry, a, contract["id"], tasks[:1], ttl_s=5).json()
    registry.clock.advance(6)
    assert registry.ok("GET", f"/offers/{offer['id']}", a)["state"] == "expired"
    assert registry.call("POST", f"/offers/{offer['id']}/accept", b).status_code == 409
    fresh = _offer(registry, a, contract["id"], tasks[:1]).json()
    assert [o["id"] for o in registry.ok("GET", "/offers?state=expired", a)] == [offer["id"]]
    assert registry.call("POST", f"/offers/{fresh['id']}/withdraw", b).status_code == 403
    assert registry.ok("POST", f"/offers/{fresh['id']}/withdraw", a)["state"] == "withdrawn"
    assert registry.ok("GET", "/offers?state=pending", a) == []


def test_offer_needs_contract_in_force(registry, pair):
    a, b, contract, tasks = pair
    registry.ok("POST", f"/contracts/{contract['id']}/terminate", b)
    assert _offer(registry, a, contract["id"], tasks[:1]).status_code == 409


def test_tasks_away_cannot_be_offered_again(registry, pair):
    a, b, contract, tasks = pair
    offer = _offer(registry, a, contract["id"], tasks[:1]).json()
    registry.ok("POST", f"/offers/{offer['id']}/accept", b)
    refused = _offer(registry, a, contract["id"], tasks[:1])
    assert refused.status_code == 409 and "do not run at a" in refused.json()["detail"]
    # b hosts the task now, but never offers it to its own origin.
    back = _offer(registry, b, contract["id"], tasks[:1])
    assert back.status_code == 409 and "belongs to a" in back.json()["detail"]


@pytest.fixture
def chain(registry, pair):
    """a's task t0 runs at c, passed on by b: movements a -> b and b -> c, both active."""
    a, b, contract, tasks = pair
    c = registry.participant("c")
    onward = registry.active_contract(b, "c", c, price_min=1.0, price_max=2.0, duration=30.0)
    first = registry.ok("POST", f"/offers/{_offer(registry, a, contract['id'], tasks[:1]).json()['id']}/accept", b)["movements"][0]
    registry.clock.advance(2)
    offer = _offer(registry, b, onward["id"], tasks[:1], price=1.2).json()
    second = registry.ok("POST", f"/offers/{offer['id']}/accept", c)["movements"][0]
    return a, b, c, tasks[0], first, second


def test_a_host_passes_a_task_on_and_is_paid_by_the_origin_while_it_pays_the_next_host(registry, chain):
    a, b, c, task_id, first, second = chain
    task = registry.ok("GET", f"/tasks/{task_id}")
    assert (task["origin"], task["host"], task["epoch"]) == ("a", "c", 2)
    moved = registry.ok("GET", f"/movements/{second}", c)
    assert (moved["from"], moved["to"], moved["origin"], moved["state"]) == ("b", "c", "a", "active")
    assert registry.ok("GET", f"/movements/{first}", a)["state"] == "active"
    # The origin follows its task down the chain; c sees only the movement it is party to.
    assert [m["id"] for m in registry.ok("GET", "/movements", a)] == [first, second]
    assert [m["id"] for m in registry.ok("GET", "/movements?participant=a", a)] == [first, second]
    assert [m["id"] for m in registry.ok("GET", "/movements", c)] == [second]
    assert registry.call("GET", f"/movements/{first}", c).status_code == 403
    registry.clock.advance(10)
    balances = {x["participant"]: x for x in registry.ok("GET", "/ledger")["balances"]}
    assert balances["a"]["paid"] == pytest.approx(1.5 * 0.1 * 12) and balances["c"]["earned"] == pytest.approx(1.2 * 0.1 * 10)
    assert balances["b"]["balance"] == pytest.approx(1.5 * 0.1 * 12 - 1.2 * 0.1 * 10)
    assert sum(x["balance"] for x in balances.values()) == pytest.approx(0.0)


def test_a_participant_lists_the_tasks_that_concern_it_and_reconciles_with_them(registry, chain):
    from bpm.federation.views import reconcile

    a, b, c, task_id, first, second = chain
    involving = {name: [(t["origin"], t["name"], t["host"]) for t in registry.ok("GET", f"/tasks?involving={name}")] for name in "abc"}
    assert involving["a"] == [("a", "t0", "c"), ("a", "t1", "a"), ("a", "t2", "a")], "its own tasks, wherever they run"
    assert involving["c"] == [("a", "t0", "c")], "the task it hosts"
    assert involving["b"] == [], "b passed t0 on: it neither originates, hosts nor keeps a replica of it"
    plan = reconcile("b", registry.ok("GET", "/tasks?involving=b"), {"a.t0"}, registry.ok("GET", "/movements", b))
    assert plan.stop == ("a.t0",) and plan.start == (), "a task still running at b that left its view stops there"
    assert registry.call("GET", "/tasks?involving=nobody").status_code == 404


def test_the_next_host_returns_a_passed_on_task_to_the_host_that_passed_it(registry, chain):
    a, b, c, task_id, first, second = chain
    registry.clock.advance(30)
    # b no longer runs the task: it cannot return it to a, only take it back from c.
    refused = registry.call("POST", f"/movements/{first}/end", b)
    assert refused.status_code == 409 and refused.json()["onward_movement_id"] == second
    registry.ok("POST", f"/movements/{second}/end", c)
    task = registry.ok("GET", f"/tasks/{task_id}")
    assert (task["host"], task["epoch"]) == ("b", 3)
    assert registry.ok("GET", f"/movements/{first}", a)["state"] == "active"
    registry.ok("POST", f"/movements/{first}/end", b)
    assert (registry.ok("GET", f"/tasks/{task_id}")["host"], registry.ok("GET", f"/tasks/{task_id}")["epoch"]) == ("a", 4)


def test_the_origin_takes_its_task_back_and_the_chain_unwinds(registry, chain):
    a, b, c, task_id, first, second = chain
    registry.clock.advance(9)  # past a -> b's minimum duration (10 s), not yet b -> c's (30 s)
    # The origin is not a party to b -> c: it ends its own movement, which unwinds the chain.
    registry.clock.advance(30)
    foreign = registry.call("POST", f"/movements/{second}/end", a)
    assert foreign.status_code == 403 and "only b and c may end" in foreign.json()["detail"], foreign.text
    registry.clock.advance(-30)
    ended = registry.ok("POST", f"/movements/{first}/end", a)
    assert ended["state"] == "ended"
    assert registry.ok("GET", f"/movements/{second}", c)["state"] == "ended"
    task = registry.ok("GET", f"/tasks/{task_id}")
    assert (task["host"], task["epoch"]) == ("a", 3)  # one change of host: c hands it straight to a
    unwound = registry.ok("GET", "/events?kind=movement.unwound")
    assert [e["data"]["movement_id"] for e in unwound] == [second]
    assert registry.call("POST", f"/movements/{second}/end", b).status_code == 409
    ledger = registry.ok("GET", "/ledger")
    assert {e["movement_id"]: round(e["seconds"], 6) for e in ledger["entries"]} == {first: 11.0, second: 9.0}


def test_a_replicated_task_is_not_passed_on(registry):
    a, b, c = (registry.participant(n) for n in "abc")
    guarded = registry.active_contract(a, "b", b, price_min=1.0, price_max=2.0, duration=10.0, ha_mode="passive_standby")
    plain = registry.active_contract(b, "c", c, price_min=1.0, price_max=2.0, duration=10.0)
    task = registry.task(a, "t", load=0.1)["id"]
    registry.ok("POST", f"/offers/{_offer(registry, a, guarded['id'], [task]).json()['id']}/accept", b)
    refused = _offer(registry, b, plain["id"], [task])
    assert refused.status_code == 409 and "HA replicas" in refused.json()["detail"]
    own = registry.task(b, "own", load=0.1)["id"]
    offered = _offer(registry, b, plain["id"], [own])
    assert offered.status_code == 201


def test_ledger_accrues_price_times_load_times_seconds_and_balances(registry, pair):
    a, b, contract, tasks = pair
    offer = _offer(registry, a, contract["id"], tasks[1:], price=2.0).json()  # loads 0.2 and 0.3
    registry.ok("POST", f"/offers/{offer['id']}/accept", b)
    registry.clock.advance(10)
    first = registry.ok("GET", "/movements", a)[0]
    registry.ok("POST", f"/movements/{first['id']}/end", a)  # 2.0 * 0.2 * 10 = 4.0, then stops
    registry.clock.advance(10)  # the other: 2.0 * 0.3 * 20 = 12.0
    ledger = registry.ok("GET", "/ledger")
    amounts = sorted(round(e["amount"], 9) for e in ledger["entries"])
    assert amounts == [4.0, 12.0]
    balances = {x["participant"]: x for x in ledger["balances"]}
    assert balances["a"]["paid"] == pytest.approx(16.0) and balances["a"]["balance"] == pytest.approx(-16.0)
    assert balances["b"]["earned"] == pytest.approx(16.0)
    assert sum(x["balance"] for x in ledger["balances"]) == pytest.approx(0.0)
    mine = registry.ok("GET", "/ledger", b)
    assert [x["participant"] for x in mine["balances"]] == ["b"]
    c = registry.participant("c")
    assert registry.call("GET", "/ledger?participant=a", c).status_code == 403
    assert registry.ok("GET", "/ledger", c)["entries"] == []


def test_participant_events_are_private(registry, pair):
    a, b, contract, tasks = pair
    c = registry.participant("c")
    reported = registry.ok("POST", "/events", c, status=201, json={"kind": "agent.error", "message": "spark restarted"})
    assert reported["actor"] == "c"
    assert [e["kind"] for e in registry.ok("GET", "/events", c)] == ["participant.registered", "agent.error"]
    assert all(e["actor"] in ("a", "b") or e["subject"] in ("a", "b") for e in registry.ok("GET", "/events", a))
    assert registry.call("POST", "/events", json={"kind": "x", "message": "y"}).status_code == 403
    # An event shows in its subject's feed: only about oneself or a participant one deals with.
    about_a = {"kind": "agent.error", "message": "a is slow", "subject": "a"}
    stranger = registry.call("POST", "/events", c, json=about_a)
    assert stranger.status_code == 403 and "no contract and no task with a" in stranger.json()["detail"]
    assert registry.call("POST", "/events", c, json={**about_a, "subject": "zz"}).status_code == 404
    assert registry.ok("POST", "/events", b, status=201, json=about_a)["subject"] == "a"
    assert registry.ok("POST", "/events", c, status=201, json={**about_a, "subject": "c"})["subject"] == "c"
    assert [e["message"] for e in registry.ok("GET", "/events?kind=agent.error", a)] == ["a is slow"]


def _beat(registry, key, name, task_id, load, total=None):
    registry.ok("POST", f"/participants/{name}/heartbeat", key,
                json={"load": load if total is None else total, "tasks": [{"task_id": task_id, "load": load}]})


def test_a_movement_is_paid_on_the_load_its_host_measures(registry, pair):
    """The payer declared 0.1 for t0; b, hosting it, measures 0.14 then 0.06, within the
    bound the declaration sets; a's own report about a task it no longer hosts changes nothing."""
    a, b, contract, tasks = pair
    offer = _offer(registry, a, contract["id"], tasks[:1], price=2.0).json()
    assert offer["loads"] == [pytest.approx(0.1)], "an offer that names no loads declares what the registry last heard"
    movement = registry.ok("POST", f"/offers/{offer['id']}/accept", b)["movements"][0]

    registry.clock.advance(10)
    _beat(registry, b, "b", tasks[0], 0.14)  # 2.0 x 0.14 x 10 = 2.8
    _beat(registry, a, "a", tasks[0], 0.0)  # not the host: ignored
    registry.clock.advance(5)
    _beat(registry, b, "b", tasks[0], 0.06)  # + 2.0 x 0.06 x 5 = 0.6
    registry.clock.advance(5)  # + 2.0 x 0.06 x 5 = 0.6 at the last measured load, until the next report
    entry = registry.ok("GET", "/ledger")["entries"][0]
    assert (entry["movement_id"], entry["load"], entry["seconds"]) == (movement, 0.06, 20.0)
    assert entry["amount"] == pytest.approx(4.0)
    registry.ok("POST", f"/movements/{movement}/end", a)
    registry.clock.advance(5)
    _beat(registry, b, "b", tasks[0], 0.09)  # after the end: nothing more accrues
    assert registry.ok("GET", "/ledger")["entries"][0]["amount"] == pytest.approx(4.0)


def test_a_host_is_paid_on_no_more_than_the_load_the_offer_declared_nor_its_own_total(registry, pair):
    """A hostile host of a task declared at 0.01 reports it at 10^6 on a total of 0.05:
    it is paid on 1.5 x 0.01, the payer sees one dispute, and a task reported above the
    host's own total is paid on that total."""
    a, b, contract, tasks = pair
    offer = _offer(registry, a, contract["id"], tasks[:1], price=2.0, loads=[0.01]).json()
    assert offer["loads"] == [0.01]
    movement = registry.ok("POST", f"/offers/{offer['id']}/accept", b)["movements"][0]
    assert registry.ok("GET", f"/movements/{movement}", b)["declared_load"] == 0.01
    for _ in range(3):
        registry.clock.advance(10)
        _beat(registry, b, "b", tasks[0], 1e6, total=0.05)
    seen = registry.ok("GET", f"/movements/{movement}", a)
    assert seen["load"] == pytest.approx(0.015) and seen["accrued"] == pytest.approx(2.0 * 0.015 * 30)
    disputes = [e for e in registry.ok("GET", "/events?kind=movement.disputed", a)]
    assert len(disputes) == 1, "a dispute is recorded when the measurement first goes past the bound, not at every report"
    assert disputes[0]["data"]["measured"] == 1e6 and disputes[0]["subject"] == "a" and disputes[0]["actor"] == "b"
    registry.clock.advance(10)
    _beat(registry, b, "b", tasks[0], 0.012, total=0.004)  # more than all it carries: paid on its total
    registry.clock.advance(10)
    assert registry.ok("GET", f"/movements/{movement}", a)["accrued"] == pytest.approx(2.0 * 0.015 * 30 + 2.0 * 0.004 * 20)


def test_offered_loads_are_one_per_task_and_bounded(registry, pair):
    a, b, contract, tasks = pair
    for bad in ([0.1], [0.1, 0.2, 0.3], [-0.1, 0.2], [0.1, 1e7]):
        response = _offer(registry, a, contract["id"], tasks[:2], loads=bad)
        assert response.status_code == 422 and "loads" in str(response.json()["detail"]), (bad, response.text)


def test_a_movement_ends_where_its_accrual_stopped_when_a_report_came_in_while_the_end_waited(registry, pair):
    """The end reads the time before it waits for the task's row; a heartbeat that took the
    row first accrued past that time. The movement ends where the accrual stopped, so what it
    was paid is its load times its whole span, not more."""
    a, b, contract, tasks = pair
    offer = _offer(registry, a, contract["id"], tasks[:1], price=2.0).json()
    movement = registry.ok("POST", f"/offers/{offer['id']}/accept", b)["movements"][0]
    registry.clock.advance(12)
    _beat(registry, b, "b", tasks[0], 0.1)
    registry.clock.advance(-1)  # the end's time, read before the heartbeat committed
    ended = registry.ok("POST", f"/movements/{movement}/end", a)
    span = (datetime.fromisoformat(ended["ended_at"]) - datetime.fromisoformat(ended["started_at"])).total_seconds()
    assert span == pytest.approx(12.0)
    assert ended["accrued"] == pytest.approx(2.0 * 0.1 * span)


def test_accept_settles_the_price_between_range_minimum_and_offered_cap(registry, pair):
    a, b, contract, tasks = pair
    offer = _offer(registry, a, contract["id"], tasks[:1], price=1.8).json()
    assert offer["settled_price"] is None
    for bad in (0.5, 1.9, 2.5):
        assert registry.call("POST", f"/offers/{offer['id']}/accept", b, json={"price": bad}).status_code == 422
    accepted = registry.ok("POST", f"/offers/{offer['id']}/accept", b, json={"price": 1.4})
    assert (accepted["price"], accepted["settled_price"]) == (1.8, 1.4), "the offerer's cap is kept beside the settled price"
    assert registry.ok("GET", f"/offers/{offer['id']}", a)["price"] == 1.8
    assert registry.ok("GET", f"/movements/{accepted['movements'][0]}", a)["price"] == 1.4


def test_an_offer_carries_a_cap_for_each_leading_part_and_a_partial_accept_settles_under_its_own(registry, pair):
    a, b, contract, tasks = pair
    for bad in ([1.8, 1.5], [1.2, 1.5, 1.8], [1.9, 1.7, 1.6], [2.5, 1.8, 1.5], [1.8, 1.6, 1.5, 1.5]):
        response = _offer(registry, a, contract["id"], tasks, price=1.5, caps=bad)
        assert response.status_code == 422 and "cap" in response.json()["detail"], (bad, response.text)
    offer = _offer(registry, a, contract["id"], tasks, price=1.5, caps=[1.9, 1.7, 1.5]).json()
    assert offer["caps"] == [1.9, 1.7, 1.5]
    assert registry.call("POST", f"/offers/{offer['id']}/accept", b, json={"task_ids": tasks[:2], "price": 1.8}).status_code == 422
    accepted = registry.ok("POST", f"/offers/{offer['id']}/accept", b, json={"task_ids": tasks[:2]})
    assert (accepted["price"], accepted["settled_price"]) == (1.5, 1.7), "two tasks settle at most at the cap for two"
    assert {registry.ok("GET", f"/movements/{m}", a)["price"] for m in accepted["movements"]} == {1.7}


def test_an_offer_without_caps_has_its_price_as_the_cap_of_every_part(registry, pair):
    a, b, contract, tasks = pair
    assert _offer(registry, a, contract["id"], tasks[:2], price=1.6).json()["caps"] == [1.6, 1.6]


def test_a_failover_of_a_passed_on_task_ends_its_whole_chain(registry, chain):
    a, b, c, task_id, first, second = chain
    keys = {"a": a, "b": b, "c": c}
    beat(registry, keys, *keys)
    silence(registry, keys, "c")
    registry.ok("POST", f"/tasks/{task_id}/failover", a, status=201, json={"to": "a", "expected_epoch": 2})
    assert {m["id"]: m["state"] for m in registry.ok("GET", "/movements")} == {first: "failed", second: "failed"}
    assert registry.ok("GET", f"/tasks/{task_id}")["host"] == "a"


def test_a_participant_s_view_holds_the_active_movements_and_the_newest_of_each_task_the_list_the_history(registry, pair):
    from bpm.federation.views import reconcile, task_ha_mode

    a, b, contract, tasks = pair
    made = []
    for task_id in (tasks[0], tasks[1], tasks[0]):
        made.append(registry.ok("POST", f"/offers/{_offer(registry, a, contract['id'], [task_id]).json()['id']}/accept", b)["movements"][0])
        registry.clock.advance(10)
        if len(made) < 3:
            registry.ok("POST", f"/movements/{made[-1]}/end", a)
    history = {name: registry.ok("GET", "/movements", key) for name, key in (("a", a), ("b", b))}
    for name, key in (("a", a), ("b", b)):
        view = registry.ok("GET", f"/participants/{name}/view", key)
        assert [m["id"] for m in history[name]] == made
        assert [(m["id"], m["state"]) for m in view["movements"]] == [(made[1], "ended"), (made[2], "active")], name
        # What the agent decides from its view is what it would decide from the whole history.
        for running in (set(), {"a.t0"}, {"a.t1"}):
            assert reconcile(name, view["tasks"], running, view["movements"]) == reconcile(name, view["tasks"], running, history[name])
        assert [task_ha_mode(t, view["movements"], []) for t in view["tasks"]] == [task_ha_mode(t, history[name], []) for t in view["tasks"]]
