"""`bpm demo --scenario split`: a task too large to move is split over its key groups, and a half moves.

1. A runs one task over its whole stream, with traffic heavy enough (`SPLIT_RATE`
   connections per second, replayed from outside A's host) to take it over its threshold
   on its own. B runs nothing. Participants have 0.2 CPU each (`SPLIT_CPUS`), and their one
   contract a narrow price range ([0.9 p, p], `SPLIT_SPREAD`). A cannot shed the task:
   moving all of it would save A less per unit than the contract's lowest price (its
   marginal cost falls steeply as the load leaves), so no offer pays ("lumpy",
   `bpm.negotiation.why_no_offer`).
2. A's agent, told what a running task costs whatever its input (`--fixed-cost`, from what
   `bpm bench fixed-cost` measured: `FIXED_COST_CPU_S`), splits the task in two over its
   key groups (`bpm.negotiation.choose_split`) at a window boundary: the old task
   completes the windows before it and retires, the halves take the rows from it on. A
   half is small enough to pay: A offers it and B takes it. The phase ends once the
   allocation has held after the move (`Demo._steady_s`); its verdict says whether that
   allocation is acceptable, which depends on what the halves measure where they run.
3. The input closes, every task drains, and the alerts of all three tasks (the one split
   and its halves, wherever they ran) are compared with the plain computation over what was
   fed: each window of each key group once.

The report adds `scenario` and, as every demo's, `regrains` (the split, from the registry's
lineage) and the movement of the half. The timeline marks the split on A's panel.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from bpm_app.demo.run import Demo, DemoSettings, Member

SPLIT_MEMBERS = (
    Member("a", 1, 1, 11),  # one share: one task over every key group of A's stream
    Member("b", 0, 0, 12),
)
SPLIT_CONTRACTS = {("a", "b"): 1.0}
# Participants of 0.2 CPU, and traffic that takes A's one task over A's threshold while a
# half of it fits at B, and that A's batches keep up with at a 10 s trigger: the rates tried
# are in docs/benchmarks.md, "Split scenario".
SPLIT_CPUS = 0.2
SPLIT_RATE = 2400.0
SPLIT_SPREAD = 0.1
# A threshold of 0.41 at the reference price (1 - sqrt(0.35)). With the fixed cost below, A's
# task splits where it measures from about 0.41 to 0.63 of A's capacity: above the price,
# its own saving below 0.9 p (above it, B refuses it whole, and A splits on the refusal),
# and a half small enough to leave A and B below their thresholds.
SPLIT_MM1_SCALE = 0.35
# What a running task costs per micro-batch whatever its input, in CPU seconds
# (`bpm bench fixed-cost`, docs/benchmarks.md): at a 10 s trigger 0.037 CPU, 0.185 of a
# 0.2-CPU participant (`bpm agent run --fixed-cost`).
FIXED_COST_CPU_S = 0.37
SPLIT_TRAFFIC_S = 600.0  # longer than the run: the replayer closes the input when the demo ends it


class SplitDemo(Demo):
    """The split scenario (see the module text) on the phases scenario's federation."""

    pairs = SPLIT_CONTRACTS
    members = SPLIT_MEMBERS

    def __init__(self, settings: DemoSettings, view: Callable[[dict], None] | None = None, say: Callable[[str], None] = print) -> None:
        super().__init__(dataclasses.replace(settings, rate=SPLIT_RATE, spread=SPLIT_SPREAD, mm1_scale=SPLIT_MM1_SCALE,
                                             traffic_s=SPLIT_TRAFFIC_S, cpus=settings.cpus and SPLIT_CPUS), view, say)

    def _replay_host(self, member: Member) -> str:
        """The registry's host, outside A's quota: the replayer's own CPU, counted in A's
        quota, would throttle A's task and raise the load A measures."""
        return self.fed.REGISTRY

    def _agent_settings(self, member: Member, contracts: bool = True) -> dict[str, object]:
        # In units of the participant's capacity: its quota, or without quotas its Spark's
        # parallelism (the demo's agents run `local[1]`: 1 CPU).
        fixed = FIXED_COST_CPU_S / self.s.trigger_s / (self.s.cpus or 1.0)
        return {**super()._agent_settings(member, contracts), "fixed_cost": round(fixed, 4)}

    def run(self) -> dict:
        s = self.s
        names = [m.name for m in self.members]
        try:
            self._start_registry()
            self._setup_first(list(self.members), measured=["a"])
            self._phase("1 A runs one task over its whole stream, too large to move", names, until=None, hold_s=0,
                        warm=names)
            self._phase("2 A splits the task over its key groups and sheds a half to B", names, until=None, hold_s=s.settle_s,
                        feeding=Split(self))
            report = self._finish()
            report["scenario"] = "split"
            return report
        finally:
            self.fed.close()


class Split:
    """What ends phase 2: a half of a task A split, in the registry's lineage, moved to B
    (`Demo._phase` reads `reached` as it reads a phase's feeding). An acceptable allocation
    alone would not do: A's load can dip below its threshold while it runs the halves,
    before one moves."""

    def __init__(self, demo: Demo) -> None:
        self.demo = demo
        self.reached = False

    def poll(self, now: float, held: bool = True) -> None:
        state = self.demo.state
        halves = {name for r in state["regrains"] if r["kind"] == "split" and r["origin"] == "a" for name in r["made"]}
        self.reached = self.reached or any(m["task_name"] in halves and m["from"] == "a" and m["to"] == "b" for m in state["movements"])
