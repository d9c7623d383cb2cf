"""The participant's state machine: events in, instructions out, no clock and no I/O."""

from __future__ import annotations

import json

import pytest

from bpm.agent.machine import (
    Accept,
    Answered,
    Contracts,
    End,
    Gather,
    Incoming,
    InputEnded,
    MakeOffer,
    Mechanism,
    Merge,
    OfferReceived,
    Period,
    Refuse,
    Split,
    SplitsRemembered,
    TasksChanged,
    Tick,
    View,
    Wait,
)
from bpm.costs import MM1Cost
from bpm.keygroups import MAIN
from bpm.negotiation import REFUSED_SPLITS, Contract, Movement, Offer, Task

COST = MM1Cost(a=0.25, c=1.0)  # threshold 0.5 at price 1
B = Contract("1", "b", 1.0, 1.2, 30.0)
C = Contract("2", "c", 1.0, 1.2, 30.0)
OWN = tuple(Task(f"t{i}", 0.12, "a") for i in range(8))  # 0.96 of capacity


def _view(now: float, **kw) -> View:
    return View(**{"now_s": now, "load": sum(t.load for t in OWN), "cost": COST, "contracts": (B, C), "offerable": OWN, **kw})


def _kinds(instructions) -> list[str]:
    return [type(i).__name__ for i in instructions]


def test_a_period_is_due_every_period_and_trading_waits_out_the_warm_up_once_recorded():
    m = Mechanism("a", started_s=0.0, period_s=3.0, warmup_s=10.0)
    first = m.handle(Tick(0.0))
    assert _kinds(first) == ["Contracts", "Wait"] and first[1].cause == "warming_up"
    assert m.handle(Tick(1.0)) == [], "not due again within the period"
    assert m.handle(Tick(3.0)) == [Contracts()], "still warming up: recorded once"
    assert m.handle(Tick(12.0)) == [Contracts(), Gather()]


def test_tasks_that_start_while_a_participant_warms_up_extend_its_warm_up_and_later_ones_do_not():
    """A task's first batches cost far more than its later ones: a participant whose tasks
    start one after another trades `warmup_s` after the last that started while it warmed up."""
    m = Mechanism("a", started_s=0.0, period_s=3.0, warmup_s=10.0, settle_s=2.0)
    for at in (2.0, 8.0, 15.0):  # each within the warm-up the one before left
        m.handle(TasksChanged(at))
    assert [i.cause for i in m.handle(Tick(24.0)) if isinstance(i, Wait)] == ["warming_up"]
    assert m.handle(Tick(27.0)) == [Contracts(), Gather()], "warm 10 s after the last start, at the next period"
    assert m.warm_from_s == 15.0
    m.handle(TasksChanged(30.0))  # a task that arrives once it is warm: settling, not warming up
    assert m.warm_from_s == 15.0 and m.settling(31.0)


def test_an_overloaded_participant_offers_its_smallest_tasks_to_the_cheapest_partner_and_remembers_refusals():
    m = Mechanism("a")
    [made] = m.handle(Period(_view(0.0)))
    assert isinstance(made, MakeOffer) and made.offer.partner == "b"
    assert m.handle(Period(_view(1.0, outstanding=True))) == [Wait("outstanding", "an offer of mine is outstanding")]
    m.handle(Answered("b", False, 2.0))
    [again] = m.handle(Period(_view(3.0)))
    assert again.offer.partner == "c", "the partner that refused goes last"
    m.handle(Answered("b", True, 4.0))
    assert m.handle(Period(_view(5.0)))[0].offer.partner == "b", "an acceptance forgets the refusal"


