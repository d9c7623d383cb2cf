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


def test_registry_migrate_goes_to_head_and_back_and_says_why_it_cannot(tmp_path):
    import sqlite3

    url = f"sqlite:///{tmp_path / 'r.db'}"

    def version():
        with sqlite3.connect(tmp_path / "r.db") as db:
            return db.execute("select version_num from alembic_version").fetchone()[0]

    assert runner.invoke(app, ["registry", "migrate", "--database-url", url]).exit_code == 0
    head = version()
    again = runner.invoke(app, ["registry", "migrate", "--database-url", url])
    assert again.exit_code == 0 and version() == head, "applying them again does nothing"
    back = runner.invoke(app, ["registry", "migrate", "--database-url", url, "--revision", "0006"])
    assert back.exit_code == 0 and version() == "0006"
    bad = runner.invoke(app, ["registry", "migrate", "--database-url", url, "--revision", "nonsense"])
    assert bad.exit_code == 1 and "cannot migrate" in bad.output
