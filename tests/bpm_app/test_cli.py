"""The command line as a whole: its version, and help texts that show what they say."""

from __future__ import annotations

from importlib.metadata import version

from typer.testing import CliRunner

from bpm_app.cli import app

runner = CliRunner()


def test_version_prints_the_installed_version():
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0 and result.output.strip() == f"bpm {version('bpm-federation')}"


def test_brackets_in_help_are_shown_not_taken_for_markup(monkeypatch):
    import typer.rich_utils

    monkeypatch.setattr(typer.rich_utils, "MAX_WIDTH", 250)  # one help line per option
    result = runner.invoke(app, ["simulate", "--help"], terminal_width=250)
    assert "[p(1-E/2), p(1+E/2)]" in result.output
