"""The simulator waits as the live agents do when told to (`warmup_s`, `settle_s`): the
participants decide through the same state machine, behind the same gates."""

from __future__ import annotations

import pytest

from bpm.costs import MM1Cost
from bpm.negotiation import Task
from bpm.sim import Federation, SimConfig, simulate_once


def _pair(min_duration_s: float = 1e6, **waits) -> Federation:
    """A, overloaded (twenty tasks of 0.1 against a threshold of 0.5), with a contract to each
    of B, C and D, idle: A sheds to one partner a round, as much as that one takes."""
    fed = Federation(period_s=5.0, record=True, **waits)
    for name in "ABCD":
        fed.add_participant(name, MM1Cost.with_threshold(0.5, 1.0), 0.5)
    for partner in "BCD":
        fed.add_contract("A", partner, 0.95, 1.05, min_duration_s=min_duration_s)
    fed.add_tasks("A", [Task(f"a{i}", 0.1, "A") for i in range(20)])
    return fed


def _moves(fed: Federation) -> list[float]:
    return [e.time_s for e in fed.events if e.kind == "move"]


def _trades(fed: Federation) -> list[float]:
    """When A offered (a move or a refusal)."""
    return [e.time_s for e in fed.events if e.kind in ("move", "refuse")]


def test_without_waits_a_offers_every_round_from_the_first():
    fed = _pair()
    for _ in range(5):
        fed.step()
    assert _trades(fed) == [5.0, 10.0, 15.0, 20.0, 25.0]
    assert _moves(fed) == [5.0, 15.0, 25.0], "after each acceptance, the partner that took its fill refuses the next offer"


def test_no_load_moves_while_a_participant_warms_up():
    fed = _pair(warmup_s=22.0)
    for _ in range(6):
        fed.step()
    assert _moves(fed) and min(_moves(fed)) == 25.0, "the first round past 22 s"


def test_after_its_tasks_change_a_participant_waits_before_it_trades_again():
    fed = _pair(settle_s=12.0)
    for _ in range(10):
        fed.step()
    # a move changes A's tasks: it next offers in the first round past 12 s; a refusal changes nothing
    assert _trades(fed) == [5.0, 20.0, 25.0, 40.0, 45.0]
    assert [round(p.load, 9) for p in fed.participants] == [0.5] * 4


def test_a_run_is_not_stable_while_a_participant_waits():
    fed = _pair(min_duration_s=10.0, warmup_s=100.0)
    assert fed.run(max_rounds=200, quiet_rounds=3)
    assert min(_moves(fed)) == 100.0


@pytest.mark.parametrize("field", ["warmup_s", "settle_s"])
def test_a_negative_wait_is_refused(field):
    with pytest.raises(ValueError, match="not be negative"):
        SimConfig(**{field: -1.0})


def test_waits_slow_a_random_federation_down_but_it_still_settles():
    quick = simulate_once(SimConfig(participants=40), 3)
    slow = simulate_once(SimConfig(participants=40, warmup_s=30.0, settle_s=14.0), 3)
    assert slow.rounds_run > quick.rounds_run
    assert slow.stable


def test_an_offer_to_a_partner_still_warming_up_expires_unanswered():
    fed = Federation(period_s=5.0, record=True, warmup_s=10.0)
    fed.add_participant("A", MM1Cost.with_threshold(0.5, 1.0), 0.5)
    fed.add_tasks("A", [Task(f"a{i}", 0.1, "A") for i in range(10)])
    for _ in range(3):
        fed.step()  # A is warm at 15 s, with no partner yet
    fed.add_participant("B", MM1Cost.with_threshold(0.5, 1.0), 0.5)  # joins at 15 s: warm at 25 s
    fed.add_contract("A", "B", 0.95, 1.05, min_duration_s=1e6)
    fed.step()
    assert fed.waiting == 1 and _moves(fed) == [], "at 20 s B waits: A's offer expires unanswered"
    assert fed.participants[0].machine.mechanism.unanswered == {"B": 20.0}
    for _ in range(3):
        fed.step()
    assert _moves(fed) and min(_moves(fed)) >= 25.0
