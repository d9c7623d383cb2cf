"""End to end: a registry and four agents as real processes, Spark local, the poster's phases;
each participant a host of its own (network namespace, CPU quota, folder) where this machine allows it."""

from __future__ import annotations

import pytest

from bpm_app.demo.report import write_report
from bpm_app.demo.run import Demo, DemoSettings
from bpm_app.demo.outcomes import poster_misses
from spark_agents.network import ip
from tests.conftest import free_port, requires_hosts

pytestmark = [pytest.mark.slow, pytest.mark.full, pytest.mark.serial,
              requires_hosts()]


# The demo bounds itself: each phase waits at most phase_timeout_s (240 s, the command's).
@pytest.mark.timeout(1800)
def test_federation_moves_load_and_loses_nothing(tmp_path):
    settings = DemoSettings(workdir=tmp_path / "run", port=free_port(), agent_port=free_port())
    settings.workdir.mkdir()
    demo = Demo(settings, say=lambda msg: print(msg, flush=True))
    report = demo.run()
    write_report(report, tmp_path / "report", demo.t0)
    misses = poster_misses(report)
    assert not misses, "\n".join([*misses, demo.fed.decisions()])
    assert (tmp_path / "report" / "timeline.png").stat().st_size > 10_000
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
