"""One participant's side of the mechanism as a state machine: events in, instructions out.

The machine holds what a participant remembers between periods (when it started, when
the tasks running here last changed, who refused its last offer, why it made no offer
last time) and decides with `bpm.negotiation`. It does no I/O and reads no clock: every
event carries its time. The live agent (`spark_agents.agent`) reads the registry and its
Spark host, feeds the machine events and executes the instructions it returns; the
simulator (`bpm.sim`) feeds the same machine from its own state, so both decide alike.
Both reach it through a participant's one front door, `bpm.agent.participant`, which
also routes HA's observations and journals both.

Events:
    `Tick` — the agent's loop turned; when a period is due the machine asks for the contracts
        agreed offline to be brought into force (`Contracts`), then either for what the
        participant sees (`Gather`: read it and send a `Period`) or records why it does not
        trade now (`Wait`).
    `Period` — a mechanism period with what the participant sees (`View`): answer the
        offers made to it, end the movements that no longer pay, make its next offer.
    `OfferReceived` — one offer to answer now (the simulator answers at once).
    `EndsDue` / `OfferDue` — one step of a period on its own (the simulator ends every
        participant's movements before anyone offers), behind the same warm-up and settling
        gates as a whole period.
    `Answered` — a partner answered an offer of mine (the refusal memory).
    `TasksChanged` — a task started or stopped here: the load window is mixed until
        `settle_s` has passed.
    `InputEnded` — a participant's input has ended (its stream's newest record is an
        end-of-input mark): its tasks drain where they run. For the participant's own input,
        no key groups are handed over from then on, and none of its own tasks is offered or
        called home; for the input of a partner whose tasks it hosts, none of those is passed
        on or returned early; and an offer of a task of an input that has ended is refused.
        A task whose input is over has no load to come, and a move would only hold its drain up.

Instructions: `Contracts`, `Gather`, `Accept`, `Refuse`, `End`, `MakeOffer`, `Split` and `Merge`
(tasks over their key groups, `bpm.negotiation.granularity`, when the machine has a
`fixed_cost`), and `Wait` — the record of a decision not taken, once each time its cause changes.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from bpm.costs.base import CostFunction
from bpm.keygroups import BITS, MAIN, check_input, check_prefix
from bpm.negotiation import (
    DEFAULT_HYSTERESIS,
    DEFAULT_MARGIN,
    REFUSED_SPLITS,
    Contract,
    Movement,
    Offer,
    Task,
    after_answer,
    choose_merge,
    choose_offer,
    choose_split,
    evaluate_offer,
    movements_to_end,
    settle,
    why_no_offer,
    why_refused,
)

# ---- events ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Incoming:
    """A pending offer made to me: `offer` is None when it names no contract of mine in force."""

    id: str
    partner: str
    offer: Offer | None


@dataclass(frozen=True, slots=True)
class View:
    """What the participant sees at a period.

    Attributes:
        now_s: the time, on the clock the movements' times are on.
        load: everything it carries now (own tasks here and tasks hosted for others).
        cost: its cost function.
        contracts: its contracts in force, seen from its side.
        incoming: offers made to it, waiting for an answer.
        movements: active movements it is a party to and may end (as host only those whose
            task still runs here).
        offerable: the tasks it may offer (`bpm.federation.views.offerable_tasks`).
        outstanding: whether an offer of its own waits for an answer.
        handing_over: whether tasks it gave away still run here (its load still counts them).
        split: the shares (input, key-group prefix) of its own tasks that were split, whose halves may
            merge back (`bpm.negotiation.choose_merge`).
        unreachable: the partners of its contracts in force that count as failed, whose
            contracts `contracts` leaves out (`bpm.ha.failed_partners`).
    """

    now_s: float
    load: float
    cost: CostFunction
    contracts: tuple[Contract, ...] = ()
    incoming: tuple[Incoming, ...] = ()
    movements: tuple[Movement, ...] = ()
    offerable: tuple[Task, ...] = ()
    outstanding: bool = False
    handing_over: bool = False
    split: tuple[tuple[str, str], ...] = ()
    unreachable: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Tick:
    now_s: float


@dataclass(frozen=True, slots=True)
class Period:
    view: View


@dataclass(frozen=True, slots=True)
class OfferReceived:
    now_s: float
    load: float
    cost: CostFunction
    incoming: Incoming


@dataclass(frozen=True, slots=True)
class EndsDue:
    now_s: float
    load: float
    cost: CostFunction
    movements: tuple[Movement, ...]


@dataclass(frozen=True, slots=True)
class OfferDue:
    view: View


@dataclass(frozen=True, slots=True)
class Answered:
    """`partner` answered the offer made to it at `at_s` (`accepted` or not), or, `expired`, let it
    expire unanswered at `at_s` (a participant settling after its own movements answers nothing)."""

    partner: str
    accepted: bool
    at_s: float
    expired: bool = False


@dataclass(frozen=True, slots=True)
class TasksChanged:
    at_s: float


@dataclass(frozen=True, slots=True)
class InputEnded:
    at_s: float
    reason: str
    origin: str | None = None  # whose input: None for the participant's own


@dataclass(frozen=True, slots=True)
class SplitsRemembered:
    """A restarted participant takes back what `Mechanism.split_memory` gave before (a JSON
    object); ValueError, nothing taken, when it is not that."""

    memory: Mapping


Event = Tick | Period | OfferReceived | EndsDue | OfferDue | Answered | TasksChanged | InputEnded | SplitsRemembered

# ---- instructions ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Contracts:
    """A period is due: bring the contracts agreed offline into force (also while not trading)."""


@dataclass(frozen=True, slots=True)
class Gather:
    """A period is due: read what the participant sees and send it as a `Period`."""


@dataclass(frozen=True, slots=True)
class Accept:
    """Take the leading `task_ids` of offer `offer_id` at `price` per unit of load."""

    offer_id: str
    partner: str
    task_ids: tuple[str, ...]
    load: float
    price: float


@dataclass(frozen=True, slots=True)
class Refuse:
    offer_id: str
    partner: str
    reason: str


@dataclass(frozen=True, slots=True)
class End:
    """End `movement`: its tasks go back to its origin."""

    movement: Movement


@dataclass(frozen=True, slots=True)
class MakeOffer:
    offer: Offer


@dataclass(frozen=True, slots=True)
class Split:
    """Split `task` over its key groups into two halves (`bpm.keygroups.halves`)."""

    task: Task


@dataclass(frozen=True, slots=True)
class Merge:
    """Merge the halves `tasks` (key groups p0 and p1) back into one task over p."""

    tasks: tuple[Task, Task]


@dataclass(frozen=True, slots=True)
class Wait:
    """A decision not taken: `cause` is short (`warming_up`, `settling`, `handing_over`, `input_ended`, or one
    of `bpm.negotiation.why_no_offer`'s), `message` says it with the figures behind it."""

    cause: str
    message: str


Instruction = Contracts | Gather | Accept | Refuse | End | MakeOffer | Split | Merge | Wait

# ---- the machine -------------------------------------------------------------------------------


@dataclass
class Mechanism:
    """One participant's state between events.

    Attributes:
        name: the participant.
        started_s: when it started (warm-up counts from here).
        period_s: how often a period is due.
        warmup_s: how long after the start, and after each task that starts while it warms
            up, it neither offers nor takes load: a JVM compiling its code, and a task's first
            batches, measure far more CPU than its tasks will need. Tasks that start one after
            another keep it warming up until `warmup_s` after the last: a participant warm
            from its own start alone reads its last tasks' first batches in its load window,
            and sheds on that reading.
        settle_s: how long after the tasks running here change (or it accepts an offer or
            ends a movement) it neither answers, ends nor offers: until its load window has
            seen only the tasks it runs now.
        margin, hysteresis: the relative margins of `bpm.negotiation`.
        fixed_cost: what a running task costs whatever its input, in units of load: with
            it, own tasks split where their size keeps load from moving and merge back
            where it no longer does (`bpm.negotiation.granularity`); None: tasks keep
            their size.
        refused: partner -> when it refused the last offer made to it (`after_answer`).
        unanswered: partner -> when the last offer made to it expired unanswered. Offers pass such
            a partner over as they do one that refused (`contract_order` tries it last, until it
            answers one), but a split never counts it: it said nothing of the tasks' size.
        split_s: when it last split a task.
        refused_splits: splits made because a partner refused, since an offer of its was last
            accepted: at most `REFUSED_SPLITS` (near saturation no partner has room at any
            size, and splitting on would only add fixed costs).
        refusal_split: the shares (input, key groups) of the tasks it split because a partner refused: what
            such a split made does not split again on a refusal (an acceptance of a small
            piece elsewhere would otherwise let it halve on down to single key groups).
        changed_s: when the tasks running here last changed.
        warm_from_s: when a task last started while it warmed up (the warm-up counts from it).
        ended: per participant whose input has ended (`InputEnded`), why: its tasks no longer
            move, and the participant's own no longer split or merge either.
        queries: the queries it can run, (name, digest) (`bpm.query`); an offer of a task whose
            query is not one of them is refused whole. None: it runs whatever it is offered
            (a simulated participant's tasks run no query).
        waiting: the cause of the last decision not taken (recorded once per change).
        next_period_s: when the next period is due (`Tick`).
    """

    name: str
    started_s: float = 0.0
    period_s: float = 0.0
    warmup_s: float = 0.0
    settle_s: float = 0.0
    margin: float = DEFAULT_MARGIN
    hysteresis: float = DEFAULT_HYSTERESIS
    fixed_cost: float | None = None
    refused: dict[str, float] = field(default_factory=dict)
    unanswered: dict[str, float] = field(default_factory=dict)
    split_s: float = -math.inf
    refused_splits: int = 0
    refusal_split: frozenset[tuple[str, str]] = frozenset()
    changed_s: float = -math.inf
    warm_from_s: float = -math.inf
    ended: dict[str, str] = field(default_factory=dict)
    queries: frozenset[tuple[str, str]] | None = None
    waiting: str | None = None
    next_period_s: float = -math.inf

    def handle(self, event: Event) -> list[Instruction]:
        """`event` in, the instructions it calls for out (a participant's events reach it
        through `bpm.agent.participant.ParticipantMachine`)."""
        match event:
            case Tick(now_s):
                return self._tick(now_s)
            case Period(view):
                return self._period(view)
            case OfferReceived(now_s, load, cost, incoming):
                if self._gate(now_s) is not None:
                    return []  # the offer waits, or expires
                return [self._answer(now_s, load, cost, incoming)]
            case EndsDue(now_s, load, cost, movements):
                gate = self._gate(now_s)
                return self._ends(now_s, load, cost, movements) if gate is None else self._wait(*gate)
            case OfferDue(view):
                gate = self._gate(view.now_s)
                return self._offer(view, view.load, ()) if gate is None else self._wait(*gate)
            case Answered(partner, _, at_s, True):
                self.unanswered[partner] = max(at_s, self.unanswered.get(partner, -math.inf))
                return []
            case Answered(partner, accepted, at_s):
                self.unanswered.pop(partner, None)
                self.refused = after_answer(self.refused, partner, accepted, at_s)
                if accepted and at_s >= self.split_s:  # an acceptance decided before the last split counts no splits after it
                    self.refused_splits = 0
                return []
            case TasksChanged(at_s):
                if self.warming(at_s):
                    self.warm_from_s = max(self.warm_from_s, at_s)
                self.changed_s = max(self.changed_s, at_s)
                return []
            case InputEnded(_, reason, origin):
                origin = origin or self.name
                if origin in self.ended:
                    return []
                self.ended[origin] = reason
                self.waiting = "input_ended"
                what = "split, merge or move of its own tasks" if origin == self.name else f"move of the tasks it hosts for {origin}"
                return [Wait("input_ended", f"no {what} from now on: {reason}")]
            case SplitsRemembered(memory):
                self._remember_splits(memory)
                return []
        raise TypeError(f"not an event: {event!r}")

    def split_memory(self) -> dict:
        """What the machine knows of its splits on refusals, as a JSON object: a restarted
        agent takes it back (`SplitsRemembered`) so that it does not split on refusals again
        what it had bounded (the answers it reads again, `Answered`, are older than its last
        split and reset no count)."""
        return {"refused_splits": self.refused_splits, "refusal_split": [list(s) for s in sorted(self.refusal_split)],
                "split_s": None if self.split_s == -math.inf else self.split_s}

    def _remember_splits(self, memory: Mapping) -> None:
        if not isinstance(memory, Mapping):
            raise ValueError("the split memory is a JSON object")
        count, prefixes = memory.get("refused_splits"), memory.get("refusal_split")
        if isinstance(count, bool) or not isinstance(count, int) or not 0 <= count <= REFUSED_SPLITS:
            raise ValueError(f"refused_splits is a count from 0 to {REFUSED_SPLITS}, not {count!r}")
        if not isinstance(prefixes, list) or len(prefixes) > 2 ** (BITS + 1):
            raise ValueError("refusal_split is a list of [input, key-group prefix] pairs")
        split_s = memory.get("split_s")
        if split_s is not None and (isinstance(split_s, bool) or not isinstance(split_s, (int, float)) or not math.isfinite(split_s)):
            raise ValueError(f"split_s is a time in seconds or null, not {split_s!r}")
        self.refusal_split = frozenset(_share(s) for s in prefixes)
        self.refused_splits = count
        self.split_s = -math.inf if split_s is None else float(split_s)

    @property
    def input_ended(self) -> str | None:
        """Why its own input has ended, if it has."""
        return self.ended.get(self.name)

    def passed_over(self) -> dict[str, float]:
        """Partners that refused the last offer made to them or let it expire, with when: offers
        try them last (`contract_order`)."""
        return {p: max(self.refused.get(p, -math.inf), self.unanswered.get(p, -math.inf))
                for p in self.refused.keys() | self.unanswered.keys()}

    def warming(self, now_s: float) -> bool:
        return now_s - max(self.started_s, self.warm_from_s) < self.warmup_s

    def settling(self, now_s: float) -> bool:
        return now_s - self.changed_s < self.settle_s

    # The steps

    def _tick(self, now_s: float) -> list[Instruction]:
        if now_s < self.next_period_s:
            return []
        self.next_period_s = now_s + self.period_s
        gate = self._gate(now_s)
        return [Contracts(), *([Gather()] if gate is None else self._wait(*gate))]

    def _gate(self, now_s: float) -> tuple[str, str] | None:
        """Why this participant may not trade now (cause, message), if it may not."""
        if self.warming(now_s):
            return "warming_up", f"warming up: no load is traded for {self.warmup_s:g} s after the start and after the tasks that start meanwhile"
        if self.settling(now_s):
            return "settling", f"settling: the load window still covers a change of the tasks running here ({self.settle_s:g} s)"
        return None

    def _period(self, view: View) -> list[Instruction]:
        """Answer, end, offer; a step that changes the tasks running here ends the period
        when the participant settles after a change (its load window no longer fits)."""
        now_s, load = view.now_s, view.load
        gate = self._gate(now_s)
        if gate is not None:
            return self._wait(*gate)
        out: list[Instruction] = []
        for incoming in view.incoming:
            answer = self._answer(now_s, load, view.cost, incoming)
            out.append(answer)
            if isinstance(answer, Accept):
                load += answer.load
        if self.settling(now_s):
            return out
        ends = self._ends(now_s, load, view.cost, view.movements)
        out += ends
        for end in ends:
            load += end.movement.load if end.movement.origin == self.name else -end.movement.load
        if self.settling(now_s):
            return out
        gone = {t for end in ends for t in end.movement.task_ids}
        return out + self._offer(view, load, gone)

    def _answer(self, now_s: float, load: float, cost: CostFunction, incoming: Incoming) -> Accept | Refuse:
        offer = incoming.offer
        if offer is None:
            return Refuse(incoming.id, incoming.partner, "no active contract")
        drained = sorted({t.origin for t in offer.tasks if self._draining(t.origin)})
        if drained:
            return Refuse(incoming.id, incoming.partner, f"the input of {', '.join(drained)} has ended: its tasks drain where they run")
        foreign = [t for t in offer.tasks if not self._runs(t.query)]
        if foreign:
            name, digest = foreign[0].query or ("no query", "none")
            return Refuse(incoming.id, incoming.partner, f"task #{foreign[0].id} runs query {name} (digest {digest}), which I do not have")
        unfit = [t for t in offer.tasks if t.unrunnable]
        if unfit:
            return Refuse(incoming.id, incoming.partner, f"task #{unfit[0].id} cannot run here: {unfit[0].unrunnable}")
        answer = evaluate_offer(load=load, cost=cost, offer=offer, margin=self.margin)
        price = settle(offer, answer)
        if price is None:
            reason = (why_refused(load=load, cost=cost, offer=offer, margin=self.margin) if not answer.accepted
                      else f"no price in the contract's range [{offer.price_min:.3f}, {offer.price_max:.3f}] between the offered cap and my floor ({answer.price_floor:.3f})")
            return Refuse(incoming.id, incoming.partner, reason)
        self.changed_s = now_s  # the accepted tasks will start here
        return Accept(incoming.id, incoming.partner, answer.task_ids, answer.load, price)

    def _runs(self, query: tuple[str, str] | None) -> bool:
        """Whether a task of `query` can run here (`queries`); a task of no query runs anywhere."""
        return self.queries is None or query is None or query in self.queries

    def _draining(self, origin: str) -> bool:
        """Whether a task of `origin` drains where it runs: once `origin`'s input has ended."""
        return origin in self.ended

    def _ends(self, now_s: float, load: float, cost: CostFunction, movements: Sequence[Movement]) -> list[Instruction]:
        movements = [m for m in movements if not self._draining(m.origin)]
        by_id = {m.id: m for m in movements}
        ended = movements_to_end(me=self.name, now_s=now_s, load=load, cost=cost, movements=movements, hysteresis=self.hysteresis)
        if ended:
            self.changed_s = now_s  # tasks leave or come home
        return [End(by_id[i]) for i in ended]

    def _offer(self, view: View, load: float, gone: set[str]) -> list[Instruction]:
        if view.handing_over:
            return self._wait("handing_over", "tasks of an accepted offer still run here")
        tasks = [t for t in view.offerable if t.id not in gone and not self._draining(t.origin)]
        offer = choose_offer(load=load, cost=view.cost, tasks=tasks, contracts=view.contracts, refused_last=self.passed_over(),
                             outstanding=view.outstanding, margin=self.margin, me=self.name)
        if offer is not None:
            # The best offer left goes to a partner that refused one since the last split:
            # the tasks are too large for the room the partners have at the price.
            split = None
            if self.refused.get(offer.partner, -math.inf) > self.split_s and self.refused_splits < REFUSED_SPLITS:
                split = self._split(view, load, [t for t in tasks if not _within(t, self.refusal_split)])
                if split is not None:
                    self.refused_splits += 1
                    self.refusal_split = self.refusal_split | {split.task.share}
            self.waiting = None
            return [split or MakeOffer(offer)]
        cause, message = why_no_offer(load=load, cost=view.cost, tasks=tasks, contracts=view.contracts,
                                      outstanding=view.outstanding, margin=self.margin)
        regrain: Split | Merge | None = None
        if cause == "lumpy":
            regrain = self._split(view, load, tasks)
        elif cause in ("below_price", "no_contract") and self.fixed_cost is not None and self.input_ended is None and not view.unreachable:
            # Not while a partner under contract is cut off: it may come back, and halves merged
            # now would split again once it does, each time restarting the tasks.
            pair = choose_merge(load=load, cost=view.cost, tasks=tasks, contracts=view.contracts, split=view.split,
                                margin=self.margin, hysteresis=self.hysteresis, me=self.name)
            regrain = None if pair is None else Merge(pair)
        if regrain is None:
            return self._wait(cause, message)
        self.waiting = None
        return [regrain]

    def _split(self, view: View, load: float, tasks: list[Task]) -> Split | None:
        """With a fixed cost per task and an input that goes on: a split where every task is too
        large to move, for this participant's saving ("lumpy") or for its partners' room (refused)."""
        if self.fixed_cost is None or self.input_ended is not None:
            return None
        task = choose_split(load=load, cost=view.cost, tasks=tasks, contracts=view.contracts, fixed_cost=self.fixed_cost,
                            margin=self.margin, me=self.name)
        if task is None:
            return None
        self.split_s = view.now_s
        return Split(task)

    def _wait(self, cause: str, message: str) -> list[Instruction]:
        if cause == self.waiting:
            return []
        self.waiting = cause
        return [Wait(cause, message)]


def _within(task: Task, shares: frozenset[tuple[str, str]]) -> bool:
    """Whether the key groups of `task` lie within one of `shares` (a task a split of them made)."""
    return task.groups is not None and any(task.input == i and task.groups.startswith(p) for i, p in shares)


def _share(item: object) -> tuple[str, str]:
    """An [input, key-group prefix] pair of the split memory, checked (a prefix alone, as an
    agent that knew one input only kept it: of the main input)."""
    if isinstance(item, str):
        return MAIN, check_prefix(item)
    if not isinstance(item, (list, tuple)) or len(item) != 2:
        raise ValueError(f"refusal_split holds [input, key-group prefix] pairs, not {item!r}")
    return check_input(item[0]), check_prefix(item[1])
