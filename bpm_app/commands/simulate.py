"""`bpm simulate` and `bpm bench simulate`: the federation simulator from the command line."""

from __future__ import annotations

import json
import sys
import time
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Any, Iterator, Optional

import typer

from bpm.sim.generate import COST_MODELS
from bpm_app.commands import app, bench_app, choice

CostModel = choice("CostModel", COST_MODELS)
Scenario = choice("Scenario", ("poster",))

SWEEP_K = "1,2,3,4,6,8"
SWEEP_E = "0,0.05,0.1,0.2,0.5"
SWEEP_LF = "0.5,0.8,0.95"


def _floats(text: str) -> list[float]:
    try:
        return [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise typer.BadParameter(f"expected comma-separated numbers, got {text!r}") from None


def _ints(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise typer.BadParameter(f"expected comma-separated integers, got {text!r}") from None


@contextmanager
def _progress(total: int, label: str) -> Iterator[Any]:
    """Runs done, on stderr (`bpm_app.progress`); yields a function that counts more done."""
    from bpm_app.progress import progress

    with progress("runs") as steps:
        step = steps.add(label, total)
        yield lambda n: steps.update(step, advance=n)


def _fmt(value: Any, digits: int = 3) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


@app.command("simulate")
def simulate(
    participants: Annotated[int, typer.Option(help="Participants in each federation.")] = 100,
    contracts_per_participant: Annotated[int, typer.Option("--contracts-per-participant", "-k", help="Contract partners per participant (random graph).")] = 4,
    price_range: Annotated[float, typer.Option("--price-range", "-e", help="Relative width E of each price range, centred on the reference price: \\[p(1-E/2), p(1+E/2)].")] = 0.1,
    load_factor: Annotated[float, typer.Option(help="Total load over the sum of the thresholds.")] = 0.8,
    skew: Annotated[float, typer.Option(help="How unevenly load starts: 0 = every participant at the same fraction of its threshold, 1 = from 0 to twice that.")] = 0.5,
    tasks_per_participant: Annotated[float, typer.Option(help="Tasks per participant on average (their granularity).")] = 10.0,
    cost_model: Annotated[CostModel, typer.Option(help="mm1 (Borealis' M/M/1 delay), quadratic, or mixed.")] = CostModel.mm1,
    hysteresis: Annotated[float, typer.Option(help="Relative margin on ending movements.")] = 0.1,
    margin: Annotated[float, typer.Option(help="Relative margin on offering and accepting load.")] = 0.0,
    forward: Annotated[bool, typer.Option("--forward/--no-forward", help="Whether hosts may pass hosted tasks on.")] = True,
    split: Annotated[bool, typer.Option("--split/--no-split", help="Whether tasks split and merge over their key groups.")] = False,
    fixed_cost: Annotated[float, typer.Option(help="With --split: what a running task costs whatever its input (share of a participant's capacity).")] = 0.005,
    warmup: Annotated[float, typer.Option(help="Seconds a participant neither offers nor takes load after the start, as a live agent warms up (0: none).")] = 0.0,
    settle: Annotated[float, typer.Option(help="Seconds a participant neither offers nor takes load after its tasks change, as a live agent settles (0: none).")] = 0.0,
    runs: Annotated[int, typer.Option(help="Runs (random federations) per setting.")] = 20,
    seed: Annotated[int, typer.Option(help="Seed: the same seed gives the same results.")] = 0,
    jobs: Annotated[int, typer.Option(help="Processes to spread runs over (0: one per CPU).")] = 1,
    max_rounds: Annotated[int, typer.Option(help="Rounds after which a run stops even if load still moves.")] = 500,
    scenario: Annotated[Optional[Scenario], typer.Option(help="poster: the Borealis demonstration's four phases.")] = None,
    sweep: Annotated[bool, typer.Option(help="Run the grid --sweep-k x --sweep-e x --sweep-load-factors.")] = False,
    sweep_k: Annotated[str, typer.Option(help="Contracts per participant for --sweep.")] = SWEEP_K,
    sweep_e: Annotated[str, typer.Option(help="Price ranges for --sweep.")] = SWEEP_E,
    sweep_load_factors: Annotated[str, typer.Option(help="Load factors for --sweep.")] = SWEEP_LF,
    plot: Annotated[Optional[Path], typer.Option(help="With --sweep: write a PNG of the results here.")] = None,
    details: Annotated[bool, typer.Option(help="With --json: include every run's result.")] = False,
    json_out: Annotated[bool, typer.Option("--json", help="Print one JSON object instead of tables.")] = False,
) -> None:
    """Simulate federations that run the Bounded-Price Mechanism, round by round."""
    from bpm.sim import SimConfig

    if scenario is not None:
        _poster(hysteresis=hysteresis, seed=seed, json_out=json_out)
        return
    try:
        base = SimConfig(
            participants=participants, contracts_per_participant=contracts_per_participant, price_range=price_range,
            load_factor=load_factor, skew=skew, tasks_per_participant=tasks_per_participant, cost_model=cost_model.value,
            hysteresis=hysteresis, margin=margin, forward=forward, max_rounds=max_rounds, split=split, fixed_cost=fixed_cost,
            warmup_s=warmup, settle_s=settle,
        )
    except ValueError as err:
        raise typer.BadParameter(str(err)) from None
    if runs < 1:
        raise typer.BadParameter("runs must be >= 1", param_hint="--runs")
    from bpm.sim.runner import default_jobs, run_many, summarize, sweep_configs

    jobs = default_jobs() if jobs <= 0 else jobs
    configs = sweep_configs(base, _ints(sweep_k), _floats(sweep_e), _floats(sweep_load_factors)) if sweep else [base]
    start = time.perf_counter()
    with _progress(len(configs) * runs, "simulating") as advance:
        results = run_many(configs, runs, seed, jobs=jobs, progress=advance)
    elapsed = time.perf_counter() - start
    summaries = [summarize(c, r, sum(x.elapsed_s for x in r)) for c, r in zip(configs, results)]
    if details:
        for s, r in zip(summaries, results):
            s["per_run"] = [x.to_dict() for x in r]
    command = "bpm simulate " + " ".join(sys.argv[2:]) if len(sys.argv) > 1 and sys.argv[1] == "simulate" else None
    if sweep:
        if plot is not None:
            from bpm.sim.plot import plot_sweep

            splitting = f", splitting (fixed cost {base.fixed_cost:g})" if base.split else ""
            plot_sweep(summaries, plot, title=f"{base.participants} participants, {base.cost_model} costs{splitting}, {runs} runs per cell")
        out = {"command": command, "base": base.to_dict(), "runs_per_cell": runs, "seed": seed, "cells": summaries, "elapsed_s": elapsed}
        if json_out:
            print(json.dumps(out, indent=1))
        else:
            _sweep_tables(summaries, base, runs)
            if plot is not None:
                typer.echo(f"plot written to {plot}")
        return
    summary = {**summaries[0], "seed": seed, "elapsed_s": elapsed}
    if json_out:
        print(json.dumps(summary, indent=1))
        return
    _summary_table(summary)


def _summary_table(s: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"bpm simulate: {s['runs']} runs of {s['participants']} participants", show_header=False)
    rows = [
        ("contracts per participant (K)", s["contracts_per_participant"]),
        ("price range (E)", s["price_range"]),
        ("load factor", s["load_factor"]),
        ("skew", s["skew"]),
        ("tasks per participant", s["tasks_per_participant"]),
        ("cost model", s["cost_model"]),
        ("tasks split and merge", f"yes, fixed cost {s['fixed_cost']:g} per task" if s["split"] else "no"),
        ("reached an acceptable allocation", f"{s['acceptable_fraction']:.0%} of runs"),
        ("acceptable at the end", f"{s['acceptable_at_end_fraction']:.0%} of runs"),
        ("acceptable within one task", f"{s['within_one_task_fraction']:.0%} of runs"),
        ("participants keeping it unacceptable (median)", _fmt(s["median_unacceptable_participants"], 1)),
        ("stable (nothing moves any more)", f"{s['stable_fraction']:.0%} of runs"),
        ("median rounds to acceptable", _fmt(s["median_rounds"], 1)),
        ("median movements", _fmt(s["median_movements"], 1)),
        ("median movements ended", _fmt(s["median_endings"], 1)),
        ("median cost / lower bound", _fmt(s["median_cost_ratio"])),
        ("median cost / lower bound at the start", _fmt(s["median_initial_cost_ratio"])),
        ("participants worse off than alone", s["worse_off_participants"]),
        ("median splits / merges", f"{_fmt(s['median_splits'], 1)} / {_fmt(s['median_merges'], 1)}"),
        ("most tasks at the end / at the start", _fmt(s["max_task_ratio"], 2)),
        ("elapsed", f"{s['elapsed_s']:.2f} s"),
    ]
    for k, v in rows:
        table.add_row(k, str(v))
    Console().print(table)


def _sweep_tables(summaries: list[dict], base: Any, runs: int) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    ks = sorted({s["contracts_per_participant"] for s in summaries})
    es = sorted({s["price_range"] for s in summaries})
    for lf in sorted({s["load_factor"] for s in summaries}):
        cells = {(s["contracts_per_participant"], s["price_range"]): s for s in summaries if s["load_factor"] == lf}
        table = Table(title=f"load factor {lf}: acceptable fraction / median cost ratio ({runs} runs per cell)")
        table.add_column("K \\ E")
        for e in es:
            table.add_column(f"{e:g}", justify="right")
        for k in ks:
            row = [str(k)]
            for e in es:
                c = cells.get((k, e))
                row.append("-" if c is None else f"{c['acceptable_fraction']:.2f} / {_fmt(c['median_cost_ratio'], 2)}")
            table.add_row(*row)
        console.print(table)


def _poster(*, hysteresis: float, seed: int, json_out: bool) -> None:
    from bpm.sim.scenario import PRICE, PRICE_RANGE, TASK_LOAD, THRESHOLD, run_poster

    reports = run_poster(hysteresis=hysteresis, seed=seed)
    if json_out:
        print(json.dumps({"scenario": "poster", "phases": [r.to_dict() for r in reports]}, indent=1))
        return
    from rich.console import Console
    from rich.table import Table

    console = Console()
    console.print(
        f"[bold]Borealis poster scenario[/bold]: M/M/1 costs with threshold {THRESHOLD} at reference price p = {PRICE}, "
        f"tasks of {TASK_LOAD} load, contracts A-B, A-C, B-C at [{PRICE * (1 - PRICE_RANGE / 2):g}, {PRICE * (1 + PRICE_RANGE / 2):g}]"
    )
    for r in reports:
        console.rule(r.title)
        moves = [e for e in r.events if e.kind == "move"]
        ends = [e for e in r.events if e.kind == "end"]
        refusals = [e for e in r.events if e.kind == "refuse"]
        if not r.events:
            console.print("No offers: every participant's marginal cost is below its contracts' prices.")
        flows: dict[tuple[str, str], list[float]] = {}
        for e in moves:
            f = flows.setdefault((e.origin, e.host), [0, 0.0, 0.0, 0])
            f[0] += e.tasks
            f[1] += e.load
            f[2] += e.price * e.load
            f[3] += e.passed_on
        for (o, h), (n, load, value, passed) in flows.items():
            note = f" ({int(passed)} of them hosted for others, passed on)" if passed else ""
            console.print(f"  {o} -> {h}: {int(n)} tasks{note}, load {load:.3f}, at {value / load:.3f} per unit load on average")
        for e in ends:
            who = "the origin took them back" if e.by == e.origin else "the host returned them"
            console.print(f"  round {e.round}: {e.tasks} tasks ({e.load:.3f}) went back from {e.host} to {e.origin}: {who}")
        if refusals:
            console.print(f"  {len(refusals)} offers refused (partners whose marginal cost would pass the price)")
        table = Table(show_header=True, box=None, padding=(0, 2))
        for col in ("", "load", "threshold", "MC", "own at home", "hosts", "paid", "earned"):
            table.add_column(col, justify="right")
        for p in r.participants:
            table.add_row(
                p["name"], f"{p['load']:.3f}", f"{p['threshold']:.2f}", f"{p['marginal_cost']:.2f}",
                f"{p['own_tasks_at_home']} tasks", f"{p['hosted_movements']} moves", f"{p['paid']:.1f}", f"{p['earned']:.1f}",
            )
        console.print(table)
        state = "system overload; " if r.overloaded else ""
        verdict = "acceptable" if r.acceptable else "NOT acceptable"
        console.print(f"  after {r.rounds} rounds: {state}allocation {verdict}")


@bench_app.command("simulate")
def bench_simulate(
    sizes: Annotated[str, typer.Option(help="Federation sizes to time, one run each.")] = "1000,10000",
    runs: Annotated[int, typer.Option(help="Runs for the quality goal (K=4, E=0.1, load factor 0.8).")] = 100,
    participants: Annotated[int, typer.Option(help="Participants per run for the quality goal.")] = 100,
    cost_model: Annotated[CostModel, typer.Option(help="Cost model for every run.")] = CostModel.mm1,
    split: Annotated[bool, typer.Option("--split/--no-split", help="Whether tasks split and merge over their key groups.")] = False,
    fixed_cost: Annotated[float, typer.Option(help="With --split: what a running task costs whatever its input (share of a participant's capacity).")] = 0.005,
    seed: Annotated[int, typer.Option()] = 0,
    jobs: Annotated[int, typer.Option(help="Processes for the quality runs (0: one per CPU); timings always use one.")] = 0,
    json_out: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Measure the simulator against its goals: quality at K=4, E=0.1, load 0.8, and speed at scale."""
    from bpm.sim import SimConfig, simulate_once
    from bpm.sim.runner import default_jobs, run_many, summarize

    limits = {1000: 30.0, 10000: 300.0}
    try:
        base = SimConfig(participants=participants, contracts_per_participant=4, price_range=0.1, load_factor=0.8, cost_model=cost_model.value,
                         split=split, fixed_cost=fixed_cost)
    except ValueError as err:
        raise typer.BadParameter(str(err)) from None
    start = time.perf_counter()
    with _progress(runs, "quality runs") as advance:
        (results,) = run_many([base], runs, seed, jobs=default_jobs() if jobs <= 0 else jobs, progress=advance)
    quality = summarize(base, results, time.perf_counter() - start)
    quality["goal"] = {"acceptable_fraction_min": 0.99, "median_cost_ratio_max": 1.1}
    quality["goal_met"] = bool(
        quality["acceptable_fraction"] >= 0.99 and quality["median_cost_ratio"] is not None and quality["median_cost_ratio"] <= 1.1
    )
    if split:  # splitting's own goal: strictly acceptable at the end, at most 1.5 times the tasks
        quality["split_goal"] = {"acceptable_at_end_fraction_min": 0.99, "max_task_ratio_max": 1.5}
        quality["split_goal_met"] = bool(quality["acceptable_at_end_fraction"] >= 0.99 and (quality["max_task_ratio"] or 0) <= 1.5)
    scale = []
    for n in _ints(sizes):
        config = replace(base, participants=n)
        t0 = time.perf_counter()
        r = simulate_once(config, seed, 0)
        elapsed = time.perf_counter() - t0
        limit = limits.get(n)
        scale.append({
            "participants": n, "tasks": round(n * config.tasks_per_participant), "elapsed_s": elapsed, "rounds": r.rounds_run,
            "movements": r.movements, "reached_acceptable": r.reached_acceptable, "within_one_task": r.within_one_task,
            "unacceptable_participants": r.unacceptable_participants, "cost_ratio": r.cost_ratio,
            "limit_s": limit, "within_limit": None if limit is None else elapsed <= limit,
        })
    out = {"benchmark": "simulate", "quality": quality, "scale": scale}
    if json_out:
        print(json.dumps(out, indent=1))
        return
    _summary_table(quality)
    typer.echo(f"quality goal (>= 99% acceptable, median cost ratio <= 1.1) met: {quality['goal_met']}")
    if split:
        typer.echo(f"splitting goal (>= 99% acceptable at the end, at most 1.5 times the tasks) met: {quality['split_goal_met']}")
    for s in scale:
        limit = f" (goal {s['limit_s']:.0f} s: {'met' if s['within_limit'] else 'missed'})" if s["limit_s"] else ""
        typer.echo(f"{s['participants']} participants, {s['tasks']} tasks: {s['elapsed_s']:.1f} s, {s['rounds']} rounds{limit}")
