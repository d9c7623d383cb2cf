"""The task host: runs tasks (a user's query, `bpm.query.Query`, over a share of a participant's
stream) on one SparkSession, starts and stops them at batch boundaries with their own
checkpoint folders, and measures them.

Typical use::

    host = SparkHost(spark, work_dir)
    host.start_task("a.g0", source, query=query, params=query.bind({"window_s": 30}), sink=broker_sink(broker, "a.g0", epoch))
    ...
    checkpoint = host.stop_task("a.g0")       # after the current batch
    pack(checkpoint) ... unpack(data, elsewhere)   # the checkpoint travels, then another host:
    other.start_task("a.g0", source, elsewhere, query=query, params=params, sink=...)   # resumes at the next batch

Measurements come from a `StreamingQueryListener` (`BatchRecorder`); `sample()` closes one
measuring interval (the sampler thread started by `start_sampling` calls it periodically),
and the cost model is fitted to the intervals recorded so far.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bpm.costs import CostFunction, MM1Cost, fit_cost_function
from bpm.names import UnsafeName, check_name
from bpm.query import Params, Query
from spark_agents.checkpoint import committed_watermark_ms, processed_seq
from spark_agents.exporter import batch_durations
from spark_agents.hosts import cpu_capacity
from spark_agents.listener import BatchRecorder, TaskCpuMeter
from bpm.load import BatchSample, IntervalSample, cost_samples, interval_sample, overhead_factor, task_loads
from spark_agents.metrics import SparkCpu
from spark_agents.query import Sink, staggered_trigger_s, start_query, stop_between_batches

log = logging.getLogger(__name__)

# How old the backlog a status shows may be: it is read through a consumer per task, and the
# status at every heartbeat.
BACKLOG_MAX_AGE_S = 5.0

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from spark_agents.broker.source import JetStreamInput
    from pyspark.sql.streaming import StreamingQuery

class TaskError(RuntimeError):
    """A task operation that cannot be done (unknown task, already running, bad id)."""


@dataclass
class HostedTask:
    """A task on this host.

    Attributes:
        task_id: the task's name (also the streaming query's name).
        source: its share of a participant's broker stream.
        checkpoint_dir: its own checkpoint folder (offsets and state).
        definition: the query it runs (`bpm.query.Query`).
        params: the query's parameters.
        trigger_s: its processing-time trigger interval (`spark_agents.query.staggered_trigger_s`).
        query: the running Spark query (None once stopped).
        started_s: when it was started here.
        stopped_s: when it was stopped here (None while it runs).
        position: the stream sequence it has read up to, as of its last batch.
        error: the query's failure, if it failed.
    """

    task_id: str
    source: JetStreamInput
    checkpoint_dir: Path
    definition: Query
    params: Params
    trigger_s: float | None
    query: StreamingQuery | None
    started_s: float
    stopped_s: float | None = None
    position: int | None = None
    error: str | None = None
    batches: int = 0
    rows: int = 0
    last_batch: BatchSample | None = field(default=None, repr=False)
    planned: bool = False  # its query has asked its source for offsets: its Python planner is up (`SparkHost.starting`)
    backlog_read: tuple[float, int | None] | None = field(default=None, repr=False)  # (when, messages): `SparkHost.backlog`
    # Set when a batch's output function has returned (Spark then only writes its commit).
    output_done: threading.Event = field(default_factory=threading.Event, repr=False)

    @property
    def input(self) -> str:
        """What it reads, as a person reads it (a broker location carries no credential)."""
        return self.source.location

    def read_position(self, batch_id: int | None = None) -> int | None:
        """The sequence its checkpoint has reached, as of batch `batch_id` (default the newest planned)."""
        return processed_seq(self.checkpoint_dir, batch_id)

    @property
    def state(self) -> str:
        query = self.query  # once: a stop on another thread sets it to None meanwhile
        if self.error:
            return "failed"
        if query is None:
            return "stopped"
        if not query.isActive:
            exc = query.exception()
            self.error = str(exc) if exc else None
            return "failed" if exc else "stopped"
        return "running"


class SparkHost:
    """Hosts tasks on one SparkSession and measures their load.

    Attributes:
        spark: the session (its master decides where tasks run).
        work_dir: default parent of the tasks' checkpoint folders.
        cpus: the participant's capacity in CPUs, the denominator of load: what it was told,
            else its cgroup CPU quota where it has one, else Spark's parallelism.
        intervals: recent measuring intervals (bounded).
        batch_durations: the wall time of each task's batches since it started here, a
            Prometheus histogram by task (`spark_agents.exporter`).
        factor: process CPU per unit of task CPU over the recorded intervals (see `bpm.load.overhead_factor`).
    """

    def __init__(
        self,
        spark: SparkSession,
        work_dir: str | Path,
        cpus: float | None = None,
        interval_s: float = 5.0,
        history: int = 720,
    ) -> None:
        self.spark = spark
        self.work_dir = Path(work_dir)
        self.cpus = float(cpus or cpu_capacity(default=spark.sparkContext.defaultParallelism))
        self.interval_s = interval_s
        self.intervals: deque[IntervalSample] = deque(maxlen=history)
        self._tasks: dict[str, HostedTask] = {}
        self._lock = threading.RLock()
        self.batch_durations = batch_durations()
        self.cpu_meter = TaskCpuMeter(spark)
        self._run_ids: set[str] = set()
        self.recorder = BatchRecorder(self.cpu_meter, on_batch=self._on_batch, accept=self._run_ids.__contains__)
        spark.streams.addListener(self.recorder)
        gateway = getattr(spark.sparkContext, "_gateway", None)
        proc = getattr(gateway, "proc", None)
        # The Spark driver JVM is a child of this process when PySpark launched it; its CPU and
        # ours (foreachBatch runs here) cross-check the measured utilisation.
        self._spark_cpu = SparkCpu(proc.pid) if proc is not None and spark.sparkContext.master.startswith("local") else None
        self._last_tick = (time.time(), self._cpu_seconds())
        self.factor = 1.0
        self._model: tuple[tuple, CostFunction] | None = None
        self._sampler: threading.Thread | None = None
        self._stop = threading.Event()

    # -- tasks -------------------------------------------------------------------------

    def start_task(
        self,
        task_id: str,
        source: JetStreamInput,
        checkpoint_dir: str | Path | None = None,
        query: Query | None = None,
        params: Params | None = None,
        trigger_s: float | None = 1.0,
        *,
        sink: Sink,
    ) -> HostedTask:
        """Start (or resume, when `checkpoint_dir` holds a checkpoint) a task running `query`
        with `params` (default: its defaults) over its share of a participant's broker stream
        (`JetStreamInput`: its start and batch bound apply to a fresh checkpoint), its results
        to `sink` (the output fence, or a standby's held-back output).

        The trigger interval is `trigger_s` staggered per task (`spark_agents.query.staggered_trigger_s`).
        """
        from spark_agents.broker.source import JetStreamInput

        try:
            check_name(task_id, "task id")
        except UnsafeName as exc:
            raise TaskError(str(exc)) from exc
        if not isinstance(source, JetStreamInput):
            raise TaskError(f"task {task_id} reads {source!r}, not a share of a broker stream")
        if not isinstance(query, Query):
            raise TaskError(f"task {task_id} names no query to run (a bpm.query.Query), but {query!r}")
        with self._lock:
            current = self._tasks.get(task_id)
            if current is not None and current.state == "running":
                raise TaskError(f"task {task_id} is already running here")
            checkpoint = Path(checkpoint_dir) if checkpoint_dir else self.work_dir / "checkpoints" / task_id
            params = query.bind() if params is None else params
            if trigger_s is not None:
                trigger_s = staggered_trigger_s(task_id, trigger_s)
            running = start_query(self.spark, task_id, source, checkpoint, query, params, sink, trigger_s, self._output_done)
            self._run_ids.add(str(running.runId))
            self.batch_durations.remove(task_id)  # counted afresh, as its batches and rows are
            task = HostedTask(task_id, source, checkpoint, query, params, trigger_s, running, time.time())
            task.position = task.read_position()
            self._tasks[task_id] = task
            return task

    def stop_task(self, task_id: str, timeout_s: float = 60.0) -> Path:
        """Stop a task after its current batch (`spark_agents.query.stop_between_batches`) and
        return its checkpoint folder, ready to hand over.

        Should a new trigger begin before the stop lands, Spark abandons that batch
        uncommitted; the next start runs it again, and the fence drops what was written.
        A task stopped before the batch that its watermark owes runs it where it resumes
        (`spark_agents.broker.source.JetStreamReader.latestOffset`).
        """
        task = self._task(task_id)
        query = task.query
        if query is not None:
            stop_between_batches(query, task.output_done, timeout_s)
            task.query = None
            task.stopped_s = time.time()
        return task.checkpoint_dir

    def _output_done(self, task_id: str, batch_id: int, cpu_s: float) -> None:
        """Called by a task's output function as it returns, with the CPU it used here."""
        self.cpu_meter.record_python(task_id, batch_id, cpu_s)
        task = self._tasks.get(task_id)
        if task is not None:
            task.output_done.set()

    def remove_task(self, task_id: str) -> None:
        """Forget a stopped task (its measurements stay in the history)."""
        with self._lock:
            if self._task(task_id).state == "running":
                raise TaskError(f"task {task_id} is running; stop it first")
            del self._tasks[task_id]
            self.batch_durations.remove(task_id)

    def _task(self, task_id: str) -> HostedTask:
        try:
            return self._tasks[task_id]
        except KeyError:
            raise TaskError(f"no task {task_id} on this host") from None

    def tasks(self) -> list[HostedTask]:
        with self._lock:
            return list(self._tasks.values())

    def running(self) -> list[str]:
        return [t.task_id for t in self.tasks() if t.state == "running"]

    def starting(self, within_s: float = 10.0) -> list[str]:
        """Tasks started in the last `within_s` seconds whose query has not yet asked its
        source for offsets. Each start launches a Python process that plans the source's
        batches and must connect back to Spark within 10 s (Spark's limit), which a
        participant with a small CPU quota misses when several start at once. Once the
        query has planned (its status is past "Initializing ..."), that process is up, and
        the next may start while the first batch still runs (a fresh query's first batch,
        empty or not, takes seconds under a small quota)."""
        now = time.time()
        return [t.task_id for t in self.tasks()
                if t.state == "running" and now - t.started_s < within_s and not self._has_planned(t)]

    @staticmethod
    def _has_planned(task: HostedTask) -> bool:
        query = task.query
        if not task.planned and (task.batches or (query is not None and not query.status.get("message", "").startswith("Initializing"))):
            task.planned = True
        return task.planned

    def _on_batch(self, sample: BatchSample, end_offset: dict | None) -> None:
        task = self._tasks.get(sample.task_id)
        if task is None:
            return
        task.batches += 1
        task.rows += sample.rows
        task.last_batch = sample
        self.batch_durations.labels(sample.task_id).observe(sample.duration_s)
        if end_offset and "seq" in end_offset:
            task.position = int(end_offset["seq"])

    # -- measurements ------------------------------------------------------------------

    def _cpu_seconds(self) -> float | None:
        """The Spark processes' CPU seconds so far (`SparkCpu`); None without a local JVM."""
        return None if self._spark_cpu is None else self._spark_cpu.seconds()

    def sample(self) -> IntervalSample:
        """Close the current measuring interval and record it."""
        now, cpu = time.time(), self._cpu_seconds()
        start, start_cpu = self._last_tick
        if now <= start:
            now = start + 1e-6
        samples = self.recorder.samples(since_s=start)
        used = None if cpu is None or start_cpu is None else cpu - start_cpu
        running = self.running()
        raw = interval_sample(samples, start, now, self.cpus, running, used)
        self.factor = overhead_factor([*self.intervals, raw], default=self.factor)
        interval = interval_sample(samples, start, now, self.cpus, running, used, self.factor)
        self._last_tick = (now, cpu)
        self.intervals.append(interval)
        return interval

    def start_sampling(self) -> None:
        """Record an interval every `interval_s` seconds on a background thread."""
        if self._sampler is not None:
            return
        self._last_tick = (time.time(), self._cpu_seconds())

        def loop() -> None:
            # The loop never dies: without intervals, loads would stand still from then on.
            failed = None
            while not self._stop.wait(self.interval_s):
                try:
                    self.sample()
                    failed = None
                except Exception as exc:  # noqa: BLE001 - said once, tried again at the next interval
                    if repr(exc) != failed:
                        log.warning("measuring interval failed: %r; trying again in %g s", exc, self.interval_s)
                    failed = repr(exc)

        self._sampler = threading.Thread(target=loop, name="bpm-load-sampler", daemon=True)
        self._sampler.start()

    def loads(self, window_s: float | None = None) -> dict[str, float]:
        """Each running task's load over the last `window_s` seconds (default: the measuring interval)."""
        now = time.time()
        window = window_s or self.interval_s
        own = task_loads(self.recorder.samples(now - window), now - window, now, self.cpus, self.running())
        return {task: load * self.factor for task, load in own.items()}

    def backlog(self, task: HostedTask, max_age_s: float = BACKLOG_MAX_AGE_S) -> dict[str, float | str | None]:
        """What the task has not taken yet: the messages of its key groups after its position.
        Read as a partner reads, through a consumer on its key groups (no partner may read the
        stream's own state), and at most every `max_age_s`: the status is read at every heartbeat."""
        unknown = {"pending": None, "unit": "messages"}
        if task.state != "running":  # its host may no longer be let in to read the stream
            return unknown
        now = time.monotonic()
        if task.backlog_read is None or now - task.backlog_read[0] >= max_age_s:
            try:
                pending = task.source.pending(task.position or task.source.start_seq)
            except Exception:  # the broker unreachable: the status says so rather than failing
                pending = None
            task.backlog_read = (now, pending)
        return unknown if task.backlog_read[1] is None else {"pending": task.backlog_read[1], "unit": "messages"}

    def cost_function(self) -> CostFunction:
        """The convex cost model fitted to (utilisation, mean batch duration) of the recorded
        intervals; the M/M/1 form when the samples do not allow a fit (`fallback_used`).
        Refitted only when a new interval was recorded."""
        key = (len(self.intervals), self.intervals[-1].end_s if self.intervals else None)
        if self._model is None or self._model[0] != key:
            loads, durations = cost_samples(self.intervals)
            self._model = (key, fit_cost_function(loads, durations, fallback=MM1Cost()))
        return self._model[1]

    def marginal_costs(self, loads: dict[str, float] | None = None) -> dict[str, Any]:
        """The participant's load, and per task the marginal cost of shedding it and of taking as much more."""
        loads = loads if loads is not None else self.loads()
        total = sum(loads.values())
        model = self.cost_function()
        # A task that used no capacity in the window is priced at the margin (the limit of both formulas).
        per_task = {
            task: {
                "load": load,
                "shed": model.marginal_shed(total, load) if load > 0 else model.marginal(total),
                "take": model.marginal_take(total, load) if load > 0 else model.marginal(total),
            }
            for task, load in loads.items()
        }
        return {"load": total, "marginal": model.marginal(total), "tasks": per_task}

    def status(self) -> dict[str, Any]:
        """Everything a person or the control loop wants to know, as JSON-ready data."""
        loads = self.loads()
        last = self.intervals[-1] if self.intervals else None
        model = self.cost_function()
        tasks = []
        for task in self.tasks():
            batch = task.last_batch
            tasks.append({
                "task_id": task.task_id, "state": task.state, "input": task.input,
                "checkpoint": str(task.checkpoint_dir), "query": task.definition.name, "params": dict(task.params), "trigger_s": task.trigger_s,
                "batches": task.batches, "rows": task.rows, "position": task.position,
                "watermark_ms": committed_watermark_ms(task.checkpoint_dir),
                "last_batch_id": batch.batch_id if batch else None,
                "last_batch_duration_s": batch.duration_s if batch else None,
                "load": loads.get(task.task_id, 0.0), "backlog": self.backlog(task), "error": task.error,
            })
        return {
            "master": self.spark.sparkContext.master, "cpus": self.cpus, "interval_s": self.interval_s,
            "utilisation": sum(loads.values()),
            "cpu_utilisation": last.cpu_utilisation if last else None,
            "wall_utilisation": last.wall_utilisation if last else None,
            "overhead_factor": self.factor,
            "mean_batch_s": last.mean_batch_s if last else None,
            "tasks": tasks,
            "cost_function": model.to_dict(), "fallback_used": model.fallback_used,
            "marginal_costs": self.marginal_costs(loads),
            "intervals": len(self.intervals),
        }

    def close(self, stop_tasks: bool = True) -> None:
        """Stop sampling, optionally the tasks, and detach the listener."""
        self._stop.set()
        if self._sampler is not None:
            self._sampler.join(timeout=self.interval_s + 1)
        if stop_tasks:
            for task_id in self.running():
                self.stop_task(task_id)
        self.spark.streams.removeListener(self.recorder)
