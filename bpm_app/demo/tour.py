"""`bpm demo --scenario tour`: every scenario on one federation, in one run.

The poster's four phases (`bpm_app.demo.run`) play on participants a, b and c, as in the
phases scenario but with shorter waits (fewer spare tasks, a shorter warm-up, phases that
end once their goal has held). Meanwhile, on two more participants, the rest plays out, one
step after another:

- **Split.** E and D play the split scenario's A and B (`bpm_app.demo.split`): 0.2-CPU hosts,
  its steep cost curve, one contract with a narrow range ([0.9 p, p]). E runs one task over its
  whole stream, with traffic heavy enough to take it over its threshold alone: moving all of it
  would save E less per unit than the lowest price, or, on a busier machine, D refuses it whole
  (on the same curve it costs D more than the price), so E's agent splits the task over its
  key groups and sheds a piece to D. The contract replicates what moves (passive standby: E
  keeps a copy of each piece D hosts).
- **Registry cut.** Once D hosts a piece whose copy is up to date, D's link to the registry
  is cut: the registry counts D failed, E asks D's agent itself, finds it answering and fails
  nothing over; D processes the piece through the cut, and is heard from again once it heals.
- **Partition.** Then D is cut off from every host: E fails the piece over to itself from its
  copy; once the link heals, D learns it lost the piece and stops it (the fence refuses what
  it still writes).
- **Crash.** Once D hosts a piece again, D's host crashes: E fails the piece over again. Once
  the registry has counted D failed, D's host restarts (its agent, with its key and folder), as
  a participant's does after a crash, as the poster's D: 0.6 CPU and the poster's cost curve.
  E's traffic then ends: its tasks drain.

D joins the poster in phase 4 once all of this is over: it signs its contract with C, and
load flows B to C and C to D. At the end every stream closes, every task drains, and the
results of A's, B's, C's and E's tasks (the split's pieces wherever they ran, the pieces that
failed over) are compared with the plain computation. The report adds `split` and `faults`.

The participants' CPU quotas (0.4 CPU for A, B and C, 0.2 for E, and for D 0.2 and then 0.6;
`--cpus` sets A's, B's and C's, and D's after its restart at 1.5 times theirs)
add up to at most a 2-core machine's CPUs, though they are never all used at once; E's traffic
is replayed from the registry's host (outside every quota).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterator

from bpm.federation.views import AgreedTerms
from bpm_app.demo.faults import Fault
from bpm_app.demo.outcomes import JOINS, POSTER
from bpm_app.demo.run import Demo, DemoSettings, Member
from bpm_app.demo.split import FIXED_COST_CPU_S, SPLIT_CPUS, SPLIT_MM1_SCALE, SPLIT_RATE, SPLIT_SPREAD

SPLITS = "e"  # D (`JOINS`) is E's partner, and the faults' victim, before it joins the poster in phase 4
TOUR_MEMBERS = (
    # The phases scenario's participants (`bpm_app.demo.run.MEMBERS`), B with fewer spare shares:
    # E's traffic and restarts keep the machine busier, and a task here costs more.
    Member("a", 16, 1, 11, spare=9),
    Member("b", 32, 1, 12, spare=13),
    Member("c", 4, 1, 13),
    Member(JOINS, 0, 0, 14),
    Member(SPLITS, 1, 1, 15),  # one share: one task over every key group of E's stream
)
# (pair): (price factor, how far the range reaches below the price, HA mode)
TOUR_CONTRACTS = {
    ("a", "b"): (1.0, None, "none"),
    ("a", "c"): (1.0, None, "none"),
    ("b", "c"): (1.0, None, "none"),
    ("c", JOINS): (0.8, None, "none"),
    # The split scenario's range, D and E on its curve: whatever E's task measures above E's
    # threshold, either moving all of it saves E less per unit than the lowest price, or D
    # refuses it whole; either way E splits it. (With the poster's flatter curve, D would take
    # the whole task when E's measures from about 0.6 to 0.8.)
    (JOINS, SPLITS): (1.0, SPLIT_SPREAD, "passive_standby"),
}
CUT_S = 20.0
# D, once it has restarted and joins in phase 4, is larger than the others (0.6 CPU beside their
# 0.4): room for the load phase 3 leaves, which goes on rising after its last share is fed while
# E's traffic and D's restart keep the machine busy (a federation of four equal participants
# ended phase 4 overloaded). A multiple of the others' quota, so that `--cpus` scales the
# poster's four alike: with half their quotas, a task is as large a part of a participant as on
# a machine half as fast.
JOINS_SCALE = 1.5
# E's traffic: longer than the split and the faults take, so that E's input is still open when
# D's host crashes (an input that has ended moves no task, and E would not shed a piece again).
SPLITS_TRAFFIC_S = 900.0
SPLITS_AMPLIFY = 10  # E's replayer feeds each generated connection ten times: generating them all took minutes


def tour_settings(settings: DemoSettings) -> DemoSettings:
    """The phases scenario's settings with shorter waits: the agents' own warm-up
    (`bpm.load.default_warmup_s`, no spare) and phases that hold
    their goal for `Demo._steady_s` and no longer. (A 5 s
    trigger would shorten the load windows too, but it doubles what a task costs, and with
    tasks of a third of a participant the allocations were too lumpy to end acceptable.)"""
    return dataclasses.replace(settings, warmup_spare_s=0.0, settle_s=10.0)


class Tour(Demo):
    """The tour (see the module text). `faults` lists the faults as they struck; `side_error`
    says why the split or the faults' steps stopped short, if they did."""

    pairs = {pair: factor for pair, (factor, _, _) in TOUR_CONTRACTS.items()}
    members = TOUR_MEMBERS

    def __init__(self, settings: DemoSettings, view: Callable[[dict], None] | None = None, say: Callable[[str], None] = print) -> None:
        super().__init__(tour_settings(settings), view, say)
        self.faults: list[Fault] = []
        self.side_error: str | None = None
        self.side_done_s: float | None = None
        self.restarted_s: float | None = None
        self._steps: dict[str, Iterator[None]] = {}  # advanced at every poll: the split and faults, then E's recovery

    # Setup: E and the contracts differ from the poster's participants

    def _contracts(self, member: Member) -> list[AgreedTerms]:
        terms = []
        for (x, y), (factor, spread, mode) in TOUR_CONTRACTS.items():
            if member.name in (x, y):
                price = factor * self.s.price
                reach = self.s.spread if spread is None else spread
                terms.append(AgreedTerms(y if x == member.name else x, price * (1 - reach), price, self.s.min_duration_s, mode))
        return terms

    def _agent_settings(self, member: Member, contracts: bool = True) -> dict[str, object]:
        settings = super()._agent_settings(member, contracts)
        if member.name == JOINS and not contracts:
            # D trades with E from the start; it signs C's proposal when it joins the poster.
            settings["contract"] = [t.spec() for t in self._contracts(member) if t.partner == SPLITS]
        if member.name == SPLITS or (member.name == JOINS and self.restarted_s is None):
            # The split scenario's curve for E, and for D until it restarts as the poster's D. The
            # fixed cost in units of a 0.2-CPU capacity, at the trigger: what a running query costs
            # whatever its input.
            fixed = FIXED_COST_CPU_S / self.s.trigger_s / (SPLIT_CPUS if self.s.cpus else 1.0)
            settings.update(mm1_scale=SPLIT_MM1_SCALE, fixed_cost=round(fixed, 4))
        return settings

    def _cpus(self, member: Member) -> float | None:
        if not self.s.cpus:
            return None
        return {SPLITS: SPLIT_CPUS, JOINS: SPLIT_CPUS if self.restarted_s is None else round(JOINS_SCALE * self.s.cpus, 3)}.get(member.name, self.s.cpus)

    def _replay_host(self, member: Member) -> str:
        """E's heavy traffic from the registry's host, outside E's quota (`bpm_app.demo.split`)."""
        return self.fed.REGISTRY if member.name == SPLITS else member.name

    def _generate_input(self, member: Member) -> Callable[[], object]:
        if member.name != SPLITS:
            return super()._generate_input(member)
        s = self.s
        return self.fed.generate_traffic(member.name, SPLITS_TRAFFIC_S, SPLIT_RATE / SPLITS_AMPLIFY, s.sources, s.scanners, member.seed)

    def _amplify(self, member: Member) -> int:
        return SPLITS_AMPLIFY if member.name == SPLITS else 1

    # Observation: the split and the faults advance with every poll

    def poll(self) -> dict:
        state = super().poll()
        for name, steps in list(self._steps.items()):
            try:
                next(steps)
            except StopIteration:
                del self._steps[name]
                if name == "side":
                    self.side_done_s = round(time.time() - self.t0, 1)
            except Exception as exc:  # the poster goes on; the report says where the side stopped
                del self._steps[name]
                self.side_error = f"{name}: {type(exc).__name__}: {exc}"
                self.say(f"the split and faults stopped short: {self.side_error}")
        return state

    def _faults_underway(self) -> bool:
        """From the first fault's strike until the faults' steps and E's recovery are over."""
        return bool(self.faults) and bool({"side", "recovery"} & set(self._steps))

    def split_moved(self) -> bool:
        """Whether a piece of a task E split runs at D, as the last poll read the registry."""
        pieces = {name for r in self.state.get("regrains", []) if r["kind"] == "split" and r["origin"] == SPLITS for name in r["made"]}
        return any(t["origin"] == SPLITS and t["name"] in pieces and t["host"] == JOINS for t in self.state["tasks"])

    def side(self, timeout_s: float = 600.0) -> Iterator[None]:
        """The split, then the faults of D's host, one after another (see the module text)."""
        deadline = time.monotonic() + timeout_s
        while not self.split_moved():
            if time.monotonic() > deadline:
                raise TimeoutError(f"no piece of a task {SPLITS} split ran at {JOINS} within {timeout_s:.0f} s")
            yield
        self.say(f"  {SPLITS} split its task and a piece runs at {JOINS}")
        for kind in ("registry", "cut", "crash"):
            fault = Fault(self, JOINS, kind, cut_s=CUT_S)
            yield from fault.strike_when_copied()
            if self.faults:
                self.faults[-1].until = fault.at
            self.faults.append(fault)
            if kind == "registry":
                yield from fault.ride_out()
                yield from fault.heal()
            elif kind == "cut":
                yield from fault.recover()
                yield from fault.heal()
            else:
                # Once the registry has counted D failed: E's traffic has done its part (its stream
                # closes, E recovers the piece from its copy and the stream so far), and D's host
                # restarts meanwhile. D may join the poster once its agent answers, whether E's
                # recovery is over or not (`recovery`, which the drain waits for).
                while not fault.failover_rows(self.state.get("failovers", [])):
                    yield
                self.fed.end_replay(SPLITS)
                self.restarted_s = round(time.time() - self.t0, 1)
                self.say(f"{JOINS}'s host restarts as the poster's {JOINS}: {self._cpus(self._members[JOINS]) or 'no'} CPU quota, the poster's cost curve")
                if self.s.cpus:
                    self.fed.hosts.set_cpus(JOINS, self._cpus(self._members[JOINS]))
                self.unreachable.discard(JOINS)
                self._join(self._members[JOINS], sign=False)
                self._steps["recovery"] = fault.recover()
        while not self._agent_status(JOINS, timeout_s=2.0):
            yield

    # The run: the phases scenario's, with the side steps and D's restart before D joins

    fill_step = 1
    join_partners = ("c",)

    def _set_up(self) -> None:
        self._setup_first(list(self.members), measured=[*POSTER, SPLITS], unsigned={JOINS})
        self._steps["side"] = self.side()

    def _before_join(self, timeout_s: float = 600.0) -> None:
        """Before D joins the poster: the split and the faults are over and D's agent runs again."""
        self._wait_steps({"side"}, timeout_s, "before D joins")
        if self._agent_status(JOINS, timeout_s=2.0) is None:
            raise RuntimeError(f"{JOINS}'s agent does not answer: it cannot join ({self.side_error or 'see its log'})")

    def _wait_steps(self, names: set[str], timeout_s: float, when: str) -> None:
        if names & set(self._steps):
            self.say(f"waiting for {', '.join(sorted(names & set(self._steps)))} to end {when}")
        deadline = time.monotonic() + timeout_s
        while names & set(self._steps) and time.monotonic() < deadline:
            time.sleep(self.s.poll_s)
            self.poll()
        for name in names & set(self._steps):
            del self._steps[name]
            self.side_error = self.side_error or f"{name}: not over within {timeout_s:.0f} s {when}"

    def _finish(self) -> dict:
        self._wait_steps(set(self._steps), 300.0, "before the input closes")  # E's recovery: its tasks drain where they run
        return super()._finish()

    def _report(self, report: dict) -> dict:
        records = self.state.get("failovers", [])
        report["scenario"] = "tour"
        report["split"] = {"origin": SPLITS, "to": JOINS,
                           "regrains": [r for r in report["regrains"] if r["origin"] == SPLITS],
                           "moved": [m for m in report["movements"] if m["origin"] == SPLITS]}
        report["faults"] = [f.report(records) for f in self.faults]
        report["side"] = {"error": self.side_error, "done_s": self.side_done_s, "restarted_s": self.restarted_s}
        return report
