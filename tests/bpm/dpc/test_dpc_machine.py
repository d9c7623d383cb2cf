"""DPC stepped without a clock: on time, late, cut off, healed, and a property over random partitions."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bpm.dpc import Alerts, CorrelatedRow, CorrelatedView, Correlator, Ignored, Members, Publish, Tick, correlate

W = (0, 60)
ABC = frozenset("abc")


def published(instructions):
    return [i for i in instructions if isinstance(i, Publish)]


def test_a_window_whose_alerts_all_arrive_in_time_is_published_stable_once():
    m = Correlator(ABC, bound_s=10)
    assert m.handle(Alerts("a", W, frozenset({"s"}), at=100)) == []
    assert m.handle(Alerts("b", W, frozenset({"s"}), at=101)) == []
    (p,) = m.handle(Alerts("c", W, frozenset(), at=102))
    assert (p.version, p.stable, p.missing, p.due_at, p.at) == (1, True, (), 100, 102)
    assert p.added == (CorrelatedRow(0, 60, "s", ("a", "b")),)
    assert m.handle(Tick(200)) == []
    assert isinstance(m.handle(Alerts("c", W, frozenset({"s"}), at=201))[0], Ignored)


def test_missing_alerts_make_the_window_tentative_at_the_bound_then_a_correction_makes_it_stable():
    m = Correlator(ABC, bound_s=10)
    m.handle(Alerts("a", W, frozenset({"s", "t"}), at=100))
    m.handle(Alerts("b", W, frozenset({"t"}), at=100.5))
    assert m.handle(Tick(109.9)) == []
    (tentative,) = m.handle(Tick(110))
    assert (tentative.version, tentative.stable, tentative.missing) == (1, False, ("c",))
    assert tentative.added == (CorrelatedRow(0, 60, "t", ("a", "b")),)
    assert m.handle(Tick(120)) == []  # published once; waits for c
    (stable,) = m.handle(Alerts("c", W, frozenset({"s", "t"}), at=140))
    assert (stable.version, stable.stable) == (2, True)
    assert stable.retracted == (CorrelatedRow(0, 60, "t", ("a", "b")),)
    assert set(stable.added) == {CorrelatedRow(0, 60, "s", ("a", "c")), CorrelatedRow(0, 60, "t", ("a", "b", "c"))}
    view = CorrelatedView()
    assert view.apply(tentative) and view.apply(stable)
    assert not view.apply(stable)  # a redelivery changes nothing
    assert view.stable_rows() == correlate(W, {"a": {"s", "t"}, "b": {"t"}, "c": {"s", "t"}})


def test_a_tentative_window_is_corrected_again_when_some_but_not_all_missing_alerts_arrive():
    m = Correlator(frozenset("abcd"), bound_s=5)
    m.handle(Alerts("a", W, frozenset({"s"}), at=0))
    m.handle(Tick(5))
    (again,) = m.handle(Alerts("b", W, frozenset({"s"}), at=8))
    assert (again.version, again.stable, again.missing) == (2, False, ("c", "d"))
    assert m.handle(Alerts("c", W, frozenset(), at=9)) == []  # rows unchanged: no new version
    (stable,) = m.handle(Alerts("d", W, frozenset(), at=9.5))
    assert (stable.version, stable.stable, stable.added, stable.retracted) == (3, True, (), ())


def test_strangers_and_partners_that_left_are_not_waited_for():
    m = Correlator(ABC, bound_s=10)
    assert isinstance(m.handle(Alerts("x", W, frozenset({"s"}), at=0))[0], Ignored)
    m.handle(Alerts("a", W, frozenset({"s"}), at=1))
    m.handle(Alerts("b", W, frozenset({"s"}), at=2))
    (p,) = m.handle(Members(frozenset("ab"), at=3))
    assert p.stable and p.added == (CorrelatedRow(0, 60, "s", ("a", "b")),)


def test_a_view_refuses_a_gap_in_versions():
    m = Correlator(ABC, bound_s=0)
    m.handle(Alerts("a", W, frozenset({"s"}), at=0))
    m.handle(Tick(0))
    (p,) = m.handle(Alerts("b", W, frozenset({"s"}), at=1))
    with pytest.raises(ValueError, match="version 2 after 0"):
        CorrelatedView().apply(p)


SOURCES = st.frozensets(st.sampled_from(["s1", "s2", "s3", "s4"]), max_size=4)


@settings(max_examples=200, deadline=None)
@given(
    alerts=st.lists(st.tuples(SOURCES, SOURCES, SOURCES), min_size=1, max_size=6),
    lag=st.lists(st.floats(0, 3), min_size=18, max_size=18),
    cut=st.sampled_from(["a", "b", "c"]),
    cut_from=st.floats(0, 300),
    cut_s=st.sampled_from([0.0, 5.0, 15.0, 30.0, 60.0]),
    bound_s=st.sampled_from([2.0, 10.0]),
)
def test_stable_output_is_the_plain_correlation_and_first_results_keep_the_bound(alerts, lag, cut, cut_from, cut_s, bound_s):
    """Windows close every 60 s; alerts arrive after a small lag, a cut-off participant's only when it heals."""
    m = Correlator(ABC, bound_s=bound_s)
    view = CorrelatedView()
    arrivals = []
    for i, sets in enumerate(alerts):
        window = (i * 60, i * 60 + 60)
        close = window[1] + 1.0
        for j, (p, sources) in enumerate(zip("abc", sets)):
            at = close + lag[(3 * i + j) % len(lag)]
            if p == cut and cut_from <= at < cut_from + cut_s:
                at = cut_from + cut_s
            arrivals.append((at, p, window, sources))
    arrivals.sort()
    first: dict = {}
    due: dict = {}
    late_windows = set()
    events = [(at, Alerts(p, w, s, at)) for at, p, w, s in arrivals]
    end = arrivals[-1][0] + bound_s + 1
    events += [(t / 4, Tick(t / 4)) for t in range(int(end * 4) + 1)]
    events.sort(key=lambda e: (e[0], isinstance(e[1], Tick)))
    for at, event in events:
        for p in published(m.handle(event)):
            view.apply(p)
            first.setdefault(p.window, p.at)
            due[p.window] = p.due_at
            if not p.stable:
                late_windows.add(p.window)
    expected = set()
    for i, sets in enumerate(alerts):
        expected |= correlate((i * 60, i * 60 + 60), dict(zip("abc", sets)))
    assert view.stable_rows() == expected
    assert view.tentative_windows() == set()
    for window, at in first.items():
        assert at <= due[window] + bound_s + 0.25
    for window in late_windows:  # tentative only where some alerts came later than the bound
        latest = max(at for at, _, w, _ in arrivals if w == window)
        assert latest > due[window] + bound_s


