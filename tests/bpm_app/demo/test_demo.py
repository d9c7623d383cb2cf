"""End to end: a registry and four agents as real processes, Spark local, the poster's phases;
each participant a host of its own (network namespace, CPU quota, folder) where this machine allows it."""

from __future__ import annotations

import pytest

from bpm_app.demo.report import write_report
from bpm_app.demo.run import Demo, DemoSettings
from bpm.federation.views import seconds
from bpm.negotiation.decisions import is_acceptable
from spark_agents.hosts import CpuHosts
from spark_agents.network import HostNetwork, ip
from tests.conftest import free_port

pytestmark = pytest.mark.slow


# The demo bounds itself: each phase waits at most phase_timeout_s, here 150 s. In the CI run
# at 3430ab3, with the default 240 s, the start-up took 370 s and the test 1090 s.
@pytest.mark.timeout(1500)
def test_federation_moves_load_and_loses_nothing(tmp_path):
    settings = DemoSettings(workdir=tmp_path / "run", port=free_port(), agent_port=free_port(), settle_s=10, phase_timeout_s=150)
    settings.workdir.mkdir()
    demo = Demo(settings, say=lambda msg: print(msg, flush=True))
    report = demo.run()
    write_report(report, tmp_path / "report", demo.t0)

    phases = report["phases"]
    assert [p["name"][0] for p in phases] == ["1", "2", "3", "4"]
    assert report["movements"], "load moved between participants"
    payments = report["payments"]
    assert payments["total_paid"] == pytest.approx(payments["total_earned"]), "what one pays the other earns"
    assert report["expected_results"] > 0, "the input raised alerts to compare"
    assert report["lost_results"] == 0
    assert report["duplicate_results"] == 0

    shed = [m for m in report["movements"] if m["from"] == "a" and phases[1]["started_s"] <= seconds(m["started_at"]) - demo.t0 <= phases[1]["ended_s"]]
    assert shed, "A, its load risen over its threshold, shed load in phase 2"
    assert any(m["to"] == "d" for m in report["movements"]), "load flowed to D once it joined"
    joined = demo.t0 + phases[3]["started_s"]
    assert all(seconds(m["started_at"]) >= joined for m in report["movements"] if "d" in (m["from"], m["to"])), "D trades only once it has joined"
    # The phases aim at an acceptable allocation (1, 2 and 4) and an overloaded federation (3).
    # Whether a run gets there within a phase's limit depends on what a task costs on the
    # machine, which varies from machine to machine and from day to day (in the CI run at
    # 3430ab3 phase 2 ran out its limit with A at 0.72 against 0.63, and C, on tasks A had
    # shed to it, at 0.66), and is measured over runs in a row (scripts/demo-runs.sh,
    # docs/benchmarks.md, "Demo runs"). Here: that the report says each as its loads have it.
    for phase, names in zip(phases, ("abc", "abc", "abc", "abcd")):
        loads, thresholds = phase["loads"], phase["thresholds"]
        assert set(loads) == set(thresholds) == set(names), phase
        assert phase["overloaded"] == (sum(loads.values()) > sum(thresholds.values())), phase
        assert phase["acceptable"] == is_acceptable([loads[n] for n in thresholds], list(thresholds.values())), phase
    assert (tmp_path / "report" / "timeline.png").stat().st_size > 10_000
    if CpuHosts.available() is None and HostNetwork.available() is None:  # root on Linux, as in CI: every participant a host
        assert set(report["hosts"]) == {"a", "b", "c", "d"}
        assert all(h["cpus"] == settings.cpus and h["isolated"] for h in report["hosts"].values()), report["hosts"]
        assert len({h["address"] for h in report["hosts"].values()}) == 4
        assert report["cpu"] and all(0 < r["busy"] <= 1 for r in report["cpu"][1:]), "the machine was busy all along"
        assert set(report["cpu"][-1]["throttled"]) == {"a", "b", "c", "d"}, "each quota's throttling till the end"
        used = report["cpu"][-1]["processes"]
        assert set(used) == {"a", "b", "c", "d"} and all({"jvm", "agent"} <= set(used[n]) for n in used), used
        assert all("nats-server" in used[n] for n in "abc"), "the three with input streams have brokers of their own"
        assert not demo.fed.hosts.cpu.parent.exists(), "the demo removed its cgroups"
        assert demo.fed.hosts.net.bridge not in ip("link", "show") and "bpm" not in ip("netns", "list"), "and its hosts"
