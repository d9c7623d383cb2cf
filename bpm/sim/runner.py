"""Running simulated federations and summarising many runs."""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, replace
from statistics import median

import numpy as np

from bpm.negotiation import is_acceptable
from bpm.sim.bound import divisible_optimum
from bpm.sim.generate import SimConfig, build_federation


@dataclass(frozen=True, slots=True)
class RunResult:
    """What one run did.

    Attributes:
        reached_acceptable: whether the allocation was acceptable after some round (round 0: from the start).
        rounds: the first such round, or None.
        acceptable_at_end: whether the final allocation is acceptable.
        within_one_task: whether the final allocation is acceptable once every threshold
            is raised by the mean task load (the granularity a mover has).
        unacceptable_participants: at the end, how many participants keep the allocation
            from being acceptable (above their threshold; in overload, below it).
        stable: whether the run stopped because nothing changed any more (not at max_rounds).
        rounds_run: rounds stepped.
        movements, endings, refusals: counts over the run.
        payments: total paid by origins to hosts over the run (price x load x seconds).
        initial_cost, total_cost: sum of D_i(L_i) at the start and at the end.
        lower_bound: the divisible optimum of the same total load.
        worse_off: participants whose cost per second (processing plus payments) ends
            above what running all their own tasks at home would cost.
        tasks_start, tasks_end: tasks in the federation at the start and at the end.
        splits, merges: tasks split and merged over the run (with `SimConfig.split`).
    """

    seed: int
    run: int
    participants: int
    reached_acceptable: bool
    rounds: int | None
    acceptable_at_end: bool
    within_one_task: bool
    unacceptable_participants: int
    stable: bool
    rounds_run: int
    movements: int
    endings: int
    refusals: int
    payments: float
    initial_cost: float
    total_cost: float
    lower_bound: float
    worse_off: int
    elapsed_s: float
    tasks_start: int = 0
    tasks_end: int = 0
    splits: int = 0
    merges: int = 0

    @property
    def cost_ratio(self) -> float:
        return self.total_cost / self.lower_bound if self.lower_bound > 0 else math.nan

    @property
    def initial_cost_ratio(self) -> float:
        return self.initial_cost / self.lower_bound if self.lower_bound > 0 else math.nan

    def to_dict(self) -> dict:
        d = asdict(self)
        d["cost_ratio"] = self.cost_ratio
        d["initial_cost_ratio"] = self.initial_cost_ratio
        return d


def simulate_once(config: SimConfig, seed: int, run: int = 0) -> RunResult:
    """Build one random federation and step it until it is stable (or `max_rounds`)."""
    start = time.perf_counter()
    fed = build_federation(config, seed, run)
    thresholds = fed.thresholds()
    first: list[int] = [0] if is_acceptable(fed.loads(), thresholds) else []

    def on_round(f) -> None:
        if not first and is_acceptable(f.loads(), thresholds):
            first.append(f.rounds)

    initial_cost = fed.total_cost()
    tasks_start = fed.task_count()
    stable = fed.run(max_rounds=config.max_rounds, on_round=on_round)
    loads = fed.loads()
    lower, _ = divisible_optimum([p.cost for p in fed.participants], float(loads.sum()))
    now, alone = fed.cost_rates()
    paid, _ = fed.payments()
    return RunResult(
        seed=seed,
        run=run,
        participants=len(fed.participants),
        reached_acceptable=bool(first),
        rounds=first[0] if first else None,
        acceptable_at_end=is_acceptable(loads, thresholds),
        within_one_task=is_acceptable(loads, thresholds + fed.mean_task_load()),
        unacceptable_participants=_unacceptable(loads, thresholds),
        stable=stable,
        rounds_run=fed.rounds,
        movements=fed.movement_count,
        endings=fed.ending_count,
        refusals=fed.refusal_count,
        payments=float(paid.sum()),
        initial_cost=initial_cost,
        total_cost=fed.total_cost(),
        lower_bound=lower,
        worse_off=int(np.sum(now > alone * (1 + 1e-9) + 1e-12)),
        elapsed_s=time.perf_counter() - start,
        tasks_start=tasks_start,
        tasks_end=fed.task_count(),
        splits=fed.split_count,
        merges=fed.merge_count,
    )


