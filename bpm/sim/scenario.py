"""The Borealis demonstration's load-management scenario (the poster in shared/seeds), in four phases.

1. Three participants A, B, C with identical contracts and uneven load, all below
   their thresholds: the allocation is already acceptable, nothing moves.
2. A's load rises past its threshold: A sheds load to its partners B and C until the
   allocation is acceptable again.
3. B's load rises: the total exceeds the three thresholds (system overload); load
   moves until no participant is below its threshold.
4. D joins with one contract, with C, at 0.8 p: load flows from C to D and from B to
   C until the allocation is acceptable.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from bpm.costs import MM1Cost
from bpm.negotiation import DEFAULT_HYSTERESIS, Task
from bpm.sim.federation import Event, Federation

PRICE = 1.0
THRESHOLD = 0.8
TASK_LOAD = 0.025
PRICE_RANGE = 0.2


@dataclass
class PhaseReport:
    """What one phase did, for the readable account and `--json`."""

    title: str
    rounds: int
    acceptable: bool
    overloaded: bool
    events: list[Event] = field(default_factory=list)
    participants: list[dict] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {
            "title": self.title,
            "rounds": self.rounds,
            "acceptable": self.acceptable,
            "overloaded": self.overloaded,
            "events": [_event_dict(e) for e in self.events],
            "participants": self.participants,
        }


def _event_dict(e: Event) -> dict:
    return {k: getattr(e, k) for k in e.__dataclass_fields__}


def _tasks(prefix: str, load: float, start: int = 0) -> list[Task]:
    n = round(load / TASK_LOAD)
    return [Task(f"{prefix}{start + k}", TASK_LOAD, prefix.upper()) for k in range(n)]


def _snapshot(fed: Federation) -> list[dict]:
    paid, earned = fed.payments()
    out = []
    for i, p in enumerate(fed.participants):
        out.append(
            {
                "name": p.name,
                "load": p.load,
                "threshold": p.threshold,
                "marginal_cost": p.cost.marginal(p.load),
                "own_tasks_at_home": len(p.home),
                "hosted_movements": len(p.movements_in),
                "paid": float(paid[i]),
                "earned": float(earned[i]),
            }
        )
    return out


def run_poster(*, hysteresis: float = DEFAULT_HYSTERESIS, seed: int = 0, max_rounds: int = 200) -> list[PhaseReport]:
    """Play the four phases; each runs until the federation is stable."""
    fed = Federation(hysteresis=hysteresis, seed=seed, record=True)
    lo, hi = PRICE * (1 - PRICE_RANGE / 2), PRICE * (1 + PRICE_RANGE / 2)
    for name in "ABC":
        fed.add_participant(name, MM1Cost.with_threshold(THRESHOLD, PRICE), THRESHOLD)
    for a, b in (("A", "B"), ("A", "C"), ("B", "C")):
        fed.add_contract(a, b, lo, hi)
    fed.add_tasks("A", _tasks("a", 0.7))
    fed.add_tasks("B", _tasks("b", 0.4))
    fed.add_tasks("C", _tasks("c", 0.3))

    reports: list[PhaseReport] = []

    def phase(title: str) -> None:
        seen = len(fed.events)
        start = fed.rounds
        fed.run(max_rounds=max_rounds)
        loads, thresholds = fed.loads(), fed.thresholds()
        reports.append(
            PhaseReport(
                title=title,
                rounds=fed.rounds - start,
                acceptable=fed.acceptable(),
                overloaded=bool(loads.sum() > thresholds.sum()),
                events=fed.events[seen:],
                participants=_snapshot(fed),
            )
        )

    phase("1. Three participants with identical contracts and uneven load")
    fed.add_tasks("A", _tasks("a", 0.6, start=100))
    phase("2. A becomes overloaded and sheds load to B and C")
    fed.add_tasks("B", _tasks("b", 0.8, start=100))
    phase("3. Load rises at B: system overload")
    fed.add_participant("D", MM1Cost.with_threshold(THRESHOLD, PRICE), THRESHOLD)
    fed.add_contract("C", "D", 0.8 * lo, 0.8 * hi)
    phase("4. D joins with a contract with C at 0.8 p")
    return reports
