"""Logs of the long-running commands: text, or one JSON object per line."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from bpm_app.cli import app
from bpm_app.logs import configure, formatter, uvicorn_config
from tests.conftest import free_port


def test_a_json_line_holds_time_level_logger_message_participant_and_exception(capsys):
    configure("json", participant="a")
    try:
        logging.getLogger("bpm.test").info("took %d tasks", 3)
        try:
            raise ValueError("boom")
        except ValueError:
            logging.getLogger("bpm.test").exception("it failed")
    finally:
        configure("text")
    first, second = (json.loads(line) for line in capsys.readouterr().err.splitlines())
    assert {k: first[k] for k in ("level", "logger", "message", "participant")} == {
        "level": "info", "logger": "bpm.test", "message": "took 3 tasks", "participant": "a"}
    assert first["time"].endswith("+00:00") and "T" in first["time"]
    assert second["level"] == "error" and "ValueError: boom" in second["exception"]


def test_an_unknown_format_is_refused():
    with pytest.raises(ValueError, match="text, json"):
        formatter("xml")
    result = CliRunner().invoke(app, ["registry", "serve", "--log-format", "xml"])
    assert result.exit_code == 2
    assert uvicorn_config("json")["formatters"]["bpm"]["fmt"] == "json"


def test_the_registry_logs_json_lines_only(tmp_path):
    """Also: its port from the settings' BPM_PORT when --port is not given."""
    port = free_port()
    bpm = str(Path(sys.executable).with_name("bpm"))
    process = subprocess.Popen([bpm, "registry", "serve", "--database-url", f"sqlite:///{tmp_path / 'r.db'}", "--log-format", "json"],
                               cwd=tmp_path, stderr=subprocess.PIPE, text=True,
                               env={**os.environ, "BPM_ADMIN_KEY": "k", "BPM_PORT": str(port)})
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.2)
        httpx.get(f"http://127.0.0.1:{port}/api/v1/participants", headers={"Authorization": "Bearer k"}, timeout=5)
    finally:
        process.terminate()
        _, err = process.communicate(timeout=30)
    lines = [json.loads(line) for line in err.splitlines() if line.strip()]  # every line parses
    assert any(line["message"].startswith("registry on http://127.0.0.1") for line in lines), lines
    assert any(line["logger"].startswith("uvicorn") for line in lines), lines


def test_a_teller_prints_text_or_logs_json_with_or_without_markup(capsys):
    from bpm_app.logs import teller

    teller("text", "bpm.test")("[yellow]warning:[/] half [b, c]", logging.WARNING)
    teller("text", "bpm.test", markup=False)("a accepts [0.45, 0.5] from [b]")
    err = capsys.readouterr().err
    assert "warning: half" in err and "a accepts [0.45, 0.5] from [b]" in err
    try:
        teller("json", "bpm.test", participant="a")("[yellow]warning:[/] late rows", logging.WARNING)
        teller("json", "bpm.demo", markup=False)("contract [b]")
    finally:
        configure("text")
    first, second = (json.loads(line) for line in capsys.readouterr().err.splitlines())
    assert (first["level"], first["message"], first["participant"]) == ("warning", "warning: late rows", "a")
    assert (second["logger"], second["message"]) == ("bpm.demo", "contract [b]")
