"""Benchmarks of the data plane: the cost of the host's instrumentation, and how well the
measured loads and the fitted cost model explain what Spark really does.

They read a participant's broker stream written before the measurement starts, so no
feeder competes for the CPU, and bound each micro-batch (`maxMessagesPerTrigger`) so a run
has many batches. The source benchmark reads the same rows from CSV files too, through
Spark's own file source (`maxFilesPerTrigger`), as the baseline. Their task runs the
network-monitoring query over generated Zeek traffic unless given a `BenchTask` of another
query (`bpm bench overhead --query`, `bpm bench source --query`).
"""

from __future__ import annotations

import itertools
import statistics
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bpm.query import Params, Query
from bpm.zeek.generator import TrafficProfile, generate
from examples.network_monitoring import query as MONITORING
from examples.network_monitoring import records as monitoring_records
from spark_agents.host import SparkHost
from bpm.load import IntervalSample
from spark_agents.query import start_query
from spark_agents.status import StatusServer

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from spark_agents.broker.source import JetStreamInput

Progress = Callable[[str], None]
RATE = 300.0  # records per second of event time in the generated input


@dataclass(frozen=True)
class BenchTask:
    """A benchmark task's query, its parameters and its input: `records`, endless records of
    the query (`bpm.records.Records.parse`'s form) in input order."""

    query: Query
    params: Params
    records: Iterable[tuple[int, tuple]]


def monitoring_task() -> BenchTask:
    """The network-monitoring query with its defaults over endless generated Zeek traffic."""

    def traffic() -> Iterator[tuple[int, tuple]]:
        for i in itertools.count():
            profile = TrafficProfile(rate=RATE, duration_s=600.0)
            yield from monitoring_records(generate(replace(profile, start_ts=profile.start_ts + i * 600.0), i))

    return BenchTask(MONITORING, MONITORING.bind(), traffic())


class CsvFiles:
    """A folder of CSV files of stream rows, one file per chunk, named in order: the input of
    Spark's own file source, the source benchmark's baseline (a `RecordFeeder` writes it; a query
    reads it as it reads a `JetStreamInput`, `batch_files` files per micro-batch)."""

    partitions = 1
    since_s = until_s = None  # every row, as a task that was never split reads them

    def __init__(self, root: Path, batch_files: int) -> None:
        self.root = root
        self.batch_files = batch_files
        self.count = 0
        root.mkdir(parents=True, exist_ok=True)

    def read(self, spark, ddl: str, owed_batch: bool = False):
        """The streaming DataFrame of the rows (columns `ddl`), through Spark's file source (the
        benchmark's queries start fresh: no checkpoint owes them a batch)."""
        return spark.readStream.schema(ddl).option("maxFilesPerTrigger", self.batch_files).csv(str(self.root))

    def append(self, k: int, lines: Iterable[str]) -> int:
        temp = self.root / f".{self.count:012d}.csv.tmp"  # the file source skips hidden names
        temp.write_text("".join(lines))
        temp.rename(self.root / f"{self.count:012d}.csv")
        self.count += 1
        return self.count


def discard(batch_id: int, rows: list) -> None:
    """A benchmark's sink: the rows are computed (`batch_results`) and dropped."""


@contextmanager
def broker_input(work_dir: Path, flushes: int, rows_per_flush: int, batch_flushes: int,
                 files: bool = False, task: BenchTask | None = None) -> Iterator[tuple[JetStreamInput, CsvFiles | None, int]]:
    """A participant's broker started for a benchmark, its stream holding the records of `task`
    (default `monitoring_task()`) flushed `flushes` times (`rows_per_flush` records, 64
    messages, one per key group, each time) and closed; yields the input a task reads it
    through (`batch_flushes` flushes per micro-batch), with `files`, the same rows as CSV
    files (a file per flush), and the row count. The server stops on the way out."""
    import secrets

    from bpm.keygroups import KEY_GROUPS
    from spark_agents.broker.server import NatsServer, User
    from spark_agents.broker.source import JetStreamInput
    from spark_agents.broker.stream import Broker, BrokerStream
    from spark_agents.streams.feed import RecordFeeder

    task = task or monitoring_task()
    records = list(itertools.islice(task.records, round(flushes * rows_per_flush * 1.05)))
    owner = User("bench", secrets.token_urlsafe(16))
    with NatsServer.on_free_ports("bench", work_dir / "nats", [owner]) as server:
        with Broker(server.url, owner.name, owner.password) as broker:
            feeders = [RecordFeeder(BrokerStream(broker, "bench"), task.query, task.params)]
            csv = CsvFiles(work_dir / "files", batch_flushes) if files else None
            if csv is not None:
                feeders.append(RecordFeeder(csv, task.query, task.params))
            for feeder in feeders:
                feeder.feed(records, rows_per_flush)
                feeder.close()
        rows = sum(feeders[0].written)
        assert all(sum(f.written) == rows for f in feeders), "both inputs hold the same rows"
        yield JetStreamInput(server.url, owner.name, owner.password, "bench", max_messages=batch_flushes * KEY_GROUPS), csv, rows


