"""The poster's four phases, stepped: the outcome the mechanism promises, on any machine.

The real agents (their loop, their state machines, their reads of the change feed) trade
through the real registry app; only the Spark side is simulated, with task loads that the
test sets, and the clock is stepped. The federation is the demo's (`bpm_app.demo.run`): the
same cost curve, price ranges, margin and contracts, a task with input costing a tenth of a
participant, one without input next to nothing. The phases feed traffic as the demo's do
(a share at a time until the target) and end as the demo's do: once the allocation has
held, with no task in transit, for the demo's steady time. So a change that breaks the
mechanism's outcome fails here, named, whatever the machine's speed; the live federation
(`tests/bpm_app/demo/test_scenarios.py`) asserts the same outcomes on real Spark.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from bpm.costs import MM1Cost
from bpm.federation.views import AgreedTerms
from bpm.names import task_key
from bpm.negotiation import is_acceptable
from tests.spark_agents.stepped import stepped_federation
from tests.spark_agents.test_agent import SteppedHost

COST = MM1Cost(a=0.14)  # the demo's curve: a threshold of 1 - sqrt(0.14) = 0.63 at the reference price 1
FED, IDLE = 0.10, 0.005  # a task's load with input, and without (it runs no micro-batch)
TASKS = {"a": 10, "b": 17, "c": 1, "d": 0}  # as the demo's members: own tasks, all started before phase 1
FED_FIRST = {"a": 2, "b": 1, "c": 1}  # how many of them have input from the start
# The demo's contracts agreed offline: price q, range [q / 2, q]; D's with C only, cheaper.
PRICES = {("a", "b"): 1.0, ("a", "c"): 1.0, ("b", "c"): 1.0, ("c", "d"): 0.8}
MIN_DURATION_S = 1200.0
PERIOD_S, WARMUP_S, SETTLE_S = 3.0, 20.0, 9.0
STEADY_S = max(2 * PERIOD_S, SETTLE_S) + 2 * PERIOD_S  # as `bpm_app.demo.run.Demo._steady_s`
PHASE_LIMIT_S = 600.0  # of stepped time: no phase below needs a third of it
OVERLOAD, FILL = 1.15, 1.05  # the demo's phase 2 and phase 3 targets (`DemoSettings`)


def _terms(name: str) -> list[AgreedTerms]:
    return [AgreedTerms(b if a == name else a, q / 2, q, MIN_DURATION_S) for (a, b), q in PRICES.items() if name in (a, b)]


class Traffic:
    """Which tasks have input: a task's load is the same wherever it runs."""

    def __init__(self) -> None:
        self.fed: set[str] = set()

    def load(self, key: str) -> float:
        return FED if key in self.fed else IDLE


class FedHost(SteppedHost):
    """A simulated Spark host whose tasks cost what the traffic says."""

    def __init__(self, traffic: Traffic) -> None:
        super().__init__(COST)
        self.traffic = traffic

    def loads(self):
        return {key: self.traffic.load(key) for key in self.running()}


@dataclass
class Phase:
    name: str
    loads: dict[str, float] = field(default_factory=dict)
    thresholds: dict[str, float] = field(default_factory=dict)
    took_s: float = 0.0

    @property
    def acceptable(self) -> bool:
        return is_acceptable(list(self.loads.values()), list(self.thresholds.values()))

    @property
    def overloaded(self) -> bool:
        return sum(self.loads.values()) > sum(self.thresholds.values())