def test_windows_before_a_participant_began_sharing_do_not_wait_for_it():
    m = Correlator(ABC, bound_s=10)
    m.handle(Alerts("a", W, frozenset({"s"}), at=0))
    m.handle(Alerts("b", W, frozenset({"s"}), at=0))
    (tentative,) = m.handle(Tick(10))
    assert tentative.missing == ("c",)
    later = (60, 120)
    (stable, nothing_yet) = m.handle(Alerts("c", later, frozenset(), at=11)) + [None]
    assert nothing_yet is None and stable.window == W and stable.stable, "c's first window is after W: W needs a and b only"
    assert m.handle(Alerts("a", later, frozenset({"s"}), at=12)) == [], "from c's first window on, c's alerts count"
    (p,) = m.handle(Alerts("b", later, frozenset({"s"}), at=12))
    assert p.stable and p.added == (CorrelatedRow(60, 120, "s", ("a", "b")),)


def test_a_participant_that_has_shared_nothing_yet_is_waited_for_and_its_late_first_window_counts():
    """c's tasks are slow to close their first window: W is tentative at the bound, not stable
    without c, and c's alerts for W, when they come, make it stable with them."""
    m = Correlator(ABC, bound_s=10)
    m.handle(Alerts("a", W, frozenset({"s"}), at=0))
    m.handle(Alerts("b", W, frozenset({"t"}), at=1))
    (p,) = m.handle(Tick(10))
    assert not p.stable and p.missing == ("c",) and p.added == ()
    (q,) = m.handle(Alerts("c", W, frozenset({"s", "t"}), at=30))
    assert q.stable and set(q.added) == {CorrelatedRow(0, 60, "s", ("a", "c")), CorrelatedRow(0, 60, "t", ("b", "c"))}