def overhead(
    spark: SparkSession, work_dir: Path, rounds: int = 4, files: int = 24, rows_per_file: int = 4000,
    files_per_batch: int = 2, scrape_s: float = 1.0, progress: Progress = lambda _: None, task: BenchTask | None = None,
) -> dict[str, Any]:
    """Rows per second of one task (of `task`'s query, default `monitoring_task()`) with the host's
    instrumentation (listener, sampler, HTTP status scraped every `scrape_s`) against the bare
    query, in interleaved runs (ABBA order), both reading a participant's broker stream
    (`files` flushes of `rows_per_file` rows, `files_per_batch` flushes per micro-batch)."""
    task = task or monitoring_task()
    with broker_input(work_dir, files, rows_per_file, files_per_batch, task=task) as (source, _, rows):
        return _overhead(spark, work_dir, source, rows, rounds, -(-files // files_per_batch), scrape_s, progress, task)


def _overhead(spark: SparkSession, work_dir: Path, source: JetStreamInput, rows: int, rounds: int, batches: int, scrape_s: float,
              progress: Progress, task: BenchTask) -> dict[str, Any]:
    import httpx

    counter = iter(range(1_000_000))

    def bare() -> float:
        n = next(counter)
        started = time.perf_counter()
        query = start_query(spark, f"bare-{n}", source, work_dir / f"ck-{n}", task.query, task.params, discard)
        try:
            query.processAllAvailable()
            return time.perf_counter() - started
        finally:
            query.stop()

    def instrumented() -> float:
        # The host, its sampler, its HTTP server and a scraper are up before the clock starts,
        # as on a running agent; the clock covers the same span as for the bare query.
        n = next(counter)
        host = SparkHost(spark, work_dir / f"host-{n}", interval_s=1.0)
        host.start_sampling()
        server = StatusServer(host)
        url = server.start()
        stop = threading.Event()

        def scrape() -> None:
            with httpx.Client(timeout=30) as client:
                while not stop.wait(scrape_s):
                    client.get(f"{url}/metrics")

        scraper = threading.Thread(target=scrape, daemon=True)
        scraper.start()
        try:
            started = time.perf_counter()
            hosted = host.start_task(f"task-{n}", source, work_dir / f"ck-{n}", task.query, task.params, None, sink=discard)
            hosted.query.processAllAvailable()
            return time.perf_counter() - started
        finally:
            stop.set()
            scraper.join()
            host.close()
            server.stop()

    progress("warm-up runs")
    bare()
    instrumented()
    times: dict[str, list[float]] = {"bare": [], "instrumented": []}
    for r in range(rounds):
        order = ("bare", "instrumented") if r % 2 == 0 else ("instrumented", "bare")
        for variant in order:
            progress(f"round {r + 1}/{rounds}: {variant}")
            times[variant].append(bare() if variant == "bare" else instrumented())
    bare_rps = rows * rounds / sum(times["bare"])
    instr_rps = rows * rounds / sum(times["instrumented"])
    pair_ratios = [b / i for b, i in zip(times["bare"], times["instrumented"])]
    return {
        "benchmark": "overhead", "query": task.query.name,
        "input": "broker", "rows_per_run": rows, "batches_per_run": batches, "rounds": rounds,
        "bare_rows_per_s": round(bare_rps, 1), "instrumented_rows_per_s": round(instr_rps, 1),
        "ratio": round(instr_rps / bare_rps, 4), "median_pair_ratio": round(statistics.median(pair_ratios), 4),
        "bare_run_s": [round(t, 2) for t in times["bare"]], "instrumented_run_s": [round(t, 2) for t in times["instrumented"]],
        "goal": ">= 0.98", "goal_met": instr_rps / bare_rps >= 0.98,
    }


def _level_summary(intervals: list[IntervalSample], tasks: int) -> dict[str, Any]:
    timed = [i for i in intervals if i.mean_batch_s is not None]
    cpu = [i.cpu_utilisation for i in intervals if i.cpu_utilisation is not None]
    return {
        "tasks": tasks,
        "utilisation": statistics.fmean(i.utilisation for i in intervals),
        "task_cpu_utilisation": statistics.fmean(i.task_cpu_utilisation for i in intervals),
        "wall_utilisation": statistics.fmean(i.wall_utilisation for i in intervals),
        "cpu_utilisation": statistics.fmean(cpu) if cpu else None,
        "mean_batch_s": statistics.fmean(i.mean_batch_s for i in timed) if timed else None,
        "intervals": len(intervals),
    }


def predicted_batch_s(model: Any, utilisation: float) -> float:
    """Batch duration the fitted model predicts at a utilisation: D(u) plus the fitted idle duration."""
    return model.cost(utilisation) + model.fit.intercept


def _prediction(levels: list[dict[str, Any]], samples: list[list[IntervalSample]], held_out: int) -> dict[str, Any]:
    from bpm.costs import CostFitError, fit_cost_function
    from bpm.load import cost_samples

    training = [i for n, level in enumerate(samples) if n != held_out for i in level]
    loads, durations = cost_samples(training)
    target = levels[held_out]
    try:
        model = fit_cost_function(loads, durations)
    except CostFitError as exc:
        return {"held_out_tasks": target["tasks"], "error": str(exc), "relative_error": None,
                "samples": [[round(x, 4), round(y, 4)] for x, y in zip(loads, durations)]}
    predicted = predicted_batch_s(model, target["utilisation"])
    observed = target["mean_batch_s"]
    return {
        "held_out_tasks": target["tasks"], "utilisation": round(target["utilisation"], 4),
        "predicted_batch_s": round(predicted, 4), "observed_batch_s": round(observed, 4),
        "relative_error": round(abs(predicted - observed) / observed, 4), "model": model.to_dict(),
    }


def _load_levels(host: SparkHost, sources: list[JetStreamInput], level_s: float, interval_s: float, trigger_s: float,
                 warmup_s: float, progress: Progress) -> tuple[list[list[IntervalSample]], list[float]]:
    """The intervals of each level (1..N tasks together), and each task's task-CPU utilisation alone."""
    tasks, settle = len(sources), interval_s

    def run(active: range | list[int], seconds: float) -> list[IntervalSample]:
        for k in range(tasks):
            name = f"task-{k}"
            if k in active and name not in host.running():
                host.start_task(name, sources[k], query=MONITORING, params=MONITORING.bind(), trigger_s=trigger_s, sink=discard)
            elif k not in active and name in host.running():
                host.stop_task(name)
        time.sleep(settle)  # a started task's first batches catch up; not measured
        host.sample()
        intervals = []
        for _ in range(max(1, round(seconds / interval_s))):
            time.sleep(interval_s)
            intervals.append(host.sample())
        return intervals

    progress("warm-up: every task")
    run(range(tasks), warmup_s)
    samples: list[list[IntervalSample]] = []
    for n in range(tasks, 0, -1):  # one task fewer per level: no restarts while levels are measured
        progress(f"level {tasks - n + 1}/{tasks}: {n} task(s) together")
        samples.insert(0, run(range(n), level_s))
    alone = [statistics.fmean(i.task_cpu_utilisation for i in samples[0])]
    for k in range(1, tasks):
        progress(f"task {k + 1}/{tasks} alone")
        alone.append(statistics.fmean(i.task_cpu_utilisation for i in run([k], level_s)))
    return samples, alone


def load_model(
    spark: SparkSession, work_dir: Path, tasks: int = 4, level_s: float = 30.0, interval_s: float = 5.0,
    trigger_s: float = 2.0, rows_per_batch: int = 3000, warmup_s: float = 30.0, plot: Path | None = None,
    progress: Progress = lambda _: None,
) -> dict[str, Any]:
    """Do measured loads explain the measured utilisation, and does the fitted cost model predict batch duration?

    `tasks` (a power of two) tasks read a share each of one broker stream, about
    `rows_per_batch` rows per batch each. After a warm-up with every task running, `tasks`..1 tasks run together (one fewer per
    level), then each other task runs alone. Per level, the sum of the task loads, and the sum
    of the loads the same tasks had alone, are compared with the process CPU / CPUs; the cost
    model fitted to the other levels' intervals predicts the batch duration at a held-out level
    (interpolation: a middle level; extrapolation: the top one).
    """
    from bpm.keygroups import KEY_GROUPS, shares

    prefixes = shares(tasks)
    settle = interval_s
    flushes = int((warmup_s + (2 * tasks) * (level_s + settle)) / trigger_s) + 20
    progress("writing input")
    with broker_input(work_dir, flushes, rows_per_batch * tasks, 1) as (source, _, _):
        # A batch is bounded in stream sequences, every key group's: a bound of one flush
        # (64 messages) gives each task its share of a flush per batch.
        sources = [replace(source, prefix=p, max_messages=KEY_GROUPS) for p in prefixes]
        host = SparkHost(spark, work_dir / "host", interval_s=interval_s)
        try:
            samples, alone = _load_levels(host, sources, level_s, interval_s, trigger_s, warmup_s, progress)
        finally:
            host.close()

    # One overhead factor for the whole run, as the host settles on one: loads are k x task CPU.
    k = host.factor
    levels = []
    for n, level in enumerate(samples, start=1):
        summary = _level_summary(level, n)
        summary["utilisation"] = k * summary["task_cpu_utilisation"]
        summary["sum_of_loads_alone"] = k * sum(alone[:n])
        levels.append(summary)
    rescaled = [[replace(i, utilisation=k * i.task_cpu_utilisation) for i in level] for level in samples]
    together = [abs(lv["utilisation"] - lv["cpu_utilisation"]) / lv["cpu_utilisation"] for lv in levels]
    added = [abs(lv["sum_of_loads_alone"] - lv["cpu_utilisation"]) / lv["cpu_utilisation"] for lv in levels]
    interpolation = _prediction(levels, rescaled, held_out=len(levels) // 2)
    extrapolation = _prediction(levels, rescaled, held_out=len(levels) - 1)
    result = {
        "benchmark": "load-model", "cpus": host.cpus, "trigger_s": trigger_s, "rows_per_batch": rows_per_batch,
        "overhead_factor": round(k, 4), "loads_alone": [round(k * x, 4) for x in alone],
        "levels": [{key: (round(v, 4) if isinstance(v, float) else v) for key, v in lv.items()} for lv in levels],
        "sum_of_loads_vs_measured_error": [round(e, 4) for e in together],
        "sum_of_loads_alone_vs_measured_error": [round(e, 4) for e in added],
        "prediction_interpolated": interpolation, "prediction_extrapolated": extrapolation,
        "goal": "within 15%: sum of loads against measured utilisation at every level, interpolated prediction",
        "goal_met": max(together) <= 0.15 and interpolation["relative_error"] is not None
        and interpolation["relative_error"] <= 0.15,
    }
    if plot is not None and interpolation["relative_error"] is not None:
        plot_load_model(levels, rescaled, interpolation, plot)
        result["plot"] = str(plot)
    return result


def fixed_cost(
    spark: SparkSession, work_dir: Path, depth: int = 3, level_s: float = 30.0, interval_s: float = 5.0, trigger_s: float = 2.0,
    rows_per_batch: int = 3000, warmup_s: float = 30.0, capacity: float = 0.4, plot: Path | None = None,
    progress: Progress = lambda _: None,
) -> dict[str, Any]:
    """What a running task costs whatever its input: the fixed cost a split adds.

    The same rows (about `rows_per_batch` per trigger in all) are read by 1, 2, 4 ..
    2^`depth` tasks, each over an equal share of one broker stream: one task split and split
    again. The levels run up, then down again (so that drift over the run cancels), each
    for `level_s` after its tasks' first batches. The process CPU per level, against the
    number of tasks, is fitted with a least-squares line: its slope is the fixed cost of a
    task, in CPU seconds per second, and in units of load of a participant of `capacity`
    CPUs (the demo's capacity by default), the figure `bpm simulate --fixed-cost` and the
    agents' split decisions take.
    """
    from bpm.keygroups import KEY_GROUPS, shares

    counts = [1 << d for d in range(depth + 1)]
    order = counts + counts[::-1]
    flushes = int((warmup_s + len(order) * (level_s + interval_s)) / trigger_s) + 20
    progress("writing input")
    measured: dict[int, list[IntervalSample]] = {n: [] for n in counts}
    with broker_input(work_dir, flushes, rows_per_batch, 1) as (source, _, rows):
        host = SparkHost(spark, work_dir / "host", interval_s=interval_s)
        try:
            for step, n in enumerate(["warm-up", *order]):
                tasks = counts[-1] if n == "warm-up" else n
                for name in list(host.running()):
                    host.stop_task(name)
                # Each level starts its tasks fresh at the stream's start. A batch is bounded in
                # stream sequences, every key group's: each task reads its share of one flush.
                for k, prefix in enumerate(shares(tasks)):
                    host.start_task(f"level{step}-{k}", replace(source, prefix=prefix, max_messages=KEY_GROUPS),
                                    query=MONITORING, params=MONITORING.bind(), trigger_s=trigger_s, sink=discard)
                progress(f"{n} with {tasks} tasks" if n == "warm-up" else f"level {step}/{len(order)}: {n} task(s) over the same rows")
                time.sleep(warmup_s if n == "warm-up" else interval_s)  # first batches, not measured
                host.sample()
                if n == "warm-up":
                    continue
                for _ in range(max(1, round(level_s / interval_s))):
                    time.sleep(interval_s)
                    measured[n].append(host.sample())
        finally:
            host.close()

    levels = []
    for n in counts:
        cpu = [i.cpu_utilisation for i in measured[n] if i.cpu_utilisation is not None]
        batches = sum(i.batches for i in measured[n])
        levels.append({"tasks": n, "cpu_utilisation": round(statistics.fmean(cpu), 4) if cpu else None,
                       "rows_per_s": round(sum(i.rows for i in measured[n]) / sum(i.end_s - i.start_s for i in measured[n]), 1),
                       "batches": batches, "intervals": len(measured[n])})
    points = [(lv["tasks"], lv["cpu_utilisation"]) for lv in levels if lv["cpu_utilisation"] is not None]
    slope = intercept = None
    if len(points) >= 2:
        slope, intercept = statistics.linear_regression([x for x, _ in points], [y for _, y in points])
    cpu_s = None if slope is None else slope * host.cpus
    result = {
        "benchmark": "fixed-cost", "cpus": host.cpus, "trigger_s": trigger_s, "rows_per_batch": rows_per_batch, "rows": rows,
        "levels": levels,
        "fixed_cost_cpu_s_per_s": None if cpu_s is None else round(cpu_s, 5),
        "one_task_cpu_s_per_s": None if slope is None else round((slope + intercept) * host.cpus, 5),
        "capacity_cpus": capacity,
        "fixed_cost_load": None if cpu_s is None else round(cpu_s / capacity, 5),
        "method": "least-squares slope of the process CPU against the number of tasks reading the same rows, levels measured up and down",
    }
    if plot is not None and slope is not None:
        plot_fixed_cost(levels, slope, intercept, plot)
        result["plot"] = str(plot)
    return result


FIRST_BATCH_TIMEOUT_S = 120.0


def first_queries(
    spark: SparkSession, work_dir: Path, task: BenchTask | None = None, prime_s: float = 0.0, queries: int = 3,
    seconds: float = 30.0, trigger_s: float = 10.0, progress: Progress = lambda _: None,
) -> dict[str, Any]:
    """What a driver's first queries cost, primed for `prime_s` (`spark_agents.warmup.prime`;
    0: not) or not: `queries` runs of `task`'s query (default `monitoring_task()`'s) over made-up records, one after
    another, each for `seconds` at a `trigger_s` trigger; per query, the CPU seconds the
    driver used (its local JVM with its Python processes, and this process) over its first
    trigger interval and over all of it (and what the priming used). Run it in a fresh process: the first query of a
    driver that has run none costs several times the later ones' start."""
    from spark_agents.metrics import SparkCpu
    from spark_agents.query import stop_between_batches
    from spark_agents.warmup import Discard, MadeUpInput, prime

    proc = getattr(getattr(spark.sparkContext, "_gateway", None), "proc", None)
    if proc is None or not spark.sparkContext.master.startswith("local"):
        raise ValueError("the driver's CPU is measured on a local master whose JVM this process started")
    spark_cpu = SparkCpu(proc.pid)
    task = task or monitoring_task()

    def cpu() -> float:
        seconds = spark_cpu.seconds()
        if seconds is None:
            raise RuntimeError(f"the driver's JVM (pid {proc.pid}) can no longer be read")
        return seconds

    primed = None
    if prime_s > 0:
        progress(f"priming for {prime_s:g} s")
        start = cpu()
        primed = prime(spark, prime_s, work_dir / "prime", task.query, task.params)
        primed["cpu_s"] = round(cpu() - start, 2)
    made_up = MadeUpInput.of(task.query, task.params)
    runs = []
    for n in range(queries):
        progress(f"query {n + 1} of {queries}")
        done, batches = threading.Event(), []

        def output(*_: Any) -> None:
            batches.append(1)
            done.set()

        start = cpu()
        query = start_query(spark, f"first-{n}", made_up, work_dir / f"first-{n}", task.query, task.params, Discard(),  # type: ignore[arg-type]
                            trigger_s, output)
        time.sleep(trigger_s)
        first = cpu()
        time.sleep(max(0.0, seconds - trigger_s))
        if not done.wait(FIRST_BATCH_TIMEOUT_S):  # a slow machine's first batch may outlast `seconds`: a query is measured over one at least
            query.stop()
            raise RuntimeError(f"query {n + 1} completed no batch in {seconds + FIRST_BATCH_TIMEOUT_S:g} s")
        stop_between_batches(query, done)
        runs.append({"query": n + 1, "first_trigger_cpu_s": round(first - start, 2), "cpu_s": round(cpu() - start, 2),
                     "batches": len(batches)})
    later = [r["first_trigger_cpu_s"] for r in runs[1:]]
    return {
        "benchmark": "first-queries", "query": task.query.name, "prime_s": prime_s, "primed": primed, "trigger_s": trigger_s, "seconds": seconds,
        "queries": runs,
        "first_over_later": round(runs[0]["first_trigger_cpu_s"] / statistics.median(later), 2) if later and statistics.median(later) > 0 else None,
        "method": "process CPU of the driver (JVM, its Python processes, this process) from /proc, around each query's first trigger interval and its whole run",
    }


def plot_fixed_cost(levels: list[dict[str, Any]], slope: float, intercept: float, path: Path) -> None:
    """The process CPU per number of tasks over the same rows, and the fitted line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    n = [lv["tasks"] for lv in levels]
    ax.plot(n, [lv["cpu_utilisation"] for lv in levels], "ks", label="measured: process CPU / CPUs")
    ax.plot(n, [intercept + slope * x for x in n], "b-", linewidth=1, label=f"fit: {slope:.4f} per task")
    ax.set(xlabel="tasks reading the same rows", ylabel="share of the CPUs", title="Fixed cost of a running task", xticks=n)
    _save(fig, [ax], path, dpi=110)


def plot_load_model(levels: list[dict[str, Any]], samples: list[list[IntervalSample]], prediction: dict[str, Any], path: Path) -> None:
    """Two panels: sum of the loads measured alone against the utilisation measured together,
    and batch duration against utilisation with the fitted model."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    from bpm.costs import cost_function_from_dict

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.5))
    n = [lv["tasks"] for lv in levels]
    left.plot(n, [lv["cpu_utilisation"] for lv in levels], "ks-", label="measured: process CPU / CPUs")
    left.plot(n, [lv["utilisation"] for lv in levels], "o-", label="sum of task loads")
    left.plot(n, [lv["sum_of_loads_alone"] for lv in levels], "d--", label="sum of loads measured alone")
    left.plot(n, [lv["wall_utilisation"] for lv in levels], "^:", label="from batch wall time (not used)")
    left.set(xlabel="tasks running", ylabel="share of the participant", title="Loads against measured utilisation", xticks=n)
    for level in samples:
        right.scatter([i.utilisation for i in level], [i.mean_batch_s for i in level], label=f"{level and len(level[0].loads)} task(s)")
    top = max(i.utilisation for level in samples for i in level) * 1.15
    model = cost_function_from_dict(prediction["model"])
    xs = np.linspace(0, top, 100)
    right.plot(xs, [predicted_batch_s(model, x) for x in xs], "k-", linewidth=1, label="fitted model")
    right.scatter([prediction["utilisation"]], [prediction["predicted_batch_s"]], marker="x", s=80, c="red", label="prediction")
    right.set(xlabel="utilisation (sum of loads)", ylabel="mean batch duration (s)", title="Cost model fit")
    _save(fig, [left, right], path, dpi=100)


def _save(fig: Any, axes: list[Any], path: Path, dpi: int) -> None:
    """A benchmark's figure, its panels with legend and grid, written to `path` (its folder made) and closed."""
    import matplotlib.pyplot as plt

    for ax in axes:
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi)
    plt.close(fig)