class Poster:
    """The federation and the phases' driver."""

    def __init__(self, federation, traffic: Traffic) -> None:
        self.operator, self.agents, add, self.clock = federation
        self.traffic = traffic
        self.elapsed_s = 0.0
        for name, count in TASKS.items():
            add(name, count)
        for name, count in FED_FIRST.items():
            self.feed(name, count)

    def feed(self, name: str, count: int) -> None:
        """`count` more of `name`'s tasks get input (its task names sort as its shares are fed)."""
        spare = sorted((k for k in (f"{name}.p{i}" for i in range(TASKS[name])) if k not in self.traffic.fed), key=lambda k: int(k.rsplit("p", 1)[1]))
        self.traffic.fed |= set(spare[:count])

    def step(self) -> None:
        for agent in self.agents.values():
            agent.tick()
        self.clock.advance(1.0)
        self.elapsed_s += 1.0

    def in_transit(self) -> set[str]:
        """Tasks the registry places at a participant that does not run them (yet)."""
        running = {name: agent.host.running() for name, agent in self.agents.items()}
        return {task_key(t) for t in self.operator.tasks() if task_key(t) not in running[t["host"]]}

    def allocation(self, names: str) -> Phase:
        phase = Phase("")
        for p in self.operator.participants():
            if p["name"] in names and p["load"] is not None:
                phase.loads[p["name"]], phase.thresholds[p["name"]] = p["load"], p["threshold"]
        return phase

    def task_loads(self, names: str) -> float:
        return sum(self.traffic.load(task_key(t)) for t in self.operator.tasks() if t["origin"] in names)

    def phase(self, name: str, names: str, until: str, feeding=None) -> Phase:
        """Step until the allocation of `names` has held `until` for the steady time, read at
        steps with no task in transit (or the phase's limit); `feeding` is called every
        period first and says whether its target is reached."""
        started, held_since, reached = self.elapsed_s, None, feeding is None
        while self.elapsed_s - started < PHASE_LIMIT_S:
            if feeding is not None and self.elapsed_s % PERIOD_S == 0:
                reached = feeding() or reached
            self.step()
            if self.in_transit():
                continue
            now = self.allocation(names)
            ok = reached and len(now.loads) == len(names) and (now.acceptable if until == "acceptable" else now.overloaded)
            held_since = (held_since if held_since is not None else self.elapsed_s) if ok else None
            if held_since is not None and self.elapsed_s - held_since >= STEADY_S:
                break
        out = self.allocation(names)
        out.name, out.took_s = name, self.elapsed_s - started
        return out

    def feeding(self, name: str, names: str, share: float):
        """The demo's load rise: a share of `name`'s traffic a period until the tasks of
        `names` add up to `share` of their thresholds."""

        def feed() -> bool:
            target = share * sum(self.allocation(names).thresholds.values())
            if self.task_loads(names) >= target:
                return True
            self.feed(name, 1)
            return False

        return feed


def _decisions(agents) -> str:
    """The tail of each agent's record: why a phase ended as it did."""
    return "\n".join(f"{name}: {r.kind}: {r.message}" for name, agent in agents.items() for r in list(agent.records)[-12:])


def test_the_poster_phases_end_as_the_mechanism_promises(tmp_path):
    traffic = Traffic()
    # D's agent runs from the start, without the terms it agreed: it joins in phase 4.
    settings = {name: dict(period_s=PERIOD_S, warmup_s=WARMUP_S, settle_s=SETTLE_S, margin=0.1, contracts=_terms(name) if name != "d" else [])
                for name in TASKS}
    with stepped_federation(tmp_path, lambda now: FedHost(traffic), settings=settings) as federation:
        poster = Poster(federation, traffic)
        operator, agents = poster.operator, poster.agents

        one = poster.phase("1 uneven load", "abc", "acceptable")
        assert one.acceptable and max(one.loads, key=one.loads.get) == "a", (one, _decisions(agents))
        assert not operator.movements(), f"nothing moves while every load is below its threshold\n{_decisions(agents)}"

        two = poster.phase("2 A's load rises", "abc", "acceptable", poster.feeding("a", "a", OVERLOAD))
        assert poster.task_loads("a") > OVERLOAD * one.thresholds["a"] - FED, "A's traffic rose past its threshold"
        assert two.acceptable, (two, _decisions(agents))
        assert two.loads["a"] <= two.thresholds["a"], f"A below its threshold at the end of phase 2: {two}\n{_decisions(agents)}"
        assert any(m["from"] == "a" for m in operator.movements()), "A shed load to its partners"

        three = poster.phase("3 B's load rises", "abc", "overloaded", poster.feeding("b", "abc", FILL))
        assert three.overloaded, (three, _decisions(agents))

        proposal = next(c for c in operator.contracts() if {c["proposer"], c["counterparty"]} == {"c", "d"})
        assert proposal["state"] == "proposed", "D has not joined yet"
        before_d = {m["id"] for m in operator.movements()}
        agents["d"].client.contract_action(proposal["id"], "accept")
        four = poster.phase("4 D joins", "abcd", "acceptable")
        assert four.acceptable, (four, _decisions(agents))
        to_d = [m for m in operator.movements() if m["to"] == "d"]
        assert to_d and all(m["id"] not in before_d for m in to_d), "load reached D once it joined"
        assert four.loads["d"] > 0 and agents["d"].host.running(), four

        balances = operator.ledger()["balances"]
        assert sum(b["balance"] for b in balances) == pytest.approx(0.0), "what one pays the other earns"
