"""End to end: a registry and three agents as real processes; a kill -9 of the participant that
hosts moved tasks under passive standby (or its host cut off, then healed: with the correlated
result's tentative and stable versions), the failover, and the alerts against the plain computation."""

from __future__ import annotations

import pytest

from bpm_app.demo.failover import FailoverDemo
from bpm_app.demo.report import write_report
from bpm_app.demo.run import DemoSettings
from spark_agents.network import HostNetwork
from tests.conftest import free_port, requires

pytestmark = [pytest.mark.slow, pytest.mark.full, pytest.mark.serial]
needs_namespaces = requires(HostNetwork.available(), "network namespaces (root, iproute2)")


def run_scenario(tmp_path, **kw):
    """The failover scenario under passive standby with short phases; its report (also written under tmp_path/report) and the demo."""
    settings = DemoSettings(workdir=tmp_path / "run", port=free_port(), agent_port=free_port(), settle_s=10, phase_timeout_s=60)
    settings.workdir.mkdir()
    demo = FailoverDemo(settings, say=lambda msg: print(msg, flush=True), ha_mode="passive_standby", **kw)
    report = demo.run()
    write_report(report, tmp_path / "report", demo.t0)
    return report, demo


def test_a_killed_host_fails_over_and_nothing_is_lost_or_repeated(tmp_path):
    report, demo = run_scenario(tmp_path)

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


@needs_namespaces
def test_a_host_cut_off_is_failed_over_and_once_healed_stops_what_it_lost_and_nothing_is_lost_or_repeated(tmp_path):
    report, _ = run_scenario(tmp_path, fault="cut", cut_s=25)

    assert report["scenario"] == "partition" and report["killed"]["hosted"], "the participant cut off hosted moved tasks"
    failovers = {f["task"]: f for f in report["failovers"]}
    for task in report["killed"]["hosted"]:
        f = failovers[task]
        assert f["from"] == "b" and f["to"] == "a" and f["completed"], f
    healed = report["healed"]
    assert healed["heard_after_s"] is not None, "b is heard from again once its link heals"
    assert healed["stopped_lost_tasks_after_s"] is not None, "b stops the tasks that were failed over while it was cut off"
    assert any("b is reachable again" in message for message in healed["events"]), healed
    assert report["expected_results"] > 0
    assert report["lost_results"] == 0
    assert report["duplicate_results"] == 0
    # Delay, Process and Correct: a's correlated result waited for b's alerts while b was cut
    # off, went out tentative, and every window ended stable, equal to the plain correlation.
    corr = report["correlation"]
    assert corr["stable_rows"] > 0, "the shared scanners are found at several participants"
    assert corr["tentative_windows"] > 0 and corr["stabilisation_s"] is not None, corr
    assert corr["windows_not_stable"] == [] and corr["stable_equals_plain"], corr["mismatched_windows"]
    assert (tmp_path / "report" / "correlation.png").stat().st_size > 0


@needs_namespaces
def test_a_host_cut_off_from_the_registry_only_keeps_processing_what_it_hosts_and_nothing_is_lost_or_repeated(tmp_path):
    report, _ = run_scenario(tmp_path, fault="registry", cut_s=20)

    assert report["scenario"] == "registry-cut" and report["killed"]["hosted"], "b hosted moved tasks when its registry link was cut"
    cut = report["registry_cut"]
    assert cut["registry_counted_it_failed"], "the registry heard no heartbeat and counted b failed"
    assert cut["failovers"] == [] and not report["failovers"], "nothing was failed over: a asked b directly"
    assert any("answers a directly" in message for message in cut["origin_noted"]), cut
    assert cut["polls"] > 0 and cut["polls_running_every_task"] == cut["polls"], "b ran every task it hosted throughout"
    healed = report["healed"]
    assert healed["heard_after_s"] is not None and healed["ran_its_tasks_after_s"] is not None, healed
    assert report["expected_results"] > 0
    assert report["lost_results"] == 0
    assert report["duplicate_results"] == 0
