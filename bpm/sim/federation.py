"""A federation stepped in discrete rounds, deciding with `bpm.negotiation` unchanged.

One round is one offer period of the live agents (Borealis: 7 s). Every participant
decides with the live agent's state machine (`bpm.agent.participant.ParticipantMachine`). In each
round, participants whose movements may end decide which to end (`EndsDue`); then every
participant, in a seeded random order, makes at most one offer (`OfferDue`; so there is
never more than one outstanding), which the partner answers at once (`OfferReceived`)
and the offerer learns the answer of (`Answered`). The round's
loads are updated after every decision, as they would be in a live federation where
offers are spread over the period.

A participant may fail (`fail`): it stops trading and its own tasks stop with it; the
origin of every task it hosted decides where the task goes with the same machine (its HA
part, `bpm.ha.machine.HAMachine`), and the movements that carried it end. The simulator
keeps no replicas, so every task fails over to its origin, as under upstream backup.

With a fixed cost per task (`fixed_cost`), tasks are made of key groups: each
participant's stream has `bpm.keygroups.KEY_GROUPS` key groups with a load each
(`set_stream`), a task over a prefix of them carries their load plus the fixed cost, and
participants split and merge their own tasks as their machines decide (`Split`, `Merge`).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from bpm.agent.machine import Accept, Answered, End, EndsDue, Incoming, MakeOffer, Merge, OfferDue, OfferReceived, Split, TasksChanged, View
from bpm.agent.participant import ParticipantMachine
from bpm.costs.base import CostFunction
from bpm.ha import failed_partners, task_mode, with_live_partners
from bpm.ha.machine import FailOver, Here, Observed
from bpm.keygroups import groups as key_groups, halves
from bpm.negotiation import DEFAULT_HYSTERESIS, DEFAULT_MARGIN, Contract, Movement, Task, is_acceptable


@dataclass(slots=True)
class Participant:
    """A participant's state in the simulator.

    Attributes:
        name: its id.
        cost: its private cost function.
        threshold: the load at which its marginal cost reaches its reference price.
        load: the load it carries now (own tasks at home plus tasks it hosts).
        home: its own tasks running at home, by id.
        hosted: other participants' tasks running here, by id.
        machine: its decisions, the live agent's (`bpm.agent.participant`): its side of the
            mechanism (the refusal memory among it) and of high availability (its tasks' failovers).
        contracts: its contracts, seen from its side.
        movements_out / movements_in: active movements of its tasks elsewhere / of others' tasks here.
        paid, earned: payments so far (price x load x seconds).
        own_load: the total load of its own tasks wherever they run.
        min_price: the lowest `price_min` of its contracts (below it no offer can pay).
        failed: whether it failed (it no longer trades; its partners fail its tasks over).
        split: shares (input, key-group prefix) of its own tasks that were split (their halves may merge).
    """

    name: str
    cost: CostFunction
    threshold: float
    machine: ParticipantMachine
    load: float = 0.0
    home: dict[str, Task] = field(default_factory=dict)
    hosted: dict[str, Task] = field(default_factory=dict)
    contracts: list[Contract] = field(default_factory=list)
    movements_out: dict[str, Movement] = field(default_factory=dict)
    movements_in: dict[str, Movement] = field(default_factory=dict)
    paid: float = 0.0
    earned: float = 0.0
    own_load: float = 0.0
    min_price: float = math.inf
    failed: bool = False
    split: set[tuple[str, str]] = field(default_factory=set)

    def add_contract(self, contract: Contract) -> None:
        self.contracts.append(contract)
        self.min_price = min(self.min_price, contract.price_min)


@dataclass(frozen=True, slots=True)
class Event:
    """One thing that happened, for the readable account and the counts."""

    round: int
    time_s: float
    kind: str  # "move", "refuse", "end", "failover", "split", "merge"
    origin: str
    host: str
    load: float
    price: float
    tasks: int
    by: str = ""
    passed_on: int = 0  # tasks of a "move" that belong to someone else than the mover


class Federation:
    """Participants, contracts and movements, stepped round by round.

    Attributes:
        period_s: seconds per round (the offer period).
        hysteresis: the margin on ending movements.
        margin: the margin on offering and accepting load.
        forward: whether a host may pass tasks it hosts on to its own partners (a
            movement of its own: it pays the next host, and is still paid by the
            origin). When the origin takes its tasks back, the chain unwinds.
        fixed_cost: what a running task costs whatever its input; with it, own tasks split
            and merge over their key groups. None: tasks keep their size.
        warmup_s, settle_s: how long a participant neither offers nor takes load after it
            joins, and after the tasks running at it change (`bpm.agent.machine.Mechanism`,
            as in the live agent); 0: no wait, the rounds then only space the offers.
        now_s: the simulated clock.
        rounds: rounds stepped so far.
        events: every movement, refusal and ending, when `record` is True.
    """

    def __init__(
        self,
        *,
        period_s: float = 7.0,
        hysteresis: float = DEFAULT_HYSTERESIS,
        margin: float = DEFAULT_MARGIN,
        forward: bool = True,
        seed: int = 0,
        record: bool = False,
        fixed_cost: float | None = None,
        warmup_s: float = 0.0,
        settle_s: float = 0.0,
    ) -> None:
        self.period_s = period_s
        self.warmup_s = warmup_s
        self.settle_s = settle_s
        self.waiting = 0  # participants that, in the last round, waited out a warm-up or a change
        self.fixed_cost = fixed_cost
        self.streams: dict[str, np.ndarray] = {}  # participant -> the load of each key group of its stream
        self.split_count = 0
        self.merge_count = 0
        self.hysteresis = hysteresis
        self.margin = margin
        self.forward = forward
        self.rng = np.random.default_rng(seed)
        self.record = record
        self.participants: list[Participant] = []
        self.index: dict[str, int] = {}
        self.movements: dict[str, Movement] = {}
        self.events: list[Event] = []
        self.now_s = 0.0
        self.rounds = 0
        self.movement_count = 0
        self.ending_count = 0
        self.refusal_count = 0
        self.failover_count = 0
        self._next_movement = 0
        self._contract_ids = 0
        # Movements not yet past their earliest end, by that time; and participants to recheck for endings.
        self._pending: list[tuple[float, str]] = []
        self._recheck: set[int] = set()
        self._ready: dict[int, int] = {}  # participant -> number of its movements past earliest end
        self._moved: dict[str, tuple[Task, ...]] = {}  # the tasks of each active movement
        self._carriers: dict[str, list[str]] = {}  # task id -> movements carrying it, outermost first
        self._eligible: set[str] = set()  # movements past their earliest end
        self._status: dict[str, str] = {}  # liveness of participants that failed (the others are alive)

    # ---- building -------------------------------------------------------------------------------

    def add_participant(self, name: str, cost: CostFunction, threshold: float | None = None, *, reference_price: float | None = None) -> Participant:
        """Add a participant; its threshold is given, or is where its marginal cost reaches `reference_price`."""
        if name in self.index:
            raise ValueError(f"participant {name!r} exists")
        if threshold is None:
            if reference_price is None:
                raise ValueError("give a threshold or a reference price")
            threshold = cost.threshold(reference_price)
        p = Participant(name=name, cost=cost, threshold=threshold,
                        machine=ParticipantMachine.named(name, started_s=self.now_s, period_s=self.period_s, warmup_s=self.warmup_s,
                                                         settle_s=self.settle_s, margin=self.margin, hysteresis=self.hysteresis,
                                                         fixed_cost=self.fixed_cost))
        self.index[name] = len(self.participants)
        self.participants.append(p)
        return p

    def add_contract(self, a: str, b: str, price_min: float, price_max: float, *, min_duration_s: float = 60.0, ha_mode: str = "none") -> str:
        """Sign a contract between `a` and `b`; returns its id."""
        self._contract_ids += 1
        cid = f"c{self._contract_ids}"
        for me, other in ((a, b), (b, a)):
            self.participants[self.index[me]].add_contract(
                Contract(id=cid, partner=other, price_min=price_min, price_max=price_max, min_duration_s=min_duration_s, ha_mode=ha_mode)
            )
        return cid

    def add_tasks(self, name: str, tasks: Sequence[Task]) -> None:
        """New own tasks for `name`, running at home."""
        p = self.participants[self.index[name]]
        for t in tasks:
            if t.origin != name:
                t = Task(t.id, t.load, name)
            p.home[t.id] = t
            p.load += t.load
            p.own_load += t.load

    def set_stream(self, name: str, group_loads: Sequence[float]) -> None:
        """The load of each key group of `name`'s stream (without the fixed cost per task):
        what the pieces of its tasks carry when they split and merge."""
        self.streams[name] = np.asarray(group_loads, dtype=float)

    def task_over(self, origin: str, groups: str) -> Task:
        """`origin`'s task over key groups `groups`: their load plus the fixed cost."""
        share = key_groups(groups)
        load = (self.fixed_cost or 0.0) + float(self.streams[origin][share.start:share.stop].sum())
        return Task(f"{origin}/{groups}", load, origin, groups=groups)

    def task_count(self) -> int:
        return sum(len(p.home) + len(p.hosted) for p in self.participants)

    # ---- views ----------------------------------------------------------------------------------

    def loads(self) -> np.ndarray:
        return np.fromiter((p.load for p in self.participants), dtype=float, count=len(self.participants))

    def thresholds(self) -> np.ndarray:
        return np.fromiter((p.threshold for p in self.participants), dtype=float, count=len(self.participants))

    def mean_task_load(self) -> float:
        """The mean load of all tasks, wherever they run."""
        loads = [t.load for p in self.participants for t in (*p.home.values(), *p.hosted.values())]
        return float(np.mean(loads)) if loads else 0.0

    def acceptable(self) -> bool:
        return is_acceptable(self.loads(), self.thresholds())

    def total_cost(self) -> float:
        return math.fsum(p.cost.cost(p.load) for p in self.participants)

    def payments(self) -> tuple[np.ndarray, np.ndarray]:
        """What each participant has paid and earned up to now, active movements included."""
        paid = np.fromiter((p.paid for p in self.participants), dtype=float, count=len(self.participants))
        earned = np.fromiter((p.earned for p in self.participants), dtype=float, count=len(self.participants))
        for m in self.movements.values():
            amount = m.price * m.load * max(self.now_s - m.started_s, 0.0)
            paid[self.index[m.origin]] += amount
            earned[self.index[m.host]] += amount
        return paid, earned

    def cost_rates(self) -> tuple[np.ndarray, np.ndarray]:
        """Per participant, its cost per second now (processing plus payments out minus
        payments in) and what it would be alone, running all its own tasks at home."""
        now = np.fromiter((p.cost.cost(p.load) for p in self.participants), dtype=float, count=len(self.participants))
        alone = np.fromiter((p.cost.cost(p.own_load) for p in self.participants), dtype=float, count=len(self.participants))
        for m in self.movements.values():
            now[self.index[m.origin]] += m.price * m.load
            now[self.index[m.host]] -= m.price * m.load
        return now, alone

    # ---- stepping -------------------------------------------------------------------------------

    def step(self) -> int:
        """Play one round; returns the number of movements started or ended in it."""
        self.rounds += 1
        self.now_s += self.period_s
        self.waiting = 0
        changes = self._end_movements()
        order = self.rng.permutation(len(self.participants))
        for i in order:
            changes += self._offer(int(i))
        return changes

    def run(self, *, max_rounds: int = 1000, quiet_rounds: int | None = None, on_round: Callable[[Federation], None] | None = None) -> bool:
        """Step until nothing has changed for `quiet_rounds` rounds and no movement is waiting
        for its earliest end (the allocation is then stable), or until `max_rounds`.
        Returns whether it became stable."""
        if quiet_rounds is None:
            quiet_rounds = 2 + max((len(p.contracts) for p in self.participants), default=0)
        quiet = 0
        for _ in range(max_rounds):
            changed = self.step()
            if on_round is not None:
                on_round(self)
            quiet = 0 if changed or self.waiting else quiet + 1
            if quiet >= quiet_rounds and not self._pending and not self._recheck:
                return True
        return False

    def _touch(self, i: int) -> None:
        if self._ready.get(i):
            self._recheck.add(i)

    def _offer(self, i: int) -> int:
        p = self.participants[i]
        if p.failed or not p.contracts or not (p.home or (self.forward and p.hosted)):
            return 0
        # A task's per-unit saving never exceeds the marginal cost at the current load
        # (a participant with split tasks may still merge them).
        if p.cost.marginal(p.load) <= p.min_price * (1.0 + self.margin) and not p.split:
            return 0
        tasks = [*p.home.values(), *p.hosted.values()] if self.forward else list(p.home.values())
        made = p.machine.handle(OfferDue(View(now_s=self.now_s, load=p.load, cost=p.cost, contracts=with_live_partners(p.contracts, self._status),
                                              offerable=tuple(tasks), split=tuple(sorted(p.split)),
                                              unreachable=failed_partners(p.contracts, self._status))))
        if made and isinstance(made[0], Split | Merge):
            return self._regrain(p, made[0])
        if self._held(p):
            self.waiting += 1
        if not made or not isinstance(made[0], MakeOffer):
            return 0
        offer = made[0].offer
        j = self.index[offer.partner]
        q = self.participants[j]
        answers = q.machine.handle(OfferReceived(self.now_s, q.load, q.cost, Incoming(f"o{self.rounds}.{i}", p.name, offer)))
        if not answers:  # the partner waits out its warm-up or a change: the offer expires unanswered
            p.machine.handle(Answered(q.name, False, self.now_s, expired=True))
            self.waiting += 1
            return 0
        answer = answers[0]
        p.machine.handle(Answered(q.name, isinstance(answer, Accept), self.now_s))
        if not isinstance(answer, Accept):
            self.refusal_count += 1
            if self.record:
                self.events.append(Event(self.rounds, self.now_s, "refuse", p.name, q.name, offer.load, offer.price_cap, len(offer.tasks)))
            return 0
        price = answer.price
        contract = next(c for c in p.contracts if c.id == offer.contract_id)
        self._next_movement += 1
        m = Movement(
            id=f"m{self._next_movement}", task_ids=answer.task_ids, origin=p.name, host=q.name, price=price,
            load=answer.load, started_s=self.now_s, earliest_end_s=self.now_s + contract.min_duration_s,
            contract_id=contract.id,
        )
        moved = tuple(p.home.pop(tid, None) or p.hosted.pop(tid) for tid in answer.task_ids)
        self._moved[m.id] = moved
        for t in moved:
            q.hosted[t.id] = t
            self._carriers.setdefault(t.id, []).append(m.id)
        p.load = max(p.load - answer.load, 0.0)
        q.load += answer.load
        p.machine.handle(TasksChanged(self.now_s))  # its tasks left (the host's machine counts the change when it accepts)
        p.movements_out[m.id] = m
        q.movements_in[m.id] = m
        self.movements[m.id] = m
        heapq.heappush(self._pending, (m.earliest_end_s, m.id))
        self.movement_count += 1
        self._touch(i)
        self._touch(j)
        if self.record:
            passed_on = sum(1 for t in moved if t.origin != p.name)
            self.events.append(Event(self.rounds, self.now_s, "move", p.name, q.name, m.load, price, len(m.task_ids), passed_on=passed_on))
        return 1

    def _held(self, p: Participant) -> bool:
        """Whether `p` waits out its warm-up or a change of its tasks (it decides nothing now)."""
        return p.machine.mechanism.warming(self.now_s) or p.machine.mechanism.settling(self.now_s)

    def _regrain(self, p: Participant, instruction: Split | Merge) -> int:
        """Carry out a split or a merge of `p`'s own tasks at home; returns 1."""
        if isinstance(instruction, Split):
            old = [instruction.task]
            new = [self.task_over(p.name, g) for g in halves(instruction.task.groups or "")]
            p.split.add((instruction.task.input, instruction.task.groups or ""))
            self.split_count += 1
        else:
            old = list(instruction.tasks)
            parent = (old[0].groups or "")[:-1]
            new = [self.task_over(p.name, parent)]
            p.split.discard((old[0].input, parent))
            self.merge_count += 1
        for t in old:
            del p.home[t.id]
        for t in new:
            p.home[t.id] = t
        change = math.fsum(t.load for t in new) - math.fsum(t.load for t in old)
        p.load = max(p.load + change, 0.0)
        p.own_load = max(p.own_load + change, 0.0)
        p.machine.handle(TasksChanged(self.now_s))
        self._touch(self.index[p.name])
        if self.record:
            kind = "split" if isinstance(instruction, Split) else "merge"
            self.events.append(Event(self.rounds, self.now_s, kind, p.name, p.name, change, 0.0, len(new)))
        return 1

    def _end_movements(self) -> int:
        while self._pending and self._pending[0][0] <= self.now_s:
            _, mid = heapq.heappop(self._pending)
            m = self.movements.get(mid)
            if m is None:
                continue
            self._eligible.add(mid)
            for name in (m.origin, m.host):
                k = self.index[name]
                self._ready[k] = self._ready.get(k, 0) + 1
                self._recheck.add(k)
        changes = 0
        todo = sorted(self._recheck)
        self._recheck.clear()  # endings below may queue their participants for the next round
        for i in todo:
            p = self.participants[i]
            if p.failed:
                continue
            # As host it can only return what still runs here (not what it passed on).
            mine = [m for m in p.movements_out.values() if m.id in self._eligible]
            mine += [m for m in p.movements_in.values() if m.id in self._eligible and all(t in p.hosted for t in m.task_ids)]
            ends = p.machine.handle(EndsDue(self.now_s, p.load, p.cost, tuple(mine)))
            if self._held(p):
                self.waiting += 1
                self._recheck.add(i)  # its movements wait for it
            for mid in (e.movement.id for e in ends if isinstance(e, End)):
                if mid in self.movements:  # not already unwound by an earlier ending
                    changes += self._end(self.movements[mid], by=p.name)
        return changes

    def end_movement(self, movement_id: str, *, by: str) -> int:
        """End a movement now, whatever the decisions say (an origin's right to its tasks,
        a failure); tasks it carried that were passed on come back first. Returns the
        number of movements ended."""
        return self._end(self.movements[movement_id], by=by)

    def _end(self, m: Movement, *, by: str) -> int:
        """End `m`; tasks it carried that were passed on come back first. Returns the number ended."""
        ended = 0
        tasks = self._moved[m.id]
        for t in tasks:
            chain = self._carriers[t.id]
            while chain[-1] != m.id:
                ended += self._end(self.movements[chain[-1]], by=by)
        o = self.participants[self.index[m.origin]]
        h = self.participants[self.index[m.host]]
        self._book(m, self.now_s)
        del self.movements[m.id]
        del self._moved[m.id]
        del o.movements_out[m.id]
        del h.movements_in[m.id]
        if m.id in self._eligible:
            self._eligible.discard(m.id)
            for k in (self.index[m.origin], self.index[m.host]):
                self._ready[k] -= 1
        for t in tasks:
            self._carriers[t.id].pop()
            del h.hosted[t.id]
            if t.origin == o.name:
                o.home[t.id] = t
            else:
                o.hosted[t.id] = t
        o.load += m.load
        h.load = max(h.load - m.load, 0.0)
        for p in (o, h):
            p.machine.handle(TasksChanged(self.now_s))
        self._touch(self.index[m.origin])
        self._touch(self.index[m.host])
        self.ending_count += 1
        if self.record:
            self.events.append(Event(self.rounds, self.now_s, "end", m.origin, m.host, m.load, m.price, len(m.task_ids), by=by))
        return ended + 1

    def fail(self, name: str) -> int:
        """`name` fails now: it trades no more, its own tasks stop, and every origin of a task
        it hosted fails that task over as its HA machine decides; the movement from the
        origin that carried the task ends (with any other task it carried). Returns the
        number of tasks failed over."""
        f = self.participants[self.index[name]]
        f.failed = True
        self._status[name] = "failed"
        for t in f.home.values():
            f.own_load -= t.load
        f.home.clear()
        f.load = math.fsum(t.load for t in f.hosted.values())
        status = {p.name: "failed" if p.failed else "alive" for p in self.participants}
        hosted: dict[str, list[Task]] = {}
        for t in f.hosted.values():
            hosted.setdefault(t.origin, []).append(t)
        count = 0
        for origin, tasks in hosted.items():
            o = self.participants[self.index[origin]]
            if o.failed:
                continue
            # The origin sees each task as the registry would show it: hosted by `name`, moved under a movement that runs.
            seen: dict[str, tuple[Task, Movement]] = {}
            records, modes = [], {}
            for n, t in enumerate(tasks):
                m = self.movements[self._carriers[t.id][0]]
                record = {"id": n, "origin": origin, "host": name, "epoch": 0, "name": f"t{n}", "input_uri": ""}
                key = f"{origin}.t{n}"
                contract = next(c for c in o.contracts if c.id == m.contract_id)
                modes[key] = task_mode("none", movement_state="active", contract_mode=contract.ha_mode)
                records.append(record)
                seen[key] = (t, m)
            decided = o.machine.handle(Observed(now_s=self.now_s, tasks=tuple(records), replicas=(), failovers=(), modes=modes,
                                                status=status, partners=(), here=Here()))
            for instruction in decided:
                if not isinstance(instruction, FailOver) or instruction.to != origin:
                    continue
                t, m = seen[instruction.key]
                count += 1
                self.failover_count += 1
                if self.record:
                    self.events.append(Event(self.rounds, self.now_s, "failover", origin, name, t.load, 0.0, 1, by=t.id))
                if m.id in self.movements:
                    self._end(m, by="failover")
        return count

    def _book(self, m: Movement, until_s: float) -> None:
        amount = m.price * m.load * max(until_s - m.started_s, 0.0)
        self.participants[self.index[m.origin]].paid += amount
        self.participants[self.index[m.host]].earned += amount
