"""`bpm demo --workdir`: an earlier run's folder is emptied for the next run; no other folder is touched."""

from __future__ import annotations

from typer.testing import CliRunner

from bpm_app.cli import app
from bpm_app.commands.demo import RUN_MARK, prepare_workdir

runner = CliRunner()


def said(result) -> str:
    """The command's output as one line (the console wraps long messages)."""
    return " ".join(result.output.split())


def test_a_folder_the_demo_did_not_make_is_refused_and_kept(tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "thesis.tex").write_text("years of work")
    result = runner.invoke(app, ["demo", "--headless", "--workdir", str(mine), "--report", str(tmp_path / "report")])
    assert result.exit_code == 2, result.output
    assert "no earlier `bpm demo` run made" in said(result)
    assert (mine / "thesis.tex").read_text() == "years of work" and not (mine / RUN_MARK).exists()


def test_an_earlier_runs_folder_is_emptied_and_a_new_or_empty_one_marked(tmp_path):
    run = tmp_path / "run"
    prepare_workdir(run)
    assert (run / RUN_MARK).exists()
    (run / "logs").mkdir()
    (run / "logs" / "a.log").write_text("old")
    prepare_workdir(run)
    assert sorted(p.name for p in run.iterdir()) == [RUN_MARK]
    empty = tmp_path / "empty"
    empty.mkdir()
    prepare_workdir(empty)
    assert (empty / RUN_MARK).exists()


def test_a_file_is_refused(tmp_path):
    path = tmp_path / "file"
    path.write_text("x")
    result = runner.invoke(app, ["demo", "--headless", "--workdir", str(path)])
    assert result.exit_code == 2 and "is a file, not a folder" in said(result) and path.read_text() == "x"


def test_an_unknown_scenario_is_refused_and_help_lists_them():
    result = runner.invoke(app, ["demo", "--scenario", "flood"])
    assert result.exit_code == 2
    assert "phases" in runner.invoke(app, ["demo", "--help"]).output