def test_a_partner_that_lets_an_offer_expire_goes_last_until_it_answers_and_no_split_counts_it():
    """A partner settling after its own movements answers nothing; the offer expires. The next
    offer goes to another partner, as after a refusal, but the tasks were not found too large:
    with every partner passed over by expiry the offerer offers again, it does not split."""
    m = Mechanism("a", fixed_cost=0.005)
    shares = _shares({"0": 0.48, "1": 0.48})
    [first] = m.handle(Period(_view(0.0, offerable=shares)))
    assert isinstance(first, MakeOffer) and first.offer.partner == "b"
    m.handle(Answered("b", False, 20.0, expired=True))
    [second] = m.handle(Period(_view(21.0, offerable=shares)))
    assert isinstance(second, MakeOffer) and second.offer.partner == "c", "b let the offer expire: c is tried"
    m.handle(Answered("c", False, 41.0, expired=True))
    [third] = m.handle(Period(_view(42.0, offerable=shares)))
    assert isinstance(third, MakeOffer) and third.offer.partner == "b", "the older expiry first; an expiry is no refusal"
    assert m.refused == {} and m.refused_splits == 0
    m.handle(Answered("b", False, 43.0))
    [fourth] = m.handle(Period(_view(44.0, offerable=shares)))
    assert isinstance(fourth, MakeOffer) and fourth.offer.partner == "c", "b refused now: c, whose offer expired earlier, is tried"
    m.handle(Answered("c", True, 45.0))
    assert m.unanswered == {} and m.passed_over() == {"b": 43.0}, "an answer supersedes the partner's expiry"


def test_a_participant_with_room_accepts_part_of_an_offer_at_a_settled_price_and_refuses_one_without_contract():
    m = Mechanism("b")
    offer = Offer("1", "a", tuple(Task(f"t{i}", 0.12) for i in range(5)), (1.2,) * 5, 1.0, 1.2)
    accept, refuse, *_ = m.handle(Period(View(now_s=0.0, load=0.12, cost=COST, incoming=(Incoming("7", "a", offer), Incoming("8", "x", None)))))
    assert isinstance(accept, Accept) and accept.offer_id == "7" and 0 < len(accept.task_ids) < 5
    assert 1.0 <= accept.price <= 1.2
    assert isinstance(refuse, Refuse) and refuse.reason == "no active contract"
    full = m.handle(OfferReceived(1.0, 0.9, COST, Incoming("9", "a", offer)))
    assert isinstance(full[0], Refuse), "over its threshold it takes nothing"


def test_after_accepting_a_participant_that_settles_neither_ends_nor_offers_until_its_window_fits():
    m = Mechanism("a", settle_s=10.0)
    offer = Offer("1", "b", (Task("x", 0.01),), (1.2,), 1.0, 1.2)
    out = m.handle(Period(_view(0.0, load=0.2, incoming=(Incoming("5", "b", offer),))))
    assert _kinds(out) == ["Accept"], "the period stops after the accept"
    assert _kinds(m.handle(Period(_view(5.0)))) == ["Wait"]
    m.handle(TasksChanged(8.0))
    assert m.handle(Period(_view(12.0))) == [], "settling again since the task started: recorded once"
    assert _kinds(m.handle(Period(_view(18.5)))) == ["MakeOffer"]


def test_a_task_that_a_period_sends_home_is_not_offered_in_the_same_period():
    m = Mechanism("b")
    hosted = Task("h", 0.3, "a")
    moved = Movement("m1", ("h",), "a", "b", price=1.0, load=0.3, started_s=0.0, earliest_end_s=10.0)
    out = m.handle(Period(View(now_s=20.0, load=0.9, cost=COST, contracts=(Contract("3", "c", 1.0, 1.2),), movements=(moved,), offerable=(hosted,))))
    assert isinstance(out[0], End) and out[0].movement.id == "m1"
    assert not any(isinstance(i, MakeOffer) for i in out), out


def _shares(loads: dict[str, float]) -> tuple[Task, ...]:
    return tuple(Task(f"a/{g}", load, "a", groups=g) for g, load in loads.items())


def test_a_participant_splits_a_task_too_large_to_move_and_offers_a_half_next():
    """Just over its threshold with tasks too large for their saving to beat the price
    ("lumpy"), a machine with a fixed cost per task splits one; without one it waits."""
    tasks = _shares({"00": 0.14, "01": 0.13, "10": 0.125, "11": 0.125})  # 0.52 against a threshold of 0.5
    centred = (Contract("1", "b", 0.9, 1.1, 30.0), Contract("2", "c", 0.9, 1.1, 30.0))  # on price 1, where the threshold is
    view = View(now_s=0.0, load=0.52, cost=COST, contracts=centred, offerable=tasks)
    assert [w.cause for w in Mechanism("a").handle(Period(view))] == ["lumpy"]
    [split] = Mechanism("a", fixed_cost=0.01).handle(Period(view))
    assert isinstance(split, Split) and split.task.groups in ("10", "11")
    halves = _shares({"00": 0.14, "01": 0.13, split.task.groups + "0": 0.05, split.task.groups + "1": 0.085,
                      "1" + ("1" if split.task.groups == "10" else "0"): 0.125})
    [made] = Mechanism("a", fixed_cost=0.01).handle(Period(View(now_s=1.0, load=0.53, cost=COST, contracts=centred, offerable=halves)))
    assert isinstance(made, MakeOffer) and made.offer.tasks[0].load == 0.05
    below = View(now_s=0.0, load=0.49, cost=COST, contracts=centred, offerable=tasks)
    assert [w.cause for w in Mechanism("a", fixed_cost=0.01).handle(Period(below))] == ["lumpy"], \
        "below its threshold, though above the lowest price, it does not split: the allocation needs no finer unit"


