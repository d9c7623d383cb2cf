"""From registry records (JSON dicts) to the views of `bpm.negotiation`, and back. Pure.

Times become seconds on one clock (`bpm.clock.seconds`: the registry's UTC timestamps as POSIX seconds), so
`movements_to_end` compares them with `now_s` from the same clock.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from bpm.clock import seconds
from bpm.ha.decisions import HA_MODES, task_mode
from bpm.keygroups import MAIN, is_location, parse_location
from bpm.names import task_key
from bpm.negotiation.models import Contract, Movement, Offer, Task

# A task measured at no load cannot be offered (it would cost nothing to keep); tiny
# loads are floored so that a just-started task still counts as a small one.
MIN_TASK_LOAD = 1e-4


def active_contracts(me: str, contracts: Iterable[Mapping], now: float | None = None) -> list[Contract]:
    """My contracts in force (at `now`, when given: one read earlier may have expired since), each seen from my side."""
    views = []
    for c in contracts:
        if c["state"] != "active" or not c.get("in_force", True) or me not in (c["proposer"], c["counterparty"]):
            continue
        if now is not None and c.get("valid_until") and seconds(c["valid_until"]) <= now:
            continue
        partner = c["counterparty"] if c["proposer"] == me else c["proposer"]
        views.append(Contract(id=str(c["id"]), partner=partner, price_min=c["price_min"], price_max=c["price_max"], min_duration_s=c["min_duration_s"],
                              ha_mode=c.get("ha_mode", "none")))
    return views


def offerable_tasks(
    me: str, tasks: Iterable[Mapping], measured: Mapping[str, float], running: Iterable[str], *, pass_on: bool = False,
    modes: Mapping[str, str] | None = None,
) -> list[Task]:
    """The tasks I may offer (registry ids as strings), each with a measured load and its
    effective HA mode (`modes`, by task key, else its own): my own tasks running here and,
    with `pass_on`, tasks running here for others; under which contract each may go is
    `bpm.negotiation.not_offerable`'s to say. A task not measured yet has no price and is
    not offered."""
    running = set(running)
    modes = modes or {}
    out = []
    for t in tasks:
        key = task_key(t)
        load = measured.get(key, 0.0)
        if t["host"] != me or key not in running or load < MIN_TASK_LOAD or ending(t):
            continue
        if t["origin"] == me or pass_on:
            input, groups = (task_share(t) if t["origin"] == me else None) or (MAIN, None)
            out.append(Task(id=str(t["id"]), load=load, origin=t["origin"], ha_mode=modes.get(key, t.get("ha_mode", "none")),
                            groups=groups, input=input))
    return out


def ending(task: Mapping) -> bool:
    """Whether a task handed its key groups over to the tasks a split or merge made (it runs
    on only to complete its windows, then retires): it neither moves nor splits again."""
    return task.get("until_s") is not None or bool(task.get("retired"))


def task_share(task: Mapping) -> tuple[str, str] | None:
    """(the input, the key groups) a task reads of its origin's stream (None: it reads no broker stream)."""
    uri = task.get("input_uri") or ""
    return parse_location(uri).share if is_location(uri) else None


def task_input(task: Mapping) -> str:
    """The input of its origin's stream a task reads (`bpm.keygroups.MAIN` for one that reads
    no broker stream, as a simulated task)."""
    share = task_share(task)
    return MAIN if share is None else share[0]


def key_groups(task: Mapping) -> str | None:
    """The key groups a task reads of its origin's stream (None: it reads no broker stream)."""
    share = task_share(task)
    return None if share is None else share[1]


def passing_load(me: str, tasks: Iterable[Mapping], loads: Mapping[str, float], fixed_cost: float = 0.0) -> float:
    """What my load holds of the tasks a split or merge ended that still run here, above the
    fixed cost of each (`loads`: per task key): it leaves as they complete their windows. An
    ended task catches up on its input to the handover time, then costs its fixed cost until
    it retires; counted in full, its catch-up made a participant on a 0.2-CPU host shed
    both halves of the task it had just split."""
    return sum(max(0.0, loads.get(task_key(t), 0.0) - fixed_cost)
               for t in tasks if t["host"] == me and ending(t) and not t.get("retired"))


def split_groups(me: str, tasks: Iterable[Mapping]) -> tuple[tuple[str, str], ...]:
    """The shares (input, key groups) of my tasks that were split and whose halves may merge
    back: those whose half runs on as a task a split made (`bpm.negotiation.choose_merge`)."""
    out = set()
    for t in tasks:
        input, groups = task_share(t) or (MAIN, "")
        if t["origin"] == me and groups and len(t.get("from_tasks") or ()) == 1 and not ending(t):
            out.add((input, groups[:-1]))
    return tuple(sorted(out))


