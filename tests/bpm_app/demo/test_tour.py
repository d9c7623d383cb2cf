"""End to end, the CI tier's one federation: `bpm demo --scenario tour` as real processes on
hosts. The poster's phases end as the mechanism promises; meanwhile E splits a task too large
to move and sheds a piece to D, whose host is cut off from the registry, partitioned and
crashed in turn, and every time the federation does what it must; D restarts and joins; no
result is lost or repeated. The limits are generous for a slow machine; when an outcome is
missed, the test prints why (each agent's last decisions)."""

from __future__ import annotations

import time

import pytest

from bpm_app.demo.outcomes import poster_misses
from bpm_app.demo.report import write_report
from bpm_app.demo.run import DemoSettings
from bpm_app.demo.tour import Tour
from tests.conftest import free_port, requires_hosts

pytestmark = [pytest.mark.slow, pytest.mark.serial,
              requires_hosts()]


@pytest.mark.timeout(1800)
def test_the_tour_ends_every_scenario_as_promised_on_one_federation(tmp_path):
    settings = DemoSettings(workdir=tmp_path / "run", port=free_port(), agent_port=free_port())
    settings.workdir.mkdir()
    started = time.monotonic()
    demo = Tour(settings, say=lambda msg: print(f"{time.monotonic() - started:4.0f} s  {msg}", flush=True))
    try:
        report = demo.run()
        write_report(report, tmp_path / "report", demo.t0)
        _check(report, demo)
    except BaseException:
        print(demo.fed.decisions())  # why: each agent's last decisions
        raise


def _check(report: dict, demo: Tour) -> None:
    misses = poster_misses(report)
    assert not misses, "the poster's phases: " + "; ".join(misses)

    # The split: E's task, too large to move, split over its key groups; a piece, never the whole, moved to D.
    split = report["split"]
    splits = [r for r in split["regrains"] if r["kind"] == "split"]
    assert splits and splits[0]["from"] == ["g"], split["regrains"]
    pieces = {name for r in splits for name in r["made"]}
    moved = {m["task_name"] for m in split["moved"] if m["to"] == "d"}
    assert moved & pieces and "g" not in moved, f"a piece moved to D, never the task as it was: {split['moved']}"

    # The faults of D's host, in turn.
    assert report["side"]["error"] is None, report["side"]
    cut, partition, crash = report["faults"]
    assert [f["fault"] for f in report["faults"]] == ["registry", "cut", "crash"]
    assert all(f["hosted"] and all(key.startswith("e.") for key in f["hosted"]) for f in report["faults"]), "D hosted E's pieces each time"

    registry = cut["registry_cut"]
    assert registry["registry_counted_it_failed"], "the registry heard no heartbeat and counted D failed"
    assert registry["failovers"] == [] and cut["failovers"] == [], "nothing was failed over: E asked D directly"
    assert any("answers" in message for message in registry["origin_noted"]), registry
    assert registry["polls"] > 0 and registry["polls_running_every_task"] == registry["polls"], "D ran every piece it hosted throughout"
    assert cut["healed"]["heard_after_s"] is not None and cut["healed"]["ran_its_tasks_after_s"] is not None, cut["healed"]

    for fault in (partition, crash):
        failed_over = {f["task"]: f for f in fault["failovers"]}
        assert set(fault["hosted"]) <= set(failed_over), f"every piece D hosted was failed over: {fault}"
        for task in fault["hosted"]:
            f = failed_over[task]
            assert f["mode"] == "passive_standby" and f["from"] == "d" and f["to"] == "e" and f["completed"], f
            # Silence past the registry's heartbeat timeout (3 s), read on a poll: a bound, not a speed.
            assert 0 < f["detected_s"] < 30, f
    healed = partition["healed"]
    assert healed["heard_after_s"] is not None, "D is heard from again once its link heals"
    assert healed["stopped_lost_tasks_after_s"] is not None, "D stops the pieces that were failed over while it was cut off"
    assert report["side"]["restarted_s"] is not None, "D's host restarted after the crash"

    # poster_misses also holds every result of A's, B's, C's and E's tasks to the plain
    # computation: nothing lost, nothing repeated across the moves, the split, the failovers and the partition.
    assert set(report["hosts"]) == {"a", "b", "c", "d", "e"} and all(h["isolated"] for h in report["hosts"].values())
    assert not demo.fed.hosts.cpu.parent.exists(), "the demo removed its cgroups"