def test_a_participant_whose_partners_refused_splits_before_offering_the_same_tasks_again():
    m = Mechanism("a", fixed_cost=0.005)
    [first] = m.handle(Period(_view(0.0, offerable=_shares({"0": 0.48, "1": 0.48}))))
    assert isinstance(first, MakeOffer)
    m.handle(Answered("b", False, 1.0))
    [second] = m.handle(Period(_view(2.0, offerable=_shares({"0": 0.48, "1": 0.48}))))
    assert isinstance(second, MakeOffer) and second.offer.partner == "c", "one partner refused: the other is tried"
    m.handle(Answered("c", False, 3.0))
    [split] = m.handle(Period(_view(4.0, offerable=_shares({"0": 0.48, "1": 0.48}))))
    assert isinstance(split, Split), "every partner refused the task as it is: the best offer left goes to one that refused"
    [after] = m.handle(Period(_view(5.0, offerable=_shares({"00": 0.245, "01": 0.24, "1": 0.48}))))
    assert isinstance(after, MakeOffer), "the halves are offered, to partners that refused before the split"


def test_where_partners_refuse_every_size_a_participant_stops_splitting_until_one_accepts():
    """Near saturation no partner has room at any size: two splits on refusals, then offers of
    what it has; an acceptance lets it split on a refusal again, but never a task that such
    a split made (a small piece taken now and then would otherwise halve it on and on)."""
    m = Mechanism("a", fixed_cost=0.005)
    shares, now, split = {"00": 0.32, "01": 0.32, "1": 0.32}, 0.0, []

    def period():
        nonlocal now
        [out] = m.handle(Period(_view(now, offerable=_shares(shares))))
        if isinstance(out, Split):
            g = out.task.groups
            split.append(g)
            load = shares.pop(g)
            shares.update({g + "0": load / 2, g + "1": load / 2})
        else:
            assert isinstance(out, MakeOffer)
            m.handle(Answered(out.offer.partner, False, now + 0.5))
        now += 1.0

    for _ in range(12):
        period()
    assert len(split) == REFUSED_SPLITS == 2
    m.handle(Answered("b", True, now))
    for _ in range(12):
        period()
    assert len(split) == 3 and split[2] == "1", split
    m.handle(Answered("b", True, now))
    for _ in range(12):
        period()
    assert len(split) == 3, "every task left was made by a split on a refusal"


def test_halves_of_a_split_merge_back_where_the_participant_no_longer_sheds():
    halves = _shares({"00": 0.05, "01": 0.06, "1": 0.1})
    view = View(now_s=0.0, load=0.21, cost=COST, contracts=(B, C), offerable=halves, split=((MAIN, "0"),))
    [merge] = Mechanism("a", fixed_cost=0.01).handle(Period(view))
    assert isinstance(merge, Merge) and {t.groups for t in merge.tasks} == {"00", "01"}
    assert [w.cause for w in Mechanism("a", fixed_cost=0.01).handle(Period(View(now_s=0.0, load=0.21, cost=COST, contracts=(B, C),
                                                                                   offerable=halves)))] == ["below_price"], \
        "nothing was split: nothing merges"


