"""End to end: a registry and four agents as real processes, Spark local, the poster's phases."""

from __future__ import annotations

import pytest

from bpm.demo.report import write_report
from bpm.demo.run import Demo, DemoSettings

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skip(
        reason="the demo does not yet reach an acceptable allocation in every phase within the time limit on a "
        "2-core machine (loads include each JVM's idle CPU; handovers stall behind long batches); open work of the live federation"
    ),
]


def test_federation_moves_load_and_loses_nothing(tmp_path):
    settings = DemoSettings(workdir=tmp_path / "run", port=8711, agent_port=9111, settle_s=10, phase_timeout_s=90)
    settings.workdir.mkdir()
    demo = Demo(settings, say=lambda msg: print(msg, flush=True))
    report = demo.run()
    write_report(report, tmp_path / "report", demo.t0)

    assert report["movements"], "load moved between participants"
    assert {m["from"] for m in report["movements"]} & {"a", "b", "c"}
    payments = report["payments"]
    assert payments["total_paid"] == pytest.approx(payments["total_earned"]), "what one pays the other earns"
    assert report["expected_results"] > 0, "the input raised alerts to compare"
    assert report["lost_results"] == 0
    assert report["duplicate_results"] == 0
    assert report["phases"][-1]["acceptable"], report["phases"][-1]
    assert (tmp_path / "report" / "timeline.png").stat().st_size > 10_000
