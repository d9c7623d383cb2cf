"""What `bpm demo` prints with its live view when its output is a file or a pipe, and how it exits, with the run itself faked."""

from __future__ import annotations

import json

from rich.text import Text
from typer.testing import CliRunner

import bpm_app.demo.report
import bpm_app.demo.run
import bpm_app.demo.view
from bpm_app.cli import app


class FakeDemo:
    t0 = 0.0

    def __init__(self, settings, view=None, say=None):
        self.view, self.say = view, say

    def run(self) -> dict:
        self.view(None)
        self.say("agents up")
        return {"phases": [], "movements": [], "lost_results": 0, "duplicate_results": 0}


def test_to_a_file_the_view_s_last_state_and_the_report_line_are_lines_of_their_own(tmp_path, monkeypatch):
    monkeypatch.setattr(bpm_app.demo.run, "Demo", FakeDemo)
    monkeypatch.setattr(bpm_app.demo.view, "render", lambda state: Text("admin UI: http://10.0.0.1:8700/"))
    monkeypatch.setattr(bpm_app.demo.report, "write_report", lambda report, folder, t0: folder)
    result = CliRunner().invoke(app, ["demo", "--workdir", str(tmp_path / "run"), "--report", str(tmp_path / "report")])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert "admin UI: http://10.0.0.1:8700/" in lines, lines
    assert any(line.startswith("report: ") for line in lines), lines
    assert any(line.endswith("s  agents up") for line in lines), lines


def _phase(number: int, loads: dict[str, float], started_s: float) -> dict:
    return {"name": f"{number} phase", "loads": loads, "thresholds": dict.fromkeys(loads, 0.6), "started_s": started_s, "ended_s": started_s + 10,
            "acceptable": max(loads.values()) <= 0.6, "overloaded": sum(loads.values()) > 0.6 * len(loads)}


def _run_of(report: dict):
    class Run(FakeDemo):
        def run(self) -> dict:
            return report

    return Run


def _poster(phase_3: dict[str, float]) -> dict:
    """A report of the four phases that keeps every promise but phase 3's, whose loads are `phase_3`."""
    def moved(origin: str, to: str, at_s: float) -> dict:
        return {"origin": origin, "from": origin, "to": to, "started_at": f"2026-01-01T00:00:{at_s:02.0f}Z"}

    low = {"a": 0.3, "b": 0.3, "c": 0.3}
    return {"phases": [_phase(1, low, 0), _phase(2, low, 10), _phase(3, phase_3, 20), _phase(4, {**low, "d": 0.3}, 30)],
            "started_at": "2026-01-01T00:00:00Z", "movements": [moved("a", "b", 15), moved("c", "d", 35)],
            "expected_results": 10, "lost_results": 0, "duplicate_results": 0, "payments": {"total_paid": 1.0, "total_earned": 1.0}}


def test_a_run_that_misses_a_promise_exits_1_and_says_which(tmp_path, monkeypatch):
    monkeypatch.setattr(bpm_app.demo.report, "write_report", lambda report, folder, t0: folder)
    args = ["demo", "--headless", "--workdir", str(tmp_path / "run"), "--report", str(tmp_path / "report")]
    monkeypatch.setattr(bpm_app.demo.run, "Demo", _run_of(_poster({"a": 0.7, "b": 0.7, "c": 0.7})))
    kept = CliRunner().invoke(app, args)
    assert kept.exit_code == 0 and "missed" not in kept.output, kept.output
    assert "  3 phase: overloaded, as promised" in kept.stdout.splitlines(), kept.stdout

    monkeypatch.setattr(bpm_app.demo.run, "Demo", _run_of(_poster({"a": 0.5, "b": 0.5, "c": 0.5})))
    missed = CliRunner().invoke(app, args)
    assert missed.exit_code == 1 and "missed: phase 3 ended not overloaded" in missed.output, missed.output
    # the summary says which phases kept their promise, not only the state each ended in
    assert [line for line in missed.stdout.splitlines() if " phase: " in line] == [
        "  1 phase: acceptable, as promised", "  2 phase: acceptable, as promised",
        "  3 phase: acceptable, not overloaded as promised", "  4 phase: acceptable, as promised"], missed.stdout
    as_json = CliRunner().invoke(app, [*args, "--json"])
    assert as_json.exit_code == 1
    report = json.loads(as_json.stdout.splitlines()[-1])
    assert len(report["misses"]) == 1 and report["misses"][0].startswith("phase 3 ended not overloaded"), report["misses"]

    monkeypatch.setattr(bpm_app.demo.run, "Demo", _run_of({"phases": [], "movements": [], "lost_results": 2, "duplicate_results": 0}))
    lost = CliRunner().invoke(app, [*args, "--json"])
    assert lost.exit_code == 1 and json.loads(lost.stdout.splitlines()[-1])["misses"] == ["2 results lost, 0 duplicated"]
