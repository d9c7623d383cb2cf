"""The mechanism's promises: both sides of every accepted movement gain, no price leaves
its range, movements end only when that pays, and the decisions need no Spark."""

from __future__ import annotations

import subprocess
import sys

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from bpm.costs import MM1Cost, QuadraticCost
from bpm.negotiation import (
    Contract,
    Movement,
    Offer,
    Task,
    after_answer,
    choose_offer,
    contract_order,
    evaluate_offer,
    is_acceptable,
    movements_to_end,
    settle_price,
    why_no_offer,
    why_refused,
)


@st.composite
def costs(draw):
    if draw(st.booleans()):
        return MM1Cost.with_threshold(draw(st.floats(0.2, 0.9)), draw(st.floats(0.2, 5.0)))
    return QuadraticCost(a=draw(st.floats(0.1, 10.0)), b=draw(st.floats(0.0, 2.0)))


@st.composite
def contracts(draw, partner: str = "B"):
    lo = draw(st.floats(0.05, 5.0))
    width = draw(st.sampled_from([0.0, draw(st.floats(0.0, 1.0))]))
    return Contract(id=f"c-{partner}", partner=partner, price_min=lo, price_max=lo * (1 + width), min_duration_s=60.0)


task_lists = st.lists(st.floats(0.005, 0.3), min_size=1, max_size=25).map(
    lambda loads: [Task(f"t{i}", x, "A") for i, x in enumerate(loads)]
)
margins = st.sampled_from([0.0, 0.05, 0.1, 0.3])


@settings(max_examples=200, deadline=None)
@given(costs(), costs(), task_lists, st.floats(0.0, 1.5), contracts(), margins)
def test_both_sides_of_every_accepted_movement_gain_and_the_price_stays_in_range(
    cost_a, cost_b, tasks, load_b, contract, margin
) -> None:
    load_a = sum(t.load for t in tasks) + 0.1
    offer = choose_offer(load=load_a, cost=cost_a, tasks=tasks, contracts=[contract], margin=margin)
    assume(offer is not None)
    assert offer.partner == "B" and offer.caps
    assert all(contract.price_min < c <= contract.price_max or contract.fixed_price and c == contract.price_min for c in offer.caps)
    assert all(b <= a + 1e-12 for a, b in zip(offer.caps, offer.caps[1:]))
    answer = evaluate_offer(load=load_b, cost=cost_b, offer=offer, margin=margin)
    assume(answer.accepted)
    assert answer.task_ids == offer.task_ids[: answer.count]
    price = settle_price(
        shedder_limit=offer.caps[answer.count - 1], taker_limit=answer.price_floor,
        price_min=contract.price_min, price_max=contract.price_max,
    )
    assert price is not None
    assert contract.price_min <= price <= contract.price_max
    if contract.fixed_price:
        assert price == contract.price_min
    amount = answer.load
    saving_a = cost_a.cost(load_a) - cost_a.cost(load_a - amount)
    extra_b = cost_b.cost(load_b + amount) - cost_b.cost(load_b)
    # Per second: A pays price * amount and saves saving_a; B earns it and spends extra_b.
    assert saving_a - price * amount > 0
    assert price * amount - extra_b > 0


@settings(max_examples=300, deadline=None)
@given(st.floats(0, 10), st.floats(0, 10), st.floats(0, 5), st.floats(0, 5))
def test_settled_price_never_leaves_the_range(shedder, taker, lo, width) -> None:
    hi = lo + width
    price = settle_price(shedder_limit=shedder, taker_limit=taker, price_min=lo, price_max=hi)
    if price is None:
        assert max(lo, taker) > min(hi, shedder)
    else:
        assert lo <= price <= hi
        assert max(lo, taker) <= price <= min(hi, shedder)


def test_settled_price_splits_the_difference_and_a_fixed_price_is_the_price() -> None:
    assert settle_price(shedder_limit=1.4, taker_limit=1.0, price_min=0.5, price_max=2.0) == pytest.approx(1.2)
    assert settle_price(shedder_limit=3.0, taker_limit=0.1, price_min=0.9, price_max=1.1) == pytest.approx(1.0)
    assert settle_price(shedder_limit=3.0, taker_limit=0.1, price_min=1.0, price_max=1.0) == 1.0
    assert settle_price(shedder_limit=0.9, taker_limit=1.0, price_min=0.5, price_max=2.0) is None


def test_contract_order_cheapest_first_refusals_and_unreachable_last() -> None:
    cs = [
        Contract("c1", "B", 1.0, 1.2),
        Contract("c2", "C", 0.8, 1.0),
        Contract("c3", "D", 0.9, 0.9),
        Contract("c4", "E", 0.5, 0.6),
    ]
    assert [c.partner for c in contract_order(cs)] == ["E", "C", "D", "B"]
    order = contract_order(cs, refused_last={"C": 20.0, "E": 10.0}, unreachable={"D"})
    assert [c.partner for c in order] == ["B", "E", "C", "D"]


