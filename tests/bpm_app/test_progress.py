"""Progress of long commands in a log: a line when a step changes or completes, else at most every `every_s`."""

from __future__ import annotations

import io

from rich.console import Console

from bpm_app.progress import Lines, progress


def test_off_a_terminal_progress_is_plain_lines_when_something_changes_or_time_passed():
    out = io.StringIO()
    now = [0.0]
    lines = Lines(Console(file=out, width=200), unit="modes", every_s=30.0, clock=lambda: now[0])
    step = lines.add("starting", 4)
    for t, kw in ((1, {"completed": 1}), (2, {"completed": 2}), (31, {"completed": 2}), (32, {"description": "none: measuring"}),
                  (33, {"advance": 1}), (40, {"completed": 4})):
        now[0] = t
        lines.update(step, **kw)
    said = out.getvalue().splitlines()
    assert said == [
        "      0 s  starting  0/4 modes",
        "     31 s  starting  2/4 modes",  # 30 s after the last line, though nothing changed
        "     32 s  none: measuring  2/4 modes",
        "     40 s  none: measuring  4/4 modes",  # done
    ], said


def test_a_step_without_a_total_says_its_description_and_brackets_are_text():
    out = io.StringIO()
    with progress(console=Console(file=out, width=200)) as steps:
        step = steps.add("starting")
        steps.update(step, description="partition 1 of 4: [5 s]")
    assert [line.split(" s  ", 1)[1] for line in out.getvalue().splitlines()] == ["starting", "partition 1 of 4: [5 s]"]