def _unacceptable(loads: np.ndarray, thresholds: np.ndarray, tolerance: float = 1e-9) -> int:
    if loads.sum() <= thresholds.sum():
        return int(np.sum(loads > thresholds + tolerance))
    return int(np.sum(loads < thresholds - tolerance))


def _median(values: Iterable[float]) -> float | None:
    v = [x for x in values if x is not None and not (isinstance(x, float) and math.isnan(x))]
    return float(median(v)) if v else None


def summarize(config: SimConfig, results: Sequence[RunResult], elapsed_s: float) -> dict:
    """The summary `bpm simulate --json` prints."""
    n = len(results)
    return {
        "runs": n,
        "participants": config.participants,
        "contracts_per_participant": config.contracts_per_participant,
        "price_range": config.price_range,
        "load_factor": config.load_factor,
        "skew": config.skew,
        "tasks_per_participant": config.tasks_per_participant,
        "cost_model": config.cost_model,
        "hysteresis": config.hysteresis,
        "margin": config.margin,
        "forward": config.forward,
        "split": config.split,
        "fixed_cost": config.fixed_cost if config.split else None,
        "acceptable_fraction": sum(r.reached_acceptable for r in results) / n if n else None,
        "acceptable_at_end_fraction": sum(r.acceptable_at_end for r in results) / n if n else None,
        "within_one_task_fraction": sum(r.within_one_task for r in results) / n if n else None,
        "stable_fraction": sum(r.stable for r in results) / n if n else None,
        "median_unacceptable_participants": _median(r.unacceptable_participants for r in results),
        "median_rounds": _median(r.rounds for r in results),
        "median_movements": _median(r.movements for r in results),
        "median_endings": _median(r.endings for r in results),
        "median_payments": _median(r.payments for r in results),
        "median_cost_ratio": _median(r.cost_ratio for r in results),
        "median_initial_cost_ratio": _median(r.initial_cost_ratio for r in results),
        "max_cost_ratio": max((r.cost_ratio for r in results), default=None),
        "worse_off_participants": sum(r.worse_off for r in results),
        "median_splits": _median(r.splits for r in results),
        "median_merges": _median(r.merges for r in results),
        "max_task_ratio": max((r.tasks_end / r.tasks_start for r in results if r.tasks_start), default=None),
        "elapsed_s": elapsed_s,
    }


def _run_job(args: tuple[SimConfig, int, int]) -> RunResult:
    return simulate_once(*args)


def run_many(
    configs: Sequence[SimConfig],
    runs: int,
    seed: int,
    *,
    jobs: int = 1,
    progress: Callable[[int], None] | None = None,
) -> list[list[RunResult]]:
    """`runs` runs of each config (run r of every config shares its loads, see `build_federation`).
    With `jobs` > 1 the runs spread over that many processes; results do not depend on it."""
    tasks = [(c, seed, r) for c in configs for r in range(runs)]
    out: list[RunResult] = []
    if jobs <= 1 or len(tasks) == 1:
        for t in tasks:
            out.append(_run_job(t))
            if progress:
                progress(1)
    else:
        with ProcessPoolExecutor(max_workers=jobs) as pool:
            for res in pool.map(_run_job, tasks, chunksize=max(1, len(tasks) // (jobs * 8))):
                out.append(res)
                if progress:
                    progress(1)
    return [out[i * runs : (i + 1) * runs] for i in range(len(configs))]


def default_jobs() -> int:
    return max(1, min(os.cpu_count() or 1, 8))


def sweep_configs(base: SimConfig, ks: Sequence[int], es: Sequence[float], lfs: Sequence[float]) -> list[SimConfig]:
    return [replace(base, contracts_per_participant=k, price_range=e, load_factor=lf) for lf in lfs for k in ks for e in es]