def source(
    spark: SparkSession, work_dir: Path, rounds: int = 4, flushes: int = 30, rows_per_flush: int = 4000, flushes_per_batch: int = 2,
    progress: Progress = lambda _: None, task: BenchTask | None = None,
) -> dict[str, Any]:
    """Rows per second of a query (`task`'s, default `monitoring_task()`) reading the same rows from a participant's
    JetStream input (a NATS server started for the run, 64 key groups) and from CSV files
    through Spark's file source, in interleaved runs (ABBA order). Both are written before
    the clock starts, flushed alike (a file of `rows_per_flush` rows; 64 messages, one per
    key group), and read `flushes_per_batch` flushes per micro-batch; both runs' rows go to
    the same sink."""
    progress("writing the input")
    task = task or monitoring_task()
    with broker_input(work_dir, flushes, rows_per_flush, flushes_per_batch, files=True, task=task) as (source, files, rows):
        counter = iter(range(1_000_000))

        def run(variant: str) -> tuple[float, float]:
            """The run's seconds from the query's start to all rows processed, and of those the
            seconds its micro-batches took (Spark's `triggerExecution`): the rest is its start."""
            n = next(counter)
            started = time.perf_counter()
            query = start_query(spark, f"{variant}-{n}", source if variant == "jetstream" else files, work_dir / f"ck-{n}", task.query, task.params, discard)
            try:
                query.processAllAvailable()
                elapsed = time.perf_counter() - started
                return elapsed, sum(p.durationMs.get("triggerExecution", 0) for p in query.recentProgress) / 1000
            finally:
                query.stop()

        progress("warm-up runs")
        run("file")
        run("jetstream")
        times: dict[str, list[tuple[float, float]]] = {"file": [], "jetstream": []}
        for r in range(rounds):
            for variant in (("file", "jetstream") if r % 2 == 0 else ("jetstream", "file")):
                progress(f"round {r + 1}/{rounds}: {variant}")
                times[variant].append(run(variant))

    def rate(variant: str, part: int) -> float:
        return rows * rounds / sum(t[part] for t in times[variant])

    file_rps, js_rps = rate("file", 0), rate("jetstream", 0)
    file_batch_rps, js_batch_rps = rate("file", 1), rate("jetstream", 1)
    return {
        "benchmark": "source", "query": task.query.name,
        "rows_per_run": rows, "rounds": rounds, "flushes_per_batch": flushes_per_batch,
        "jetstream_rows_per_s": round(js_rps, 1), "file_rows_per_s": round(file_rps, 1), "ratio": round(js_rps / file_rps, 4),
        # In the micro-batches alone, without each run's start (a JetStream query starts a
        # Python process that plans its batches, `docs/benchmarks.md`, "Sources").
        "jetstream_batch_rows_per_s": round(js_batch_rps, 1), "file_batch_rows_per_s": round(file_batch_rps, 1),
        "batch_ratio": round(js_batch_rps / file_batch_rps, 4),
        "jetstream_start_s": round(statistics.median(t[0] - t[1] for t in times["jetstream"]), 3),
        "file_start_s": round(statistics.median(t[0] - t[1] for t in times["file"]), 3),
        "jetstream_run_s": [round(t[0], 2) for t in times["jetstream"]], "file_run_s": [round(t[0], 2) for t in times["file"]],
        "goal": ">= 1.0", "goal_met": js_rps / file_rps >= 1.0,
    }
