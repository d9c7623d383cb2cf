"""`bpm bench move`: the pause of a task movement between two processes, beside the restart floor."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Annotated

import typer

from bpm_app.commands import bench_app


@bench_app.command("move")
def bench_move_command(
    moves: Annotated[int, typer.Option(min=1, help="Measured movements (and as many floor restarts, interleaved).")] = 10,
    warmup: Annotated[int, typer.Option(min=0, help="Unmeasured rounds first, so both sessions have run the task.")] = 2,
    age: Annotated[int, typer.Option(min=0, help="Batches the task runs before the first round (its checkpoint grows until Spark's retention of 100 batches).")] = 100,
    spark_master: Annotated[str, typer.Option(help="Spark master of both processes' sessions.")] = "local[2]",
    retain: Annotated[int | None, typer.Option(min=1, help="spark.sql.streaming.minBatchesToRetain of both sessions (default: Spark's, 100).")] = None,
    conf: Annotated[list[str] | None, typer.Option("--conf", help="A further Spark setting of both sessions, KEY=VALUE (repeatable).")] = None,
    trigger: Annotated[float, typer.Option(min=0.05, help="The task's micro-batch trigger interval, seconds.")] = 1.0,
    flush: Annotated[float, typer.Option(min=0.05, help="Seconds between stream files written by the feeder.")] = 0.25,
    query: Annotated[str | None, typer.Option(help="The task's query, module:attribute or path/to/file.py:attribute; its module's generate(seconds=, rate=, seed=) makes the input (default: the network-monitoring query).")] = None,
    param: Annotated[list[str] | None, typer.Option("--param", help="A parameter of the query, name=value (repeatable).")] = None,
    rate: Annotated[float, typer.Option(min=1.0, help="Generated records per second of event time.")] = 100.0,
    speedup: Annotated[float, typer.Option(min=0.1, help="Event time per second of wall time.")] = 10.0,
    seed: Annotated[int, typer.Option(help="Seed of the generated input.")] = 0,
    timeout: Annotated[float, typer.Option(min=10.0, help="Limit of the whole run, seconds.")] = 900.0,
    insecure: Annotated[bool, typer.Option("--insecure", help="The origin's broker in plain text (by default TLS, pinned, as an agent's broker serves it).")] = False,
    workdir: Annotated[Path | None, typer.Option(help="Keep the run's files here (default: a temporary folder, removed).")] = None,
    plot: Annotated[Path | None, typer.Option(help="Write a PNG of every pause beside every floor restart.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Pause of a task movement between two processes (median, max) against restarting it in one process."""
    from rich.console import Console
    from bpm_app.progress import progress

    from bpm_app.bench.move import MoveBenchError, MoveSettings, plot_rounds, run_move_bench

    try:
        extra = tuple(conf_setting(item) for item in conf or ())
        settings = MoveSettings(moves=moves, warmup=warmup, age_batches=age, master=spark_master, retain_batches=retain,
                                extra_conf=extra, trigger_s=trigger, flush_s=flush, rate=rate, speedup=speedup,
                                seed=seed, timeout_s=timeout, workload=workload(query, param), tls=not insecure)
    except ValueError as exc:
        typer.secho(str(exc), fg="red", err=True)
        raise typer.Exit(2) from None
    err = Console(stderr=True)
    try:
        with tempfile.TemporaryDirectory(prefix="bpm-bench-move-") as tmp, progress("rounds", console=err) as steps:
            rounds = steps.add("starting", 2 * (warmup + moves))
            root = workdir or Path(tmp)
            root.mkdir(parents=True, exist_ok=True)
            result = run_move_bench(settings, root, lambda what, done: steps.update(rounds, description=what, completed=done))
    except MoveBenchError as exc:
        typer.secho(f"bench move failed: {exc}", fg="red", err=True)
        raise typer.Exit(1) from None
    if plot is not None:
        result["plot"] = str(plot_rounds(result, plot))
    if as_json:
        typer.echo(json.dumps(result))
        return
    console = Console()
    console.print(_rounds_table(result))
    goal = result["goal"]
    console.print(
        f"movement pause: median {result['pause_median_s']} s, max {result['pause_max_s']} s over {result['moves']} movements\n"
        f"floor (same-process restart): median {result['floor_median_s']} s, max {result['floor_max_s']} s\n"
        f"ratio of medians: {result['ratio_median']}  "
        f"(goal: median under 3 s [{'met' if goal['pause_median_under_3s'] else 'NOT met'}], "
        f"within 1.2 x floor [{'met' if goal['within_1_2x_floor'] else 'NOT met'}])\n"
        f"results: {result['expected_results']} expected, {result['lost_results']} lost, "
        f"{result['duplicate_results']} duplicated, {result['unexpected_results']} unexpected\n"
        f"load average before/after: {result['load_average_before']} / {result['load_average_after']}"
    )
    if plot is not None:
        console.print(f"plot: {result['plot']}")


def workload(query: str | None, params: list[str] | None, default=None):
    """The benchmark's task (`bpm_app.bench.workload.Workload`) from `--query` and `--param`s;
    with no `--query`, `default` (the benchmark's own) with the `--param`s over its parameters.
    ValueError says what is wrong."""
    from bpm.query import parse_values
    from bpm_app.bench.workload import Workload

    default = default or Workload()
    if query is None:
        return Workload(default.reference, tuple({**dict(default.params), **parse_values(params)}.items()))
    return Workload(query, tuple(parse_values(params).items()))


def conf_setting(item: str) -> tuple[str, str]:
    key, sep, value = item.partition("=")
    if not sep or not key.strip():
        raise ValueError(f"--conf takes KEY=VALUE, not {item!r}")
    return key.strip(), value.strip()


def _rounds_table(result: dict):
    """Every measured round with its pause split into steps."""
    from rich import box
    from rich.table import Table

    table = Table(title="Pause: end of last batch to end of first new batch (s)", box=box.SIMPLE_HEAD, padding=(0, 1), pad_edge=False, collapse_padding=True)
    for column in ("#", "kind", "route", "pause", "stop", "pack", "unpack", "start", "idle", "batch1", "other"):
        table.add_column(column, min_width=len(column), justify="left" if column in ("kind", "route") else "right")
    for i, r in enumerate(result["rounds"], start=1):
        cells = [r.get(k) for k in ("pause_s", "stop_s", "pack_s", "unpack_s", "start_s", "idle_s", "first_batch_s", "other_s")]
        table.add_row(str((i + 1) // 2), r["kind"], f"{r['from']}->{r['to']}", *("" if c is None else f"{c:.2f}" for c in cells))
    return table
