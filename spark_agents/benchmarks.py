"""Benchmarks of the data plane: the cost of the host's instrumentation, and how well the
measured loads and the fitted cost model explain what Spark really does.

Both read streams written before the measurement starts, so no feeder competes for the CPU,
and bound each micro-batch with `maxFilesPerTrigger` so a run has many batches.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bpm.streams import PartitionedStream
from bpm.streams.feed import feed_all
from bpm.zeek.definitions import QueryParams
from bpm.zeek.generator import TrafficProfile, generate
from spark_agents.host import TaskHost
from spark_agents.metrics import IntervalSample
from spark_agents.query import start_query
from spark_agents.status import StatusServer

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

PARAMS = QueryParams()
Progress = Callable[[str], None]


def write_input(root: Path, files: int, rows_per_file: int, seed: int = 0) -> tuple[PartitionedStream, int]:
    """A one-partition stream of `files` files of generated traffic; returns it and its connection count."""
    rate = 300.0
    conns = generate(TrafficProfile(duration_s=files * rows_per_file / rate * 1.05, rate=rate), seed)
    stream = PartitionedStream.create(root, 1)
    feeder = feed_all(stream, conns, PARAMS, rows_per_file=rows_per_file)
    return stream, sum(feeder.written)


def _timed_run(run: Callable[[], None]) -> float:
    start = time.perf_counter()
    run()
    return time.perf_counter() - start


def overhead(
    spark: SparkSession, work_dir: Path, rounds: int = 4, files: int = 24, rows_per_file: int = 4000,
    files_per_batch: int = 2, scrape_s: float = 1.0, progress: Progress = lambda _: None,
) -> dict[str, Any]:
    """Rows per second of one task with the host's instrumentation (listener, sampler, HTTP status
    scraped every `scrape_s`) against the bare query, in interleaved runs (ABBA order)."""
    import httpx

    stream, rows = write_input(work_dir / "stream", files, rows_per_file)
    counter = iter(range(1_000_000))

    def bare() -> None:
        n = next(counter)
        query = start_query(spark, f"bare-{n}", stream.partition_path(0), work_dir / f"ck-{n}", work_dir / f"out-{n}",
                            PARAMS, None, files_per_batch)
        try:
            query.processAllAvailable()
        finally:
            query.stop()

    def instrumented() -> None:
        n = next(counter)
        host = TaskHost(spark, work_dir / f"host-{n}", work_dir / f"out-{n}", interval_s=1.0)
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
            task = host.start_task(f"task-{n}", stream.partition_path(0), work_dir / f"ck-{n}", PARAMS, None, files_per_batch)
            task.query.processAllAvailable()
        finally:
            stop.set()
            scraper.join()
            host.close()
            server.stop()

    progress("warm-up run")
    _timed_run(bare)
    times: dict[str, list[float]] = {"bare": [], "instrumented": []}
    for r in range(rounds):
        order = ("bare", "instrumented") if r % 2 == 0 else ("instrumented", "bare")
        for variant in order:
            progress(f"round {r + 1}/{rounds}: {variant}")
            times[variant].append(_timed_run(bare if variant == "bare" else instrumented))
    bare_rps = rows * rounds / sum(times["bare"])
    instr_rps = rows * rounds / sum(times["instrumented"])
    pair_ratios = [b / i for b, i in zip(times["bare"], times["instrumented"])]
    return {
        "benchmark": "overhead",
        "rows_per_run": rows, "batches_per_run": -(-files // files_per_batch), "rounds": rounds,
        "bare_rows_per_s": round(bare_rps, 1), "instrumented_rows_per_s": round(instr_rps, 1),
        "ratio": round(instr_rps / bare_rps, 4), "median_pair_ratio": round(statistics.median(pair_ratios), 4),
        "bare_run_s": [round(t, 2) for t in times["bare"]], "instrumented_run_s": [round(t, 2) for t in times["instrumented"]],
        "goal": ">= 0.98", "goal_met": instr_rps / bare_rps >= 0.98,
    }


def _level_summary(intervals: list[IntervalSample], tasks: int) -> dict[str, Any]:
    timed = [i for i in intervals if i.mean_batch_s is not None]
    return {
        "tasks": tasks,
        "utilisation": statistics.fmean(i.utilisation for i in intervals),
        "cpu_utilisation": statistics.fmean(i.cpu_utilisation for i in intervals if i.cpu_utilisation is not None),
        "mean_batch_s": statistics.fmean(i.mean_batch_s for i in timed) if timed else None,
        "intervals": len(intervals),
    }


def predicted_batch_s(model: Any, utilisation: float) -> float:
    """Batch duration the fitted model predicts at a utilisation: D(u) plus the fitted idle duration."""
    return model.cost(utilisation) + model.fit.intercept


def _prediction(levels: list[dict[str, Any]], samples: list[list[IntervalSample]], held_out: int) -> dict[str, Any]:
    from bpm.costs import fit_cost_function
    from spark_agents.metrics import cost_samples

    training = [i for n, level in enumerate(samples) if n != held_out for i in level]
    loads, durations = cost_samples(training)
    model = fit_cost_function(loads, durations)
    target = levels[held_out]
    predicted = predicted_batch_s(model, target["utilisation"])
    observed = target["mean_batch_s"]
    return {
        "held_out_tasks": target["tasks"], "utilisation": round(target["utilisation"], 4),
        "predicted_batch_s": round(predicted, 4), "observed_batch_s": round(observed, 4),
        "relative_error": round(abs(predicted - observed) / observed, 4), "model": model.to_dict(),
    }


def load_model(
    spark: SparkSession, work_dir: Path, tasks: int = 4, level_s: float = 40.0, interval_s: float = 5.0,
    trigger_s: float = 2.0, rows_per_file: int = 3000, plot: Path | None = None, progress: Progress = lambda _: None,
) -> dict[str, Any]:
    """Run 1..`tasks` tasks in turn (one more per load level), sampling every `interval_s`; compare
    the sum of task loads with the process CPU, and the cost model's predicted batch duration at
    a held-out level with the observed one (interpolation: a middle level; extrapolation: the top one)."""
    batches = int(tasks * level_s / trigger_s) + 10
    progress("writing input")
    streams = [write_input(work_dir / f"stream-{k}", batches, rows_per_file, seed=k)[0] for k in range(tasks)]
    host = TaskHost(spark, work_dir / "host", work_dir / "output", interval_s=interval_s)
    levels: list[dict[str, Any]] = []
    samples: list[list[IntervalSample]] = []
    try:
        for k in range(tasks):
            progress(f"level {k + 1}/{tasks}: {k + 1} task(s)")
            host.start_task(f"task-{k}", streams[k].partition_path(0), params=PARAMS, trigger_s=trigger_s, max_files_per_trigger=1)
            time.sleep(interval_s)  # let the new task reach its steady rate
            host.sample()
            level: list[IntervalSample] = []
            for _ in range(max(1, int(level_s / interval_s))):
                time.sleep(interval_s)
                level.append(host.sample())
            samples.append(level)
            levels.append(_level_summary(level, k + 1))
    finally:
        host.close()
    errors = [abs(lv["utilisation"] - lv["cpu_utilisation"]) / lv["cpu_utilisation"] for lv in levels]
    interpolation = _prediction(levels, samples, held_out=len(levels) // 2)
    extrapolation = _prediction(levels, samples, held_out=len(levels) - 1)
    result = {
        "benchmark": "load-model", "cores": host.cores, "trigger_s": trigger_s, "rows_per_batch": rows_per_file,
        "levels": [{k: (round(v, 4) if isinstance(v, float) else v) for k, v in lv.items()} for lv in levels],
        "load_vs_cpu_relative_error": [round(e, 4) for e in errors],
        "load_vs_cpu_max_error": round(max(errors), 4),
        "prediction_interpolated": interpolation, "prediction_extrapolated": extrapolation,
        "goal": "within 15%",
        "goal_met": max(errors) <= 0.15 and interpolation["relative_error"] <= 0.15 and extrapolation["relative_error"] <= 0.15,
    }
    if plot is not None:
        plot_load_model(samples, interpolation, plot)
        result["plot"] = str(plot)
    return result


def plot_load_model(samples: list[list[IntervalSample]], prediction: dict[str, Any], path: Path) -> None:
    """Two panels: sum of loads against process CPU, and batch duration against utilisation with the fit."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    from bpm.costs import cost_function_from_dict

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.5))
    for n, level in enumerate(samples):
        u = [i.utilisation for i in level]
        left.scatter([i.cpu_utilisation for i in level], u, label=f"{n + 1} task(s)")
        right.scatter(u, [i.mean_batch_s for i in level], label=f"{n + 1} task(s)")
    top = max(max(i.utilisation, i.cpu_utilisation or 0) for level in samples for i in level) * 1.1
    left.plot([0, top], [0, top], "k--", linewidth=1, label="equal")
    left.set(xlabel="process CPU / cores", ylabel="sum of task loads", title="Measured load against CPU")
    model = cost_function_from_dict(prediction["model"])
    xs = np.linspace(0, top, 100)
    right.plot(xs, [predicted_batch_s(model, x) for x in xs], "k-", linewidth=1, label="fitted model")
    right.scatter([prediction["utilisation"]], [prediction["predicted_batch_s"]], marker="x", s=80, c="red", label="prediction")
    right.set(xlabel="utilisation (sum of loads)", ylabel="mean batch duration (s)", title="Cost model fit")
    for ax in (left, right):
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
