"""From registry records (JSON dicts) to the views of `bpm.negotiation`, and back. Pure.

Times become seconds on one clock (the registry's UTC timestamps as POSIX seconds), so
`movements_to_end` compares them with `now_s` from the same clock.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime

from bpm.negotiation.models import Contract, Movement, Offer, Task

# A task measured at no load cannot be offered (it would cost nothing to keep); tiny
# loads are floored so that a just-started task still counts as a small one.
MIN_TASK_LOAD = 1e-4


def seconds(timestamp: str | datetime) -> float:
    moment = datetime.fromisoformat(timestamp.replace("Z", "+00:00")) if isinstance(timestamp, str) else timestamp
    return moment.timestamp()


def active_contracts(me: str, contracts: Iterable[Mapping]) -> list[Contract]:
    """My contracts in force, each seen from my side."""
    views = []
    for c in contracts:
        if c["state"] != "active" or not c.get("in_force", True) or me not in (c["proposer"], c["counterparty"]):
            continue
        partner = c["counterparty"] if c["proposer"] == me else c["proposer"]
        views.append(Contract(id=str(c["id"]), partner=partner, price_min=c["price_min"], price_max=c["price_max"], min_duration_s=c["min_duration_s"]))
    return views


def offerable_tasks(me: str, tasks: Iterable[Mapping], measured: Mapping[str, float], running: Iterable[str]) -> list[Task]:
    """My own tasks running at home with a measured load (registry ids as strings); a task
    not measured yet has no price and is not offered."""
    running = set(running)
    out = []
    for t in tasks:
        load = measured.get(task_key(t), 0.0)
        if t["origin"] == me and t["host"] == me and task_key(t) in running and load >= MIN_TASK_LOAD:
            out.append(Task(id=str(t["id"]), load=load))
    return out


def offer_view(offer: Mapping, contract: Mapping, task_loads: Mapping[int, float]) -> Offer:
    """A pending offer made to me, as `evaluate_offer` sees it.

    The registry carries one price, the offerer's cap for the whole set; it stands for
    every leading part too, as the offerer pays at least as much per unit for fewer tasks.
    """
    tasks = tuple(Task(id=str(tid), load=max(task_loads.get(tid, 0.0), MIN_TASK_LOAD)) for tid in offer["task_ids"])
    return Offer(
        contract_id=str(offer["contract_id"]),
        partner=offer["from"],
        tasks=tasks,
        caps=(offer["price"],) * len(tasks),
        price_min=contract["price_min"],
        price_max=contract["price_max"],
    )


def movement_views(movements: Iterable[Mapping]) -> list[Movement]:
    """Active movements; the origin pays, the host earns."""
    views = []
    for m in movements:
        if m["state"] != "active":
            continue
        views.append(
            Movement(
                id=str(m["id"]),
                task_ids=(str(m["task_id"]),),
                origin=m["from"],
                host=m["to"],
                price=m["price"],
                load=max(m["load"], MIN_TASK_LOAD),
                started_s=seconds(m["started_at"]),
                earliest_end_s=seconds(m["earliest_end_at"]),
                contract_id=str(m["contract_id"]),
            )
        )
    return views


def task_key(task: Mapping) -> str:
    """The federation-wide name of a task: stable across hosts, used for its output and checkpoint."""
    return f"{task['origin']}.{task['name']}"


@dataclass(frozen=True)
class Start:
    """Start `task` here; `source` is the participant holding its checkpoint (None: my own copy)."""

    task: Mapping
    source: str | None


@dataclass(frozen=True)
class Plan:
    start: tuple[Start, ...]
    stop: tuple[str, ...]


def reconcile(me: str, tasks: Iterable[Mapping], running: Iterable[str], movements: Iterable[Mapping]) -> Plan:
    """What to stop and start so that I run exactly the tasks the registry says I host.

    A task that arrives here comes from its previous host: the origin of an active
    movement to me, or the host of the last movement of my own task, now ended. The
    agent fetches the checkpoint from that source unless its own copy is already at the
    task's epoch. A task running here that the registry gives to another participant
    stops here and waits for that participant to fetch its checkpoint.
    """
    running = set(running)
    latest: dict[int, Mapping] = {}
    for m in sorted(movements, key=lambda m: m["id"]):
        latest[m["task_id"]] = m
    start, stop = [], []
    for task in tasks:
        key = task_key(task)
        if task["host"] == me:
            if key in running:
                continue
            m = latest.get(task["id"])
            source = None
            if m is not None and m["state"] == "active" and m["to"] == me:
                source = m["from"]
            elif m is not None and m["state"] != "active" and m["to"] != me:
                source = m["to"]
            start.append(Start(task=task, source=source))
        elif key in running:
            stop.append(key)
    return Plan(start=tuple(start), stop=tuple(stop))