def regrains(tasks: Sequence[Mapping]) -> list[dict]:
    """The splits and merges the registry's lineage records, in the order made: each with its
    `kind` ("split": one task's key groups halved; "merge": two halves made one again), the
    tasks' `origin`, the names of the tasks it was made `from` and of those it `made`, and
    their `ids` (which tell one split or merge from another)."""
    names = {t["id"]: t["name"] for t in tasks}
    made: dict[tuple[int, ...], list[Mapping]] = {}
    for t in tasks:
        if t.get("from_tasks"):
            made.setdefault(tuple(sorted(t["from_tasks"])), []).append(t)
    out = []
    for parents, children in sorted(made.items(), key=lambda item: min(c["id"] for c in item[1])):
        out.append({
            "kind": "split" if len(parents) == 1 else "merge",
            "origin": children[0]["origin"],
            "from": [names.get(p, f"#{p}") for p in parents],
            "made": sorted(c["name"] for c in children),
            "ids": sorted(c["id"] for c in children),
        })
    return out


def offer_view(offer: Mapping, contract: Mapping, task_loads: Mapping[int, float], origins: Mapping[int, str] | None = None,
               queries: Mapping[int, tuple[str, str] | None] | None = None, unrunnable: Mapping[int, str] | None = None) -> Offer:
    """A pending offer made to me, as `evaluate_offer` sees it: with the offerer's caps for
    each leading part of its tasks, as the registry carries them, and each task's origin,
    query (name, digest) and why I could not run it, where `origins`, `queries` and
    `unrunnable` say them. A task's load is the larger of what the registry last heard
    (`task_loads`) and what the offer declares: a load sampled between batches must not
    make a task look smaller than the offerer priced it."""
    origins, queries, unrunnable = origins or {}, queries or {}, unrunnable or {}
    declared = dict(zip(offer["task_ids"], offer.get("loads") or ()))
    tasks = tuple(Task(id=str(tid), load=max(task_loads.get(tid, 0.0), declared.get(tid, 0.0), MIN_TASK_LOAD), origin=origins.get(tid, ""),
                       query=queries.get(tid), unrunnable=unrunnable.get(tid))
                  for tid in offer["task_ids"])
    return Offer(
        contract_id=str(offer["contract_id"]),
        partner=offer["from"],
        tasks=tasks,
        caps=tuple(offer["caps"]),
        price_min=contract["price_min"],
        price_max=contract["price_max"],
    )


def task_query(task: Mapping) -> tuple[str, str] | None:
    """(query, digest) of a task as the registry records it; None for a task of no query."""
    name, digest = task.get("query"), task.get("query_digest")
    return (name, digest) if name and digest else None


def movement_views(movements: Iterable[Mapping]) -> list[Movement]:
    """Active movements; the side that moved the task (`origin` here, the payer) pays, the host earns."""
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


@dataclass(frozen=True)
class Start:
    """Start `task` here; `source` is the participant holding its checkpoint (None: my own copy).

    `failover`: the task arrived by a failover (its previous host failed): it is taken over
    per its HA mode (`spark_agents.ha.roles.take_over`), never fetched from the failed host.
    """

    task: Mapping
    source: str | None
    failover: Mapping | None = None


@dataclass(frozen=True)
class Plan:
    start: tuple[Start, ...]
    stop: tuple[str, ...]


def reconcile(
    me: str, tasks: Iterable[Mapping], running: Iterable[str], movements: Iterable[Mapping], failovers: Iterable[Mapping] = ()
) -> Plan:
    """What to stop and start so that I run exactly the tasks the registry says I host.

    A task that arrives here comes from its previous host: the origin of an active
    movement to me, or the host of the last movement of my own task, now ended. The
    agent fetches the checkpoint from that source unless its own copy is already at the
    task's epoch. A task running here that the registry gives to another participant
    stops here and waits for that participant to fetch its checkpoint.

    A task that a failover gave me (the newest failover of the task names me at the
    task's current epoch) has no source: its previous host failed, so it is taken over.
    A retired task runs nowhere: it stops here.

    `tasks` may be only those that concern me (the registry's `involving` filter): a task
    running here that is not among them at all was passed on by me, and stops too.
    """
    tasks = list(tasks)
    running = set(running)
    latest: dict[int, Mapping] = {}
    for m in sorted(movements, key=lambda m: m["id"]):
        latest[m["task_id"]] = m
    start, stop = [], []
    for task in tasks:
        key = task_key(task)
        if task["host"] == me and not task.get("retired"):
            if key in running:
                continue
            took = current_failover(task, failovers)
            if took is not None and took["to_host"] == me:
                start.append(Start(task=task, source=None, failover=took))
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
    listed = {task_key(t) for t in tasks}
    stop += sorted(running - listed)
    return Plan(start=tuple(start), stop=tuple(stop))