def test_halves_wait_to_merge_while_a_partner_under_contract_is_cut_off():
    """A partner that counts as failed (a partition, a crash) may come back: halves merged
    meanwhile would split again once it does, restarting the tasks twice. With its only
    partner cut off (no contract left to trade on) or one of two, the halves stay; once it
    is back, they merge as before."""
    halves = _shares({"00": 0.05, "01": 0.06, "1": 0.1})
    for contracts, unreachable in (((), ("b",)), ((C,), ("b",))):
        view = View(now_s=0.0, load=0.21, cost=COST, contracts=contracts, offerable=halves, split=((MAIN, "0"),), unreachable=unreachable)
        out = Mechanism("a", fixed_cost=0.01).handle(Period(view))
        assert not any(isinstance(i, Merge) for i in out), (contracts, out)
    [merge] = Mechanism("a", fixed_cost=0.01).handle(Period(View(now_s=0.0, load=0.21, cost=COST, contracts=(B, C), offerable=halves,
                                                                 split=((MAIN, "0"),))))
    assert isinstance(merge, Merge)


def test_once_its_input_has_ended_a_participant_neither_splits_nor_merges_and_says_so_once():
    """A split or merge after the input ended could not complete (the agent finds the end
    mark the stream's newest record): told so, the machine asks for neither again (nor
    offers the tasks: they have nothing to offer)."""
    tasks = _shares({"00": 0.14, "01": 0.13, "10": 0.125, "11": 0.125})
    centred = (Contract("1", "b", 0.9, 1.1, 30.0), Contract("2", "c", 0.9, 1.1, 30.0))
    machine = Mechanism("a", fixed_cost=0.01)
    [split] = machine.handle(Period(View(now_s=0.0, load=0.52, cost=COST, contracts=centred, offerable=tasks)))
    assert isinstance(split, Split)
    [said] = machine.handle(InputEnded(1.0, "a's stream has ended"))
    assert isinstance(said, Wait) and said.cause == "input_ended" and "a's stream has ended" in said.message
    assert machine.handle(InputEnded(2.0, "a's stream has ended")) == [], "said once"
    assert [w.cause for w in machine.handle(Period(View(now_s=3.0, load=0.52, cost=COST, contracts=centred, offerable=tasks)))] == ["no_task"]
    halves = _shares({"00": 0.05, "01": 0.06, "1": 0.1})
    assert machine.handle(Period(View(now_s=4.0, load=0.21, cost=COST, contracts=(B, C), offerable=halves, split=((MAIN, "0"),)))) == [], \
        "no merge either (the same cause, recorded once)"


def test_once_its_input_has_ended_a_participant_neither_offers_its_own_tasks_nor_calls_them_home():
    """A task whose input is over only drains: a move would stop it at a batch boundary and
    start it afresh elsewhere for nothing. Another's task it hosts may still go (its
    origin's input is not this participant's)."""
    def period(machine: Mechanism, now: float, **kw) -> list:
        return machine.handle(Period(_view(now, **kw)))

    over = Mechanism("a")
    assert _kinds(period(over, 0.0)) == ["MakeOffer"], "overloaded with its input running: it offers"
    ended = Mechanism("a")
    assert _kinds(ended.handle(InputEnded(0.0, "a's stream has ended"))) == ["Wait"]
    assert [w.cause for w in period(ended, 1.0)] == ["no_task"], "its own tasks stay"
    hosted = Task("h", 0.3, "x")
    [offer] = period(ended, 2.0, offerable=(*OWN, hosted))
    assert isinstance(offer, MakeOffer) and offer.offer.task_ids == ("h",), "what it hosts for another may still go"
    away = Movement("m1", ("t9",), "a", "b", price=1.2, load=0.1, started_s=0.0, earliest_end_s=1.0)
    idle = {"load": 0.1, "offerable": ()}
    assert "End" in _kinds(Mechanism("a").handle(Period(_view(20.0, movements=(away,), **idle)))), "it would call its task home"
    assert not any(isinstance(i, End) for i in period(ended, 20.0, movements=(away,), **idle)), "not once its input has ended"


