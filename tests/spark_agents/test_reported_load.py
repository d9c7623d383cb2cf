"""The load an agent reports (`SparkTasks.loads`) across a change of the tasks running here."""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

import pytest

from bpm.load import BatchSample, interval_sample, task_loads
from spark_agents import runtime


@dataclass
class FakeTask:
    task_id: str
    started_s: float
    stopped_s: float | None = None
    trigger_s: float = 5.0

    @property
    def state(self) -> str:
        return "stopped" if self.stopped_s is not None else "running"


class FakeHost:
    """Tasks with a batch every 5 s using `cpu` seconds each, on one core, in a process that uses
    `idle` of a core besides: what `SparkHost` measures, without Spark."""

    def __init__(self, cpu: dict[str, float], idle: float = 0.1) -> None:
        self.cpu, self.idle = cpu, idle
        self._tasks = {t: FakeTask(t, started_s=0.0) for t in cpu}
        self.samples: list[BatchSample] = []
        self.intervals: list = []
        self.recorder = SimpleNamespace(samples=lambda since_s=0.0: [s for s in self.samples if s.end_s > since_s])
        self.input_from: dict[str, float] = {}  # a task with no input runs no batch until then

    def run(self, start_s: float, end_s: float) -> None:
        """Record batches and 1-second process CPU intervals over [start_s, end_s)."""
        for t0 in range(int(start_s), int(end_s)):
            batches = []
            for task in self._tasks.values():
                # a batch every 5 s from its start, 1 s long; its first two cost ten times more
                k, late = divmod(t0 - task.started_s, 5)
                if k < 0 or late != 0 or (task.stopped_s is not None and t0 >= task.stopped_s) or t0 < self.input_from.get(task.task_id, 0.0):
                    continue
                cpu = self.cpu[task.task_id] * (10 if k < 2 else 1)
                batches.append(BatchSample(task.task_id, int(k), t0, 1.0, 10, cpu))
            self.samples += batches
            used = self.idle + sum(s.cpu_s for s in batches)
            self.intervals.append(interval_sample(batches, t0, t0 + 1, 1, self.running(), used))

    def tasks(self):
        return list(self._tasks.values())

    def running(self):
        return [t for t, task in self._tasks.items() if task.state == "running"]

    def loads(self, window_s: float):
        now = runtime.time.time()
        return task_loads(self.recorder.samples(now - window_s), now - window_s, now, 1, self.running())


@pytest.fixture
def clock(monkeypatch):
    now = SimpleNamespace(t=0.0)
    monkeypatch.setattr(runtime.time, "time", lambda: now.t)
    return now


def test_reported_loads_leave_out_tasks_that_left_and_the_first_batches_of_new_ones(clock):
    host = FakeHost({"a": 0.25, "b": 0.25, "c": 0.25})
    tasks = runtime.SparkTasks(host, trigger_s=5.0)
    host.run(0, 60)
    clock.t = 60
    before = tasks.loads()
    assert set(before) == {"a", "b", "c"}
    assert sum(before.values()) == pytest.approx(0.1 + 3 * 0.05, rel=0.1), "the process CPU, split among the tasks"

    # c leaves at 61 and d arrives at 62; its first two batches cost ten times its later ones.
    host.run(60, 61)
    host._tasks["c"].stopped_s = 61.0
    host._tasks["d"] = FakeTask("d", started_s=62.0)
    host.cpu["d"] = 0.25
    for now in range(62, 79, 2):
        host.run(now - 2, now)
        clock.t = now
        during = tasks.loads()
        assert "c" not in during, "a task that left is not reported"
        assert "d" not in during, "a task starting up has no load yet"
        assert during == pytest.approx({k: before[k] for k in ("a", "b")}), "the last steady window stands for the tasks that stayed"
    host.run(78, 100)
    clock.t = 100
    after = tasks.loads()
    assert set(after) == {"a", "b", "d"}
    assert after["d"] == pytest.approx(after["a"], rel=0.3), "d's start-up batches are not its load"
    assert sum(after.values()) == pytest.approx(0.1 + 3 * 0.05, rel=0.15)


def test_a_task_whose_input_has_just_begun_is_rising_until_a_window_past_its_first_batches(clock):
    """A task over a share not fed runs no batch; once fed, a window that began before its
    input reads part of what it needs, so it is not offered (`rising`) until its first
    batches with input are a start-up before the window. A task fed from its start is not."""
    host = FakeHost({"a": 0.25, "s": 0.25})
    host.input_from["s"] = 60.0
    tasks = runtime.SparkTasks(host, trigger_s=5.0)  # a 15 s window, a 10 s start-up
    host.run(0, 60)
    clock.t = 60
    tasks.loads()
    assert tasks.rising() == set(), "a task with no input yet has no load to be offered at"
    for now in range(62, 86, 2):
        host.run(now - 2, now)
        clock.t = now
        loads = tasks.loads()
        assert tasks.rising() == {"s"}, f"at {now} s its window began less than a start-up after its input"
        if now == 66:
            assert loads["s"] < 0.8 * loads["a"], "a window that began before its input reads part of it"
    host.run(84, 90)
    clock.t = 90
    loads = tasks.loads()
    assert tasks.rising() == set()
    assert loads["s"] == pytest.approx(loads["a"], rel=0.3)


def test_without_the_steady_window_the_change_would_show(clock):
    """The same change, measured over a plain window: what the steady window avoids."""
    host = FakeHost({"a": 0.25, "b": 0.25})
    host.run(0, 60)
    host._tasks["d"] = FakeTask("d", started_s=60.0)
    host.cpu["d"] = 0.25
    host.run(60, 70)
    clock.t = 70
    plain = runtime.SparkTasks(host, trigger_s=5.0, startup_s=0.0)
    plain.min_window_s = 0.0
    plain_loads = plain.loads()
    assert plain_loads["d"] > 3 * plain_loads["a"], "over a plain window a new task's first batches look like load"


def test_a_task_stopped_while_its_state_is_read_is_stopped_not_an_error():
    """A stop on another thread sets the task's query to None while the sampler reads its
    state: the state is read from one query, never from None (that once killed the sampler,
    and the participant's load stood still for minutes)."""
    from pathlib import Path

    from examples.network_monitoring import query as MONITORING
    from spark_agents.host import HostedTask

    class StoppingQuery:
        @property
        def isActive(self) -> bool:  # noqa: N802 - Spark's name
            task.query = None  # the stop lands here
            return False

        def exception(self) -> None:
            return None

    task = HostedTask("t", None, Path("unused"), MONITORING, MONITORING.bind(), None, StoppingQuery(), 0.0)
    assert task.state == "stopped"
