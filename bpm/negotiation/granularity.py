"""Splitting and merging tasks over their key groups: how fine the unit of movement is.

A participant just above its threshold sheds its smallest task only when that task's own
per-unit saving beats the lowest price (`choose_offer`); with tasks of a few percent of
its capacity and a narrow price range, none does (docs/mechanism.md, "Granularity").
A task covers a share of its origin's key groups (`Task.groups`, `bpm.keygroups`);
splitting it in two over them makes a smaller unit. Every running task costs a fixed
amount per batch whatever its input (`fixed_cost`, in units of load), so a split raises
the participant's load by that much: it is made only where it lets load move, and two
halves of a split task that run at their origin again merge back when the participant no
longer sheds.

Estimates: a task of load l split into 2^d pieces gives pieces of about
(l - c) / 2^d + c each (its input taken as spread evenly over its key groups; what each
piece carries is measured once it runs) and raises the participant's load by (2^d - 1) c.

Pure functions, like `bpm.negotiation.decisions`: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from bpm.costs.base import CostFunction
from bpm.keygroups import BITS
from bpm.negotiation.decisions import margin_factor
from bpm.negotiation.models import DEFAULT_HYSTERESIS, DEFAULT_MARGIN, Contract, Task
from bpm.records import grain_end


# Splits a participant makes because partners refused its smallest offer, between two
# acceptances of its offers (`bpm.agent.machine.Mechanism`, which also never splits again on
# a refusal what such a split made): where partners have some room, half a task fits it;
# where none has any (near saturation), splitting on down to single key groups adds fixed
# costs and moves nothing.
REFUSED_SPLITS = 2


def split_time(newest_event_us: int, window_s: int) -> int:
    """When a running task hands its key groups over to the tasks it splits into (or that
    merge into it), in epoch seconds: the first window start after `newest_event_us`, the
    newest event time its stream holds now.

    The old task keeps the rows before that time and completes their windows; the new tasks
    take the rows from it on, reading the stream after its present end. No row already in
    the stream is at or past that time, and a row written later before it is late for the
    new tasks' windows, never theirs: each window of each key group is one task's.
    """
    return grain_end(newest_event_us, window_s)


def regrained_name(groups: str, parents: Sequence[int]) -> str:
    """The name of the task a split or merge makes over key groups `groups` from the tasks
    `parents` (registry ids): unique for its origin, since a task hands each share of its
    key groups over once."""
    return f"g{groups}-{min(parents)}"


def reference_price(contract: Contract) -> float:
    """The price a contract's range is centred on: a participant whose marginal cost is above
    it is above its threshold (docs/mechanism.md)."""
    return (contract.price_min + contract.price_max) / 2


def piece_load(load: float, fixed_cost: float, depth: int = 1) -> float:
    """The estimated load of one of the 2^`depth` pieces of a task of `load`."""
    return max(load - fixed_cost, 0.0) / (1 << depth) + fixed_cost


def split_depth(task: Task, *, load: float, cost: CostFunction, need: float, fixed_cost: float) -> int | None:
    """The fewest halvings of `task` after which one piece is worth shedding for a
    participant at `load`, None when no depth down to one key group gives one (or the task
    does not split).

    The pieces' fixed costs come first: they raise the load to `load + (2^d - 1) c`, and
    from there the piece's own per-unit saving must beat `need`, as `choose_offer` will
    ask of it. And shedding the piece must leave the participant with less load than now:
    a piece no larger than the fixed costs the split adds moves nothing. A participant
    above its threshold thus pays the fixed cost of a task for a unit small enough to
    move; below the price it never splits (`choose_split`).
    """
    if task.groups is None:
        return None
    for depth in range(1, BITS - len(task.groups) + 1):
        piece, added = piece_load(task.load, fixed_cost, depth), ((1 << depth) - 1) * fixed_cost
        if piece > added and (cost.cost(load + added) - cost.cost(load + added - piece)) / piece > need:
            return depth
    return None


def choose_split(
    *,
    load: float,
    cost: CostFunction,
    tasks: Sequence[Task],
    contracts: Sequence[Contract],
    fixed_cost: float,
    margin: float = DEFAULT_MARGIN,
    me: str = "",
) -> Task | None:
    """The task to split in two now so that load can move, or None.

    Asked when no task can move as it is (`bpm.agent.machine.Mechanism`): `choose_offer`
    makes no offer although the marginal cost is above the lowest price with margin
    (`why_no_offer` says "lumpy"), or its best offer left goes to a partner that refused
    one since the last split. Nothing is split below that price, nor by a participant at or
    below its threshold (its marginal cost at most the reference price of a contract, the
    middle of its range): the allocation needs no finer unit from it, and a split would
    only add a fixed cost. Candidates are the participant's own
    tasks (origin `me`) that still split; the one whose piece pays after the fewest
    halvings (`split_depth`) splits, the smallest on a tie. One halving at a time: the
    halves run and are measured before the next decision.
    """
    if not contracts:
        return None
    need = min(c.price_min for c in contracts) * margin_factor(margin)
    marginal = cost.marginal(load)
    if marginal <= need or marginal <= min(reference_price(c) for c in contracts):
        return None
    best: tuple[tuple[int, float, str], Task] | None = None
    for task in tasks:
        if task.origin != me:
            continue
        depth = split_depth(task, load=load, cost=cost, need=need, fixed_cost=fixed_cost)
        if depth is not None and (best is None or (depth, task.load, task.id) < best[0]):
            best = ((depth, task.load, task.id), task)
    return None if best is None else best[1]


def choose_merge(
    *,
    load: float,
    cost: CostFunction,
    tasks: Sequence[Task],
    contracts: Sequence[Contract],
    split: Collection[tuple[str, str]],
    margin: float = DEFAULT_MARGIN,
    hysteresis: float = DEFAULT_HYSTERESIS,
    me: str = "",
) -> tuple[Task, Task] | None:
    """Two halves of a split task of `me`'s that both run here, to merge back into one, or None.

    `split` holds the (input, key-group prefix) shares of `me`'s tasks that were split (halves of an
    original task, never two original tasks, merge). Merging saves one task's fixed cost;
    it is made when the participant does not shed: its marginal cost times 1 + `hysteresis`
    is at most the lowest price with margin (without contracts, always). So a merge never
    undoes a split made to shed, and a load that moves by less than the margin does not
    split the task again. The deepest pair merges first.
    """
    if contracts:
        lowest = min(c.price_min for c in contracts) * margin_factor(margin)
        if cost.marginal(load) * margin_factor(hysteresis) > lowest:
            return None
    mine = {t.share: t for t in tasks if t.origin == me and t.groups}
    for input, groups in sorted(mine, key=lambda s: (-len(s[1]), s)):
        parent = groups[:-1]
        if groups[-1] == "0" and (input, parent) in split and (input, parent + "1") in mine:
            return mine[input, groups], mine[input, parent + "1"]
    return None
