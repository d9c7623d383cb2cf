"""The simulator: deterministic for a seed, conserves load, unwinds passed-on tasks,
compares against a correct lower bound, and plays the poster's four phases."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from bpm_app.cli import app
from bpm.costs import MM1Cost, QuadraticCost
from bpm.negotiation import Task
from bpm.sim import Federation, SimConfig, build_federation, contract_graph, divisible_optimum, simulate_once
from bpm.sim.scenario import run_poster


def _without_time(r):
    d = r.to_dict()
    d.pop("elapsed_s")
    return d


@pytest.mark.parametrize("forward", [True, False])
def test_a_run_is_deterministic_for_a_seed(forward: bool) -> None:
    config = SimConfig(participants=60, contracts_per_participant=3, price_range=0.2, forward=forward)
    a, b = simulate_once(config, 7, 2), simulate_once(config, 7, 2)
    assert _without_time(a) == _without_time(b)
    assert _without_time(simulate_once(config, 8, 2)) != _without_time(a)


def _total_task_load(fed: Federation) -> float:
    return sum(t.load for p in fed.participants for t in (*p.home.values(), *p.hosted.values()))


@settings(max_examples=15, deadline=None)
@given(st.integers(0, 10_000), st.sampled_from([1, 2, 4]), st.sampled_from([0.0, 0.1, 0.5]), st.sampled_from([0.5, 0.95, 1.2]))
def test_load_is_conserved_and_every_movement_is_inside_its_range(seed, k, e, lf) -> None:
    config = SimConfig(participants=24, contracts_per_participant=k, price_range=e, load_factor=lf, skew=1.0, min_duration_s=14.0)
    fed = build_federation(config, seed, record=True)
    total = fed.loads().sum()
    for _ in range(40):
        fed.step()
        assert fed.loads().sum() == pytest.approx(total)
        assert _total_task_load(fed) == pytest.approx(total)
        for p in fed.participants:
            assert p.load == pytest.approx(sum(t.load for t in (*p.home.values(), *p.hosted.values())), abs=1e-9)
    lo, hi = 1 - e / 2, 1 + e / 2
    for ev in fed.events:
        if ev.kind == "move":
            assert lo - 1e-12 <= ev.price <= hi + 1e-12
    now, alone = fed.cost_rates()
    assert np.all(now <= alone + 1e-9) or fed.ending_count > 0  # gains can only be lost through endings


def test_taking_tasks_back_unwinds_a_chain_of_hosts() -> None:
    fed = Federation(hysteresis=0.0, seed=1)
    cost = QuadraticCost.with_threshold(0.5, 1.0)
    for name in "ABC":
        fed.add_participant(name, cost, 0.5)
    # A range lets B take A's load above the reference price and pass it on below it.
    fed.add_contract("A", "B", 0.8, 1.2, min_duration_s=0.0)
    fed.add_contract("B", "C", 0.8, 1.2, min_duration_s=0.0)
    fed.add_tasks("A", [Task(f"a{i}", 0.05) for i in range(24)])
    fed.run(max_rounds=50)
    a, b, c = fed.participants
    assert any(t.origin == "A" for t in c.hosted.values()), "B should have passed some of A's tasks on to C"
    total = fed.loads().sum()
    for m in [m for m in fed.movements.values() if m.origin == "A"]:
        assert fed.end_movement(m.id, by="A") >= 1
    assert not any(m.origin == "A" for m in fed.movements.values())
    assert not any(t.origin == "A" for t in (*b.hosted.values(), *c.hosted.values()))
    assert len(a.home) == 24 and a.load == pytest.approx(1.2)
    assert fed.loads().sum() == pytest.approx(total)
    assert not fed.movements  # B's onward movements of A's tasks were unwound with them


def test_lower_bound_equalises_marginal_costs_and_bounds_any_allocation() -> None:
    from scipy.optimize import minimize

    rng = np.random.default_rng(3)
    costs = [MM1Cost.with_threshold(t, 1.0) for t in rng.uniform(0.5, 0.9, 4)] + [QuadraticCost(2.0, 0.1)]
    total = 2.5
    bound, x = divisible_optimum(costs, total)
    assert x.sum() == pytest.approx(total)
    marginals = [c.marginal(float(v)) for c, v in zip(costs, x) if v > 1e-9]
    assert max(marginals) == pytest.approx(min(marginals), rel=1e-6)
    res = minimize(lambda v: sum(c.cost(max(float(u), 0.0)) for c, u in zip(costs, v)), np.full(5, total / 5),
                   constraints=[{"type": "eq", "fun": lambda v: v.sum() - total}], bounds=[(0, None)] * 5, method="SLSQP")
    assert bound <= res.fun + 1e-6
    for _ in range(50):
        w = rng.dirichlet(np.ones(5)) * total
        assert bound <= sum(c.cost(float(u)) for c, u in zip(costs, w)) + 1e-9


@pytest.mark.parametrize(("n", "k"), [(10, 1), (11, 3), (200, 4), (50, 8), (5, 8)])
def test_contract_graph_has_about_k_distinct_partners(n: int, k: int) -> None:
    edges = contract_graph(n, k, np.random.default_rng(0))
    assert len(set(edges)) == len(edges)
    assert all(a != b for a, b in edges)
    degree = np.zeros(n, int)
    for a, b in edges:
        degree[a] += 1
        degree[b] += 1
    assert degree.max() <= min(k, n - 1)
    assert degree.mean() >= min(k, n - 1) - 1.0


def test_the_mechanism_reaches_acceptable_allocations_where_the_thesis_says_it_should() -> None:
    # Fine-grained tasks, four partners and a 20% range: the thesis' regime.
    config = SimConfig(participants=80, contracts_per_participant=4, price_range=0.2, cost_model="quadratic")
    results = [simulate_once(config, 0, r) for r in range(5)]
    assert all(r.stable for r in results)
    assert sum(r.reached_acceptable for r in results) >= 4
    assert all(r.total_cost < r.initial_cost for r in results)
    # Every movement lowers both partners' costs; only an ending can leave one worse off.
    assert all(r.worse_off == 0 or r.endings > 0 for r in results)
    # One partner each (the graph is a set of pairs) is not enough.
    single = [simulate_once(replace(config, contracts_per_participant=1), 0, r) for r in range(5)]
    assert not any(r.reached_acceptable for r in single)


def test_poster_scenario_four_phases() -> None:
    p1, p2, p3, p4 = run_poster()
    assert p1.acceptable and not p1.events
    moves2 = {(e.origin, e.host) for e in p2.events if e.kind == "move"}
    assert moves2 == {("A", "B"), ("A", "C")} and p2.acceptable
    assert p3.overloaded and p3.acceptable  # overload: nobody below its threshold
    moves4 = {(e.origin, e.host) for e in p4.events if e.kind == "move"}
    assert ("C", "D") in moves4 and ("B", "C") in moves4
    assert p4.acceptable and not p4.overloaded
    d = {p["name"]: p for p in p4.participants}["D"]
    assert d["load"] > 0 and d["earned"] > 0


runner = CliRunner()


def test_cli_simulate_json_has_the_promised_fields() -> None:
    result = runner.invoke(app, ["simulate", "--participants", "30", "--runs", "3", "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    for key in ("runs", "participants", "acceptable_fraction", "median_rounds", "median_movements", "median_cost_ratio", "elapsed_s"):
        assert key in out
    assert out["runs"] == 3 and out["participants"] == 30


def test_cli_sweep_poster_and_bench(tmp_path) -> None:
    png = tmp_path / "sweep.png"
    result = runner.invoke(app, ["simulate", "--sweep", "--participants", "20", "--runs", "2", "--sweep-k", "1,4",
                                 "--sweep-e", "0,0.2", "--sweep-load-factors", "0.8", "--plot", str(png), "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert len(out["cells"]) == 4 and png.stat().st_size > 1000
    table = runner.invoke(app, ["simulate", "--participants", "20", "--runs", "2"])
    assert table.exit_code == 0 and "reached an acceptable allocation" in table.output
    poster = runner.invoke(app, ["simulate", "--scenario", "poster"])
    assert poster.exit_code == 0 and "D joins" in poster.output and "A -> B" in poster.output
    bench = runner.invoke(app, ["bench", "simulate", "--sizes", "50", "--runs", "2", "--participants", "20", "--jobs", "1", "--json"])
    assert bench.exit_code == 0, bench.output
    b = json.loads(bench.stdout)
    assert b["scale"][0]["participants"] == 50 and "goal_met" in b["quality"]
    bad = runner.invoke(app, ["simulate", "--scenario", "nope"])
    assert bad.exit_code != 0
    split = runner.invoke(app, ["bench", "simulate", "--sizes", "", "--runs", "2", "--participants", "20", "--jobs", "1", "--split", "--json"])
    assert split.exit_code == 0, split.output
    quality = json.loads(split.stdout)["quality"]
    assert quality["split"] and quality["fixed_cost"] == 0.005 and "split_goal_met" in quality and quality["median_splits"] is not None
    too_many = runner.invoke(app, ["simulate", "--split", "--tasks-per-participant", "40", "--runs", "1"])
    assert too_many.exit_code != 0 and "16 tasks" in too_many.output


def test_a_failed_participant_s_tasks_fail_over_to_their_origins_and_nobody_offers_to_it() -> None:
    fed = Federation(period_s=1.0, record=True)
    for name, count in (("a", 12), ("b", 1), ("c", 0)):
        fed.add_participant(name, MM1Cost(a=0.25, c=1.0), reference_price=1.0)
        fed.add_tasks(name, [Task(f"{name}.p{i}", 0.12, name) for i in range(count)])
    fed.add_contract("a", "b", 1.0, 1.3, min_duration_s=30.0, ha_mode="upstream_backup")
    fed.add_contract("a", "c", 1.0, 1.3, min_duration_s=30.0)
    fed.run(max_rounds=10)
    at_b = {t for t, task in fed.participants[fed.index["b"]].hosted.items() if task.origin == "a"}
    assert at_b, "a shed load to b"
    total = _total_task_load(fed)
    assert fed.fail("b") == len(at_b)
    b = fed.participants[fed.index["b"]]
    assert not b.hosted and not b.home and b.load == 0.0
    assert at_b <= set(fed.participants[fed.index["a"]].home), "b's tasks are back at a"
    assert _total_task_load(fed) == pytest.approx(total - 0.12), "only b's own task is gone"
    before = len(fed.events)
    fed.run(max_rounds=10)
    assert all(e.host != "b" for e in fed.events[before:] if e.kind in ("move", "refuse")), "no offer goes to a failed partner"
    assert {(e.by, e.origin, e.host) for e in fed.events if e.kind == "failover"} == {(t, "a", "b") for t in at_b}


def _key_groups_of(fed: Federation) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for p in fed.participants:
        for t in (*p.home.values(), *p.hosted.values()):
            out.setdefault(t.origin, []).append(t.groups)
    return out


def test_tasks_that_split_and_merge_keep_every_key_group_once_and_count_their_fixed_cost() -> None:
    """With splitting on (K = 4, E = 0.1, M/M/1, where tasks of a tenth of a participant are
    too lumpy to reach an acceptable allocation): each participant's tasks still cover each
    of its key groups exactly once, its load is its key groups' load plus a fixed cost per
    task, and more runs end acceptable than without splitting."""
    from bpm.keygroups import KEY_GROUPS, groups

    config = SimConfig(participants=40, contracts_per_participant=4, price_range=0.1, cost_model="mm1", split=True, fixed_cost=0.005)
    fed = build_federation(config, 3, 0)
    fed.run(max_rounds=config.max_rounds)
    assert fed.split_count > 0
    for origin, shares in _key_groups_of(fed).items():
        covered = sorted(g for share in shares for g in groups(share))
        assert covered == list(range(KEY_GROUPS)), f"{origin}'s tasks cover every key group once"
        p = fed.participants[fed.index[origin]]
        assert p.own_load == pytest.approx(float(fed.streams[origin].sum()) + config.fixed_cost * len(shares))
    assert sum(p.load for p in fed.participants) == pytest.approx(_total_task_load(fed))
    with_split = [simulate_once(config, 0, r) for r in range(4)]
    without = [simulate_once(replace(config, split=False), 0, r) for r in range(4)]
    assert sum(r.acceptable_at_end for r in with_split) > sum(r.acceptable_at_end for r in without)
    assert all(r.tasks_end <= 1.5 * r.tasks_start and r.splits > 0 for r in with_split)
    assert all(r.splits == r.merges == 0 and r.tasks_end == r.tasks_start for r in without)
