"""Random federations in the setup of Balazinska's thesis experiments.

Every participant has a capacity of 1 and a threshold T_i drawn from a range; its
cost curve is scaled so that its marginal cost reaches the common reference price p at
T_i (so p is each participant's reference price). Contracts form a random graph with K
partners per participant (the union of K random perfect matchings, so K = 1 pairs the
participants off and K = 2 makes cycles); each has the price range
`[p (1 - E/2), p (1 + E/2)]` centred on p (E = 0: fixed price p). The tasks add up
to `load_factor` times the sum of the thresholds and start unevenly (see
`initial_tasks`).

With `split`, each participant's tasks cover shares of its stream's key groups
(`task_shares`), every task costs `fixed_cost` whatever its input, and the rest of its
load is spread unevenly over its key groups (`group_loads`); participants split and merge
their tasks (`bpm.negotiation.granularity`).

With `warmup_s` and `settle_s`, participants wait as the live agents do: neither offering
nor taking load for `warmup_s` after the start, nor for `settle_s` after the tasks running
at them change (0, the default: the thesis's setup, in which a round only spaces offers).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from bpm.costs import CostFunction, MM1Cost, QuadraticCost
from bpm.keygroups import KEY_GROUPS, groups
from bpm.negotiation import DEFAULT_HYSTERESIS, DEFAULT_MARGIN, Task
from bpm.sim.federation import Federation

COST_MODELS = ("mm1", "quadratic", "mixed")


@dataclass(frozen=True, slots=True)
class SimConfig:
    """One simulated federation's parameters (see the module docstring)."""

    participants: int = 100
    contracts_per_participant: int = 4
    price_range: float = 0.1
    load_factor: float = 0.8
    skew: float = 0.5
    tasks_per_participant: float = 10.0
    cost_model: str = "mm1"
    threshold_min: float = 0.6
    threshold_max: float = 0.9
    reference_price: float = 1.0
    min_duration_s: float = 60.0
    period_s: float = 7.0
    hysteresis: float = DEFAULT_HYSTERESIS
    margin: float = DEFAULT_MARGIN
    forward: bool = True
    max_rounds: int = 500
    split: bool = False
    fixed_cost: float = 0.005
    warmup_s: float = 0.0
    settle_s: float = 0.0

    def __post_init__(self) -> None:
        if self.participants < 2:
            raise ValueError("a federation needs at least 2 participants")
        if self.contracts_per_participant < 1:
            raise ValueError("contracts_per_participant must be >= 1")
        if not 0 <= self.price_range < 2:
            raise ValueError("price_range must be in [0, 2)")
        if not self.load_factor > 0:
            raise ValueError("load_factor must be > 0")
        if not 0 <= self.skew <= 1:
            raise ValueError("skew must be in [0, 1]")
        if not self.tasks_per_participant > 0:
            raise ValueError("tasks_per_participant must be > 0")
        if self.cost_model not in COST_MODELS:
            raise ValueError(f"cost_model must be one of {COST_MODELS}")
        if not 0 < self.threshold_min <= self.threshold_max < 0.95:
            raise ValueError("need 0 < threshold_min <= threshold_max < 0.95")
        if not 0 <= self.fixed_cost < 0.05:
            raise ValueError("fixed_cost must be in [0, 0.05)")
        if self.warmup_s < 0 or self.settle_s < 0:
            raise ValueError("warmup_s and settle_s must not be negative")
        if self.split and self.tasks_per_participant > 16:
            raise ValueError(f"with split, at most 16 tasks per participant on average (a stream has {KEY_GROUPS} key groups)")

    def to_dict(self) -> dict:
        return asdict(self)


