"""End to end: `bpm demo --scenario split`'s federation as real processes on hosts; A's one
task, too large to move, is split over its key groups, a piece of it moves to B, and the
alerts of the task and its pieces equal the plain computation's."""

from __future__ import annotations

import pytest

from bpm_app.demo.report import write_report
from bpm_app.demo.run import DemoSettings
from bpm_app.demo.split import SplitDemo
from tests.conftest import free_port

pytestmark = [pytest.mark.slow, pytest.mark.full, pytest.mark.serial]


# Bounded by the scenario itself: the warm-up, phase 2's limit, the drain's 180 s and the
# stop's 60 s. On a slow machine (the CI run at 220a158) they add up past pytest's 600 s.
@pytest.mark.timeout(1200)
def test_a_task_too_large_to_move_is_split_and_a_piece_moves_with_each_window_once(tmp_path):
    """Whether the allocation ends acceptable depends on what the halves measure where they
    run (docs/benchmarks.md, "Split scenario"): the report says; this asserts the split.
    Phase 2 ends once a half has moved and the allocation has held after it, so its limit
    (the command's) only bounds a run whose split or move does not come. On a busy machine
    a half measures high at A while it catches up beside the task it came from: in the CI
    run at 2404b54 A offered one at 0.92, B refused it, A split the other half again, and a
    150 s limit ended the phase before any piece had moved."""
    settings = DemoSettings(workdir=tmp_path / "run", port=free_port(), agent_port=free_port(), settle_s=10)
    settings.workdir.mkdir()
    demo = SplitDemo(settings, say=lambda msg: print(msg, flush=True))
    try:
        report = demo.run()
        write_report(report, tmp_path / "report", demo.t0)
        _check(report, tmp_path / "report")
    except BaseException:
        # What the agents did is the only account of a run that failed here (CI keeps no folder).
        for log in sorted((settings.workdir / "logs").glob("*.log")):
            print(f"--- {log.name}", *log.read_text(errors="replace").splitlines()[-60:], sep="\n")
        raise


def _check(report: dict, folder) -> None:
    splits = [r for r in report["regrains"] if r["kind"] == "split"]
    assert splits and splits[0]["origin"] == "a" and splits[0]["from"] == ["g"], report["regrains"]
    # A half, or a piece of a half split again (the split is made again while no piece has moved):
    # in the CI run at 024b2a4 a quarter moved.
    pieces = {name for r in splits if r["origin"] == "a" for name in r["made"]}
    moved = {m["task_name"] for m in report["movements"] if m["from"] == "a" and m["to"] == "b"}
    assert moved and moved <= pieces, f"a piece moved to B, never the whole task: {report['movements']}"
    assert report["expected_results"] > 0, "the input raised alerts to compare"
    assert report["lost_results"] == 0 and report["duplicate_results"] == 0, "each window of each key group once across the split"
    assert (folder / "timeline.png").stat().st_size > 0
