"""Splits and merges in the demo's live view, report and timeline, from the registry's lineage (no processes)."""

from __future__ import annotations

from rich.console import Console

from bpm.federation.views import regrains
from bpm_app.demo.report import plot_timeline
from bpm_app.demo.view import render

# a's task g0 (#1) split into g00-1 and g01-1 (#3, #4), whose halves merged back into g0-3 (#5); g1 (#2) as it was.
TASKS = [
    {"id": 1, "name": "g0", "origin": "a", "from_tasks": []},
    {"id": 2, "name": "g1", "origin": "a", "from_tasks": []},
    {"id": 3, "name": "g00-1", "origin": "a", "from_tasks": [1]},
    {"id": 4, "name": "g01-1", "origin": "a", "from_tasks": [1]},
    {"id": 5, "name": "g0-3", "origin": "a", "from_tasks": [4, 3]},
    {"id": 6, "name": "g1", "origin": "b", "from_tasks": []},
]


def test_the_lineage_tells_each_split_and_merge_in_the_order_made():
    assert regrains(TASKS) == [
        {"kind": "split", "origin": "a", "from": ["g0"], "made": ["g00-1", "g01-1"], "ids": [3, 4]},
        {"kind": "merge", "origin": "a", "from": ["g00-1", "g01-1"], "made": ["g0-3"], "ids": [5]},
    ]
    assert regrains([t for t in TASKS if not t["from_tasks"]]) == []
    # A task made from one the listing no longer holds is still told, by the id it came from.
    assert regrains(TASKS[2:4])[0]["from"] == ["#1"]


def test_the_live_view_and_the_timeline_mark_them(tmp_path):
    made = [{**r, "t": t} for r, t in zip(regrains(TASKS), (40.0, 90.0))]
    state = {"phase": "2", "t": 100.0, "participants": [{"name": "a", "status": "active", "load": 0.5, "threshold": 0.6, "hosted_tasks": [1, 2]}],
             "movements": [], "ledger": {"balances": []}, "registry": "http://127.0.0.2:8700", "regrains": made}
    console = Console(width=200, record=True)
    console.print(render(state))
    text = console.export_text()
    assert "splits: 1, merges: 1" in text and "a split g0 → g00-1+g01-1" in text and "a merge g00-1+g01-1 → g0-3" in text
    report = {"timeline": [{"t": t, "participant": "a", "load": 0.5, "threshold": 0.6} for t in (0.0, 50.0, 100.0)],
              "phases": [{"name": "1", "started_s": 0.0, "ended_s": 100.0, "acceptable": True, "overloaded": False}],
              "movements": [], "regrains": made, "lost_results": 0, "duplicate_results": 0}
    plot_timeline(report, tmp_path / "timeline.png")
    assert (tmp_path / "timeline.png").stat().st_size > 0


def test_the_timeline_marks_each_fault_of_the_tour_with_its_heal_and_failovers(tmp_path, monkeypatch):
    """The tour's registry cut, partition and crash each get a line on every panel and a name
    above the first, in rows of their own; a heal and a failover their own lines."""
    import bpm_app.demo.report as report_module

    faults = [
        {"participant": "d", "fault": "registry", "at_s": 318.0, "healed": {"at_s": 338.0}, "failovers": []},
        {"participant": "d", "fault": "cut", "at_s": 341.0, "healed": {"at_s": 371.0}, "failovers": [{"to": "e", "at_s": 345.4}]},
        {"participant": "d", "fault": "crash", "at_s": 421.0, "healed": None, "failovers": [{"to": "e", "at_s": 425.6}]},
    ]
    report = {"timeline": [{"t": t, "participant": p, "load": 0.5, "threshold": 0.6} for t in (0.0, 300.0, 500.0) for p in "de"],
              "phases": [{"name": "3", "started_s": 250.0, "ended_s": 450.0, "acceptable": False, "overloaded": True}],
              "movements": [], "faults": faults, "lost_results": 0, "duplicate_results": 0}
    marked = []
    real = report_module._mark_faults
    monkeypatch.setattr(report_module, "_mark_faults", lambda axes, f: marked.append((axes, real(axes, f))) or marked[-1][1])
    plot_timeline(report, tmp_path / "timeline.png")
    assert (tmp_path / "timeline.png").stat().st_size > 0
    axes, texts = marked[0]
    assert [t.get_text() for t in texts] == ["d's host is cut off from the registry", "d's host is cut off", "d's host crashes"]
    assert len({t.get_position()[1] for t in texts}) == 3, "each name in a row of its own"
    lines = {round(line.get_xdata()[0], 1) for ax in axes.flat for line in ax.get_lines() if line.get_linestyle() in ("-", "--", ":")
             and len(line.get_xdata()) == 2 and line.get_xdata()[0] == line.get_xdata()[1]}
    assert {318.0, 338.0, 341.0, 371.0, 345.4, 421.0, 425.6} <= lines