def contract_graph(n: int, k: int, rng: np.random.Generator) -> list[tuple[int, int]]:
    """About k distinct partners per participant: the union of k random perfect matchings,
    each repaired by swaps so that no pair is matched twice."""
    if k >= n - 1:
        return [(a, b) for a in range(n) for b in range(a + 1, n)]
    edges: set[tuple[int, int]] = set()

    def key(a: int, b: int) -> tuple[int, int]:
        return (a, b) if a < b else (b, a)

    for _ in range(k):
        perm = rng.permutation(n).tolist()
        pairs = [(perm[2 * i], perm[2 * i + 1]) for i in range(n // 2)]
        for _attempt in range(50):
            bad = [i for i, (a, b) in enumerate(pairs) if key(a, b) in edges]
            if not bad:
                break
            for i in bad:
                j = int(rng.integers(len(pairs)))
                (a, b), (c, d) = pairs[i], pairs[j]
                if i != j and key(a, c) not in edges and key(b, d) not in edges:
                    pairs[i], pairs[j] = (a, c), (b, d)
        edges.update(key(a, b) for a, b in pairs)
    return sorted(edges)


def make_cost(model: str, threshold: float, price: float, rng: np.random.Generator) -> CostFunction:
    if model == "mixed":
        model = "mm1" if rng.random() < 0.5 else "quadratic"
    if model == "mm1":
        return MM1Cost.with_threshold(threshold, price)
    return QuadraticCost.with_threshold(threshold, price)


def build_federation(config: SimConfig, seed: int, run: int = 0, *, record: bool = False) -> Federation:
    """A random federation for `config`. Loads and costs come from one random stream and the
    contract graph from another, so runs with the same (seed, run) and load parameters
    share their participants and initial loads whatever K and E are."""
    load_rng = np.random.default_rng([seed, run, 1])
    graph_rng = np.random.default_rng([seed, run, 2])
    n = config.participants
    p = config.reference_price
    fed = Federation(period_s=config.period_s, hysteresis=config.hysteresis, margin=config.margin, forward=config.forward,
                     seed=int(np.random.default_rng([seed, run, 3]).integers(2**63)), record=record,
                     fixed_cost=config.fixed_cost if config.split else None, warmup_s=config.warmup_s, settle_s=config.settle_s)
    thresholds = load_rng.uniform(config.threshold_min, config.threshold_max, n)
    for i in range(n):
        fed.add_participant(f"p{i}", make_cost(config.cost_model, float(thresholds[i]), p, load_rng), float(thresholds[i]))
    e = config.price_range
    for a, b in contract_graph(n, config.contracts_per_participant, graph_rng):
        fed.add_contract(f"p{a}", f"p{b}", p * (1 - e / 2), p * (1 + e / 2), min_duration_s=config.min_duration_s)
    group_rng = np.random.default_rng([seed, run, 4])
    for owner, tasks in enumerate(initial_tasks(config, thresholds, load_rng)):
        if not tasks:
            continue
        name = f"p{owner}"
        if config.split:
            shares = task_shares(len(tasks))
            fed.set_stream(name, group_loads([t.load for t in tasks], shares, config.fixed_cost, group_rng))
            tasks = [fed.task_over(name, share) for share in shares]
        fed.add_tasks(name, tasks)
    return fed


def task_shares(n: int) -> list[str]:
    """Key-group prefixes of `n` tasks that cover a stream together (1 to `KEY_GROUPS`):
    the shortest prefix halved, leftmost first, until there are `n`."""
    if not 1 <= n <= KEY_GROUPS:
        raise ValueError(f"a stream has {KEY_GROUPS} key groups: 1 to {KEY_GROUPS} tasks, not {n}")
    shares = [""]
    while len(shares) < n:
        k = min(range(len(shares)), key=lambda i: (len(shares[i]), shares[i]))
        shares[k:k + 1] = [shares[k] + "0", shares[k] + "1"]
    return shares


def group_loads(sizes: list[float], shares: list[str], fixed_cost: float, rng: np.random.Generator) -> np.ndarray:
    """The load of each key group of a stream whose tasks over `shares` have loads `sizes`
    (each the fixed cost plus its key groups' loads): a task's input spreads over its key
    groups unevenly (weights drawn from a flat Dirichlet distribution: a half of a task
    carries anything from a little to most of it)."""
    out = np.zeros(KEY_GROUPS)
    for size, share in zip(sizes, shares):
        span = groups(share)
        out[span.start:span.stop] = max(size - fixed_cost, 0.0) * rng.dirichlet(np.ones(len(span)))
    return out


def initial_tasks(config: SimConfig, thresholds: np.ndarray, rng: np.random.Generator) -> list[list[Task]]:
    """Each participant's own tasks. Participant i starts with load proportional to
    `T_i * (1 + S * u_i)`, u_i uniform in [-1, 1], scaled so that the loads add up to
    `load_factor * sum(T)`: S = 0 starts everyone at the same fraction of its
    threshold, S = 1 spreads starting loads from 0 to twice that. The load is cut
    into tasks of about `mean(T) * load_factor / tasks_per_participant` each (sizes
    uniform within +-50%), at least one task per participant with any load."""
    n = thresholds.size
    share = thresholds * np.maximum(1.0 + config.skew * rng.uniform(-1.0, 1.0, n), 0.0)
    if share.sum() <= 0:
        share = thresholds.copy()
    targets = share * (config.load_factor * float(thresholds.sum()) / float(share.sum()))
    mean_task = config.load_factor * float(thresholds.mean()) / config.tasks_per_participant
    out: list[list[Task]] = []
    next_id = 0
    for i in range(n):
        if targets[i] < 1e-12:
            out.append([])
            continue
        sizes = rng.uniform(0.5, 1.5, max(int(round(targets[i] / mean_task)), 1))
        sizes *= targets[i] / sizes.sum()
        out.append([Task(f"t{next_id + k}", float(x), f"p{i}") for k, x in enumerate(sizes)])
        next_id += sizes.size
    return out