def test_once_a_partners_input_has_ended_the_tasks_hosted_for_it_neither_move_on_nor_go_back():
    """The agent reads a partner's stream as the tasks it hosts for it do; once that input has
    ended, those tasks drain here as well: a task passed on or sent back would stop at a batch
    boundary and start afresh elsewhere for the few batches it has left."""
    hosted = Task("h", 0.3, "x")
    here = Movement("m2", ("h",), "x", "a", price=0.5, load=0.3, started_s=0.0, earliest_end_s=1.0)
    loaded = {"offerable": (hosted,), "movements": (here,)}
    machine = Mechanism("a")
    assert "End" in _kinds(machine.handle(Period(_view(20.0, **loaded)))), "overloaded, it sends the task back"
    ended = Mechanism("a")
    [said] = ended.handle(InputEnded(0.0, "x's stream has ended", "x"))
    assert said.cause == "input_ended" and "hosts for x" in said.message and ended.input_ended is None
    assert ended.handle(InputEnded(1.0, "x's stream has ended", "x")) == [], "said once"
    assert [w.cause for w in ended.handle(Period(_view(20.0, **loaded)))] == ["no_task"], "nor sent back nor passed on"
    [offer] = ended.handle(Period(_view(30.0, offerable=(*OWN, hosted), movements=(here,))))
    assert isinstance(offer, MakeOffer) and "h" not in offer.offer.task_ids, "its own input goes on: its own tasks still move"
    # Nor does it take a task of that input from a partner that had not read the end yet.
    offer = Offer("1", "b", (Task("t1", 0.12, "x"),), (1.2,), 1.0, 1.2)
    [refused] = ended.handle(OfferReceived(40.0, 0.12, COST, Incoming("3", "b", offer)))
    assert isinstance(refused, Refuse) and "the input of x has ended" in refused.reason
    [accepted] = Mechanism("a").handle(OfferReceived(40.0, 0.12, COST, Incoming("3", "b", offer)))
    assert isinstance(accepted, Accept), "an input that goes on: taken"


def test_halves_split_again_merge_back_deepest_first_into_the_first_task():
    """A task split twice (0 into 00 and 01, then 01 into 010 and 011) merges back in two
    steps: 010 and 011 into 01, then 00 and 01 into 0. Which prefixes were split comes from
    the lineage the registry lists (`split_groups`), as the live agent reads it."""
    from bpm.federation.views import split_groups

    def listed(made_from: dict[str, int]) -> list[dict]:
        # Each task as the registry lists it: the key groups it reads, the tasks it came from.
        return [{"origin": "a", "input_uri": f"nats://10.0.0.2:4222/a/{g}", "from_tasks": list(range(n))}
                for g, n in made_from.items()]

    m = Mechanism("a", fixed_cost=0.01)
    made_from = {"00": 1, "010": 1, "011": 1, "1": 0}
    loads = {"00": 0.05, "010": 0.03, "011": 0.03, "1": 0.1}
    for halves, whole in (({"010", "011"}, "01"), ({"00", "01"}, "0")):
        split = split_groups("a", listed(made_from))
        view = View(now_s=0.0, load=sum(loads.values()), cost=COST, contracts=(B, C), offerable=_shares(loads), split=split)
        [merge] = m.handle(Period(view))
        assert isinstance(merge, Merge) and {t.groups for t in merge.tasks} == halves, (split, merge)
        loads[whole] = sum(loads.pop(g) for g in halves)
        for g in halves:
            del made_from[g]
        made_from[whole] = 2  # a merge's task comes from both halves
    split = split_groups("a", listed(made_from))
    assert split == () and set(loads) == {"0", "1"}
    view = View(now_s=0.0, load=sum(loads.values()), cost=COST, contracts=(B, C), offerable=_shares(loads), split=split)
    assert not any(isinstance(i, Merge) for i in m.handle(Period(view))), "the first tasks 0 and 1 never merge"


