"""Ctrl-C during `bpm demo` stops every process the demo started and removes its hosts (cgroups, namespaces, bridge)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import free_port

pytestmark = [pytest.mark.slow, pytest.mark.full, pytest.mark.serial]


def _processes_mentioning(text: str) -> list[str]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in cmdline:
            found.append(f"{entry.name}: {cmdline[:160]}")
    return found


def test_ctrl_c_stops_every_process_of_the_demo(tmp_path):
    workdir = tmp_path / "run"
    bpm = str(Path(sys.executable).with_name("bpm"))
    log = tmp_path / "demo.log"
    with log.open("w") as out:
        demo = subprocess.Popen(
            [bpm, "demo", "--headless", "--workdir", str(workdir), "--report", str(tmp_path / "report"), "--port", str(free_port())],
            cwd=tmp_path, stdout=out, stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and "agents up" not in log.read_text():
            assert demo.poll() is None, log.read_text()
            time.sleep(1)
        assert "agents up" in log.read_text(), log.read_text()
        assert re.search(r"(?m)^ *\d+ s  agents up; input flowing$", log.read_text()), "each line after the seconds since the start"
        started = _processes_mentioning(str(workdir))
        assert len(started) >= 7, f"registry, three agents, three replayers: {started}"
        demo.send_signal(signal.SIGINT)
        demo.send_signal(signal.SIGINT)  # an impatient second Ctrl-C
        assert demo.wait(timeout=120) == 130, log.read_text()[-3000:]
        assert _processes_mentioning(str(workdir)) == [], log.read_text()[-3000:]
        assert "interrupted" in log.read_text()
        quotas = re.search(r"under a CPU quota of [0-9.]+ CPU \((\S+)\)", log.read_text())
        if quotas:  # root on Linux: each participant had a cgroup of its own
            assert not Path(quotas.group(1)).exists(), "the demo's cgroups are removed"
        bridge = re.search(r"a host of its own on \S+ \(bridge (\S+)\)", log.read_text())
        if bridge:  # root on Linux: each participant had a network namespace of its own
            from spark_agents.network import ip

            assert bridge.group(1) not in ip("link", "show") and bridge.group(1) not in ip("netns", "list"), "its hosts are removed"
    finally:
        if demo.poll() is None:
            demo.kill()
