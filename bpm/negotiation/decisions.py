"""The Bounded-Price Mechanism's decisions, as pure functions of one participant's state.

No I/O, no clock (time is a parameter), no randomness: the same call gives the same
answer in a unit test, in the simulator and in the live agent.

Hysteresis. Two relative margins, both documented where they apply:

- `hysteresis` on ending movements (default 0.1, as in Borealis). The origin takes
  tasks back only when hosting them costs it less than the price by the margin
  (`MC_take * (1 + h) < price`); the host returns them only when keeping them costs
  it more than the price by the margin (`MC_shed / (1 + h) > price`). Right after a
  movement both are false whatever h is, so only a change of load by about the
  margin ends a movement: this is what keeps load from bouncing.
- `margin` on offers and acceptance (default 0). Offers cannot bounce: an accepted
  movement lowers the federation's total cost strictly (the offerer saves more than
  the price, the host spends less), so a sequence of offers never returns to an
  allocation it left. A margin there is only a way to skip movements whose gain is
  too small to be worth the pause; it also stops participants just above their
  threshold from shedding their last task and keeps partners within the margin of
  their threshold from taking load (measured in docs/mechanism.md).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Mapping, Sequence

import numpy as np

from bpm.costs.base import CostFunction
from bpm.negotiation.models import DEFAULT_HYSTERESIS, DEFAULT_MARGIN, Acceptance, Contract, Movement, Offer, Task

_EPS = 1e-12


def margin_factor(margin: float) -> float:
    if not (margin >= 0 and math.isfinite(margin)):
        raise ValueError(f"a margin must be a finite number >= 0, got {margin!r}")
    return 1.0 + margin


def _smallest_first(tasks: Iterable[Task]) -> list[Task]:
    # Small tasks first: the last one taken decides how close to its threshold a side
    # gets, and small steps get closer.
    return sorted(tasks, key=lambda t: (t.load, t.id))


def after_answer(refused: Mapping[str, float], partner: str, accepted: bool, at: float) -> dict[str, float]:
    """Who refused the last offer made to them, after `partner` answered one at time `at`.

    `refused` maps partner -> time of its refusal of the last offer made to it
    (`contract_order` tries those partners last). A refusal records its time; an
    acceptance forgets an earlier refusal, since the partner's last answer is now a yes.
    The simulator applies each answer as it happens; the agent replays its decided
    offers in the order they were decided, so both keep the same map.
    """
    after = dict(refused)
    if accepted:
        after.pop(partner, None)
    else:
        after[partner] = at
    return after


def not_offerable(*, me: str, partner: str, origin: str, task_mode: str, contract_id: str, contract_mode: str) -> str | None:
    """Why a task of `origin` (effective HA mode `task_mode`) that runs at `me` may not be
    offered to `partner` under contract `contract_id` (HA mode `contract_mode`); None if it
    may. One rule for the registry, which refuses such an offer, and for the agents and the
    simulator, which do not make it: a task never goes to its own origin (which gets it back
    by ending a movement), and a task hosted for another (`origin` not `me`, nor "" for
    unknown) is passed on only when neither it nor the contract keeps replicas."""
    if origin == partner:
        return f"it belongs to {partner}; a task goes back to its origin only when its movement ends"
    if origin in ("", me):
        return None
    if task_mode != "none":
        return f"it keeps HA replicas ({task_mode}); a replicated task is not passed on, it returns to its origin"
    if contract_mode != "none":
        return (f"contract #{contract_id} replicates moved tasks ({contract_mode}); tasks hosted for others are passed on "
                "only under contracts without HA")
    return None


def contract_order(
    contracts: Sequence[Contract],
    *,
    refused_last: Mapping[str, float] | Collection[str] = (),
    unreachable: Collection[str] = (),
) -> list[Contract]:
    """Contracts in the order offers try them: cheapest first; partners that refused the
    last offer made to them go after the others, the most recent refusal last (pass a
    mapping partner -> time of that refusal; a plain collection counts as one time);
    unreachable partners go last of all."""
    when = refused_last if isinstance(refused_last, Mapping) else dict.fromkeys(refused_last, 0.0)
    return sorted(
        contracts,
        key=lambda c: (
            c.partner in unreachable,
            c.partner in when,
            when.get(c.partner, 0.0),
            c.price_min,
            c.price_max,
            c.id,
        ),
    )


def choose_offer(
    *,
    load: float,
    cost: CostFunction,
    tasks: Sequence[Task],
    contracts: Sequence[Contract],
    refused_last: Mapping[str, float] | Collection[str] = (),
    unreachable: Collection[str] = (),
    outstanding: bool = False,
    margin: float = DEFAULT_MARGIN,
    me: str = "",
) -> Offer | None:
    """The next offer to make, or None.

    `load` is everything the participant carries (its own tasks and those it hosts);
    `tasks` are the ones it may offer: its own tasks running at home and, if it passes
    load on, tasks it hosts for others; under each contract only those `not_offerable`
    allows (`me` is the offerer; a task never goes to its own origin). With an outstanding offer
    there is no new one. Contracts are tried in `contract_order`; under each, the
    offerer takes tasks smallest first, keeping a task only when its own per-unit
    saving, after the tasks already taken, beats the contract's lowest price (times
    1 + margin): `(D(L - s) - D(L - s - l_t)) / l_t > price_min * (1 + margin)` (the
    poster's "unit MC of task t > p at A"), so the whole set's saving beats it too. The first contract that
    yields a non-empty set gets the offer, with the offerer's limit for each leading
    part of it, `min(price_max, MC_shed(first k tasks) / (1 + margin))`.
    """
    if outstanding or not tasks or not contracts:
        return None
    f = margin_factor(margin)
    ordered = _smallest_first(tasks)
    d_load = cost.cost(load)
    for contract in contract_order(contracts, refused_last=refused_last, unreachable=unreachable):
        need = contract.price_min * f  # per-unit saving each task must beat
        chosen: list[Task] = []
        amount = 0.0
        d_rest = d_load
        caps: list[float] = []
        for task in ordered:
            if not_offerable(me=me, partner=contract.partner, origin=task.origin, task_mode=task.ha_mode,
                             contract_id=contract.id, contract_mode=contract.ha_mode) is not None:
                continue
            new = amount + task.load
            if new > load * (1 + 1e-9):
                continue
            d_new = cost.cost(max(load - new, 0.0))
            if (d_rest - d_new) / task.load > need:
                chosen.append(task)
                amount, d_rest = new, d_new
                caps.append(min(contract.price_max, (d_load - d_new) / amount / f))
        if chosen:
            return Offer(
                contract_id=contract.id,
                partner=contract.partner,
                tasks=tuple(chosen),
                caps=tuple(caps),
                price_min=contract.price_min,
                price_max=contract.price_max,
            )
    return None


def why_no_offer(
    *,
    load: float,
    cost: CostFunction,
    tasks: Sequence[Task],
    contracts: Sequence[Contract],
    outstanding: bool = False,
    margin: float = DEFAULT_MARGIN,
) -> tuple[str, str]:
    """Why `choose_offer`, called with the same state, made no offer, for the record of a
    decision not taken: a short cause (`outstanding`, `no_contract`, `no_task`,
    `below_price`, `lumpy`) and a sentence with the figures behind it."""
    if outstanding:
        return "outstanding", "an offer of mine is outstanding"
    if not contracts:
        return "no_contract", "no contract in force"
    if not tasks:
        return "no_task", "no task to offer: none measured yet (a task that has just arrived or whose input has just begun), or none may move"
    lowest = min(c.price_min for c in contracts) * margin_factor(margin)
    marginal = cost.marginal(load)
    if marginal <= lowest:
        return "below_price", f"marginal cost {marginal:.3f} at load {load:.3f} is below every contract's lowest price with margin ({lowest:.3f})"
    smallest = min(t.load for t in tasks)
    return "lumpy", (f"marginal cost {marginal:.3f} at load {load:.3f} is above the lowest price with margin ({lowest:.3f}), but no "
                     f"task's own saving beats the price of a contract whose partner may take it: the smallest ({smallest:.3f}) is too large")


def why_refused(*, load: float, cost: CostFunction, offer: Offer, margin: float = DEFAULT_MARGIN) -> str:
    """Why `evaluate_offer`, called with the same state, took nothing of `offer`, for the
    record of a refusal: its first task's own per-unit cost here, with the margin, is not
    below the offerer's cap for that task. The marginal cost at the load alone can be below
    the cap while a whole task, taken at once, costs more per unit."""
    first, cap = offer.tasks[0], offer.caps[0]
    unit = cost.marginal_take(load, first.load)
    return (f"taking task {first.id} ({first.load:.3f} load) at load {load:.3f} costs {unit:.3f} per unit, "
            f"{unit * margin_factor(margin):.3f} with margin: not below the offered {cap:.3f}")


def evaluate_offer(*, load: float, cost: CostFunction, offer: Offer, margin: float = DEFAULT_MARGIN) -> Acceptance:
    """The receiver's answer to `offer`, given the load it carries now.

    It takes the longest leading part of the offer (the offerer's order, smallest
    first) in which every task's own per-unit cost, after the tasks before it, stays
    below the offerer's cap for the part up to it (times 1 + margin):
    `(D(L + s + l_t) - D(L + s)) / l_t * (1 + margin) < caps[k]` (the poster's "unit MC
    of task t < p at B"). So a partner stops at about the load where its marginal
    cost meets the price: past its threshold by at most half a task when the price
    is its reference price. An empty answer is a refusal; otherwise `price_floor` is
    its per-unit cost of the whole part, `max(price_min, MC_take * (1 + margin))`,
    always below the offerer's cap for it.
    """
    f = margin_factor(margin)
    amount = 0.0
    count = 0
    for task, cap in zip(offer.tasks, offer.caps):
        if not cost.marginal_take(load + amount, task.load) * f < cap:
            break
        amount += task.load
        count += 1
    if not count:
        return Acceptance(task_ids=(), load=0.0, price_floor=offer.price_max)
    floor = max(offer.price_min, cost.marginal_take(load, amount) * f)
    return Acceptance(task_ids=offer.task_ids[:count], load=amount, price_floor=floor, count=count)


def settle_price(*, shedder_limit: float, taker_limit: float, price_min: float, price_max: float) -> float | None:
    """The price of a movement, or None when the two limits leave no price in range.

    The price splits the difference: the midpoint of `[max(price_min, taker_limit),
    min(price_max, shedder_limit)]`. With linear gains this is the Nash bargaining
    solution, which gives both partners the same gain per unit of load; neither
    side's identity or role tilts it. It is never outside `[price_min, price_max]`, and
    a fixed-price contract (`price_min == price_max`) always settles at its one price.
    Because the range bounds the price, a partner who misreports its limit can move
    the price by at most half the range width: narrow ranges keep the mechanism
    nearly immune to haggling.
    """
    lo = max(price_min, taker_limit)
    hi = min(price_max, shedder_limit)
    if lo > hi:
        return None
    if price_min == price_max:
        return price_min
    return min(price_max, max(price_min, 0.5 * (lo + hi)))


def settle(offer: Offer, answer: Acceptance) -> float | None:
    """The price of the movements an accepted answer makes, or None when there is none:
    `settle_price` between the offerer's cap for the part taken (`offer.caps`, for the
    first `answer.count` tasks) and the receiver's floor, within the contract's range."""
    if not answer.accepted:
        return None
    return settle_price(shedder_limit=offer.caps[answer.count - 1], taker_limit=answer.price_floor,
                        price_min=offer.price_min, price_max=offer.price_max)


def movements_to_end(
    *,
    me: str,
    now_s: float,
    load: float,
    cost: CostFunction,
    movements: Iterable[Movement],
    hysteresis: float = DEFAULT_HYSTERESIS,
) -> tuple[str, ...]:
    """The ids of movements that participant `me` ends now; their tasks go back to their origin.

    Only movements past their `earliest_end_s` are considered, and only when ending
    pays for `me` by the margin. As host, `me` returns tasks (cheapest price first)
    while its per-unit cost of keeping them exceeds the price: `MC_shed / (1 + h) >
    price`. Then, as origin, it takes tasks back (dearest price first) while hosting
    them itself costs less than paying for them: `MC_take * (1 + h) < price`. Each
    decision accounts for the ones before it.
    """
    f = margin_factor(hysteresis)
    ready = [m for m in movements if now_s >= m.earliest_end_s and me in (m.origin, m.host) and m.origin != m.host]
    ended: list[str] = []
    current = load
    for m in sorted((m for m in ready if m.host == me), key=lambda m: (m.price, m.id)):
        if m.load <= current * (1 + 1e-9) and cost.marginal_shed(current, min(m.load, current)) / f > m.price:
            ended.append(m.id)
            current = max(current - m.load, 0.0)
    for m in sorted((m for m in ready if m.origin == me), key=lambda m: (-m.price, m.id)):
        if cost.marginal_take(current, m.load) * f < m.price:
            ended.append(m.id)
            current += m.load
    return tuple(ended)


def is_acceptable(loads: Sequence[float] | np.ndarray, thresholds: Sequence[float] | np.ndarray, *, tolerance: float = 1e-9) -> bool:
    """Whether an allocation is acceptable: every load at most its threshold, or, when the
    total load exceeds the total of the thresholds (overload), no load below its threshold."""
    x = np.asarray(loads, dtype=float)
    t = np.asarray(thresholds, dtype=float)
    if x.shape != t.shape:
        raise ValueError(f"{x.size} loads but {t.size} thresholds")
    if x.sum() <= t.sum():
        return bool(np.all(x <= t + tolerance))
    return bool(np.all(x >= t - tolerance))