def current_failover(task: Mapping, failovers: Iterable[Mapping]) -> Mapping | None:
    """The failover that put `task` where it is now: its newest failover, if the task has not
    changed epoch since (a movement afterwards bumps the epoch). None otherwise."""
    newest = None
    for f in failovers:
        if f["task_id"] == task["id"] and f.get("kind", "failover") == "failover" and (newest is None or f["id"] > newest["id"]):
            newest = f
    return newest if newest is not None and newest["to_epoch"] == task["epoch"] else None


def task_ha_mode(task: Mapping, movements: Iterable[Mapping], contracts: Iterable[Mapping], failovers: Iterable[Mapping] = (),
                 *, ended_too: bool = False) -> str:
    """The task's HA mode (`bpm.ha.task_mode`, the registry's rule) from the records an agent sees."""
    took = current_failover(task, failovers)
    newest = None
    for m in movements:
        if m["task_id"] == task["id"] and (newest is None or m["id"] > newest["id"]):
            newest = m
    contract_mode = None if newest is None else next((c.get("ha_mode") for c in contracts if c["id"] == newest["contract_id"]), None)
    return task_mode(task.get("ha_mode", "none"), movement_state=None if newest is None else newest["state"], contract_mode=contract_mode,
                     failover_mode=None if took is None else took["mode"], ended_too=ended_too)


@dataclass(frozen=True)
class AgreedTerms:
    """Terms a participant agreed with a partner offline (its agent's `--contract` option).

    `ha_mode` is the contract's HA mode: the default for every task moved under it.
    """

    partner: str
    price_min: float
    price_max: float
    min_duration_s: float
    ha_mode: str = "none"

    @classmethod
    def parse(cls, spec: str) -> AgreedTerms:
        """'PARTNER:PRICE_MIN:PRICE_MAX:MIN_DURATION_S[:HA_MODE]', e.g. 'b:1.0:1.1:15' or 'b:1.0:1.1:15:passive_standby'."""
        parts = spec.split(":")
        if len(parts) not in (4, 5) or not parts[0]:
            raise ValueError(f"bad contract {spec!r}: use PARTNER:PRICE_MIN:PRICE_MAX:MIN_DURATION_S[:HA_MODE], e.g. b:1.0:1.1:15")
        mode = parts[4] if len(parts) == 5 else "none"
        if mode not in HA_MODES:
            raise ValueError(f"bad contract {spec!r}: the HA mode is one of {', '.join(HA_MODES)}")
        try:
            return cls(parts[0], float(parts[1]), float(parts[2]), float(parts[3]), mode)
        except ValueError as exc:
            raise ValueError(f"bad contract {spec!r}: prices and duration are numbers") from exc

    def spec(self) -> str:
        """The terms as `parse` reads them (the HA mode only when there is one)."""
        mode = f":{self.ha_mode}" if self.ha_mode != "none" else ""
        return f"{self.partner}:{self.price_min:g}:{self.price_max:g}:{self.min_duration_s:g}{mode}"

    def matches(self, contract: Mapping) -> bool:
        same_terms = all(abs(contract[k] - getattr(self, k)) <= 1e-9 * max(1.0, abs(contract[k])) for k in ("price_min", "price_max", "min_duration_s"))
        return same_terms and contract.get("ha_mode", "none") == self.ha_mode


@dataclass(frozen=True)
class ContractStep:
    action: str  # "propose" or "accept"
    terms: AgreedTerms
    contract_id: int | None = None


def contract_steps(me: str, agreed: Iterable[AgreedTerms], contracts: Iterable[Mapping], participants: Iterable[str]) -> list[ContractStep]:
    """What brings the registry's contracts in line with the terms agreed offline.

    Both sides declare the same terms; the side whose name sorts first proposes them once
    the partner is registered, and the other accepts a proposal whose terms match its own
    declaration exactly (any other proposal is left for a person to answer). Nothing is
    done for a partner with an active contract or a pending proposal of mine.
    """
    contracts = list(contracts)
    present = set(participants)
    steps = []
    for terms in agreed:
        if terms.partner not in present or terms.partner == me:
            continue
        between = [c for c in contracts if {c["proposer"], c["counterparty"]} == {me, terms.partner}]
        if any(c["state"] == "active" for c in between):
            continue
        waiting = [c for c in between if c["state"] in ("proposed", "countered")]
        mine = [c for c in waiting if c.get("awaiting") == me and terms.matches(c)]
        if mine:
            steps.append(ContractStep("accept", terms, mine[0]["id"]))
        elif not any(c.get("awaiting") == terms.partner for c in waiting) and me < terms.partner:
            steps.append(ContractStep("propose", terms))
    return steps
