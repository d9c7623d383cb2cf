"""Waiting for a server: `on_wait` keeps running (a live view goes on) until the server answers or time is up."""

from __future__ import annotations

import subprocess
import sys

import pytest

from bpm_app.processes import wait_http
from tests.conftest import free_port


def test_on_wait_runs_while_a_server_does_not_answer_and_the_wait_ends_at_its_limit(tmp_path):
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    calls = []
    try:
        with pytest.raises(TimeoutError):
            wait_http(f"http://127.0.0.1:{free_port()}/healthz", process, tmp_path / "log", 2.0, on_wait=lambda: calls.append(1), every_s=0.5)
    finally:
        process.kill()
        process.wait()
    assert 1 <= len(calls) <= 4  # at most one call per every_s
