"""End to end: a registry and three agents as real processes; a kill -9 of the participant that
hosts moved tasks under passive standby, the failover, and the alerts against the plain computation."""

from __future__ import annotations

import pytest

from bpm_app.demo.failover import FailoverDemo
from bpm_app.demo.report import write_report
from bpm_app.demo.run import DemoSettings
from tests.conftest import free_port

pytestmark = pytest.mark.slow


def test_a_killed_host_fails_over_and_nothing_is_lost_or_repeated(tmp_path):
    settings = DemoSettings(workdir=tmp_path / "run", port=free_port(), agent_port=free_port(), settle_s=10, phase_timeout_s=60)
    settings.workdir.mkdir()
    demo = FailoverDemo(settings, say=lambda msg: print(msg, flush=True), ha_mode="passive_standby")
    report = demo.run()
    write_report(report, tmp_path / "report", demo.t0)

    assert report["killed"]["hosted"], "the killed participant hosted moved tasks"
    failovers = {f["task"]: f for f in report["failovers"]}
    assert set(report["killed"]["hosted"]) <= set(failovers), "every task it hosted was failed over"
    for task in report["killed"]["hosted"]:
        f = failovers[task]
        assert f["mode"] == "passive_standby" and f["from"] == "b" and f["to"] == "a", f
        assert f["completed"] and f["recovery_s"] is not None, f
        assert 0 < f["detected_s"] < 10, f
    assert report["expected_results"] > 0, "the input raised alerts to compare"
    assert report["lost_results"] == 0
    assert report["duplicate_results"] == 0
    assert all(p["status"] != "alive" for p in demo.state["participants"] if p["name"] == "b")
