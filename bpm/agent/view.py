"""What a participant sees at a period, from what its agent read and measured (pure).

The agent reads the registry (`Read`: its tasks, offers, movements and contracts, its
partners' liveness) and its task host (loads, the tasks running and still rising), and
`see` turns that into the machine's `View` and the answers to its own offers it has not
told the machine yet (`Answered`, in the order they came). The rules are here, not in the
agent: an offer still pending as read but past its expiry has expired; a movement whose
task would go back to a failed participant, or would have to come from one, ends by
failover, not by the mechanism; a task still rising, or not measured here yet, is not
offered; what tasks a split or merge ended still cost leaves the load the machine trades on.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field

from bpm.agent.machine import Answered, Incoming, View
from bpm.clock import seconds
from bpm.costs.base import CostFunction
from bpm.federation.views import movement_views, offer_view, offerable_tasks, passing_load, split_groups, task_query
from bpm.ha import failed_partners, is_failed, with_live_partners
from bpm.names import task_key
from bpm.negotiation import Contract


@dataclass(frozen=True)
class Read:
    """What one participant's agent read and measured for a period.

    Attributes:
        me: the participant.
        now_s: the time, on the clock of the registry's timestamps (`bpm.clock`).
        load: everything it carries now, as measured.
        loads: each running task's load by task key: as measured here, or for a task not
            measured here yet, as its previous host reported.
        measured: the loads measured here (rising ones included).
        cost: its cost function.
        contracts: its contracts in force, seen from its side.
        records: its contracts as the registry lists them (every state).
        offers: the offers it read: pending ones made by it and to it, and its own decided since.
        movements: the movements it is a party to.
        tasks: the tasks that concern it.
        partners: the liveness of the participants that concern it.
        offered: per pending offer made to it (by id), the offered tasks' records as read at
            the offerer (`offers_to_answer` says which to read).
        unrunnable: per task id among those, why its query could not run here.
        rising: the running tasks whose load is still rising (`bpm.load.still_rising`).
        running: the tasks running here (standby replicas included).
        hosting: the tasks running here as the task itself.
        ha: whether it does HA duties (movements of failed participants then end by failover).
        modes: each task's effective HA mode by key (None: each its own).
        pass_on: whether it offers on tasks it hosts for others.
        fixed_cost: what a running task costs whatever its input.
        answered: its own offers whose answers the machine was already told.
    """

    me: str
    now_s: float
    load: float
    loads: Mapping[str, float]
    measured: Mapping[str, float]
    cost: CostFunction
    contracts: Sequence[Contract] = ()
    records: Sequence[Mapping] = ()
    offers: Sequence[Mapping] = ()
    movements: Sequence[Mapping] = ()
    tasks: Sequence[Mapping] = ()
    partners: Mapping[str, str] = field(default_factory=dict)
    offered: Mapping[int, Sequence[Mapping]] = field(default_factory=dict)
    unrunnable: Mapping[int, str] = field(default_factory=dict)
    rising: Collection[str] = frozenset()
    running: Collection[str] = frozenset()
    hosting: Collection[str] = frozenset()
    ha: bool = False
    modes: Mapping[str, str] | None = None
    pass_on: bool = False
    fixed_cost: float = 0.0
    answered: Collection[int] = frozenset()


def current(offers: Sequence[Mapping], now_s: float) -> list[Mapping]:
    """The offers as they stand at `now_s`: one still pending as read but past its expiry has expired."""
    return [{**o, "state": "expired"} if o["state"] == "pending" and seconds(o["expires_at"]) <= now_s else o for o in offers]


def offers_to_answer(me: str, offers: Sequence[Mapping], now_s: float, contracts: Sequence[Contract]) -> list[Mapping]:
    """The offers made to `me` still pending at `now_s` under a contract of mine in force: those
    whose tasks the agent reads at the offerer before it answers."""
    return _answerable(me, current(offers, now_s), contracts)


def _answerable(me: str, offers: Sequence[Mapping], contracts: Sequence[Contract]) -> list[Mapping]:
    in_force = {int(c.id) for c in contracts}
    return [o for o in offers if o["to"] == me and o["state"] == "pending" and o["contract_id"] in in_force]


def see(read: Read) -> tuple[View, list[tuple[int, Answered]]]:
    """The machine's view of the period, and the answers to my offers not told it yet, in the
    order they came, each with its offer's id; an offer that expired unanswered counts from
    its expiry (the partner goes after the others until it answers one)."""
    me, now = read.me, read.now_s
    offers = current(read.offers, now)
    records = {c["id"]: c for c in read.records}
    answerable = {o["id"] for o in _answerable(me, offers, read.contracts)}
    incoming = []
    for offer in offers:
        if offer["to"] != me or offer["state"] != "pending":
            continue
        view = None
        if offer["id"] in answerable and offer["contract_id"] in records:
            offered = [t for t in read.offered.get(offer["id"], ()) if t["id"] in offer["task_ids"]]
            view = offer_view(offer, records[offer["contract_id"]], {t["id"]: t["load"] for t in offered}, {t["id"]: t["origin"] for t in offered},
                              {t["id"]: task_query(t) for t in offered}, read.unrunnable)
        incoming.append(Incoming(str(offer["id"]), offer["from"], view))
    movements = [m for m in read.movements if m["state"] == "active"]
    # Where each task runs: the host of the newest of its movements I see (the end of its
    # chain, as far as I am in it). As host I can return only tasks that still run here.
    runs_at = {m["task_id"]: m["to"] for m in sorted(movements, key=lambda m: m["id"])}
    endable = movement_views(m for m in movements if m["to"] != me or runs_at[m["task_id"]] == me)
    if read.ha:
        # A movement whose task would go back to a failed participant, or would have to come
        # from one, ends by failover, not here: the task would wait for a checkpoint that no
        # one can release. (The task runs at the movement's host unless that host passed it on.)
        failed = {p for p, status in read.partners.items() if is_failed(status)}
        endable = [v for v in endable if v.origin not in failed and runs_at[int(v.task_ids[0])] not in failed]
    mine = [o for o in offers if o["from"] == me]

    def answered_at(o: Mapping) -> float:
        return seconds(o["expires_at"] if o["state"] == "expired" else o["decided_at"])

    answers = [(o["id"], Answered(o["to"], o["state"] == "accepted", answered_at(o), expired=o["state"] == "expired"))
               for o in sorted((o for o in mine if (o["state"] == "expired" or o["state"] in ("accepted", "rejected") and o["decided_at"])
                                and o["id"] not in read.answered), key=lambda o: (answered_at(o), o["id"]))]
    steady = {key: value for key, value in read.measured.items() if key not in read.rising}
    view = View(
        now_s=now,
        load=read.load - passing_load(me, read.tasks, read.loads, read.fixed_cost),
        cost=read.cost,
        contracts=with_live_partners(read.contracts, read.partners),
        unreachable=failed_partners(read.contracts, read.partners),
        incoming=tuple(incoming),
        movements=tuple(endable),
        # Only tasks measured here (`offerable_tasks`: a task not measured has no price): one
        # that has just arrived counts in my load with what its previous host measured, and
        # from the end of my settling time to its first steady window here it was offered at
        # that load. Nor one whose load is still rising.
        offerable=tuple(offerable_tasks(me, read.tasks, steady, read.running, pass_on=read.pass_on, modes=read.modes)),
        outstanding=any(o["state"] == "pending" for o in mine),
        # An offer of mine was just accepted: its tasks still run here, and my load still counts them.
        handing_over=bool(set(read.hosting) - {task_key(t) for t in read.tasks if t["host"] == me}),
        split=split_groups(me, read.tasks),
    )
    return view, answers