def test_a_partner_goes_last_only_while_its_answer_to_the_last_offer_is_a_refusal() -> None:
    refused = after_answer({}, "B", False, 10.0)
    refused = after_answer(refused, "C", False, 12.0)
    assert refused == {"B": 10.0, "C": 12.0}
    assert after_answer(refused, "B", False, 15.0) == {"B": 15.0, "C": 12.0}, "the newest refusal counts"
    accepted = after_answer(refused, "B", True, 20.0)
    assert accepted == {"C": 12.0}, "a yes to a later offer forgets the refusal"
    assert refused == {"B": 10.0, "C": 12.0}, "the map given is left as it was"
    cs = [Contract("c1", "B", 1.0, 1.2), Contract("c2", "C", 0.8, 1.0)]  # C is the cheaper
    c_refused = after_answer({}, "C", False, 1.0)
    assert [c.partner for c in contract_order(cs, refused_last=c_refused)] == ["B", "C"]
    assert [c.partner for c in contract_order(cs, refused_last=after_answer(c_refused, "C", True, 2.0))] == ["C", "B"]


def test_a_decision_not_to_offer_says_why() -> None:
    cost = MM1Cost.with_threshold(0.6, 1.0)  # marginal cost 1.0 at load 0.6
    small = [Task(f"t{i}", 0.05, "A") for i in range(10)]
    contracts = [Contract("c", "B", 1.0, 1.2)]
    state = dict(cost=cost, contracts=contracts, margin=0.1)
    cases = {
        "outstanding": dict(load=0.9, tasks=small, outstanding=True),
        "no_contract": dict(load=0.9, tasks=small, contracts=[]),
        "no_task": dict(load=0.9, tasks=[]),
        "below_price": dict(load=0.5, tasks=small),
        "lumpy": dict(load=0.63, tasks=[Task("big", 0.5, "A")]),
    }
    for cause, case in cases.items():
        args = {**state, **case}
        assert choose_offer(**args) is None, cause
        got, sentence = why_no_offer(**args)
        assert got == cause and sentence, (cause, got, sentence)
    assert "0.500" in why_no_offer(**{**state, **cases["lumpy"]})[1], "the sentence names the smallest task"
    assert choose_offer(load=0.9, tasks=small, **state) is not None, "the same state over its threshold with small tasks offers"


def test_a_refusal_says_what_the_whole_first_task_would_cost() -> None:
    # At load 0.5 the marginal cost (0.59) is below the offered cap (0.85), but a task of
    # 0.23 taken at once costs about 1.1 per unit: refused, and the sentence says so.
    cost = MM1Cost.with_threshold(0.6258, 1.0)
    offer = Offer("c", "B", (Task("12", 0.226, "A"),), (0.851,), 0.5, 1.0)
    assert cost.marginal(0.5) < 0.851
    assert not evaluate_offer(load=0.5, cost=cost, offer=offer, margin=0.1).accepted
    unit = cost.marginal_take(0.5, 0.226)
    sentence = why_refused(load=0.5, cost=cost, offer=offer, margin=0.1)
    assert sentence == (f"taking task 12 (0.226 load) at load 0.500 costs {unit:.3f} per unit, "
                        f"{unit * 1.1:.3f} with margin: not below the offered 0.851")
    assert unit * 1.1 >= 0.851
    # A smaller task at the same load is taken: the rule the sentence states is the one applied.
    small = Offer("c", "B", (Task("13", 0.05, "A"),), (0.851,), 0.5, 1.0)
    assert cost.marginal_take(0.5, 0.05) * 1.1 < 0.851
    assert evaluate_offer(load=0.5, cost=cost, offer=small, margin=0.1).accepted


def test_offers_respect_outstanding_prices_and_task_origin() -> None:
    cost = MM1Cost.with_threshold(0.6, 1.0)
    tasks = [Task(f"t{i}", 0.05, "A") for i in range(20)]
    contract = Contract("c", "B", 1.0, 1.0)
    assert choose_offer(load=1.0, cost=cost, tasks=tasks, contracts=[contract], outstanding=True) is None
    assert choose_offer(load=0.5, cost=cost, tasks=tasks[:10], contracts=[contract]) is None  # below threshold
    offer = choose_offer(load=1.0, cost=cost, tasks=tasks, contracts=[contract])
    assert offer is not None
    # It sheds down to about its threshold: every task it gives up saves more than the price.
    assert 1.0 - offer.load == pytest.approx(0.6, abs=0.05)
    # A task is never offered to the participant it belongs to.
    theirs = [Task(f"b{i}", 0.05, "B") for i in range(20)]
    assert choose_offer(load=1.0, cost=cost, tasks=theirs, contracts=[contract]) is None


