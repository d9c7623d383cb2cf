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


def _options() -> dict[str, set[str]]:
    """Every option of every `bpm` command: its spelling -> the commands that have it."""
    import typer

    found: dict[str, set[str]] = {}

    def walk(command, path: str) -> None:
        for name, sub in getattr(command, "commands", {}).items():
            walk(sub, f"{path} {name}")
        for param in command.params:
            for opt in param.opts:
                if opt.startswith("--"):
                    found.setdefault(opt, set()).add(path)

    walk(typer.main.get_command(app), "bpm")
    return found


def test_one_spelling_per_option_across_commands():
    options = _options()
    # Each thing has one name: the spellings retired for these are gone from every command.
    for retired in ("--master", "--work-dir", "--url", "--partitions-count"):
        assert retired not in options, (retired, options.get(retired))
    # The key a command acts with is --key; only the agent, which holds its participant's key,
    # takes the operator's besides.
    assert options["--admin-key"] == {"bpm agent run"}, options["--admin-key"]
    assert {"bpm participants add", "bpm participants revoke-key", "bpm registry rotate-signing-key",
            "bpm bench registry", "bpm contracts propose", "bpm events"} <= options["--key"]
    assert {"bpm demo", "bpm agent run"} <= options["--workdir"] and {"bpm agent run"} <= options["--spark-master"]
