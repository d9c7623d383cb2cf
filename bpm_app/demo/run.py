"""The four phases of the Borealis load-management demonstration, on a live local federation.

1. Three participants with identical contracts and uneven load (A carries most tasks),
   every load below its threshold: acceptable.
2. A's load rises over its threshold (it starts more queries: what a query costs depends on
   the machine); it sheds load to B and C until the allocation is acceptable.
3. Load rises at B: it starts new queries until the federation is overloaded (its total load
   above the total of its thresholds): no allocation among A, B and C is acceptable.
4. D joins with a contract to C at 0.8 p; load flows B to C and C to D until acceptable.

Each participant, and the registry, is a host of its own (`spark_agents.hosts`): its own
address, CPU quota and storage, where the machine allows it.

D's agent starts with the others, without a contract: a JVM starting takes much of this
machine's CPU for a while, and loads measured then would be far off. D joins the
federation in phase 4, when it accepts C's proposal of the terms they agreed offline,
through the registry's API with its own key; until then no one trades with it.

Loads are measured by each agent on its Spark; the decisions are `bpm.negotiation`'s.
Each participant's stream and results are on its own broker, which its agent runs
(`bpm_app.demo.inputs`). At the end the input is closed, every task drains, and the
federation's alerts are compared with the plain computation over exactly what was fed to the
shares of the streams its tasks query: lost and duplicate results.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from bpm_app.demo.federation import Federation
from bpm.federation.views import AgreedTerms
from bpm.names import task_key
from bpm.negotiation import is_acceptable
from bpm_app.demo.inputs import BrokerInputs
from spark_agents.streams.feed import end_mark_us, end_watermark_ms
from bpm.zeek.definitions import QueryParams, ResultRow
from spark_agents.hosts import Hosts


@dataclass(frozen=True)
class Member:
    name: str
    shares: int  # equal shares of its input stream (a power of two)
    initial: int  # how many of them are its tasks from the start
    seed: int


MEMBERS = (
    # What a query costs varies from run to run (0.06 to 0.2 of a participant's capacity
    # measured here), so phases 2 and 3 start as many more as it takes, over shares that
    # have none yet; shares left without a query are no task's input.
    Member("a", 16, 3, 11),  # phase 2 starts queries over other shares until A is overloaded
    Member("b", 32, 1, 12),  # phase 3 starts queries over the other shares, as many as it takes (up to 31)
    Member("c", 4, 1, 13),
    Member("d", 0, 0, 14),
)
# The contracts agreed offline, at the reference price p times the factor: A, B and C with
# identical contracts; D with C only, cheaper (0.8 p). Each contract's range reaches down
# from its price (`DemoSettings.spread`).
CONTRACTS = {("a", "b"): 1.0, ("a", "c"): 1.0, ("b", "c"): 1.0, ("c", "d"): 0.8}
JOINS_LATER = "d"  # signs its contract in phase 4


@dataclass
class DemoSettings:
    """Knobs of the demo; with the defaults a run takes 5 to 10 minutes on a 2-core machine.

    Attributes:
        price: the reference price p: each agent's threshold is its load where its marginal
            cost is p, and a contract's range is [q(1 - spread), q] below its price q (p, and
            0.8 p for D's).
        spread: how far the ranges reach below the price. Tasks are lumpy: a participant just
            over its threshold sheds its last task only if that task's per-unit saving, about
            its marginal cost half a task lower, beats the contract's lowest price
            (docs/mechanism.md, "Where the mechanism falls short"), and a partner paid more
            than p would take load past its threshold. With the range below p and the
            agents' 10% margin (`margin`), a participant sheds down to where its marginal cost
            is about 0.55 q (1.1 x 0.5 q) and a partner takes load only up to where its cost
            is about 0.9 q. Tasks are large here (see `mm1_scale`): loads go up in steps of
            about 0.14 (0.29, 0.42, 0.55, 0.68 for one to four tasks), and the cost's
            per-unit steps between them are about 0.34, 0.54 and 0.97 of p. So a participant
            with four tasks (over its threshold of 0.63) sheds one to a partner with two or
            fewer, none sheds at three, and C passes load on to D (saving above 1.1 x 0.4 p)
            while it carries three tasks: in phase 4 load flows B to C and C to D.
        margin: what both sides demand on top of the price when offering and accepting load
            (`bpm agent run --margin`).
        mm1_scale: a in the agents' M/M/1 cost a*u/(1-u); the threshold at price p is
            1 - sqrt(a/p): 0.63 of the participant's CPUs. A query costs about 0.13 to 0.16
            of a 0.4-CPU participant (its fixed cost per batch dominates), and the idle agent
            and JVM 0.1 to 0.16: three queries fit under the threshold, four do not.
        warmup_s: how long an agent that starts with tasks of its own neither offers nor takes
            load (their first batches, JIT-compiled, cost several times the later ones).
        join_warmup_s: the same for an agent that joins without tasks (D): nothing to wait out
            but its own start.
        agent_settle_s: how long after a task starts or stops an agent waits before it
            trades again (`bpm agent run --settle`): one load window (15 s). A phase that
            waits for an acceptable allocation wants it to hold that long too.
        min_duration_s: the contracts' minimum movement duration. Longer than the demo: a
            contract is meant to outlast the load changes it absorbs, and a movement that
            ends brings a task back to where the load has since grown
            (tests/spark_agents/test_agent.py shows movements ending).
        rate: connections per second in each participant's traffic.
        phase_timeout_s: the longest a phase waits for an acceptable allocation. A partner
            paid on loads its origin measured while saturated finds them dearer once they
            run here, and may end over its threshold with its own partners full: the way out
            is a chain (C passes load on to D, then takes the partner's), about 30 s a step
            (an offer period, a handover, a settling time on each side), so a phase allows
            several steps.
        overload: phase 2 starts as many more of A's queries as it takes for them to add up to
            this multiple of A's threshold: what a query costs depends on the machine.
        fill: phase 3 starts queries at B until the loads of A, B and C, at rest, add up to this
            multiple of the sum of their thresholds: an overloaded federation, by about a query
            (their sum varies by a few hundredths from poll to poll), and room for the whole
            load once D joins.
        rest_s: after phase 3's first step, how long the demo waits at most for the agents to
            come to rest once every new query is measured, before it reads the loads anyway
            (`Demo._wait_rest`).
        cpus: each participant's capacity, a CPU quota of its own (`spark_agents.hosts`; needs
            root, else the participants share the machine's CPUs): what one participant does
            then cannot raise the load another measures. Four quotas of 0.4 leave a 2-core
            machine 0.4 CPU for the registry, the replayers and the demo itself. None: no quotas.
    """

    workdir: Path
    port: int = 8700
    agent_port: int = 9100
    window_s: int = 10
    lateness_s: int = 5
    min_connections: int = 20
    min_ports: int = 5
    trigger_s: float = 10.0
    period_s: float = 3.0
    tick_s: float = 1.0
    sample_s: float = 2.0
    price: float = 1.0
    spread: float = 0.5
    margin: float = 0.1
    min_duration_s: float = 1200.0
    mm1_scale: float = 0.14
    warmup_s: float = 30.0
    join_warmup_s: float = 15.0
    agent_settle_s: float = 15.0
    rate: float = 40.0
    sources: int = 150
    scanners: int = 3
    traffic_s: float = 1800.0
    speedup: float = 1.0
    settle_s: float = 20.0
    phase_timeout_s: float = 240.0
    poll_s: float = 2.0
    overload: float = 1.15
    fill: float = 1.05
    rest_s: float = 45.0
    cpus: float | None = 0.4
    network: bool = True


@dataclass
class Phase:
    name: str
    started_s: float
    ended_s: float = 0.0
    acceptable: bool = False
    loads: dict[str, float] = field(default_factory=dict)
    thresholds: dict[str, float] = field(default_factory=dict)

    @property
    def overloaded(self) -> bool:
        """Whether the participants' total load is above the total of their thresholds: no
        allocation among them can be acceptable."""
        return bool(self.loads) and sum(self.loads.values()) > sum(self.thresholds.values())

    def to_json(self) -> dict:
        return {
            "name": self.name,
            "acceptable": self.acceptable,
            "overloaded": self.overloaded,
            "started_s": round(self.started_s, 1),
            "ended_s": round(self.ended_s, 1),
            "loads": {k: round(v, 4) for k, v in self.loads.items()},
            "thresholds": {k: round(v, 4) for k, v in self.thresholds.items()},
        }


class Demo:
    """Runs the phases; `view` (if given) is called with the current state after every poll."""

    def __init__(self, settings: DemoSettings, view: Callable[[dict], None] | None = None, say: Callable[[str], None] = print) -> None:
        self.s = settings
        self.params = QueryParams(settings.window_s, settings.min_connections, settings.min_ports, settings.lateness_s)
        self.fed = Federation(settings.workdir, registry_port=settings.port)
        self.view = view
        self.say = say
        self.fed_logs: dict[str, Path] = {}
        self.phases: list[Phase] = []
        self.stage: str | None = None  # what the live view shows once the phases are over
        self.timeline: list[dict] = []
        self.t0 = time.time()
        self.state: dict = {}
        self._members = {m.name: m for m in MEMBERS}
        self._up_at: dict[str, float] = {}  # monotonic time each agent first answered
        self.inputs = BrokerInputs(settings.workdir)
        self._end_us: dict[str, int | None] = {}  # per participant, the end-of-input mark its replayer wrote

    # Setup

    def _contracts(self, member: Member) -> list[AgreedTerms]:
        """The terms `member` agreed offline."""
        s = self.s
        terms = []
        for pair, factor in CONTRACTS.items():
            if member.name in pair:
                partner = pair[1] if pair[0] == member.name else pair[0]
                price = factor * s.price
                terms.append(AgreedTerms(partner, price * (1 - s.spread), price, s.min_duration_s))
        return terms

    def _agent_options(self, member: Member, contracts: bool = True) -> list[str]:
        """`bpm agent run`'s options for `member`, its `--contract`s unless `contracts` is false."""
        s = self.s
        signed = [o for terms in self._contracts(member) for o in ("--contract", terms.spec())] if contracts else []
        return [*signed, "--reference-price", f"{s.price:g}", "--margin", f"{s.margin:g}",
            "--spark-master", "local[1]", "--window", str(s.window_s), "--lateness", str(s.lateness_s),
            "--min-connections", str(s.min_connections), "--min-ports", str(s.min_ports),
            "--trigger", str(s.trigger_s), "--period", str(s.period_s), "--tick", str(s.tick_s), "--sample", str(s.sample_s),
            "--cost-model", "mm1", "--mm1-scale", str(s.mm1_scale), "--warmup", str(self._warmup_s(member)), "--settle", str(s.agent_settle_s),
        ]

    def _join(self, member: Member, sign: bool = True) -> None:
        """Start the participant's agent in its host: it registers itself and, unless `sign` is
        false, signs the contracts it agreed offline (otherwise `_sign` does, later)."""
        host = self.fed.host(member.name, self.s.cpus)
        options, env = self.inputs.agent(member.name, host.address, member.shares)
        initial = ["--partitions", f"0-{member.initial - 1}"] if member.initial else []
        self.fed.start_agent(member.name, self.s.agent_port, [*options, *initial, *self._agent_options(member, contracts=sign)], env)

    def _sign(self, member: Member, timeout_s: float = 60.0) -> None:
        """`member` joins: it accepts, with its own key through the registry's API, the
        proposals of the contracts it agreed offline (its partners' agents proposed them
        once it registered)."""
        agreed = {t.partner: t for t in self._contracts(member)}
        deadline = time.monotonic() + timeout_s
        with self.fed.participant(member.name) as client:
            while agreed:
                for c in client.contracts(participant=member.name, state="proposed"):
                    terms = agreed.get(c["proposer"])
                    if terms is not None and c.get("awaiting") == member.name and terms.matches(c):
                        client.contract_action(c["id"], "accept")
                        self.say(f"  {member.name} accepts contract #{c['id']} with {terms.partner}: [{terms.price_min:g}, {terms.price_max:g}]")
                        del agreed[terms.partner]
                if not agreed:
                    return
                if time.monotonic() > deadline:
                    raise TimeoutError(f"no proposal from {', '.join(agreed)} to {member.name} after {timeout_s:.0f} s; see {self.s.workdir / 'logs'}")
                self.poll()
                time.sleep(self.s.poll_s)

    def _generate_input(self, member: Member) -> Callable[[], Path]:
        """Start `bpm generate-traffic` for the participant; the function returned waits for it."""
        s = self.s
        return self.fed.generate_traffic(member.name, s.traffic_s, s.rate, s.sources, s.scanners, member.seed)

    def _start_input(self, member: Member, generated: Callable[[], Path]) -> None:
        """`bpm replay` of the generated traffic into the participant's stream."""
        s = self.s
        target, env = self.inputs.replay(member.name)
        self.fed_logs[member.name] = self.fed.start_replay(member.name, generated(), target, env, s.window_s, s.lateness_s, s.speedup)

    # Observation

    def poll(self) -> dict:
        with self.fed.operator() as operator:
            participants = operator.participants()
            movements = operator.movements()
            ledger = operator.ledger()
        now = time.time() - self.t0
        for p in participants:
            if p["load"] is not None:
                self.timeline.append({"t": round(now, 2), "participant": p["name"], "load": p["load"], "threshold": p["threshold"]})
        self.state = {"t": now, "participants": participants, "movements": movements, "ledger": ledger, "phase": self.stage or (self.phases[-1].name if self.phases else "setup"),
                      "registry": self.fed.registry_url, "hosts": self.hosts_report()}
        if self.view:
            self.view(self.state)
        return self.state

    def _measured(self, state: dict, names: list[str]) -> tuple[dict[str, float], dict[str, float]]:
        loads, thresholds = {}, {}
        for p in state["participants"]:
            if p["name"] in names and p["load"] is not None and p["threshold"] is not None:
                loads[p["name"]], thresholds[p["name"]] = p["load"], p["threshold"]
        return loads, thresholds

    def _phase(self, name: str, names: list[str], *, until_acceptable: bool, hold_s: float, not_before: float = 0.0,
               action: Callable[[], None] | None = None) -> Phase:
        """Run `action` (what happens in the phase), then poll for at least `hold_s` and until
        `not_before` (monotonic); a phase `until_acceptable` then goes on until the allocation
        of `names` has stayed acceptable, with no new movement and no task in transit
        (`_in_transit`), for two of an agent's settling times (or the phase timeout, counted
        from then): the mechanism has come to rest, not only passed through an acceptable
        allocation between two movements."""
        phase = Phase(name, time.time() - self.t0)
        self.phases.append(phase)
        self.say(f"phase: {name}")
        if action is not None:
            action()
        held_until = max(time.monotonic() + hold_s, not_before)
        steady_s = self._steady_s()
        ok_since = None
        moved = None
        while True:
            state = self.poll()
            now = time.monotonic()
            loads, thresholds = self._measured(state, names)
            ok = len(loads) == len(names) and is_acceptable(list(loads.values()), list(thresholds.values()))
            ok_since = (ok_since or now) if ok and len(state["movements"]) == moved and not self._in_transit() else None
            moved = len(state["movements"])
            phase.loads, phase.thresholds, phase.acceptable = loads, thresholds, ok
            if now >= held_until and (not until_acceptable or (ok_since is not None and now - ok_since >= steady_s)):
                break
            if now >= held_until + self.s.phase_timeout_s:
                break
            time.sleep(self.s.poll_s)
        phase.ended_s = time.time() - self.t0
        verdict = "acceptable" if phase.acceptable else "overloaded" if phase.overloaded else "not acceptable"
        self.say(f"  {verdict}: loads {_fmt(phase.loads)} thresholds {_fmt(phase.thresholds)}")
        return phase

    def _steady_s(self) -> float:
        """How long an allocation must last, with no new movement, to count as where the
        mechanism came to rest: an agent's settling time after the last movement (or two
        offer periods) and two offer periods after it in which no one moved load."""
        return max(2 * self.s.period_s, self.s.agent_settle_s) + 2 * self.s.period_s

    def _raise_load(self, name: str, names: list[str], share: float, steps: int = 1) -> None:
        """`name` starts queries over its stream's shares that have none until the loads of the
        tasks of `names`, wherever they run, add up to `share` of the sum of their thresholds
        (a participant's load is the sum of its tasks': in phase 3 the loads of A, B and C
        then add up to `fill` times their thresholds). In at most `steps` steps: the first at
        once, as many as the missing load over what a query measures now (the median of the
        tasks running), rounded up; a later one only while the total is still within the
        thresholds, at what each query of the previous step turned out to add, and no less
        than half of what a query measures itself (a federation near its thresholds churns,
        and its total moves by a tenth from one reading to the next). Before a later step the
        total is read at rest (`_wait_rest`): once the agents have spread the new load,
        participants that keep up measure it, where a saturated one reports late, and high
        (the batches its starts slowed count as demand).

        How much load a query brings depends on the machine and varies from run to run, and
        measuring it puts the load where it is meant to be on a fast machine and a busy one
        alike. Steps decided on loads read before the new queries are measured and at rest
        stop short or overshoot: a new query's first batches cost more than its later ones,
        and the load a participant reports lags behind what it starts (one run's phase 3,
        three steps so decided, started 13 queries, took 290 s and left the loads of A, B and
        C at 1.33 times their thresholds, with no room for D). A query's own load overstates
        what one more adds (each agent splits what its processes use, their fixed part too,
        among its tasks), so a first step stops short rather than overshoots; and loads
        measured soon after the JVMs started can overstate them several times (one run's
        phase 2 started a single query and A never passed its threshold): a second step
        corrects both, at the price of a rest (phase 2 takes one step, phase 3 two)."""
        _, thresholds = self._measured(self.poll(), names)
        total, limit = sum(self._task_loads(names)), sum(thresholds.values())
        each = None
        for step in range(steps):
            missing = share * limit - total
            free = self._idle_tasks(name)
            # A later step only while the loads are still within the thresholds: the phase's point not made yet.
            if missing <= 0 or (each is not None and total > limit) or not free:
                return
            count = min(len(free), math.ceil(missing / each)) if each else self._queries_to_fill(names, share, len(free))
            self._start_queries(name, free[:count], f" (the loads add up to {total:.2f} of {share * limit:.2f})")
            if step == steps - 1:
                return
            before, (total, limit) = total, self._wait_rest(names)
            own = [load for load in self._task_loads(names) if load]
            each = max((total - before) / count, statistics.median(own) / 2 if own else 0.02)

    def _wait_rest(self, names: list[str]) -> tuple[float, float]:
        """Poll until every task of `names` has a measured load, and then until no movement has
        started and no task has been in transit for `_steady_s`, or for at most `rest_s`
        more; the sum of the loads of the tasks of `names` (the median over the polls of the
        last `_steady_s`, or since the last movement) and of their thresholds.

        A saturated participant may go on shedding for minutes, one task after another as
        its partners make room; the total moves little meanwhile (a task's load counts where
        it last ran until its new host measures it)."""
        deadline = time.monotonic() + self.s.phase_timeout_s
        measured_at = None
        state = self.poll()
        count, since, totals = len(state["movements"]), time.monotonic(), []
        while True:
            now = time.monotonic()
            _, thresholds = self._measured(state, names)
            loads = self._task_loads(names)
            if measured_at is None and all(loads):
                measured_at = now
            if measured_at is not None:
                totals.append((now, sum(loads)))
            steady = now - since >= self._steady_s()
            if now >= deadline or (measured_at is not None and (steady or now - measured_at >= self.s.rest_s)):
                recent = [total for at, total in totals if at >= now - self._steady_s()] or [sum(loads)]
                return statistics.median(recent), sum(thresholds.values())
            time.sleep(self.s.poll_s)
            state = self.poll()
            if len(state["movements"]) != count or self._in_transit():
                count, since = len(state["movements"]), time.monotonic()

    def _in_transit(self) -> set[str]:
        """The tasks the registry places at a live participant that does not run them (yet):
        between an accepted offer and the start at the new host (the old host stops it at a
        batch boundary, the new one fetches the checkpoint), a task's load counts nowhere."""
        with self.fed.operator() as operator:
            alive = {p["name"] for p in operator.participants() if p["status"] == "alive"}
            placed = {(t["host"], task_key(t)) for t in operator.tasks() if t["host"] in alive}
        running = self._running()
        return {key for host, key in placed if key not in running.get(host, {})}

    def _running(self) -> dict[str, dict[str, dict]]:
        """Per participant, the tasks its agent last reported running (its `/status`), by key."""
        running: dict[str, dict[str, dict]] = {}
        for name, endpoint in self.fed.endpoints.items():
            try:
                status = httpx.get(endpoint + "/status", timeout=10).json()
            except (httpx.HTTPError, ValueError):
                continue
            tasks = status.get("last_report", {}).get("details", {}).get("host", {}).get("tasks", [])
            running[name] = {t["task_id"]: t for t in tasks if t.get("state") == "running"}
        return running

    def _start_queries(self, name: str, tasks: list[str], why: str = "") -> None:
        """`name` starts a query over each of `tasks` (its stream's shares); wait until each is measured."""
        if not tasks:
            return
        for task in tasks:
            self._add_query(name, task)
        self.say(f"  {name} starts queries {', '.join(tasks)}{why}")
        timeout_s = 60 + 10 * len(tasks)
        if not self._wait_tasks_measured(name, {f"{name}.{task}" for task in tasks}, timeout_s):
            self.say(f"  {name}'s new queries are not all measured after {timeout_s} s (its load window waits for its tasks to stop changing); going on")

    def _idle_tasks(self, name: str) -> list[str]:
        """The tasks over `name`'s stream shares that no task of its processes yet."""
        with self.fed.operator() as operator:
            known = {task_key(t) for t in operator.tasks(origin=name)}
        return [task for task in self.inputs.tasks(self._members[name].shares) if f"{name}.{task}" not in known]

    def _queries_to_fill(self, names: list[str], share: float, most: int) -> int:
        """How many more queries take the tasks of `names` to `share` of their thresholds (see `_raise_load`), at most `most`."""
        _, thresholds = self._measured(self.poll(), names)
        target = share * sum(thresholds.values()) if len(thresholds) == len(names) else None
        loads = self._task_loads(names)
        return queries_to_add(target, loads, [load for load in loads if load], most)

    def _task_loads(self, names: list[str]) -> list[float]:
        """The loads of the tasks of `names`, wherever they run (0 where not measured yet)."""
        with self.fed.operator() as operator:
            return [t["load"] or 0.0 for t in operator.tasks() if t["origin"] in names]

    def _wait_tasks_measured(self, name: str, tasks: set[str], timeout_s: float) -> bool:
        """Wait until each of `tasks` (of `name`'s) has a measured load: its start-up is over
        (its agent starts them one at a time, `TaskHost.starting`)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self.poll()
            with self.fed.operator() as operator:
                if tasks <= {task_key(t) for t in operator.tasks(origin=name) if t["load"]}:
                    return True
            time.sleep(self.s.poll_s)
        return False

    def _warmup_s(self, member: Member) -> float:
        return self.s.warmup_s if member.initial else self.s.join_warmup_s

    def _trading_from(self, names: list[str]) -> float:
        """When (monotonic) every one of `names` is past its warm-up and may offer or take load."""
        return max(self._up_at[n] + self._warmup_s(self._members[n]) for n in names)

    def _wait_measured(self, names: list[str], timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            loads, _ = self._measured(self.poll(), names)
            if len(loads) == len(names) and all(v > 0 for v in loads.values()):
                return
            time.sleep(self.s.poll_s)
        raise TimeoutError(f"no measured load from {names} after {timeout_s:.0f} s; see {self.s.workdir / 'logs'}")

    # The run

    def run(self) -> dict:
        s = self.s
        try:
            self._open_hosts()
            self.fed.start_registry()
            self.say(f"registry on {self.fed.registry_url} (admin UI at {self.fed.registry_url}/, operator key {self.fed.admin_key})")
            self._setup_first(list(MEMBERS), measured=["a", "b", "c"], unsigned={JOINS_LATER})
            self._phase("1 uneven load: A carries most tasks, every load below its threshold", ["a", "b", "c"], until_acceptable=True,
                        hold_s=s.settle_s, not_before=self._trading_from(["a", "b", "c"]))
            self._phase("2 A's load rises over its threshold: it sheds load to B and C", ["a", "b", "c"], until_acceptable=True,
                        hold_s=s.settle_s, action=lambda: self._raise_load("a", ["a"], s.overload))
            self._phase("3 load rises at B until the federation is overloaded", ["a", "b", "c"], until_acceptable=False, hold_s=s.settle_s,
                        action=lambda: self._raise_load("b", ["a", "b", "c"], s.fill, steps=2))
            self._phase("4 D joins (contract with C at 0.8 p): load flows B to C and C to D", ["a", "b", "c", "d"], until_acceptable=True,
                        hold_s=s.settle_s, action=lambda: self._sign(self._members[JOINS_LATER]))
            return self._finish()
        finally:
            self.fed.close()

    def _open_hosts(self) -> None:
        """A host for each participant and the registry, with a network namespace and a CPU
        quota of `cpus` for each participant, where this machine and user allow them
        (`Federation.close` removes them); otherwise loopback addresses and the machine's CPUs."""
        self.fed.hosts = Hosts.open("demo", self.s.workdir / "hosts", cpus=bool(self.s.cpus), network=self.s.network, say=self.say)
        if self.fed.hosts.net is not None:
            self.say(f"each participant is a host of its own on {self.fed.hosts.net.subnet} (bridge {self.fed.hosts.net.bridge})")
        if self.fed.hosts.cpu is not None:
            self.say(f"each participant runs under a CPU quota of {self.s.cpus:g} CPU ({self.fed.hosts.cpu.parent})")

    def hosts_report(self) -> dict:
        """Per participant: its address, its CPUs (its quota), and whether it had CPU and network of its own."""
        return {name: host.report() for name, host in self.fed.hosts.hosts.items() if name in self._members}

    def _task_params(self) -> dict:
        return {**self.params.to_dict(), "trigger_s": self.s.trigger_s}

    def _setup_first(self, members: list[Member], measured: list[str] | None = None, unsigned: Collection[str] = ()) -> None:
        """Start the members' agents (those in `unsigned` without their contracts) and, while
        their JVMs start, generate their traffic; then replay it into their streams; wait until
        `measured` (default: all) report load."""
        for m in members:
            self._join(m, sign=m.name not in unsigned)
        traffic = {m.name: self._generate_input(m) for m in members if m.shares}
        for m in members:
            self.fed.wait_agent(m.name, on_wait=self.poll)  # the view and the timeline go on while the JVMs start
            self._up_at[m.name] = time.monotonic()
        for m in members:
            if m.shares:
                self._start_input(m, traffic[m.name])
        self.say("agents up; input flowing")
        self._wait_measured(measured or [m.name for m in members], 180)

    # Drain and compare

    def _finish(self) -> dict:
        self.say("closing the input and draining every task")
        self.stage = "draining: the input is closed, every task completes its last batch (phase 4 is over)"
        for name in self.fed_logs:
            self.fed.stop_replay(name)
        queried = {name: self._queried_tasks(name) for name in self.fed_logs}
        logs = {name: self._queried_input(name, log, queried[name]) for name, log in self.fed_logs.items()}
        self._drain(queried, timeout_s=180)
        state = self.poll()
        outputs = {name: self.inputs.outputs(name, tasks) for name, tasks in queried.items()}  # while the brokers run
        self.say("stopping the federation")
        self.fed.close()
        expected = self._reference(logs)
        lost = duplicate = 0
        output_rows = 0
        for name, rows in expected.items():
            out = outputs[name]
            lost += len(out.lost(rows))
            duplicate += len(out.duplicates)
            output_rows += len(out.rows)
        ledger = state["ledger"]
        return {
            "phases": [p.to_json() for p in self.phases],
            "movements": state["movements"],
            "payments": {"balances": ledger["balances"], "total_paid": sum(b["paid"] for b in ledger["balances"]), "total_earned": sum(b["earned"] for b in ledger["balances"])},
            "expected_results": sum(len(r) for r in expected.values()),
            "output_results": output_rows,
            "lost_results": lost,
            "duplicate_results": duplicate,
            "fed_connections": {name: _connections(log) for name, log in self.fed_logs.items()},
            "queried_connections": {name: _connections(log) for name, log in logs.items()},
            "queried_tasks": queried,
            "timeline": self.timeline,
            "hosts": self.hosts_report(),
            "elapsed_s": round(time.time() - self.t0, 1),
            "workdir": str(self.s.workdir),
        }

    def _queried_tasks(self, name: str) -> list[str]:
        """The tasks over `name`'s stream shares that its processes have started (from their start)."""
        idle = set(self._idle_tasks(name))
        return [task for task in self.inputs.tasks(self._members[name].shares) if task not in idle]

    def _queried_input(self, name: str, fed: Path, tasks: list[str]) -> Path:
        """What `name`'s tasks were fed: the connections of the fed log (after the lateness rule
        the stream applied to all of it) that fall in the shares of `tasks`, as a Zeek log beside
        it; and the end-of-input mark the replayer wrote after the newest of them all. Phases 1
        and 3 leave some shares without a query; their rows are no task's input."""
        from bpm.zeek.conn import read_logs, write_tsv
        from bpm.zeek.definitions import Admission, admitted, source_prefix

        selects = self.inputs.selects(tasks)
        admission = Admission(self.s.lateness_s)
        out = fed.with_name(f"{name}.queried.log")
        with out.open("w", encoding="utf-8") as handle:
            write_tsv((c for c in admitted(read_logs([fed]), admission) if selects(source_prefix(c.orig_h))), handle)
        newest = admission.newest_us
        self._end_us[name] = None if newest is None else end_mark_us(newest, self.params)
        return out

    def _add_query(self, name: str, task: str) -> None:
        """A new task of `name`'s: the query over its stream's share `task`."""
        self.fed.add_task(name, task, self.inputs.input_uri(name, task), self._task_params())

    def _drain(self, queried: dict[str, list[str]], timeout_s: float) -> None:
        """Wait until every task, where it runs now, has completed a batch with the watermark
        that the end mark of its closed stream brings: that batch emits the last windows.
        A task moved after it has drained shows the same watermark in its handed-over checkpoint."""
        needed = {}
        for name, tasks in queried.items():
            end_us = self._end_us.get(name)
            for task in tasks:
                needed[f"{name}.{task}"] = end_watermark_ms(end_us, self.params) if end_us is not None else None
        deadline, done = time.monotonic() + timeout_s, set()
        while time.monotonic() < deadline:
            done = set()
            for tasks in self._running().values():
                for key, t in tasks.items():
                    want = needed.get(key)
                    if want is not None and (t.get("watermark_ms") or 0) >= want:
                        done.add(key)
            if done >= set(needed):
                return
            self.poll()
            time.sleep(self.s.poll_s)
        self.say(f"tasks {', '.join(sorted(set(needed) - done))} had not drained after {timeout_s:.0f} s; results compared as they are")

    def _reference(self, logs: dict[str, Path]) -> dict[str, list[ResultRow]]:
        """The plain computation (`bpm.zeek.reference`, the query's definitions without Spark)
        over exactly what each participant's queried shares were fed."""
        from bpm.zeek.conn import read_logs
        from bpm.zeek.reference import compute

        self.say("reference: the plain computation over what each participant's queried shares were fed")
        return {name: compute(read_logs([log]), self.params) for name, log in logs.items()}


def queries_to_add(target: float | None, loads: list[float], query_loads: list[float], most: int) -> int:
    """How many more queries take tasks with `loads` to `target` in all, a query bringing the
    median of `query_loads` (the loads its kind measures now): rounded up, so the target is
    passed by less than one query, and at most `most`. One when the target (None) or the
    queries are not measured yet; none when the target is reached."""
    if target is None:
        return 1
    missing = target - sum(loads)
    if missing <= 0:
        return 0
    if not query_loads:
        return 1
    return min(most, math.ceil(missing / statistics.median(query_loads)))


def _connections(log: Path) -> int:
    return sum(1 for line in log.open() if not line.startswith("#"))


def _fmt(values: dict[str, float]) -> str:
    return ", ".join(f"{k}={v:.2f}" for k, v in sorted(values.items()))
