"""The partition scenario's account of the correlated result, from versions as its correlator published them (no processes)."""

from __future__ import annotations

from bpm.dpc import Alerts, Correlator, Publish, Tick
from bpm_app.demo.failover import correlation_figures, describe_correlation
from bpm_app.demo.report import plot_correlation

W1, W2 = (0, 10), (10, 20)
SHARED = {"a": {W1: frozenset({"s"}), W2: frozenset({"s", "t"})}, "b": {W1: frozenset({"s"}), W2: frozenset({"t"})},
          "c": {W2: frozenset()}}  # c began sharing at W2


def published(t0=1000.0):
    """W1 on time; W2 waits for b (cut off from 1015 to 1040), tentative at the bound, stable after the heal."""
    m = Correlator(frozenset("abc"), bound_s=10)
    out = []
    for event in (Alerts("a", W1, SHARED["a"][W1], t0 + 11), Alerts("b", W1, SHARED["b"][W1], t0 + 11.5), Alerts("c", W2, frozenset(), t0 + 21),
                  Alerts("a", W2, SHARED["a"][W2], t0 + 21), Tick(t0 + 31), Alerts("b", W2, SHARED["b"][W2], t0 + 40.5)):
        out += [i for i in m.handle(event) if isinstance(i, Publish)]
    return out


def test_figures_say_what_was_tentative_how_late_and_that_stable_equals_the_plain_correlation(tmp_path):
    c = correlation_figures(published(), SHARED, 10.0, t0=1000.0, healed_at=1040.0)
    assert (c["windows"], c["stable_windows"], c["versions"], c["tentative_windows"]) == (2, 2, 3, 1)
    assert c["tentative_rows"] == 0 and c["stable_rows"] == 2  # W1: s at a and b; W2: t at a and b (s only at a)
    assert c["max_first_result_delay_s"] == 10.0 and c["stabilisation_s"] == 0.5
    assert c["stable_equals_plain"] and c["mismatched_windows"] == []
    assert [p["tentative_rows"] for p in c["series"]] == [0, 0, 0]
    assert "1 windows were tentative" in describe_correlation(c)
    report = {"correlation": c, "killed": {"at_s": 15.0}, "healed": {"at_s": 40.0}}
    plot_correlation(report, tmp_path / "correlation.png")
    assert (tmp_path / "correlation.png").stat().st_size > 0


def test_a_window_whose_stable_rows_differ_from_the_plain_correlation_is_named():
    wrong = {**SHARED, "c": {W2: frozenset({"s"})}}  # as if c had shared an alert the correlator never took in
    c = correlation_figures(published(), wrong, 10.0, t0=1000.0, healed_at=1040.0)
    assert not c["stable_equals_plain"] and c["mismatched_windows"] == [[10, 20]]
    pending = correlation_figures(published()[:1], SHARED, 10.0, t0=1000.0, healed_at=None)
    assert not pending["stable_equals_plain"] and pending["windows_not_stable"] == [[10, 20]] and pending["stabilisation_s"] is None
