"""Progress of long commands, on stderr so that `--json` output on stdout stays clean.

On a terminal a live bar (rich); anywhere else (a pipe, a log file, CI) one plain line each
time a step's description changes, when it completes, and otherwise at most every
`every_s` seconds: a benchmark that runs for many minutes under `--json` still says where
it is, without flooding a log.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn


class Steps:
    """What a command tells of its progress: steps (`add`), each with a description and, when
    known, a total; `update` changes the description or the count done."""

    def add(self, description: str, total: float | None = None) -> TaskID:
        raise NotImplementedError

    def update(self, step: TaskID, *, description: str | None = None, completed: float | None = None, advance: float | None = None) -> None:
        raise NotImplementedError


class _Bar(Steps):
    def __init__(self, bar: Progress) -> None:
        self.bar = bar

    def add(self, description: str, total: float | None = None) -> TaskID:
        return self.bar.add_task(description, total=total)

    def update(self, step: TaskID, *, description: str | None = None, completed: float | None = None, advance: float | None = None) -> None:
        self.bar.update(step, description=description, completed=completed, advance=advance)


@dataclass
class _Step:
    description: str
    total: float | None
    completed: float = 0.0
    said_at: float = field(default_factory=time.monotonic)


class Lines(Steps):
    """Plain lines for a log: `elapsed  description  done/total unit`, printed on `console` or,
    with `say`, told through it (a JSON log, `bpm_app.logs.teller`)."""

    def __init__(self, console: Console, unit: str = "", every_s: float = 30.0, clock=time.monotonic, say=None) -> None:
        self.console, self.unit, self.every_s, self.clock, self.say = console, unit, every_s, clock, say
        self.began = clock()
        self.steps: dict[TaskID, _Step] = {}

    def add(self, description: str, total: float | None = None) -> TaskID:
        step = TaskID(len(self.steps))
        self.steps[step] = _Step(description, total, said_at=self.clock())
        self._say(self.steps[step])
        return step

    def update(self, step: TaskID, *, description: str | None = None, completed: float | None = None, advance: float | None = None) -> None:
        s = self.steps[step]
        changed = description is not None and description != s.description
        if description is not None:
            s.description = description
        before = s.completed
        if completed is not None:
            s.completed = completed
        if advance is not None:
            s.completed += advance
        done = s.total is not None and s.completed >= s.total > before
        if changed or done or self.clock() - s.said_at >= self.every_s:
            self._say(s)

    def _say(self, s: _Step) -> None:
        s.said_at = self.clock()
        count = f"  {s.completed:g}/{s.total:g}{' ' + self.unit if self.unit else ''}" if s.total is not None else ""
        if self.say is not None:
            self.say(f"{s.said_at - self.began:.0f} s  {escape(s.description)}{count}")
            return
        self.console.print(f"{s.said_at - self.began:7.0f} s  {escape(s.description)}{count}", highlight=False, soft_wrap=True)


@contextmanager
def progress(unit: str = "", every_s: float = 30.0, console: Console | None = None, say=None) -> Iterator[Steps]:
    """Steps shown as a bar on a terminal, as lines elsewhere or, with `say`, told through it
    (see the module text)."""
    console = console or Console(stderr=True)
    if say is not None or not console.is_terminal:
        yield Lines(console, unit, every_s, say=say)
        return
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn(unit), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=True) as bar:
        yield _Bar(bar)
