"""`bpm demo --scenario split`: a task too large to move is split over its key groups, and a half moves.

1. A runs one task over its whole stream, with traffic heavy enough (`SPLIT_RATE`
   connections per second) to take it over its threshold on its own. B runs nothing. Their
   one contract has a narrow price range ([0.9 p, p], `SPLIT_SPREAD`). A cannot shed the
   task: moving all of it would save A less per unit than the contract's lowest price (its
   marginal cost falls steeply as the load leaves), so no offer pays ("lumpy",
   `bpm.negotiation.why_no_offer`).
2. A's agent, told what a running task costs whatever its input (`--fixed-cost`,
   `SPLIT_FIXED_COST`: what `bpm bench fixed-cost` measured for a 0.4-CPU participant at a
   10 s trigger), splits the task in two over its key groups (`bpm.negotiation.choose_split`)
   at a window boundary: the old task completes the windows before it and retires, the
   halves take the rows from it on. One half is small enough to pay: A offers it, B takes
   it, and the allocation is acceptable.
3. The input closes, every task drains, and the alerts of all three tasks (the one split
   and its halves, wherever they ran) are compared with the plain computation over what was
   fed: each window of each key group once.

The report adds `scenario` and, as every demo's, `regrains` (the split, from the registry's
lineage) and the movement of the half. The timeline marks the split on A's panel.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from bpm.federation.views import AgreedTerms
from bpm_app.demo.run import Demo, DemoSettings, Member

SPLIT_MEMBERS = (
    Member("a", 1, 1, 11),  # one share: one task over every key group of A's stream
    Member("b", 0, 0, 12),
)
SPLIT_CONTRACTS = {("a", "b"): 1.0}
# About 0.6 of a 0.4-CPU participant for one task at a 10 s trigger, by the per-row and
# per-batch costs `bpm bench fixed-cost` measured (docs/benchmarks.md, "Fixed cost of a task").
SPLIT_RATE = 1200.0
SPLIT_SPREAD = 0.1
# A threshold of 0.55 at the reference price (1 - sqrt(0.2)). A's task is lumpy from about
# 0.45 to 0.75 of its capacity (its own saving below 0.9 p, a half's above); larger, B
# refuses it whole (it would pass its threshold), and A splits on the refusal. Either way
# each half fits at B with both below their thresholds.
SPLIT_MM1_SCALE = 0.2
SPLIT_FIXED_COST = 0.09
SPLIT_TRAFFIC_S = 900.0  # longer than the run: the replayer closes the input when the demo ends it


class SplitDemo(Demo):
    """The split scenario (see the module text) on the phases scenario's federation."""

    pairs = SPLIT_CONTRACTS

    def __init__(self, settings: DemoSettings, view: Callable[[dict], None] | None = None, say: Callable[[str], None] = print) -> None:
        super().__init__(dataclasses.replace(settings, rate=SPLIT_RATE, spread=SPLIT_SPREAD, mm1_scale=SPLIT_MM1_SCALE,
                                             traffic_s=SPLIT_TRAFFIC_S), view, say)
        self.members = SPLIT_MEMBERS
        self._members = {m.name: m for m in self.members}

    def _agent_settings(self, member: Member, contracts: bool = True) -> dict[str, object]:
        return {**super()._agent_settings(member, contracts), "fixed_cost": SPLIT_FIXED_COST}

    def run(self) -> dict:
        s = self.s
        names = [m.name for m in self.members]
        try:
            self._open_hosts()
            self.fed.start_registry()
            self.say(f"registry on {self.fed.registry_url} (admin UI at {self.fed.registry_url}/, operator key {self.fed.admin_key})")
            self._setup_first(list(self.members), measured=["a"])
            self._phase("1 A's one task takes it over its threshold, and is too large to move", names, until=None, hold_s=0,
                        not_before=self._trading_from(names))
            self._phase("2 A splits the task over its key groups and sheds a half to B", names, hold_s=s.settle_s,
                        feeding=Split(self))
            report = self._finish()
            report["scenario"] = "split"
            return report
        finally:
            self.fed.close()


class Split:
    """What phase 2 needs besides an acceptable allocation: a split of A's, in the registry's
    lineage (`Demo._phase` reads `reached` as it reads a phase's feeding)."""

    def __init__(self, demo: Demo) -> None:
        self.demo = demo
        self.reached = False

    def poll(self, now: float) -> None:
        self.reached = self.reached or any(r["kind"] == "split" and r["origin"] == "a" for r in self.demo.state["regrains"])
