"""What the poster's phases promise, checked against a run's report: one rule for the tests,
the demo series' pass criterion (`scripts/demo-series.py`) and anyone reading a report.

The promises, read from the participants' own loads at each phase's end: phases 1, 2 and 4
end acceptable and phase 3 overloaded; A ends phase 2 within its threshold, having shed load
during it; the load of A, B and C reaches D, and only once D has joined (phase 4); nothing
is lost or duplicated, and what one participant pays the other earns.
"""

from __future__ import annotations

import math

from bpm.clock import seconds
from bpm.negotiation import is_acceptable

POSTER = ("a", "b", "c")
JOINS = "d"
PROMISED_ENDS = ("acceptable", "acceptable", "overloaded", "acceptable")  # phases 1 to 4


def _acceptable(phase: dict) -> bool:
    loads, thresholds = phase["loads"], phase["thresholds"]
    return bool(loads) and set(loads) == set(thresholds) and is_acceptable([loads[n] for n in thresholds], list(thresholds.values()))


def _overloaded(phase: dict) -> bool:
    return bool(phase["loads"]) and sum(phase["loads"].values()) > sum(phase["thresholds"].values())


def kept(phase: dict, promise: str | None) -> bool | None:
    """Whether `phase` (a report's entry) ended as it promised ("acceptable" or
    "overloaded", read from its loads); None when it promised nothing."""
    if promise is None:
        return None
    return _overloaded(phase) if promise == "overloaded" else _acceptable(phase)


def verdict(phase: dict) -> str:
    """How a phase ended, in a word or two, from its report entry: overloaded (the loads above
    the thresholds' total, whatever else), acceptable, or not acceptable."""
    return "overloaded" if phase.get("overloaded") else "acceptable" if phase["acceptable"] else "not acceptable"


def promised_ends(report: dict) -> list[str | None]:
    """How each phase of `report` promised to end ("acceptable" or "overloaded"): the
    poster's promises when the run played its four phases; None for a phase of any other
    scenario, which promises nothing of the state it ends in."""
    phases = report["phases"]
    if [p["name"][:1] for p in phases] == ["1", "2", "3", "4"]:
        return list(PROMISED_ENDS)
    return [None] * len(phases)


def phase_ending(phase: dict, promise: str | None) -> str:
    """How a phase ended and, when it promised an end, whether it kept it: "acceptable, as
    promised" or "acceptable, not overloaded as promised", for a person reading a run."""
    held = kept(phase, promise)
    if held is None:
        return verdict(phase)
    return f"{verdict(phase)}, as promised" if held else f"{verdict(phase)}, not {promise} as promised"


def _fmt(phase: dict) -> str:
    return ", ".join(f"{n} {phase['loads'][n]:.2f}/{phase['thresholds'].get(n, math.nan):.2f}" for n in sorted(phase["loads"]))


def to_joiner(movements: list[dict]) -> list[dict]:
    """The movements of A's, B's or C's load to or from D (the poster's phase 4)."""
    return [m for m in movements if m["origin"] in POSTER and JOINS in (m["from"], m["to"])]


def misses(report: dict) -> list[str]:
    """What a demo's run (`bpm demo --json`'s report, any scenario) promised and did not keep:
    the poster's promises when it played the four phases (the phases scenario, the tour),
    and in any scenario every result once; empty when it kept every one."""
    if [p["name"][:1] for p in report["phases"]] == ["1", "2", "3", "4"]:
        return poster_misses(report)
    if report["lost_results"] or report["duplicate_results"]:
        return [f"{report['lost_results']} results lost, {report['duplicate_results']} duplicated"]
    return []


def poster_misses(report: dict) -> list[str]:
    """The poster's promises `report` (a demo's, `bpm demo --json`) does not keep, each as a
    sentence; empty when it keeps every one."""
    phases = report["phases"]
    if [p["name"][0] for p in phases] != ["1", "2", "3", "4"]:
        return [f"the run did not play the four phases: {[p['name'] for p in phases]}"]
    one, two, three, four = phases
    misses = []
    for phase, names in ((one, POSTER), (two, POSTER), (three, POSTER), (four, (*POSTER, JOINS))):
        if set(phase["loads"]) != set(names):
            misses.append(f"phase {phase['name'][0]} measured {sorted(phase['loads'])}, not {list(names)}")
    for phase, promise in zip(phases, PROMISED_ENDS):
        if not kept(phase, promise):
            misses.append(f"phase {phase['name'][0]} ended not {promise} (load/threshold: {_fmt(phase)})")
    if "a" in two["loads"] and two["loads"]["a"] > two["thresholds"]["a"]:
        misses.append(f"A ended phase 2 over its threshold ({_fmt(two)})")
    t0 = seconds(report["started_at"])
    movements = report["movements"]

    def during(m: dict, phase: dict) -> bool:
        return phase["started_s"] <= seconds(m["started_at"]) - t0 <= phase["ended_s"]

    if not any(m["from"] == "a" and during(m, two) for m in movements):
        misses.append("A shed no load in phase 2")
    to_d = to_joiner(movements)
    if not to_d:
        misses.append("no load of A, B or C reached D")
    early = [m for m in to_d if seconds(m["started_at"]) - t0 < four["started_s"]]
    if early:
        misses.append(f"D traded load of A, B or C before it joined: {early}")
    if report["expected_results"] <= 0:
        misses.append("the input raised no alert to compare")
    if report["lost_results"] or report["duplicate_results"]:
        misses.append(f"{report['lost_results']} results lost, {report['duplicate_results']} duplicated")
    payments = report["payments"]
    if not math.isclose(payments["total_paid"], payments["total_earned"], rel_tol=1e-6, abs_tol=1e-6):
        misses.append(f"paid {payments['total_paid']} but earned {payments['total_earned']}")
    return misses
