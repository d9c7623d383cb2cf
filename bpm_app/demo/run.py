"""The four phases of the Borealis load-management demonstration, on a live local federation.

1. Three participants with identical contracts and uneven load (A carries most tasks),
   every load below its threshold: acceptable.
2. A's load rises over its threshold (more of its traffic is fed: tasks of its that had no
   input get some); it sheds load to B and C until the allocation is acceptable.
3. Load rises at B the same way until the federation is overloaded (its total load above
   the total of its thresholds): no allocation among A, B and C has every load within its
   threshold.
4. D joins with a contract to C at 0.8 p; load flows B to C and C to D until acceptable.

Every task starts while the JVMs warm up, before phase 1: starting a query is what takes a
participant's time (its Python planner, its first batch), and a participant's load cannot
be measured while its tasks change. A task whose share of the stream is not fed yet runs no
micro-batch (`spark_agents.broker.source`) and costs next to nothing; a phase raises a
participant's load by feeding more of its traffic (`bpm replay --feed-from-stdin`).

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
from collections.abc import Callable, Collection, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import httpx

from bpm_app.demo.federation import Federation
from bpm.federation.views import AgreedTerms, ending, key_groups, regrains
from bpm.names import task_key
from bpm.negotiation import is_acceptable
from bpm_app.demo.inputs import BrokerInputs
from bpm_app.demo.outcomes import JOINS, POSTER, to_joiner, verdict
from spark_agents.streams.feed import write_end
from bpm.records import Records, end_watermark_ms
from bpm.results import Result
from bpm_app.demo.queries import MONITORING, DemoQuery
from spark_agents.hosts import CpuMeter, Hosts
from bpm.load import default_load_window_s, default_warmup_s


@dataclass(frozen=True)
class Member:
    """A participant of the demo.

    Attributes:
        shares: equal shares of its input stream (a power of two), each a task's input.
        initial: how many of them are fed from the start (the first ones).
        seed: its traffic's.
        spare: how many shares after those have a task from the start, fed only when a phase
            raises the participant's load: its tasks then have input, and cost their fixed
            share of a micro-batch each trigger (`Feeding`). A task over a share not fed
            runs no micro-batch and is not offered. Starting tasks is what takes a
            participant's time (each launches its query and the query's Python planner), so
            they all start while the JVMs warm up, not while a phase is measured.
    """

    name: str
    shares: int
    initial: int
    seed: int
    spare: int = 0

    @property
    def tasks(self) -> int:
        """How many tasks it starts with: one per share fed from the start or spare."""
        return self.initial + self.spare


MEMBERS = (
    # What a query costs varies from run to run and from machine to machine, so phases 2 and 3
    # feed as many more shares as it takes; shares never fed are no task's input.
    # A starts with one share fed, and phase 1 feeds as many more as keep it below where it
    # sheds (`DemoSettings.uneven`): on a machine where a task costs a third of a participant,
    # two such tasks and its idle ones would start A over its threshold, with tasks too large
    # for its partners' room (docs/benchmarks.md, "Test suite").
    Member("a", 16, 1, 11, spare=9),  # phase 2 feeds more of A's shares until A is overloaded
    # Phase 3 feeds more of B's shares, as many as it takes: on a machine whose tasks cost
    # little, twelve fall short of an overloaded federation (docs/benchmarks.md, "Demo runs").
    Member("b", 32, 1, 12, spare=16),
    Member("c", 4, 1, 13),
    Member("d", 0, 0, 14),
)
# The contracts agreed offline, at the reference price p times the factor: A, B and C with
# identical contracts; D with C only, cheaper (0.8 p). Each contract's range reaches down
# from its price (`DemoSettings.spread`).
CONTRACTS = {("a", "b"): 1.0, ("a", "c"): 1.0, ("b", "c"): 1.0, ("c", "d"): 0.8}
FEED_STEP = 2  # shares a `Feeding` feeds at most at one poll while far short of its target
SHARED_SEED = 1  # of the addresses of the scanners that probe every participant (`DemoSettings.shared_scanners`)


@dataclass
class DemoSettings:
    """Knobs of the demo; with the defaults thirteen runs took 7.1 to 12.5 minutes on a
    2-core machine, twelve under 10 with every phase as meant, the last ten in a row, and on
    a day the machine ran the tasks slower five took 8.9 to 13.1, two as meant
    (docs/benchmarks.md, "Demo runs").

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
            is about 0.9 q: with the threshold at 0.63 (`mm1_scale`), a participant sheds to
            A, B or C while over about 0.5 and a partner takes load while under about 0.61; C
            passes load on to D (saving above 1.1 x 0.4 p) while over about 0.44 and D takes
            it while under about 0.57. So the federation holds about 2.4 in all once D has
            joined, against the 1.89 its first three thresholds add up to; in phase 4 load
            flows B to C and C to D.
        margin: what both sides demand on top of the price when offering and accepting load
            (`bpm agent run --margin`).
        mm1_scale: a in the agents' M/M/1 cost a*u/(1-u); the threshold at price p is
            1 - sqrt(a/p): 0.63 of the participant's CPUs. A task with input costs about 0.06
            to 0.15 of a 0.4-CPU participant (its fixed cost per batch dominates; more on a
            busier participant), and the idle agent and JVM about 0.1. A lower threshold
            (0.5) was tried: the federation then holds about 1.85 once D has joined against
            1.5 for the first three, a margin of three tasks, and phase 3 passed it.
        warmup_spare_s: how much longer than the agent's own warm-up for its trigger
            (`bpm.load.default_warmup_s`: a load window past a task's start-up) an agent that
            starts with tasks of its own neither offers nor takes load, after its start and after
            the last of its tasks that started meanwhile (their first batches, JIT-compiled,
            cost several times the later ones); with a shorter warm-up, A shed before phase 1
            on a machine slow to start its tasks (docs/demo.md).
        join_warmup_s: the same for an agent that joins without tasks (D): nothing to wait out
            but its own start.
        join_prime_s: how long such an agent first runs its queries over made-up records
            (`bpm agent run --prime`, at least three batches), so that its first tasks do not
            pay its JVM's warm-up: unprimed, D used its whole quota for the 25 s after its
            first two tasks came, which had used a fifth of it at C. A driver's first query
            costs about 9 CPU seconds in its first 10 s, a later one 2; three batches of
            priming bring the first to 2.2 (`bpm bench first-queries`, docs/benchmarks.md).
        agent_settle_s: how long after a task starts or stops an agent waits before it
            trades again (`bpm agent run --settle`): half its load window (30 s at the
            10 s trigger), after which a stop has left a window of the tasks that stayed.
            A phase that waits for an acceptable allocation wants it to hold that long too.
        min_duration_s: the contracts' minimum movement duration. Longer than the demo: a
            contract is meant to outlast the load changes it absorbs, and a movement that
            ends brings a task back to where the load has since grown
            (tests/spark_agents/test_agent.py shows movements ending).
        rate: connections per second in each participant's traffic.
        phase_timeout_s: the longest a phase waits for its allocation, not counting up to as
            long again while a fault is underway (`Demo._faults_underway`). A partner
            paid on loads its origin measured while saturated finds them dearer once they
            run here, and may end over its threshold with its own partners full: the way out
            is a chain (C passes load on to D, then takes the partner's), about 30 s a step
            (an offer period, a handover, a settling time on each side), so a phase allows
            several steps.
        uneven: phase 1 feeds more of A's shares while A's tasks stay below this multiple of
            A's threshold (`Feeding` with `below`): an uneven load that A holds without
            shedding (it sheds from about 0.5 of its capacity, `spread`), whatever a task costs
            on the machine: on a fast one, a few tasks; where a task costs a third of a
            participant, its first alone.
        overload: phase 2 feeds more of A's tasks until A's tasks add up to this multiple of
            A's threshold (`Feeding`): what a task costs depends on the machine.
        fill: phase 3 feeds B's tasks until the loads of A's, B's and C's tasks add up to this
            multiple of the sum of their thresholds: an overloaded federation, and room for the
            whole load once D joins. The loads go on rising for a while after the last share
            is fed (a saturated participant's most), so more leaves phase 4 too much to pack;
            with less, the participants' own loads, which the verdict reads, may stay just
            short of overloaded. With a saturated participant fed no more (`FEED_CEILING`),
            1.05 (docs/benchmarks.md, "Demo runs").
        cpus: each participant's capacity, a CPU quota of its own (`spark_agents.hosts`; needs
            root, else the participants share the machine's CPUs): what one participant does
            then cannot raise the load another measures. Four quotas of 0.4 leave a 2-core
            machine 0.4 CPU for the registry, the replayers and the demo itself. None: no quotas.
        boot_cpus: each host's quota while its JVM and its tasks start, before phase 1, and
            while its tasks drain once phase 4 is over (None: `cpus` throughout). A
            participant's agent measures its load against `cpus` throughout, and its host's
            quota is set to `cpus` once every one of its tasks runs, before its warm-up is over:
            from then on, through every phase, its quota is its capacity. Starting a query is
            CPU-bound: under its capacity's quota a participant with many tasks would take
            minutes to start them while the machine's CPUs are half idle. So is the drain,
            where every task closes its last windows at once, and the participant with most
            tasks would hold the others up (docs/benchmarks.md, "Demo runs"). Once the input is
            closed no task moves (`bpm.agent.machine.InputEnded`) and no phase is read.
        network: each participant a network namespace of its own (else loopback addresses).
        correlate: the agents share their alerts and correlate them with their partners'
            (`bpm agent run --correlate`), with `availability_bound_s` as the bound.
        shared_scanners: scanners that probe every participant (`bpm generate-traffic
            --shared-scanners`, one shared seed): sources the correlation finds at several.
    """

    workdir: Path
    port: int = 8700
    agent_port: int = 9100
    trigger_s: float = 10.0
    period_s: float = 3.0
    tick_s: float = 1.0
    sample_s: float = 2.0
    price: float = 1.0
    spread: float = 0.5
    margin: float = 0.1
    min_duration_s: float = 1200.0
    mm1_scale: float = 0.14
    warmup_spare_s: float = 10.0
    join_warmup_s: float = 15.0
    join_prime_s: float = 10.0
    agent_settle_s: float = 15.0
    rate: float = 40.0
    sources: int = 150
    scanners: int = 3
    traffic_s: float = 1800.0
    speedup: float = 1.0
    settle_s: float = 20.0
    phase_timeout_s: float = 240.0
    poll_s: float = 2.0
    uneven: float = 0.5
    overload: float = 1.15
    fill: float = 1.05
    cpus: float | None = 0.4
    boot_cpus: float | None = 0.8
    network: bool = True
    correlate: bool = False
    availability_bound_s: float = 10.0
    shared_scanners: int = 0
    queries: dict[str, str] = field(default_factory=dict)


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
        allocation among them can have every load within its threshold."""
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
    """Runs the phases; `view` (if given) is called with the current state after every poll.

    Attributes:
        pairs: the contracts agreed offline (`CONTRACTS`; a scenario has its own).
    """

    pairs = CONTRACTS
    members = MEMBERS  # a scenario's participants: its own, in each scenario

    def __init__(self, settings: DemoSettings, view: Callable[[dict], None] | None = None, say: Callable[[str], None] = print) -> None:
        self.s = settings
        self.queries = {ref: DemoQuery.load(ref) for ref in {MONITORING, *settings.queries.values()}}
        self.fed = Federation(settings.workdir, registry_port=settings.port)
        self.view = view
        self.say = say
        self.fed_logs: dict[str, Path] = {}
        self.phases: list[Phase] = []
        self.stage: str | None = None  # what the live view shows once the phases are over
        self.timeline: list[dict] = []
        self.cpu: list[dict] = []  # per poll, how busy the machine and the hosts' quotas were since the last (`CpuMeter`)
        self._meter: CpuMeter | None = None
        self.t0 = time.time()
        self.state: dict = {}
        self._members = {m.name: m for m in self.members}
        self._warm: set[str] = set()  # the agents past their warm-up, as their /status last said (`_running`)
        self.inputs = BrokerInputs(settings.workdir, self.fed.broker_certificate_file, lambda name: self.fed.peers.broker_tls(name))
        self.fed_tasks: dict[str, list[str]] = {}  # per participant, its tasks whose shares are fed, in the order fed
        self._end_us: dict[str, int | None] = {}  # per participant, the end-of-input mark its replayer wrote
        self._regrained_at: dict[tuple[int, ...], float] = {}  # the tasks a split or merge made -> when first seen
        self.unreachable: set[str] = set()  # participants whose host a fault made unreachable (`bpm_app.demo.faults`): asked briefly

    # Setup

    def _query(self, name: str) -> DemoQuery:
        """The query participant `name` runs (`DemoSettings.queries`; the network-monitoring query by default)."""
        return self.queries[self.s.queries.get(name, MONITORING)]

    def _contracts(self, member: Member) -> list[AgreedTerms]:
        """The terms `member` agreed offline."""
        s = self.s
        terms = []
        for pair, factor in self.pairs.items():
            if member.name in pair:
                partner = pair[1] if pair[0] == member.name else pair[0]
                price = factor * s.price
                terms.append(AgreedTerms(partner, price * (1 - s.spread), price, s.min_duration_s))
        return terms

    def _agent_settings(self, member: Member, contracts: bool = True) -> dict[str, object]:
        """`bpm agent run`'s settings for `member` (`spark_agents.settings.AgentSettings`), its
        contracts unless `contracts` is false: what it is told besides its input and place."""
        s = self.s
        signed = {"contract": [terms.spec() for terms in self._contracts(member)]} if contracts else {}
        return {**signed, "reference_price": s.price, "margin": s.margin,
                "spark_master": "local[1]", **self._query_settings(member),
                "trigger": s.trigger_s, "period": s.period_s, "tick": s.tick_s, "sample": s.sample_s,
                "cost_model": "mm1", "mm1_scale": s.mm1_scale, "warmup": self._warmup_s(member), "settle": s.agent_settle_s,
                **({} if member.tasks else {"prime": s.join_prime_s}),
                **({"correlate": True, "availability_bound": s.availability_bound_s} if s.correlate and member.shares else {}),
                }

    def _query_settings(self, member: Member) -> dict[str, object]:
        """The agent's query and its parameters, and the others of the run, which it hosts for its partners."""
        own = self._query(member.name)
        others = sorted(set(self.queries) - {own.reference})
        return {"query": own.reference, "param": own.param_args(), **({"can_run": others} if self.s.queries else {})}

    def _join(self, member: Member, sign: bool = True) -> None:
        """Start the participant's agent in its host: it registers itself and, unless `sign` is
        false, signs the contracts it agreed offline (otherwise `_sign` does, later)."""
        s = self.s
        host = self.fed.host(member.name, s.boot_cpus if s.cpus and s.boot_cpus else self._cpus(member))
        inputs, env = self.inputs.agent(member.name, host.address, member.shares)
        initial = {"partitions": f"0-{member.tasks - 1}"} if member.tasks else {}
        capacity = {"cpus": self._cpus(member)} if host.cpus is not None else {}  # not its boot quota (`DemoSettings.boot_cpus`)
        self.fed.start_agent(member.name, s.agent_port, {**inputs, **initial, **capacity, **self._agent_settings(member, contracts=sign)}, env)

    def _sign(self, member: Member, partners: Collection[str] | None = None, timeout_s: float = 60.0) -> None:
        """`member` joins: it accepts, with its own key through the registry's API, the
        proposals of the contracts it agreed offline (with `partners` only, if given; its
        partners' agents proposed them once it registered)."""
        agreed = {t.partner: t for t in self._contracts(member) if partners is None or t.partner in partners}
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
        """Start `bpm generate-traffic` for the participant; the function returned waits for it.
        A participant of another query gets its module's generated records, when it is called."""
        s = self.s
        query = self._query(member.name)
        if not query.zeek:
            path = self.fed.hosts.hosts[member.name].folder / "traffic" / f"{member.name}.jsonl"
            return lambda: query.generate(path, s.traffic_s, s.rate, member.seed)
        return self.fed.generate_traffic(member.name, s.traffic_s, s.rate, s.sources, s.scanners, member.seed,
                                         shared_scanners=s.shared_scanners, shared_seed=SHARED_SEED)

    def _start_input(self, member: Member, generated: Callable[[], Path]) -> None:
        """`bpm replay` of the generated traffic into the participant's stream, feeding its first `initial` shares."""
        s = self.s
        target, env = self.inputs.replay(member.name)
        self.fed_tasks[member.name] = self.inputs.tasks(member.shares)[:member.initial]
        query = self._query(member.name)
        self.fed_logs[member.name] = self.fed.start_replay(member.name, generated(), target, env, query, s.speedup,
                                                           feed=[task[1:] for task in self.fed_tasks[member.name]],
                                                           host=self._replay_host(member), amplify=self._amplify(member))

    def _amplify(self, member: Member) -> int:
        """How many times the participant's replayer feeds each generated connection (from
        distinct sources): heavy traffic without generating every connection."""
        return 1

    def _replay_host(self, member: Member) -> str:
        """Where the participant's traffic is replayed from: its own host (a few connections a
        second cost it little)."""
        return member.name

    # Observation

    def poll(self) -> dict:
        with self.fed.operator() as operator:
            participants = operator.participants()
            movements = operator.movements()
            ledger = operator.ledger()
            tasks = operator.tasks()
            failovers = operator.failovers()
            replicas = operator.replicas()
        now = time.time() - self.t0
        for p in participants:
            if p["load"] is not None:
                self.timeline.append({"t": round(now, 2), "participant": p["name"], "load": p["load"], "threshold": p["threshold"]})
        if self._meter is None:
            self._meter = CpuMeter(self.fed.hosts.cpu if self.fed.hosts is not None else None)
        else:
            self.cpu.append({"t": round(now, 2), **self._meter.sample()})
        # Splits and merges as the registry's lineage has them, each at the poll that first saw it.
        made = regrains(tasks)
        for r in made:
            self._regrained_at.setdefault(tuple(r["ids"]), round(now, 2))
        self.state = {"t": now, "participants": participants, "movements": movements, "ledger": ledger, "phase": self.stage or (self.phases[-1].name if self.phases else "setup"),
                      "registry": self.fed.registry_url, "hosts": self.hosts_report(), "tasks": tasks,
                      "failovers": failovers, "replicas": replicas,
                      "regrains": [{**r, "t": self._regrained_at[tuple(r["ids"])]} for r in made]}
        if self.view:
            self.view(self.state)
        return self.state

    def _measured(self, state: dict, names: list[str]) -> tuple[dict[str, float], dict[str, float]]:
        loads, thresholds = {}, {}
        for p in state["participants"]:
            if p["name"] in names and p["load"] is not None and p["threshold"] is not None:
                loads[p["name"]], thresholds[p["name"]] = p["load"], p["threshold"]
        return loads, thresholds

    def _phase(self, name: str, names: list[str], *, until: str | None = "acceptable", hold_s: float, warm: Collection[str] = (),
               action: Callable[[], None] | None = None, feeding: Feeding | None = None,
               after: Callable[[dict], bool] | None = None) -> Phase:
        """Run `action` (what happens in the phase), then poll for at least `hold_s` and until
        the agents of `warm` are past their warm-up (`_past_warm_up`), and then until the
        allocation of `names` has stayed `until` ("acceptable" or "overloaded"; None: any
        allocation) for `_steady_s` (or the phase timeout, counted from then), read on the
        polls when every task runs somewhere (none in transit, `_in_transit`): it held, not
        only passed by between two movements. The mechanism may go on trading within it (a
        participant whose marginal cost is above a partner's price gains by shedding,
        acceptable or not). With `feeding`, each poll first lets it feed more traffic, and
        the goal counts only once its target is reached; with `after`, only once `after(state)`
        holds (what the phase is for has happened: in phase 4, load of A, B or C reached D,
        which an allocation already acceptable when D joins would not wait for); with neither
        `until` nor `feeding`, the phase ends once `hold_s` has passed and the agents of `warm` are warm.

        The phase's limit does not run while a fault is underway (`_faults_underway`), for up
        to the limit again: a crashed host's restart and a failover's recovery take the
        machine's CPU from the participants whose loads the phase waits on, and a load fed
        meanwhile shows only once they are over."""
        phase = Phase(name, time.time() - self.t0)
        self.phases.append(phase)
        self.say(f"phase: {name}")
        if action is not None:
            action()
        held_until = time.monotonic() + hold_s
        steady_s = self._steady_s()
        ok_since = None
        paused_s, last = 0.0, time.monotonic()
        while True:
            state = self.poll()
            now = time.monotonic()
            if self._faults_underway():
                paused_s = min(self.s.phase_timeout_s, paused_s + now - last)
            last = now
            if feeding is not None:
                feeding.poll(now, held=ok_since is not None)
            # A poll while a task is in transit reads an allocation that is none (the task's
            # load counts nowhere): it neither ends nor begins the time the goal has held.
            if not self._in_transit():
                loads, thresholds = self._measured(state, names)
                phase.loads, phase.thresholds = loads, thresholds
                phase.acceptable = len(loads) == len(names) and is_acceptable(list(loads.values()), list(thresholds.values()))
                goal = {"acceptable": phase.acceptable, "overloaded": phase.overloaded, None: True}[until]
                ok = goal and (feeding is None or feeding.reached) and (after is None or after(state))
                ok_since = (ok_since or now) if ok else None
            held = ok_since is not None and now - ok_since >= steady_s
            if now >= held_until and ((until is None and feeding is None) or held) and self._past_warm_up(warm):
                break
            if now >= held_until + self.s.phase_timeout_s + paused_s:
                break
            time.sleep(self.s.poll_s)
        phase.ended_s = time.time() - self.t0
        more = f" and {paused_s:.0f} s while faults were underway" if paused_s >= 1 else ""
        waited = f" (its {self.s.phase_timeout_s:.0f} s{more} ran out before it held {until})" if until is not None and not held else ""
        self.say(f"  {verdict(phase.to_json())}{waited}: loads {_fmt(phase.loads)} thresholds {_fmt(phase.thresholds)}")
        return phase

    @staticmethod
    def _reached_joiner(state: dict) -> bool:
        """Whether load of A, B or C has moved to D (`bpm_app.demo.outcomes.to_joiner`)."""
        return bool(to_joiner(state.get("movements", [])))

    def drive(self, steps: Iterator[None], each: Callable[[dict], None] | None = None) -> None:
        """Advance `steps` (`bpm_app.demo.faults.Fault`'s) a poll at a time until they are done,
        calling `each` with every poll's state."""
        for _ in steps:
            time.sleep(self.s.poll_s)
            state = self.poll()
            if each is not None:
                each(state)

    def _steady_s(self) -> float:
        """How long an allocation must hold to count: an agent's settling time (or two offer
        periods) and two offer periods more, long enough for every agent to have measured its
        load on the tasks it runs and to have made an offer on it."""
        return max(2 * self.s.period_s, self.s.agent_settle_s) + 2 * self.s.period_s

    def _in_transit(self) -> set[str]:
        """The tasks the registry places at a live participant that does not run them (yet):
        between an accepted offer and the start at the new host (the old host stops it at a
        batch boundary, the new one fetches the checkpoint), a task's load counts nowhere.
        A retired task (a split's or merge's, its windows out) runs nowhere again and is
        left out. The registry's side as the last poll read it."""
        alive = {p["name"] for p in self.state["participants"] if p["status"] == "alive"}
        placed = {(t["host"], task_key(t)) for t in self.state["tasks"] if t["host"] in alive and not t.get("retired")}
        running = self._running()
        return {key for host, key in placed if key not in running.get(host, {})}

    def _running(self) -> dict[str, dict[str, dict]]:
        """Per participant, the tasks its agent runs now (its `/status`), by key, each with what
        the agent last reported of it (watermark, load; nothing for a task started since); the
        agents asked at once (a saturated one answers late, and a poll waited for each in turn).
        Which tasks run is the agent's own view, not its last report: an agent cut off from the
        registry sends no report, and one that started a task just before still runs it."""

        def ask(name: str) -> dict[str, dict] | None:
            status = self._agent_status(name, timeout_s=1.0 if name in self.unreachable else 10.0)
            if status is None:
                return None
            if status.get("warming_up") is False:
                self._warm.add(name)  # for good: a warm-up does not come back
            reported = status.get("last_report", {}).get("details", {}).get("host", {}).get("tasks", [])
            details = {t["task_id"]: t for t in reported}
            return {key: details.get(key, {"task_id": key, "state": "running"}) for key in status.get("running", [])}

        with ThreadPoolExecutor(max_workers=len(self.fed.endpoints) or 1) as pool:
            answers = dict(zip(self.fed.endpoints, pool.map(ask, self.fed.endpoints)))
        return {name: tasks for name, tasks in answers.items() if tasks is not None}

    def _agent_status(self, name: str, timeout_s: float = 10.0) -> dict | None:
        """Participant `name`'s agent's `/status`; None while it cannot say."""
        if name not in self.fed.endpoints:
            return None
        try:
            return self.fed.agent_get(name, "/status", timeout_s).json()
        except (httpx.HTTPError, ValueError, RuntimeError):  # RuntimeError: not registered yet (`spark_agents.tls.PeerRefused`)
            return None

    def _spare_tasks(self, name: str) -> list[str]:
        """`name`'s tasks whose shares are not fed yet, in order."""
        fed = set(self.fed_tasks.get(name, []))
        return [task for task in self.inputs.tasks(self._members[name].shares)[:self._members[name].tasks] if task not in fed]

    def _tasks_of(self, names: list[str]) -> list[dict]:
        """The tasks of `names` that are not retired, wherever they run, as the last poll read the registry."""
        return [t for t in self.state["tasks"] if t["origin"] in names and not t.get("retired")]

    def _task_loads(self, names: list[str]) -> dict[str, float]:
        """The loads of the tasks of `names` by key (0 where not measured yet)."""
        return {task_key(t): t["load"] or 0.0 for t in self._tasks_of(names)}

    def _task_hosts(self, names: list[str]) -> dict[str, str]:
        """Where the tasks of `names` run, by key."""
        return {task_key(t): t["host"] for t in self._tasks_of(names)}

    def _warmup_s(self, member: Member) -> float:
        return default_warmup_s(self.s.trigger_s) + self.s.warmup_spare_s if member.initial else self.s.join_warmup_s

    def _faults_underway(self) -> bool:
        """Whether a fault is underway, which a phase's limit does not count (`_phase`): none
        in the phases scenario (the tour's faults strike beside its phases)."""
        return False

    def _past_warm_up(self, names: Collection[str]) -> bool:
        """Whether every one of `names` is past its warm-up and may offer or take load, as its
        agent's `/status` said when a poll last read it (`_running`; its warm-up lasts until
        some time after the last of its tasks started)."""
        return set(names) <= self._warm

    def _wait_measured(self, names: list[str], timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            loads, _ = self._measured(self.poll(), names)
            if len(loads) == len(names) and all(v > 0 for v in loads.values()):
                return
            time.sleep(self.s.poll_s)
        raise TimeoutError(f"no measured load from {names} after {timeout_s:.0f} s; see {self.s.workdir / 'logs'}")

    def _start_registry(self) -> None:
        """Every scenario's first step: the hosts, then the registry on its own."""
        self._open_hosts()
        self.fed.start_registry()
        self.say(f"registry on {self.fed.registry_url} (admin UI at {self.fed.registry_url}/, operator key {self.fed.admin_key})")

    # The run

    fill_step = FEED_STEP  # phase 3's feeding: at most so many shares a poll (`Feeding`)
    join_partners: Collection[str] | None = None  # D's contracts it signs in phase 4 (None: all it agreed)

    def run(self) -> dict:
        try:
            self._start_registry()
            self._set_up()
            self._poster()
            return self._report(self._finish())
        finally:
            self.fed.close()

    def _set_up(self) -> None:
        """The participants, their agents and their input (D without its contracts)."""
        self._setup_first(list(self.members), measured=list(POSTER), unsigned={JOINS})

    def _poster(self) -> None:
        """The poster's four phases over A, B and C, D joining in the fourth (the module text)."""
        s, names = self.s, list(POSTER)
        self._phase("1 uneven load, every load below its threshold", names, hold_s=s.settle_s, warm=names,
                    feeding=Feeding(self, "a", ["a"], s.uneven, below=True))
        self._phase("2 A's load rises over its threshold: it sheds load to B and C", names,
                    hold_s=s.settle_s, feeding=Feeding(self, "a", ["a"], s.overload))
        self._phase("3 load rises at B until the federation is overloaded", names, until="overloaded", hold_s=s.settle_s,
                    feeding=Feeding(self, "b", names, s.fill, until_held=True, step=self.fill_step))
        self._before_join()
        self._phase("4 D joins (contract with C at 0.8 p): load flows B to C and C to D", [*names, JOINS], hold_s=s.settle_s,
                    action=lambda: self._sign(self._members[JOINS], partners=self.join_partners), after=self._reached_joiner)

    def _before_join(self) -> None:
        """What must be over before D joins the poster: nothing, in the phases scenario."""

    def _report(self, report: dict) -> dict:
        """The scenario's report from the drain's."""
        return report

    def _open_hosts(self) -> None:
        """A host for each participant and the registry, with a network namespace and a CPU
        quota of `cpus` for each participant, where this machine and user allow them
        (`Federation.close` removes them); otherwise loopback addresses and the machine's CPUs."""
        self.fed.hosts = Hosts.open("demo", self.s.workdir / "hosts", cpus=bool(self.s.cpus), network=self.s.network, say=self.say)
        if self.fed.hosts.net is not None:
            self.say(f"each participant is a host of its own on {self.fed.hosts.net.subnet} (bridge {self.fed.hosts.net.bridge})")
        if self.fed.hosts.cpu is not None:
            boot = f" ({self.s.boot_cpus:g} while its JVM and its tasks start, and while they drain)" if self.s.boot_cpus else ""
            quotas = {name: self._cpus(m) for name, m in self._members.items()}
            quota = f"{next(iter(quotas.values())):g} CPU" if len(set(quotas.values())) == 1 else ", ".join(f"{n} {q:g}" for n, q in quotas.items()) + " CPU"
            self.say(f"each participant runs under a CPU quota of its own: {quota}{boot} ({self.fed.hosts.cpu.parent})")

    def hosts_report(self) -> dict:
        """Per participant: its address, its CPUs (its quota), and whether it had CPU and network of its own."""
        return {name: host.report() for name, host in self.fed.hosts.hosts.items() if name in self._members}

    def _setup_first(self, members: list[Member], measured: list[str] | None = None, unsigned: Collection[str] = ()) -> None:
        """Start the members' agents (those in `unsigned` without their contracts) and, while
        their JVMs start, generate their traffic; then replay it into their streams; wait until
        `measured` (default: all) report load."""
        for m in members:
            self._join(m, sign=m.name not in unsigned)
        traffic = {m.name: self._generate_input(m) for m in members if m.shares}
        # A participant's input starts once its agent answers and its traffic is written, those
        # with input first: one that joins without (the tour's D, which primes its JVM first)
        # holds nobody's input up. The view and the timeline go on while the JVMs start.
        for m in sorted(members, key=lambda m: not m.shares):
            self.fed.wait_agent(m.name, on_wait=self.poll)
            if m.shares:
                self._start_input(m, traffic[m.name])
        self.say("agents up; input flowing")
        self._wait_measured(measured or [m.name for m in members], 300)
        self._end_boot(members, 300)

    def _end_boot(self, members: list[Member], timeout_s: float) -> None:
        """Set each member's host to its capacity quota (`DemoSettings.boot_cpus`) once every
        one of its tasks runs, or when `timeout_s` has passed."""
        s = self.s
        booting = {m.name: m.tasks for m in members if self.fed.hosts.hosts[m.name].cpus not in (None, self._cpus(m))}
        if not booting:
            return
        deadline = time.monotonic() + timeout_s
        while booting:
            running = self._running()
            for name, tasks in list(booting.items()):
                if len(running.get(name, {})) >= tasks or time.monotonic() > deadline:
                    self.fed.hosts.set_cpus(name, self._cpus(self._members[name]))
                    del booting[name]
            if booting:
                time.sleep(s.poll_s)
                self.poll()
        self.say("the tasks have started: each host's quota is its capacity")

    def _set_quotas(self, cpus: float | None) -> None:
        """Set the quota of every member's host that has one to `cpus` (None: each its capacity,
        `_cpus`; no quotas: left as they are)."""
        if self.s.cpus:
            for name, member in self._members.items():
                if name in self.fed.hosts.hosts:
                    self.fed.hosts.set_cpus(name, cpus or self._cpus(member))

    def _cpus(self, member: Member) -> float | None:
        """`member`'s capacity: its host's CPU quota once its tasks run (None: no quotas)."""
        return self.s.cpus

    # Drain and compare

    def _finish(self) -> dict:
        self.say("closing the input and draining every task")
        self.stage = "draining: the input is closed, every task completes its last batch (phase 4 is over)"
        for name in self.fed_logs:
            if self.fed.replaying(name):
                self.fed.stop_replay(name)
        queried = {name: list(self.fed_tasks[name]) for name in self.fed_logs}
        logs = {name: self._queried_input(name, log, queried[name]) for name, log in self.fed_logs.items()}
        self._end_together()
        self._set_quotas(self.s.boot_cpus)  # the phases are over: the tasks drain as they started
        self._drain(queried, timeout_s=180)
        self._set_quotas(None)
        state = self.poll()
        # while the brokers run; a split's or merge's tasks write the results of their key groups
        outputs = {name: self.inputs.outputs(name, [t["name"] for t in self._over(name, tasks)]) for name, tasks in queried.items()}
        more = self._before_close()
        self.say("stopping the federation")
        self.fed.close()
        expected = self._reference(logs)
        lost = duplicate = 0
        output_rows = 0
        per_query: dict[str, dict] = {}
        for name, rows in expected.items():
            out = outputs[name]
            lost += len(out.lost(rows))
            duplicate += len(out.duplicates)
            output_rows += len(out.rows)
            query = self._query(name)
            tally = per_query.setdefault(query.query.name, {"reference": query.reference, "params": dict(query.params), "participants": [],
                                                            "expected_results": 0, "output_results": 0, "lost_results": 0,
                                                            "duplicate_results": 0, "extra_results": 0})
            tally["participants"].append(name)
            for key, count in (("expected_results", len(rows)), ("output_results", len(out.rows)), ("lost_results", len(out.lost(rows))),
                               ("duplicate_results", len(out.duplicates)), ("extra_results", len(out.extra(rows)))):
                tally[key] += count
        ledger = state["ledger"]
        return {
            "phases": [p.to_json() for p in self.phases],
            "movements": state["movements"],
            "regrains": state["regrains"],
            "payments": {"balances": ledger["balances"], "total_paid": sum(b["paid"] for b in ledger["balances"]), "total_earned": sum(b["earned"] for b in ledger["balances"])},
            "expected_results": sum(len(r) for r in expected.values()),
            "output_results": output_rows,
            "lost_results": lost,
            "duplicate_results": duplicate,
            "queries": per_query,
            "fed_connections": {name: _connections(log) for name, log in self.fed_logs.items()},
            "queried_connections": {name: _connections(log) for name, log in logs.items()},
            "queried_tasks": queried,
            "timeline": self.timeline,
            "cpu": self.cpu,
            "hosts": self.hosts_report(),
            "started_at": datetime.fromtimestamp(self.t0, timezone.utc).isoformat(),
            "elapsed_s": round(time.time() - self.t0, 1),
            "workdir": str(self.s.workdir),
            **more,
        }

    def _before_close(self) -> dict:
        """What a scenario reads from the running federation once the tasks drained, for its report."""
        return {}

    def _queried_input(self, name: str, fed: Path, tasks: list[str]) -> Path:
        """What `name`'s tasks were fed: the records of the fed log (after the lateness rule the
        stream applied to all of it) that fall in the shares of `tasks`, beside it
        (`DemoQuery.queried`); and the end-of-input mark the replayer wrote after the newest of
        them all. Phases 1 and 3 leave some shares without a query; their rows are no task's input."""
        out, self._end_us[name] = self._query(name).queried(name, fed, self.inputs.key_groups(tasks))
        return out

    def _end_together(self) -> None:
        """Close every participant's stream at one event time, the latest end any replayer
        wrote: replayers stop a moment apart, and a window that one participant closed and a
        partner never did would hold its correlation back for ever. Where the replayer ended
        earlier, the later end mark goes to each key group: the windows in between close empty."""
        from spark_agents.broker.stream import BrokerStream

        ends = {name: end for name, end in self._end_us.items() if end is not None}
        if not ends:
            return
        common = max(ends.values())
        for name, end in ends.items():
            if end < common:
                with self.inputs.broker(name) as broker:
                    stream = BrokerStream(broker, name)
                    write_end(stream, common, range(stream.partitions), Records(self._query(name).query))
            self._end_us[name] = common

    def _over(self, name: str, tasks: list[str]) -> list[dict]:
        """The tasks of `name` in the registry (as the last poll read it) over the shares of
        `tasks`: those tasks, or the tasks splits and merges made of them, retired or not."""
        shares = [task[1:] for task in tasks]
        over = []
        for t in self.state["tasks"]:
            groups = key_groups(t) if t["origin"] == name else None
            if groups is not None and any(groups.startswith(share) for share in shares):
                over.append(t)
        return over

    def _drain(self, queried: dict[str, list[str]], timeout_s: float) -> None:
        """Wait until every task over the queried shares (`_over`), where it runs now, has
        completed a batch with the watermark that the end mark of its closed stream brings:
        that batch emits the last windows; and a task that handed its key groups over to a
        split or merge has retired (its windows are out). A task moved after it has drained
        shows the same watermark in its handed-over checkpoint."""
        deadline, pending = time.monotonic() + timeout_s, {}
        while True:
            self.poll()
            watermarks: dict[str, int] = {}
            for tasks in self._running().values():
                for key, t in tasks.items():
                    watermarks[key] = max(watermarks.get(key, 0), t.get("watermark_ms") or 0)
            pending = {}  # task: where it stands, as a person reads it
            for name, tasks in queried.items():
                end_us = self._end_us.get(name)
                if end_us is None:
                    continue  # nothing fed: nothing to drain
                want = end_watermark_ms(end_us, self._query(name).lateness_s)
                for t in self._over(name, tasks):
                    if t.get("retired"):
                        continue
                    key = task_key(t)
                    mark = watermarks.get(key, 0)
                    if ending(t):
                        pending[key] = f"not retired, its windows until {t['until_s']}"
                    elif mark < want:
                        pending[key] = f"{(want - mark) / 1000:.0f} s of input short" if mark else "no batch seen"
            if not pending or time.monotonic() >= deadline:
                break
            time.sleep(self.s.poll_s)
        if pending:
            where = ", ".join(f"{key} ({pending[key]})" for key in sorted(pending))
            self.say(f"tasks had not drained after {timeout_s:.0f} s: {where}; results compared as they are")

    def _reference(self, logs: dict[str, Path]) -> dict[str, list[Result]]:
        """The plain computation of each participant's query over exactly what its queried shares
        were fed (`DemoQuery.reference_results`), on a Spark of this process's own where one is needed."""
        self.say("reference: the plain computation over what each participant's queried shares were fed")
        sessions = []

        def spark():
            if not sessions:
                from spark_agents.session import make_session

                sessions.append(make_session("local[2]", app_name="bpm-demo-reference"))
            return sessions[0]

        try:
            return {name: self._query(name).reference_results(log, spark, self.s.workdir / "reference" / name) for name, log in logs.items()}
        finally:
            for session in sessions:
                session.stop()

# The load above which a phase feeds a participant no more shares until it has shed some: a
# saturated participant's tasks queue, and its readings understate what they need; fed on
# them, it is given more than the federation holds once D joins (docs/benchmarks.md, "Demo runs").
FEED_CEILING = 0.8


def _within(readings: list[tuple[float, float]], now: float, lag_s: float, value: float) -> list[tuple[float, float]]:
    """`readings` (when, value) of the last `lag_s` before `now`, and `value` read now."""
    return [x for x in readings if now - x[0] < lag_s] + [(now, value)]


class Feeding:
    """A phase's load rise: `name`'s replayer feeds its spare tasks' shares, a poll at a time,
    until the loads of the tasks of `names`, wherever they run, add up to `share` of the sum
    of their thresholds (in phase 3 the loads of A's, B's and C's tasks then add up to `fill`
    times their thresholds).

    At each poll it feeds one more share (up to `step`, two by default, while far short) while the highest load read
    within a lag and what the shares fed within it will add, at what a task measures now
    (the median of the tasks running), stay below the target. A task's load shows in full
    only after its next trigger and one load window, and what a task costs varies from run
    to run and grows with its participant's load (a busier JVM collects garbage and compiles
    more, a full quota delays every batch): steps sized on readings of a lightly loaded
    federation overshoot, and steps that wait for fresh readings take a minute each. A share
    at a time, counting what is on its way, stops within a task or two of the target and
    feeds more if the loads later fall short of it. The lag is the task's next trigger and
    two of its agent's load windows (`bpm.load.default_load_window_s`: 70 s in all with a
    10 s trigger): a participant that sheds and takes tasks meanwhile begins its window
    again at each change, and with a shorter lag its readings stand still while it trades
    and the phase feeds on them. A share whose task reads no more load than when it was fed
    stays on its way past the lag (`on_its_way`). `reached` says the target has been met
    once. docs/benchmarks.md, "Demo runs", has the runs behind each of these rules.

    With `until_held` (phase 3: the tasks of `names` run only at `names`, and the phase's
    verdict reads the participants' own loads), a lag after the target was reached, while the
    phase's goal does not hold and nothing fed is on its way, as many more shares as the
    participants' own loads, their median over the lag, fall short of the target (at least
    one): the highest of the tasks' loads within the lag can pass the target while the
    participants' own loads stay short of it. The participants' own loads size no step before
    that: they show a share's load later than its task does (`on_its_way` reads the tasks'),
    and feeding until they reach the target too feeds every spare share; a lag after the last
    share, they show it.

    With `below` (phase 1: a load that `name` holds without shedding), it feeds only the
    shares that keep the loads below the target (rounded down, where the others round up),
    once `name` is past its warm-up and then a step a lag, and is `reached` while nothing
    more fits and nothing fed is on its way: on a machine where a task costs a large part of
    a participant, at once.

    Attributes:
        reached: whether the loads have reached the target at least once (with `below`:
            whether, at the last poll, they were as near it as a share allows).
    """

    def __init__(self, demo: Demo, name: str, names: list[str], share: float, until_held: bool = False, step: int = FEED_STEP,
                 below: bool = False) -> None:
        self.demo, self.name, self.names, self.share, self.until_held, self.step = demo, name, names, share, until_held, step
        self.below = below
        # per task fed: when (monotonic) and the load its task read then (0 before its first batch)
        self.fed: dict[str, tuple[float, float]] = {}
        # (when, the tasks' loads) and (when, the participants' own loads) of the polls within the lag
        self.totals: list[tuple[float, float]] = []
        self.own_totals: list[tuple[float, float]] = []
        self.reached_at = math.inf  # when (monotonic) the loads first reached the target

    def poll(self, now: float, held: bool = True) -> None:
        """Feed what the loads call for; `held`: whether the phase's goal held at the last
        poll (with `until_held`, a goal the loads reach only at times calls for more shares a lag)."""
        demo = self.demo
        own, thresholds = demo._measured(demo.state, self.names)
        lag_s = demo.s.trigger_s + 2 * default_load_window_s(demo.s.trigger_s)
        read = demo._task_loads(self.names)
        on_its_way = self.on_its_way(read, now, lag_s)
        loads = self.estimated(read, on_its_way)
        self.totals = _within(self.totals, now, lag_s, sum(loads.values()))
        # Only feeding raises the total, so the highest reading within the lag stands for it:
        # readings dip while participants trade, and a dip is no reason to feed more.
        total = max(v for _, v in self.totals)
        if len(thresholds) < len(self.names):
            return
        self.own_totals = _within(self.own_totals, now, lag_s, sum(own.values()))
        target = self.share * sum(thresholds.values())
        if not self.reached and total >= target and not self.below:
            self.reached_at = now
        # What a task measures now, of the tasks whose load shows in full: a share on its way
        # reads part of its load, and counted in the median it would make each share on its
        # way count for less the more of them there are.
        shown = {key: load for key, load in loads.items() if load and key not in on_its_way}
        measured = list(shown.values())
        coming = len(on_its_way) * (statistics.median(measured) if measured else 0.0)
        spare = demo._spare_tasks(self.name)
        if self.below:
            # A step a lag, on readings past the participant's warm-up (a share's first
            # readings are partial, and on them it would feed past the target), a share at
            # what a task whose share is fed measures (an idle task's reading is next to none).
            fed = {f"{self.name}.{task}" for task in demo.fed_tasks[self.name]}
            per_share = [load for key, load in shown.items() if key in fed]
            settled = bool(per_share) and not on_its_way and demo._past_warm_up([self.name])
            count = min(self.step, queries_below(target, total, per_share, len(spare))) if settled else 0
            self.reached_at = now if settled and not count else math.inf  # while nothing more fits
        else:
            count = min(self.step, queries_to_add(target, [total + coming], measured, len(spare)))
        # The highest reading within the lag can pass the target while the participants' loads
        # stay below it most of the time, and the phase's verdict, which wants its goal to hold,
        # then never comes. A lag after the target was first reached, with nothing on its way (a share is
        # for a lag at least, so the participants' own loads show it), the goal not held feeds
        # as many shares as their median over the lag falls short (`until_held`): one a lag took
        # minutes where the shortfall was several shares.
        short = ""
        if not count and self.until_held and now - self.reached_at >= lag_s and not held and spare and not on_its_way:
            typical = statistics.median(v for _, v in self.own_totals)
            count = max(1, queries_to_add(target, [typical], measured, len(spare)))
            short = f"; the participants' own loads typically {typical:.2f}"
        if own.get(self.name, 0.0) > FEED_CEILING:
            count = 0  # until it sheds: its readings understate what its tasks need
        if count:
            tasks = spare[:count]
            demo.fed.feed_more(self.name, [task[1:] for task in tasks])
            demo.fed_tasks[self.name] += tasks
            keys = [f"{self.name}.{task}" for task in tasks]
            self.fed.update({key: (now, read.get(key, 0.0)) for key in keys})
            demo.say(f"  {self.name}'s traffic grows: its tasks {', '.join(tasks)} get input "
                     f"(the loads add up to {total:.2f}, {coming:.2f} on its way, of {target:.2f}{short})")

    @property
    def reached(self) -> bool:
        return self.reached_at < math.inf

    def estimated(self, loads: dict[str, float], on_its_way: Collection[str]) -> dict[str, float]:
        """The tasks' `loads`, each task at a saturated participant (its own load above
        `FEED_CEILING`) counted at least at what a task measures at a participant with room
        (the median of those whose load shows): a full quota delays every batch, and the
        tasks' readings there understate what they need: fed on those readings, the loads
        rise far past the target once the tasks run elsewhere (docs/benchmarks.md, "Demo
        runs", a206f56). A task that reads no load is left at none: its share is not fed (it runs no batch), or
        its first batches are still to come. Unchanged where no participant is saturated or
        none with room measures a task."""
        demo = self.demo
        own, _ = demo._measured(demo.state, [p["name"] for p in demo.state["participants"]])
        saturated = {name for name, load in own.items() if load > FEED_CEILING}
        hosts = demo._task_hosts(self.names)
        with_room = [load for key, load in loads.items() if load and key not in on_its_way and hosts.get(key) not in saturated]
        if not saturated or not with_room:
            return loads
        typical = statistics.median(with_room)
        return {key: max(load, typical) if load and hosts.get(key) in saturated and key not in on_its_way else load
                for key, load in loads.items()}

    def on_its_way(self, loads: dict[str, float], now: float, lag_s: float) -> list[str]:
        """The tasks fed whose load may not show yet: fed within the lag, or, for up to three
        lags, whose task's load reads no more than when it was fed: readings lag the lag when
        a participant's quota is full, and a share counted before its load shows calls for
        more shares than the target needs."""
        return [key for key, (at, before) in self.fed.items()
                if now - at < lag_s or (now - at < 3 * lag_s and loads.get(key, 0.0) <= before)]


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


def queries_below(target: float, load: float, query_loads: list[float], most: int) -> int:
    """How many more queries keep `load` below `target`, a query bringing the median of
    `query_loads`: rounded down, at most `most`; none while no query is measured."""
    if not query_loads or load >= target:
        return 0
    return min(most, math.floor((target - load) / statistics.median(query_loads)))


def _connections(log: Path) -> int:
    return sum(1 for line in log.open() if not line.startswith("#"))


def _fmt(values: dict[str, float]) -> str:
    return ", ".join(f"{k}={v:.2f}" for k, v in sorted(values.items()))
