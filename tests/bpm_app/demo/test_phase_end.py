"""When a demo's phase ends (`bpm_app.demo.run.Demo._phase`), against a demo that runs nothing:
phase 4 waits for what it is for, load of A, B or C reaching D, even when the allocation is
acceptable as D joins (the tour's phase 3 can end long before D's host is back, and by then
the loads may have settled within the thresholds)."""

from __future__ import annotations

import time
from types import SimpleNamespace

from bpm_app.demo.run import Demo


class _Demo:
    """What `_phase` reads of a demo: polls of a registry whose allocation is acceptable
    throughout and where a movement of B's task to D appears at the fifth poll."""

    _phase = Demo._phase
    _measured = Demo._measured
    _reached_joiner = staticmethod(Demo._reached_joiner)
    _faults_underway = Demo._faults_underway

    def __init__(self) -> None:
        self.s = SimpleNamespace(poll_s=0.001, phase_timeout_s=5.0)
        self.t0 = time.time()
        self.phases: list = []
        self.polls = 0
        self.said: list[str] = []

    def poll(self) -> dict:
        self.polls += 1
        moved = [{"origin": "c", "from": "c", "to": "d", "task_name": "g1"}] if self.polls >= 5 else []
        moved += [{"origin": "e", "from": "e", "to": "d", "task_name": "g0-1"}]  # E's piece: not the poster's load
        self.state = {"participants": [{"name": n, "load": 0.4, "threshold": 0.63} for n in "abcd"], "movements": moved}
        return self.state

    def _in_transit(self) -> set[str]:
        return set()

    def _steady_s(self) -> float:
        return 0.0

    def _past_warm_up(self, names) -> bool:
        return True

    def say(self, message: str) -> None:
        self.said.append(message)


def test_phase_4_ends_acceptable_only_once_load_of_a_b_or_c_has_reached_d():
    demo = _Demo()
    phase = demo._phase("4 D joins", list("abcd"), hold_s=0.0, after=demo._reached_joiner)
    assert phase.acceptable and demo.polls == 5, demo.polls
    early = _Demo()
    early._phase("4 D joins", list("abcd"), hold_s=0.0)
    assert early.polls == 1, "without it the phase ends at the first acceptable poll"


class _Striking(_Demo):
    """A registry whose allocation is never what the phase waits for, and a fault underway
    for the first `striking` polls."""

    def __init__(self, striking: int) -> None:
        super().__init__()
        self.s = SimpleNamespace(poll_s=0.01, phase_timeout_s=0.2)
        self.striking = striking

    def _faults_underway(self) -> bool:
        return self.polls <= self.striking


def _ran_for(demo: _Demo) -> float:
    started = time.monotonic()
    phase = demo._phase("3 load rises", list("abc"), until="overloaded", hold_s=0.0)
    assert not phase.overloaded
    return time.monotonic() - started


def test_a_phase_s_limit_does_not_run_while_a_fault_is_underway_for_up_to_the_limit_again():
    calm = _Striking(striking=0)
    calm_s = _ran_for(calm)
    assert 0.2 <= calm_s < 0.4, calm_s
    assert "ran out before it held overloaded" in calm.said[-1], calm.said[-1]
    struck = _Striking(striking=20)  # a fault underway for twenty polls (0.19 s at least): the limit runs that much longer
    assert calm_s + 0.12 <= _ran_for(struck) < 0.6
    endless = _Striking(striking=10**9)  # a fault underway throughout: twice the limit, no more
    assert 0.4 <= _ran_for(endless) < 0.6