def test_alerts_that_would_open_a_window_too_many_are_ignored():
    m = Correlator(ABC, bound_s=10, max_open=2)
    m.handle(Alerts("a", (0, 60), frozenset(), at=0))
    m.handle(Alerts("a", (60, 120), frozenset(), at=0))
    (ignored,) = m.handle(Alerts("b", (120, 180), frozenset(), at=0))
    assert isinstance(ignored, Ignored) and "2 windows are open" in ignored.why and len(m.open) == 2


SW, TW = (0, 60), (60, 120)  # stable before the restart; tentative at it


def run_until_restart(bound_s=10):
    """a, b and c close SW on time; then c is cut off: TW is tentative at the bound. Returns what was published."""
    m = Correlator(ABC, bound_s=bound_s)
    out = []
    for event in (Alerts("a", SW, frozenset({"u"}), 60), Alerts("b", SW, frozenset({"u"}), 60), Alerts("c", SW, frozenset(), 61),
                  Alerts("a", TW, frozenset({"s", "t"}), 120), Alerts("b", TW, frozenset({"t"}), 120.5), Tick(130)):
        out += published(m.handle(event))
    assert [(p.window, p.version, p.stable) for p in out] == [(SW, 1, True), (TW, 1, False)]
    return out


def test_a_restarted_correlator_resumes_from_what_it_published_and_publishes_only_what_changed():
    before = run_until_restart()
    m = Correlator(ABC, bound_s=10)
    m.resume(before, at=500)
    view = CorrelatedView()
    for p in before:
        view.apply(p)
    # Every source's alerts are read again from the start; c's for TW now arrive too.
    again = []
    for event in (Alerts("a", SW, frozenset({"u"}), 501), Alerts("a", TW, frozenset({"s", "t"}), 501),
                  Alerts("b", SW, frozenset({"u"}), 502), Alerts("b", TW, frozenset({"t"}), 502), Alerts("c", SW, frozenset(), 502)):
        again += m.handle(event)
    assert published(again) == [], "nothing new: the stable window is ignored, the tentative one waits"
    assert all(i.why == "the window is stable" for i in again if i.window == SW)
    (stable,) = published(m.handle(Alerts("c", TW, frozenset({"s"}), 503)))
    assert (stable.window, stable.version, stable.stable) == (TW, 2, True), "the next version, not a new first one"
    assert view.apply(stable)
    assert view.stable_rows() == correlate(SW, {"a": {"u"}, "b": {"u"}, "c": set()}) | correlate(TW, {"a": {"s", "t"}, "b": {"t"}, "c": {"s"}})


def test_a_resumed_tentative_window_is_corrected_only_after_the_bound_while_its_alerts_are_read_again():
    before = run_until_restart()
    m = Correlator(ABC, bound_s=10)
    m.resume(before, at=500)
    assert m.next_due() == 510
    # Only a's alerts have come again by the bound: b's are still on their way.
    assert published(m.handle(Alerts("a", TW, frozenset({"s", "t"}), 501))) == []
    assert published(m.handle(Tick(509))) == []
    (fix,) = published(m.handle(Tick(510)))  # from a's alone the rows differ: a tentative correction, once
    assert (fix.version, fix.stable, fix.retracted) == (2, False, (CorrelatedRow(60, 120, "t", ("a", "b")),))
    (back,) = published(m.handle(Alerts("b", TW, frozenset({"t"}), 511)))  # then corrected as usual
    assert (back.version, back.stable, back.added) == (3, False, (CorrelatedRow(60, 120, "t", ("a", "b")),))


def test_alerts_for_a_stable_window_no_longer_remembered_are_ignored():
    m = Correlator(frozenset("ab"), bound_s=10, keep_stable=2)
    for i in range(4):
        window = (i * 60, i * 60 + 60)
        m.handle(Alerts("a", window, frozenset({"s"}), i))
        m.handle(Alerts("b", window, frozenset({"s"}), i))
    assert sorted(m.stable) == [(120, 180), (180, 240)] and m.forgotten == (60, 120)
    (ignored,) = m.handle(Alerts("a", (0, 60), frozenset({"s"}), 10))
    assert isinstance(ignored, Ignored) and (0, 60) not in m.open
