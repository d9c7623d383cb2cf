"""What a participant sees at a period, from what its agent read (`bpm.agent.view`): pure rules,
checked without a registry or a host."""

from __future__ import annotations

from datetime import UTC, datetime

from bpm.agent.view import Read, offers_to_answer, see
from bpm.costs import MM1Cost
from bpm.negotiation import Contract

NOW = 1_000_000.0


def at(s: float) -> str:
    return datetime.fromtimestamp(s, UTC).isoformat()


def task(id_, origin, host, load=0.1, **more):
    return {"id": id_, "name": f"t{id_}", "origin": origin, "host": host, "load": load, "input_uri": "", **more}


def offer(id_, from_, to, state="pending", expires=NOW + 10, decided=None, tasks=(1,), contract=7):
    return {"id": id_, "from": from_, "to": to, "state": state, "expires_at": at(expires), "decided_at": decided and at(decided),
            "task_ids": list(tasks), "contract_id": contract, "loads": [0.1] * len(tasks), "caps": [1.0] * len(tasks), "price": 1.0}


def movement(id_, task_id, from_, to, state="active"):
    return {"id": id_, "task_id": task_id, "from": from_, "to": to, "state": state, "price": 1.0, "load": 0.1,
            "started_at": at(NOW - 100), "earliest_end_at": at(NOW - 50), "contract_id": 7}


CONTRACT = Contract(id="7", partner="b", price_min=1.0, price_max=1.1)
RECORD = {"id": 7, "proposer": "a", "counterparty": "b", "price_min": 1.0, "price_max": 1.1, "state": "active"}


def read(**kw) -> Read:
    base = dict(me="a", now_s=NOW, load=0.5, loads={}, measured={}, cost=MM1Cost(a=0.25, c=1.0), contracts=(CONTRACT,), records=(RECORD,))
    return Read(**{**base, **kw})


def test_an_offer_pending_as_read_but_past_its_expiry_is_neither_answered_nor_outstanding():
    offers = [offer(1, "b", "a", expires=NOW - 1), offer(2, "a", "b", expires=NOW - 5)]
    assert offers_to_answer("a", offers, NOW, [CONTRACT]) == []
    view, answers = see(read(offers=offers))
    assert view.incoming == () and not view.outstanding
    [(offer_id, answer)] = answers
    assert (offer_id, answer.partner, answer.expired, answer.at_s) == (2, "b", True, NOW - 5)
    _, again = see(read(offers=offers, answered={2}))
    assert again == [], "an answer is told the machine once"


def test_an_offer_made_to_me_is_seen_with_the_loads_read_at_the_offerer_and_only_under_a_contract_in_force():
    offers = [offer(1, "b", "a", tasks=(5,)), offer(2, "b", "a", tasks=(6,), contract=8)]
    assert [o["id"] for o in offers_to_answer("a", offers, NOW, [CONTRACT])] == [1]
    view, _ = see(read(offers=offers, offered={1: [task(5, "b", "b", load=0.3), task(9, "b", "b")]}))
    [one, other] = view.incoming
    assert one.offer is not None and [(t.id, t.load, t.origin) for t in one.offer.tasks] == [("5", 0.3, "b")]
    assert other.offer is None, "no contract of mine in force: refused whole"


def test_answers_are_told_in_the_order_they_came_an_expiry_from_its_time():
    offers = [offer(1, "a", "b", state="rejected", decided=NOW - 3), offer(2, "a", "c", state="expired", expires=NOW - 8),
              offer(3, "a", "b", state="accepted", decided=NOW - 1)]
    _, answers = see(read(offers=offers))
    assert [(i, a.partner, a.accepted, a.expired) for i, a in answers] == [(2, "c", False, True), (1, "b", False, False), (3, "b", True, False)]


def test_a_movement_from_or_to_a_failed_participant_ends_by_failover_not_by_the_mechanism():
    movements = [movement(1, 10, "a", "b"), movement(2, 11, "a", "c"), movement(3, 12, "d", "a")]
    partners = {"b": "failed", "c": "alive", "d": "suspected"}
    tasks = [task(12, "d", "a")]
    view, _ = see(read(movements=movements, partners=partners, tasks=tasks, ha=True))
    assert [m.id for m in view.movements] == ["2"]
    view, _ = see(read(movements=movements, partners=partners, tasks=tasks, ha=False))
    assert [m.id for m in view.movements] == ["1", "2", "3"], "without HA the mechanism ends them"


def test_as_host_only_what_still_runs_here_may_be_returned():
    # a passed task 10 on to c: the newest movement of the task says where it runs
    movements = [movement(1, 10, "b", "a"), movement(2, 10, "a", "c")]
    view, _ = see(read(movements=movements))
    assert [m.id for m in view.movements] == ["2"]


def test_a_rising_task_or_one_not_measured_here_is_not_offered_and_a_handover_in_progress_shows():
    tasks = [task(1, "a", "a"), task(2, "a", "a"), task(3, "a", "a"), task(4, "a", "b")]
    view, _ = see(read(tasks=tasks, loads={"a.t1": 0.2, "a.t2": 0.2, "a.t3": 0.1}, measured={"a.t1": 0.2, "a.t2": 0.2},
                       rising={"a.t2"}, running={"a.t1", "a.t2", "a.t3", "a.t4"}, hosting={"a.t1", "a.t2", "a.t3", "a.t4"}))
    assert [t.id for t in view.offerable] == ["1"]
    assert view.handing_over, "a.t4 runs here still, though the registry has it at b"


def test_what_ended_tasks_still_cost_above_their_fixed_cost_leaves_the_load_traded_on():
    tasks = [task(1, "a", "a", until_s=123), task(2, "a", "a")]
    view, _ = see(read(load=0.5, tasks=tasks, loads={"a.t1": 0.25, "a.t2": 0.25}, fixed_cost=0.05))
    assert abs(view.load - 0.3) < 1e-9
