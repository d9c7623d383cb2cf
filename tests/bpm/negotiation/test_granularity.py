"""Splitting and merging tasks over their key groups: a split only where it lets load move,
never free, and a merge only of a split task's halves where the participant does not shed."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bpm.costs import MM1Cost, QuadraticCost
from bpm.keygroups import MAIN
from bpm.negotiation import Contract, Task, choose_merge, choose_offer, choose_split, piece_load, reference_price, split_depth, why_no_offer

COST = MM1Cost.with_threshold(0.8, 1.0)
CONTRACTS = [Contract("c1", "B", 0.95, 1.05), Contract("c2", "C", 0.97, 1.05)]
FIXED = 0.005


def own(groups: str, load: float, origin: str = "A") -> Task:
    return Task(f"{origin}/{groups}", load, origin, groups=groups)


def test_a_piece_carries_its_share_of_the_input_and_the_whole_fixed_cost():
    assert piece_load(0.085, FIXED) == pytest.approx(0.045)
    assert piece_load(0.085, FIXED, depth=2) == pytest.approx(0.025)
    assert piece_load(FIXED, FIXED) == FIXED


def test_a_lumpy_participant_splits_the_task_whose_piece_pays_after_the_fewest_halvings():
    """Just over its threshold, no task's own saving beats the lowest price: choose_offer has
    nothing, and the task that needs the fewest halvings splits (the smaller of equals)."""
    load = 0.805
    tasks = [own("00", 0.2), own("01", 0.12), own("10", 0.12), own("11", 0.365)]
    assert choose_offer(load=load, cost=COST, tasks=tasks, contracts=CONTRACTS, me="A") is None
    assert why_no_offer(load=load, cost=COST, tasks=tasks, contracts=CONTRACTS)[0] == "lumpy"
    split = choose_split(load=load, cost=COST, tasks=tasks, contracts=CONTRACTS, fixed_cost=FIXED, me="A")
    assert split is not None and split.groups in ("01", "10") and split.id == "A/01"
    need = 0.95
    depth = split_depth(split, load=load, cost=COST, need=need, fixed_cost=FIXED)
    assert depth is not None and depth <= split_depth(tasks[0], load=load, cost=COST, need=need, fixed_cost=FIXED)
    # After `depth` halvings the piece pays from the load the pieces' fixed costs raise,
    # and shedding it leaves less load than now.
    piece, after = piece_load(split.load, FIXED, depth), load + ((1 << depth) - 1) * FIXED
    assert (COST.cost(after) - COST.cost(after - piece)) / piece > need and after - piece < load


def test_no_split_below_the_price_for_tasks_of_others_or_tasks_that_do_not_split():
    tasks = [own("0", 0.3), own("1", 0.3)]
    assert choose_split(load=0.6, cost=COST, tasks=tasks, contracts=CONTRACTS, fixed_cost=FIXED, me="A") is None, "below the price"
    hosted = [own("0", 0.1, origin="B"), Task("A/x", 0.1, "A")]
    assert choose_split(load=0.82, cost=COST, tasks=hosted, contracts=CONTRACTS, fixed_cost=FIXED, me="A") is None
    one_group = [own("010101", 0.1)]
    assert choose_split(load=0.82, cost=COST, tasks=one_group, contracts=CONTRACTS, fixed_cost=FIXED, me="A") is None
    assert choose_split(load=0.82, cost=COST, tasks=tasks, contracts=[], fixed_cost=FIXED, me="A") is None
    lumpy = [own("00", 0.2), own("01", 0.12), own("10", 0.12), own("11", 0.357)]
    assert 0.95 < COST.marginal(0.797) < min(reference_price(c) for c in CONTRACTS) == 1.0
    assert choose_split(load=0.797, cost=COST, tasks=lumpy, contracts=CONTRACTS, fixed_cost=FIXED, me="A") is None, \
        "above the lowest price but below its threshold: the allocation needs no finer unit"
    assert choose_split(load=0.805, cost=COST, tasks=lumpy, contracts=CONTRACTS, fixed_cost=FIXED, me="A") is not None


def test_a_fixed_cost_as_large_as_the_piece_makes_splitting_pointless():
    """Each halving adds a task's fixed cost: a task that is all fixed cost does not split."""
    task = own("", 0.06)
    assert split_depth(task, load=0.805, cost=COST, need=0.95, fixed_cost=0.0) is not None
    assert split_depth(task, load=0.805, cost=COST, need=0.95, fixed_cost=0.06) is None


