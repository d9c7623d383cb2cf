"""Turning batch measurements into loads, utilisation and cost-model samples, and the rules of
when a load is fit to trade on (pure functions: the participant's CPU is read by
`spark_agents.metrics`).

Definitions (docs/pipeline.md, "Measuring load"):

* a task's busy time is the CPU time its micro-batches used (`spark_agents.listener`: its
  stream thread, its jobs' executor tasks and its `foreachBatch`), spread evenly over each
  batch's wall time; the wall time of the batches (Spark's `triggerExecution`) is kept too,
  but it counts waiting (for task slots, for a CPU other processes hold) as work;
* the JVM also spends CPU that no task thread shows (garbage collection, JIT compilation,
  event buses), in proportion to the work it serves. Where the process CPU is measurable
  (Spark local), the host estimates one overhead factor k, the process CPU that grows with
  one unit of task CPU (`overhead_factor`: the idle JVM's fixed CPU is no task's; at most 3), and a
  task's busy time is k times its own CPU; loads stay proportional to what each task itself
  used (so they add up), and their sum tracks the process CPU above its idle part.
  Elsewhere k = 1;
* a task's load over an interval is its busy time inside the interval, divided by the
  interval's length and by the participant's CPUs (its capacity: its own CPU quota where it
  has one, `spark_agents.hosts`): the share of the participant's processing capacity the
  task used;
* the participant's utilisation is the sum of its tasks' loads. Whether loads add up (the
  loads of tasks measured alone against the utilisation with all of them together) is what
  `bpm bench load-model` measures;
* the cost model is fitted to (utilisation, mean batch duration) pairs, one per interval.

When a load is fit to trade on (one place for each length; the agent, its task host and the
demo take them from here):

* `default_load_window_s`: how long loads average over;
* `default_startup_s`: a task's first batches at a host, left out of its load
  (`steady_window_start`);
* `default_warmup_s`: how long a participant neither offers nor takes load after its start and
  after each task that starts meanwhile (`bpm.agent.machine.Mechanism.warmup_s`);
* `still_rising`: a task whose input began after its start-up reads part of its load until a
  start-up has passed before its window.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass


@dataclass(frozen=True, slots=True)
class BatchSample:
    """One finished micro-batch of one task.

    Attributes:
        task_id: the task (the streaming query's name).
        batch_id: Spark's batch id.
        start_s: when the batch started (epoch seconds).
        duration_s: its wall time (Spark's `triggerExecution`).
        rows: input rows it read.
        cpu_s: CPU seconds it used (None where not measured).
    """

    task_id: str
    batch_id: int
    start_s: float
    duration_s: float
    rows: int
    cpu_s: float | None = None

    @property
    def end_s(self) -> float:
        return self.start_s + self.duration_s


@dataclass(frozen=True, slots=True)
class IntervalSample:
    """What one measuring interval saw on the participant.

    Attributes:
        start_s, end_s: the interval (epoch seconds).
        loads: load per task.
        utilisation: sum of the loads.
        task_cpu_utilisation: sum of the tasks' own CPU time / (length x CPUs), before scaling.
        wall_utilisation: the same from the batches' wall time instead of their CPU time.
        cpu_utilisation: process CPU time over the interval / (length x CPUs), None where not measurable.
        mean_batch_s: mean duration of the batches that ended in the interval (None without batches).
        batches: how many batches ended in the interval.
        rows: input rows of those batches.
    """

    start_s: float
    end_s: float
    loads: dict[str, float]
    utilisation: float
    task_cpu_utilisation: float
    wall_utilisation: float
    cpu_utilisation: float | None
    mean_batch_s: float | None
    batches: int
    rows: int

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def busy_seconds(samples: Iterable[BatchSample], start_s: float, end_s: float, wall: bool = False) -> dict[str, float]:
    """Per task, the busy time of its batches that falls inside [start_s, end_s): CPU time spread
    evenly over each batch's wall time (wall time itself with `wall`, or where CPU was not measured)."""
    busy: dict[str, float] = {}
    for s in samples:
        amount = s.duration_s if wall or s.cpu_s is None else s.cpu_s
        if s.duration_s > 0:
            share = max(0.0, min(s.end_s, end_s) - max(s.start_s, start_s)) / s.duration_s
        else:
            share = 1.0 if start_s <= s.start_s < end_s else 0.0
        if share > 0:
            busy[s.task_id] = busy.get(s.task_id, 0.0) + amount * share
    return busy


def task_loads(
    samples: Iterable[BatchSample], start_s: float, end_s: float, cpus: float, tasks: Iterable[str] = (), wall: bool = False,
) -> dict[str, float]:
    """Per task, busy seconds per wall-clock second over the participant's CPUs; listed tasks without batches get 0."""
    if end_s <= start_s:
        raise ValueError("the interval must have a positive length")
    if cpus <= 0:
        raise ValueError("cpus must be positive")
    loads = {t: 0.0 for t in tasks}
    for task, busy in busy_seconds(samples, start_s, end_s, wall).items():
        loads[task] = busy / (end_s - start_s) / cpus
    return loads


# A larger factor means the process is still warming up (class loading, JIT compilation)
# or nearly idle; loads scaled by it would be mostly noise.
MAX_OVERHEAD_FACTOR = 3.0


def overhead_factor(history: Iterable[IntervalSample], default: float = 1.0, recent: int = 120) -> float:
    """Process CPU per unit of task CPU (between 1 and MAX_OVERHEAD_FACTOR), over the last
    `recent` intervals that measured both.

    The process CPU is modelled as a fixed part (the idle JVM: timers, heartbeats, event
    buses) plus k times the tasks' CPU; only k belongs to the tasks. Where the intervals'
    task CPU varies, k is the Theil-Sen slope of process CPU over task CPU (the median of the
    pairwise slopes: a warm-up burst or one odd interval does not set it). Where it does not
    vary enough to tell the two parts apart, k is the median ratio of the two.
    """
    pairs = [(i.task_cpu_utilisation, i.cpu_utilisation) for i in history
             if i.cpu_utilisation is not None and i.task_cpu_utilisation > 0][-recent:]
    if not pairs:
        return default
    tasks = [p[0] for p in pairs]
    if len(pairs) >= 8 and max(tasks) - min(tasks) >= 0.25 * statistics.median(tasks):
        from scipy.stats import theilslopes

        estimate = float(theilslopes([p[1] for p in pairs], tasks).slope)
    else:
        estimate = statistics.median(cpu / task for task, cpu in pairs)
    return min(MAX_OVERHEAD_FACTOR, max(1.0, estimate))


def interval_sample(
    samples: Sequence[BatchSample], start_s: float, end_s: float, cpus: float,
    tasks: Iterable[str] = (), cpu_seconds: float | None = None, factor: float = 1.0,
) -> IntervalSample:
    """Summarise one interval; `cpu_seconds` is the process CPU time measured over it, if any;
    `factor` scales task CPU to busy time (see `overhead_factor`)."""
    tasks = list(tasks)
    own = task_loads(samples, start_s, end_s, cpus, tasks)
    wall = task_loads(samples, start_s, end_s, cpus, tasks, wall=True)
    ended = [s for s in samples if start_s <= s.end_s < end_s]
    cpu = None if cpu_seconds is None else cpu_seconds / (end_s - start_s) / cpus
    loads = {task: load * factor for task, load in own.items()}
    return IntervalSample(
        start_s, end_s, loads, sum(loads.values()), sum(own.values()), sum(wall.values()), cpu,
        sum(s.duration_s for s in ended) / len(ended) if ended else None,
        len(ended), sum(s.rows for s in ended),
    )


def cost_samples(intervals: Iterable[IntervalSample]) -> tuple[list[float], list[float]]:
    """The (utilisation, mean batch duration) pairs the cost model is fitted to; intervals without batches are left out."""
    pairs = [(i.utilisation, i.mean_batch_s) for i in intervals if i.mean_batch_s is not None]
    return [p[0] for p in pairs], [p[1] for p in pairs]  # type: ignore[misc]


def scaled_to_process(loads: dict[str, float], intervals: Iterable[IntervalSample], start_s: float) -> dict[str, float]:
    """Task loads rescaled so that they add up to the process CPU measured since `start_s`.

    The participant's load is then what its process used (bounded by its CPUs, idle part
    included), split among its tasks in proportion to their own CPU: a short window in
    which the tasks' own CPU and the overhead factor disagree cannot report more load than
    the process had. Each interval counts for the part of it after `start_s`. Unchanged
    where the process CPU is not measured or no task did work.
    """
    weighted = [(i.end_s - max(i.start_s, start_s), i.cpu_utilisation) for i in intervals
                if i.end_s > start_s and i.cpu_utilisation is not None]
    total = sum(loads.values())
    span = sum(w for w, _ in weighted)
    if span <= 0 or total <= 0:
        return loads
    cpu = sum(w * u for w, u in weighted) / span  # type: ignore[operator]
    return {task: load * cpu / total for task, load in loads.items()}


def default_load_window_s(trigger_s: float) -> float:
    """How long an agent's loads average over: several batches (15 s, at least three triggers),
    since one batch may last longer than a measuring interval, and batches of similar tasks
    cost quite different CPU."""
    return max(15.0, 3 * trigger_s)


def default_startup_s(trigger_s: float) -> float:
    """How long a task's start-up at a host lasts, left out of its load (`steady_window_start`):
    its first two batches."""
    return 2 * trigger_s


# How long a JVM that has just started measures more CPU than its tasks need (its own JIT
# compilation), whatever the trigger.
JVM_WARMUP_S = 30.0


def default_warmup_s(trigger_s: float) -> float:
    """How long an agent neither offers nor takes load after its start and after the last of
    its tasks that started meanwhile (`bpm.agent.machine.Mechanism.warmup_s`): its JVM's
    warm-up, and at least a whole load window past that task's start-up, so that the first
    load it trades on is measured on a full window of tasks past their first batches (a
    shorter warm-up leaves half a window: the demo's A, on a slow machine, shed idle tasks on
    such readings, docs/benchmarks.md, "Runs at 0cf2873 and 45caaf8"). 30 s at a 1 s
    trigger, 50 s at 10 s."""
    return max(JVM_WARMUP_S, default_startup_s(trigger_s) + default_load_window_s(trigger_s))


def steady_window_start(now_s: float, window_s: float, started_s: Iterable[float], stopped_s: Iterable[float], startup_s: float) -> float:
    """Where a load window that saw one set of tasks, each past its start-up, begins: the
    latest of `now_s - window_s`, a running task's start plus `startup_s`, and a stop.

    A window across a change counts the process CPU of tasks that left against those that
    stayed, and a task's first batches at a host (query planning, code generation, state
    loading, the backlog of its handover pause) cost several times its later ones.
    """
    return max([now_s - window_s, *(s + startup_s for s in started_s), *stopped_s])


def still_rising(started_s: float, first_input_s: float | None, window_start_s: float, startup_s: float) -> bool:
    """Whether a task's load, read over a window from `window_start_s`, is still rising: its
    input began (`first_input_s`, its first batch with input since it started here at
    `started_s`) after its start-up (a task over a share not fed yet runs no micro-batch), and
    less than a start-up before the window. Its first batches with input are a start-up of
    their own, and a window that began before them reads a part of what it needs. A task
    with no input yet is not rising: it has no load to offer it at."""
    return first_input_s is not None and first_input_s > started_s + startup_s and first_input_s + startup_s > window_start_s


def demand(loads: dict[str, float], samples: Iterable[BatchSample], trigger_s: dict[str, float | None]) -> dict[str, float]:
    """Each task's load as the CPU it needs to keep up with its input.

    A task that cannot get the CPU it needs (its host's quota is spent) falls behind: each
    batch starts as soon as the one before ends, reads what arrived meanwhile, and takes
    longer than that one by the ratio of what the task needs to what it gets. The CPU it got
    then understates its load by that ratio: a batch's duration over the time since the
    batch before started (at least the trigger interval T). A task that keeps up has batches
    shorter than that interval and is unchanged; so is one whose batches take longer than
    T but no longer from one to the next (it keeps up with larger batches). Duration over T
    alone reads a growing backlog as growing demand. The ratio is the median over the window, so
    one catch-up batch (after a start or a handover) does not set it.
    """
    batches: dict[str, list[BatchSample]] = {}
    for s in samples:
        batches.setdefault(s.task_id, []).append(s)
    out = {}
    for task, load in loads.items():
        trigger, ran = trigger_s.get(task), sorted(batches.get(task, []), key=lambda s: s.start_s)
        ratios = [b.duration_s / max(trigger, b.start_s - a.start_s) for a, b in zip(ran, ran[1:])] if trigger else []
        out[task] = load * max(1.0, statistics.median(ratios)) if ratios else load
    return out