def test_the_memory_of_splits_on_refusals_goes_out_and_comes_back_whole_or_not_at_all():
    shares = frozenset({(MAIN, "01"), ("sensors", "1")})
    m = Mechanism("a", fixed_cost=0.01, refused_splits=REFUSED_SPLITS, refusal_split=shares, split_s=100.0)
    again = Mechanism("a", fixed_cost=0.01)
    again.handle(SplitsRemembered(json.loads(json.dumps(m.split_memory()))))
    assert (again.refused_splits, again.refusal_split, again.split_s) == (REFUSED_SPLITS, shares, 100.0)
    # What an agent of one input kept: prefixes of its main input.
    older = Mechanism("a", fixed_cost=0.01)
    older.handle(SplitsRemembered({"refused_splits": 1, "refusal_split": ["01"], "split_s": 100.0}))
    assert older.refusal_split == {(MAIN, "01")}
    # A restarted agent reads its offers' answers again: one decided before its last split resets no count.
    again.handle(Answered("b", True, 90.0))
    assert again.refused_splits == REFUSED_SPLITS
    again.handle(Answered("b", True, 110.0))
    assert again.refused_splits == 0
    never = Mechanism("a", fixed_cost=0.01)
    never.handle(SplitsRemembered(json.loads(json.dumps(never.split_memory()))))
    assert never.split_memory() == {"refused_splits": 0, "refusal_split": [], "split_s": None}
    for bad in ({"refused_splits": REFUSED_SPLITS + 1, "refusal_split": []}, {"refused_splits": True, "refusal_split": []},
                {"refused_splits": 1, "refusal_split": ["2"]}, {"refused_splits": 1, "refusal_split": "01"}, {"refused_splits": 1}, ["01"],
                {"refused_splits": 1, "refusal_split": [["s.x", "0"]]}, {"refused_splits": 1, "refusal_split": [["s", "0", "1"]]},
                {"refused_splits": 1, "refusal_split": [], "split_s": "soon"}, {"refused_splits": 1, "refusal_split": [], "split_s": float("nan")}):
        fresh = Mechanism("a", fixed_cost=0.01)
        with pytest.raises(ValueError):
            fresh.handle(SplitsRemembered(bad))
        assert fresh.split_memory() == never.split_memory(), bad


def test_a_host_refuses_an_offer_of_a_task_whose_query_it_does_not_have_in_that_version():
    mine, other = ("sensors", "7d41f04a01b0a5f0"), ("sensors", "0000000000000000")
    host = Mechanism("b", queries=frozenset({mine}))

    def answer(*queries):
        offer = Offer("1", "a", tuple(Task(f"t{i}", 0.05, "a", query=q) for i, q in enumerate(queries)), (1.2,) * len(queries), 1.0, 1.2)
        [said] = host.handle(OfferReceived(1.0, 0.1, COST, Incoming("3", "a", offer)))
        return said

    assert isinstance(answer(mine, mine, None), Accept), "its own query, and a task of no query (a simulated one)"
    refused = answer(mine, other)
    assert isinstance(refused, Refuse) and refused.reason == "task #t1 runs query sensors (digest 0000000000000000), which I do not have"
    assert isinstance(answer(("sessions", "66a83b3f57cc2a9d")), Refuse), "nothing of an offer holding a query it lacks"
    anyone = Mechanism("b")
    offer = Offer("1", "a", (Task("t0", 0.05, "a", query=other),), (1.2,), 1.0, 1.2)
    assert isinstance(anyone.handle(OfferReceived(1.0, 0.1, COST, Incoming("3", "a", offer)))[0], Accept), "no list: it runs any"


def test_a_host_refuses_an_offer_of_a_task_whose_parameters_do_not_fit_its_query_there():
    mine = ("sensors", "7d41f04a01b0a5f0")
    host = Mechanism("b", queries=frozenset({mine}))
    why = "query 'sensors' has no parameter 'windows' (its parameters: window_s, lateness_s)"
    tasks = (Task("t0", 0.05, "a", query=mine), Task("t1", 0.05, "a", query=mine, unrunnable=why))
    [said] = host.handle(OfferReceived(1.0, 0.1, COST, Incoming("3", "a", Offer("1", "a", tasks, (1.2, 1.2), 1.0, 1.2))))
    assert isinstance(said, Refuse) and said.reason == f"task #t1 cannot run here: {why}", "nothing of it: the whole offer"
    [fine] = host.handle(OfferReceived(2.0, 0.1, COST, Incoming("4", "a", Offer("2", "a", tasks[:1], (1.2,), 1.0, 1.2))))
    assert isinstance(fine, Accept)


def test_the_offer_view_carries_why_a_task_could_not_run_here():
    from bpm.federation.views import offer_view

    offer = {"task_ids": [7, 8], "from": "a", "contract_id": 3, "caps": [1.2, 1.2]}
    view = offer_view(offer, {"price_min": 1.0, "price_max": 1.2}, {7: 0.1, 8: 0.1}, {7: "a", 8: "a"},
                      {7: ("q", "d"), 8: ("q", "d")}, {8: "bad parameters"})
    assert [(t.id, t.unrunnable) for t in view.tasks] == [("7", None), ("8", "bad parameters")]