def test_halves_merge_back_only_where_the_participant_does_not_shed_and_only_halves_of_a_split():
    halves = [own("010", 0.05), own("011", 0.04), own("00", 0.1), own("10", 0.1), own("11", 0.1)]
    merged = choose_merge(load=0.39, cost=COST, tasks=halves, contracts=CONTRACTS, split={(MAIN, "01")}, me="A")
    assert merged is not None and {t.groups for t in merged} == {"010", "011"}
    assert choose_merge(load=0.39, cost=COST, tasks=halves, contracts=CONTRACTS, split=set(), me="A") is None, \
        "the original tasks 10 and 11 never merge"
    # Near the threshold, where it would shed again after merging (within the hysteresis), it keeps them.
    assert choose_merge(load=0.79, cost=COST, tasks=halves, contracts=CONTRACTS, split={(MAIN, "01")}, me="A") is None
    # A half that runs elsewhere (here only a task of another origin has those groups) does not merge.
    away = [own("010", 0.05), own("011", 0.04, origin="B")]
    assert choose_merge(load=0.39, cost=COST, tasks=away, contracts=CONTRACTS, split={(MAIN, "01")}, me="A") is None
    assert choose_merge(load=0.85, cost=COST, tasks=halves, contracts=[], split={(MAIN, "01")}, me="A") is not None, "no contract: nothing to shed to"
    # Halves of two inputs of one stream are two tasks' halves, not one's.
    mixed = [own("010", 0.05), replace(own("011", 0.04), input="sensors"), own("00", 0.1)]
    assert choose_merge(load=0.39, cost=COST, tasks=mixed, contracts=CONTRACTS, split={(MAIN, "01")}, me="A") is None
    assert choose_merge(load=0.39, cost=COST, tasks=mixed, contracts=CONTRACTS, split={("sensors", "01")}, me="A") is None
    both = [*mixed, replace(own("010", 0.05), id="s010", input="sensors")]
    pair = choose_merge(load=0.39, cost=COST, tasks=both, contracts=CONTRACTS, split={("sensors", "01")}, me="A")
    assert pair is not None and {(t.input, t.groups) for t in pair} == {("sensors", "010"), ("sensors", "011")}


@settings(max_examples=200, deadline=None)
@given(
    threshold=st.floats(0.5, 0.9),
    over=st.floats(0.0, 0.05),
    sizes=st.lists(st.floats(0.02, 0.2), min_size=1, max_size=8),
    fixed=st.floats(0.0, 0.01),
    quadratic=st.booleans(),
)
def test_a_split_never_undoes_itself_and_a_merge_never_calls_for_a_split(threshold, over, sizes, fixed, quadratic):
    """Where a participant splits it would not merge, and where it merges it would not split:
    the two decisions never flap between one period and the next."""
    cost = QuadraticCost.with_threshold(threshold, 1.0) if quadratic else MM1Cost.with_threshold(threshold, 1.0)
    tasks = [own(format(k, "03b"), size) for k, size in enumerate(sizes)]
    load = sum(sizes)
    split = choose_split(load=threshold + over, cost=cost, tasks=tasks, contracts=CONTRACTS, fixed_cost=fixed, me="A")
    pairs = [own("0000", 0.02), own("0001", 0.02)]
    if split is not None:
        assert choose_merge(load=threshold + over, cost=cost, tasks=[*tasks, *pairs], contracts=CONTRACTS, split={(MAIN, "000")}, me="A") is None
    merged = choose_merge(load=load, cost=cost, tasks=[*tasks, *pairs], contracts=CONTRACTS, split={(MAIN, "000")}, me="A")
    if merged is not None:
        assert choose_split(load=max(load - fixed, 0.0), cost=cost, tasks=tasks, contracts=CONTRACTS, fixed_cost=fixed, me="A") is None


def test_a_task_names_only_key_groups_that_exist():
    with pytest.raises(ValueError, match="key-group prefix"):
        Task("A/x", 0.1, "A", groups="012")
