"""What `bpm demo` prints with its live view when its output is a file or a pipe, with the run itself faked."""

from __future__ import annotations

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