def test_a_partner_stops_where_its_marginal_cost_meets_the_price() -> None:
    cost_b = MM1Cost.with_threshold(0.7, 1.0)
    contract = Contract("c", "B", 1.0, 1.0)
    tasks = [Task(f"t{i}", 0.05, "A") for i in range(30)]
    offer = choose_offer(load=2.0, cost=MM1Cost.with_threshold(0.5, 1.0), tasks=tasks, contracts=[contract])
    answer = evaluate_offer(load=0.2, cost=cost_b, offer=offer)
    assert answer.accepted
    end = 0.2 + answer.load
    # The last task it took cost it less than the price; one more would not have.
    assert cost_b.marginal_take(end - 0.05, 0.05) < 1.0 <= cost_b.marginal_take(end, 0.05)
    assert abs(end - 0.7) <= 0.05 / 2 + 1e-9  # within half a task of its threshold


def _movement(**kw) -> Movement:
    base = dict(id="m1", task_ids=("t1",), origin="A", host="B", price=1.0, load=0.2, started_s=0.0, earliest_end_s=60.0)
    base.update(kw)
    return Movement(**base)


def test_movements_end_only_after_the_minimum_duration_and_when_it_pays() -> None:
    cost = QuadraticCost.with_threshold(0.8, 1.0)  # marginal cost 1.0 at load 0.8
    m = _movement()
    # The origin, now nearly idle, would take its tasks back ... but not before earliest end.
    assert movements_to_end(me="A", now_s=30.0, load=0.1, cost=cost, movements=[m]) == ()
    assert movements_to_end(me="A", now_s=60.0, load=0.1, cost=cost, movements=[m]) == ("m1",)
    # Not when keeping the partner costs less than hosting them (within the margin).
    assert movements_to_end(me="A", now_s=60.0, load=0.75, cost=cost, movements=[m]) == ()
    # The host returns them when keeping them costs it more than the price, by the margin.
    assert movements_to_end(me="B", now_s=60.0, load=1.2, cost=cost, movements=[m]) == ("m1",)
    assert movements_to_end(me="B", now_s=60.0, load=0.85, cost=cost, movements=[m]) == ()
    # Someone else's movement is none of its business.
    assert movements_to_end(me="C", now_s=60.0, load=5.0, cost=cost, movements=[m]) == ()


@settings(max_examples=150, deadline=None)
@given(costs(), costs(), task_lists, st.floats(0.0, 1.5), contracts(), st.floats(0.0, 0.5))
def test_right_after_a_movement_neither_side_ends_it(cost_a, cost_b, tasks, load_b, contract, hysteresis) -> None:
    load_a = sum(t.load for t in tasks) + 0.1
    offer = choose_offer(load=load_a, cost=cost_a, tasks=tasks, contracts=[contract])
    assume(offer is not None)
    answer = evaluate_offer(load=load_b, cost=cost_b, offer=offer)
    assume(answer.accepted)
    price = settle_price(shedder_limit=offer.caps[answer.count - 1], taker_limit=answer.price_floor,
                         price_min=contract.price_min, price_max=contract.price_max)
    m = _movement(task_ids=answer.task_ids, price=price, load=answer.load, earliest_end_s=0.0)
    assert movements_to_end(me="A", now_s=0.0, load=load_a - answer.load, cost=cost_a, movements=[m], hysteresis=hysteresis) == ()
    assert movements_to_end(me="B", now_s=0.0, load=load_b + answer.load, cost=cost_b, movements=[m], hysteresis=hysteresis) == ()


def test_acceptable_allocations() -> None:
    assert is_acceptable([0.5, 0.7], [0.8, 0.8])
    assert not is_acceptable([0.9, 0.3], [0.8, 0.8])
    # Overload: acceptable when nobody is below its threshold.
    assert is_acceptable([1.0, 0.8], [0.8, 0.8])
    assert not is_acceptable([1.2, 0.7], [0.8, 0.8])
    with pytest.raises(ValueError):
        is_acceptable([1.0], [1.0, 2.0])


def test_decisions_import_without_spark() -> None:
    code = (
        "import sys; sys.modules['pyspark'] = None\n"
        "import bpm.negotiation, bpm.costs, bpm.sim\n"
        "assert not any(m.startswith('pyspark') and sys.modules[m] is not None for m in sys.modules)\n"
        "from bpm.sim import SimConfig, simulate_once\n"
        "simulate_once(SimConfig(participants=10), 0)\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
