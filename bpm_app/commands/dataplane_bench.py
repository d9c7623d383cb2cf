"""`bpm bench overhead`, `bpm bench source`, `bpm bench load-model`, `bpm bench fixed-cost` and `bpm bench first-queries`: benchmarks of the Spark data plane."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from bpm_app.commands import bench_app

SparkMaster = Annotated[str, typer.Option("--spark-master", help="Spark master URL.")]
PlotFile = Annotated[Path | None, typer.Option("--plot", help="Write a PNG of the measurements and the fit here.")]
AsJson = Annotated[bool, typer.Option("--json", help="Print one JSON object.")]
QueryRef = Annotated[str | None, typer.Option("--query", help="The task's query, module:attribute or path/to/file.py:attribute; its module's generate(seconds=, rate=, seed=) makes the input (default: the network-monitoring query over generated Zeek traffic).")]
QueryParam = Annotated[list[str] | None, typer.Option("--param", help="A parameter of the query, name=value (repeatable).")]


def _task(query: str | None, params: list[str] | None):
    """The benchmark's task of `--query` with its `--param`s (None: the network-monitoring query's own); exits 2 on a bad one."""
    if query is None and not params:
        return None
    from bpm.query import QueryError
    from bpm_app.bench.workload import Workload, generator
    from bpm_app.commands.bench_move import workload
    from bpm_app.bench.dataplane import RATE, BenchTask

    try:
        chosen: Workload = workload(query, params)
        definition, bound = chosen.load()
        generator(definition)
    except (QueryError, ValueError) as exc:
        typer.secho(str(exc), fg="red", err=True)
        raise typer.Exit(2) from None
    return BenchTask(definition, bound, chosen.records(rate=RATE, seed=0))


def _report(result: dict, as_json: bool) -> None:
    if as_json:
        print(json.dumps(result))
    else:
        Console().print_json(json.dumps(result))


def _with_spark(name: str, master: str, as_json: bool, bench, lean: bool = False) -> None:
    """Run `bench(spark, work_dir, progress)` in a temporary folder with a session of its own
    (`lean`: the JVM options of an agent's local driver); report its result."""
    from spark_agents.session import make_session

    err = Console(stderr=True)
    with tempfile.TemporaryDirectory(prefix=f"bpm-bench-{name}-") as tmp, err.status("starting Spark") as status:
        result = bench(make_session(master, f"bpm-bench-{name}", lean=lean), Path(tmp), status.update)
    _report(result, as_json)


@bench_app.command("overhead")
def overhead_command(
    rounds: int = typer.Option(4, "--rounds", min=1, help="Interleaved pairs of runs (bare, instrumented)."),
    files: int = typer.Option(24, "--files", min=2, help="Flushes of the feeder into the broker stream (64 messages each)."),
    rows_per_file: int = typer.Option(4000, "--rows-per-file", min=100, help="Rows per flush."),
    query: QueryRef = None,
    param: QueryParam = None,
    spark_master: SparkMaster = "local[*]",
    as_json: AsJson = False,
) -> None:
    """Rows per second of the query over a broker stream with the host's instrumentation against bare Spark (goal: ratio >= 0.98)."""
    from bpm_app.bench import dataplane as benchmarks

    task = _task(query, param)
    _with_spark("overhead", spark_master, as_json,
                lambda spark, tmp, progress: benchmarks.overhead(spark, tmp, rounds, files, rows_per_file, progress=progress, task=task))


@bench_app.command("source")
def source_command(
    rounds: int = typer.Option(4, "--rounds", min=1, help="Interleaved pairs of runs (file source, JetStream source)."),
    flushes: int = typer.Option(30, "--flushes", min=2, help="Flushes of the feeder: a CSV file each for the file source, 64 messages each of the JetStream input."),
    rows_per_flush: int = typer.Option(4000, "--rows-per-flush", min=100),
    flushes_per_batch: int = typer.Option(2, "--flushes-per-batch", min=1, help="Flushes each micro-batch reads, in both sources."),
    query: QueryRef = None,
    param: QueryParam = None,
    spark_master: SparkMaster = "local[*]",
    as_json: AsJson = False,
) -> None:
    """Rows per second of the query reading a participant's JetStream input against Spark's file source over the same rows (goal: ratio >= 1.0)."""
    from bpm_app.bench import dataplane as benchmarks

    task = _task(query, param)
    _with_spark("source", spark_master, as_json,
                lambda spark, tmp, progress: benchmarks.source(spark, tmp, rounds, flushes, rows_per_flush, flushes_per_batch, progress=progress, task=task))


@bench_app.command("load-model")
def load_model_command(
    tasks: int = typer.Option(4, "--tasks", min=4, max=64, help="Load levels: 1..N concurrent tasks, each over a share of one stream (a power of two)."),
    level_seconds: float = typer.Option(40.0, "--level-seconds", min=5, help="Measured seconds per level."),
    warmup: float = typer.Option(30.0, "--warmup", min=0, help="Seconds of warm-up with every task, not measured."),
    interval: float = typer.Option(10.0, "--interval", min=1, help="Measuring interval in seconds (longer: more batches per sample, less noise)."),
    trigger: float = typer.Option(2.0, "--trigger", min=0.1, help="Tasks' trigger interval in seconds."),
    rows_per_batch: int = typer.Option(3000, "--rows-per-batch", min=100),
    spark_master: SparkMaster = "local[*]",
    plot: PlotFile = None,
    as_json: AsJson = False,
) -> None:
    """Do task loads measured alone add up to the utilisation measured together, and does the fitted
    cost model predict batch duration at a new load level? (goal: both within 15%)"""
    from bpm.keygroups import KeyGroupError, shares
    from bpm_app.bench import dataplane as benchmarks

    try:
        shares(tasks)
    except KeyGroupError as exc:
        raise typer.BadParameter(str(exc), param_hint="--tasks") from None
    _with_spark("load-model", spark_master, as_json,
                lambda spark, tmp, progress: benchmarks.load_model(spark, tmp, tasks, level_seconds, interval, trigger, rows_per_batch,
                                                                   warmup, plot, progress=progress))


@bench_app.command("fixed-cost")
def fixed_cost_command(
    depth: int = typer.Option(3, "--depth", min=1, max=6, help="Levels 1, 2, 4 .. 2^DEPTH tasks over the same rows."),
    level_seconds: float = typer.Option(30.0, "--level-seconds", min=2, help="Measured seconds per level (each level runs twice)."),
    warmup: float = typer.Option(30.0, "--warmup", min=0, help="Seconds of warm-up with the most tasks, not measured."),
    interval: float = typer.Option(5.0, "--interval", min=1, help="Measuring interval in seconds."),
    trigger: float = typer.Option(2.0, "--trigger", min=0.1, help="Tasks' trigger interval in seconds."),
    rows_per_batch: int = typer.Option(3000, "--rows-per-batch", min=100, help="Rows per trigger, over all the tasks of a level."),
    capacity: float = typer.Option(0.4, "--capacity", min=0.01, help="The participant's capacity in CPUs, to give the fixed cost in units of its load."),
    spark_master: SparkMaster = "local[*]",
    plot: PlotFile = None,
    as_json: AsJson = False,
) -> None:
    """What a running task costs whatever its input: the same rows read by 1, 2, 4 .. tasks (a task split again and again); the slope of the CPU against the tasks."""
    from bpm_app.bench import dataplane as benchmarks

    _with_spark("fixed-cost", spark_master, as_json,
                lambda spark, tmp, progress: benchmarks.fixed_cost(spark, tmp, depth, level_seconds, interval, trigger, rows_per_batch,
                                                                   warmup, capacity, plot, progress=progress))


@bench_app.command("first-queries")
def first_queries_command(
    prime: float = typer.Option(0.0, "--prime", min=0, help="Seconds of priming first (bpm agent run --prime); 0: none."),
    queries: int = typer.Option(3, "--queries", min=2, help="Queries run one after another."),
    seconds: float = typer.Option(30.0, "--seconds", min=1, help="Seconds each query runs."),
    trigger: float = typer.Option(10.0, "--trigger", min=0.1, help="Their trigger interval in seconds."),
    query: QueryRef = None,
    param: QueryParam = None,
    spark_master: SparkMaster = "local[1]",
    as_json: AsJson = False,
) -> None:
    """What a fresh driver's first query costs against its later ones, primed (--prime) or not,
    with the JVM options of an agent's local driver (goal, primed: the first query's first trigger interval costs at most 1.5 times a later one's)."""
    from bpm_app.bench import dataplane as benchmarks

    if not spark_master.startswith("local"):
        raise typer.BadParameter("the driver's CPU is measured on a local master", param_hint="--spark-master")
    task = _task(query, param)
    _with_spark("first-queries", spark_master, as_json,
                lambda spark, tmp, progress: benchmarks.first_queries(spark, tmp, task, prime, queries, seconds, trigger, progress=progress),
                lean=True)
