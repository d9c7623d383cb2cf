"""`bpm bench partition`: the correlated result across network partitions of several lengths."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Annotated

import typer

from bpm_app.bench.partition import CUTS
from bpm_app.commands import bench_app, choice, fail

Cut = choice("Cut", CUTS)


@bench_app.command("partition")
def bench_partition_command(
    lengths: Annotated[str, typer.Option(help="Partition lengths in seconds, in order, comma-separated.")] = "5,15,30,60",
    cut: Annotated[Cut, typer.Option(help="host: cut the participant off from every other host; link: only from the correlating participant.")] = Cut.host,
    cut_host: Annotated[str, typer.Option(help="The participant cut off (b or c).")] = "b",
    bound: Annotated[float, typer.Option(min=0.0, help="Availability bound of the correlated result, seconds.")] = 10.0,
    window: Annotated[int, typer.Option(min=1, help="Window length, seconds of wall time.")] = 2,
    lead: Annotated[float, typer.Option(min=0.0, help="Seconds before each cut.")] = 8.0,
    recover: Annotated[float, typer.Option(min=0.0, help="Seconds after each heal before the next partition's lead.")] = 20.0,
    seed: Annotated[int, typer.Option(help="Seed of the synthetic alerts.")] = 0,
    workdir: Annotated[Path | None, typer.Option(help="Keep the run's files here (default: a temporary folder, removed).")] = None,
    plot: Annotated[Path | None, typer.Option(help="Write a PNG of each window's delay and its tentative and stable rows.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Delay, tentative rows, stabilisation, lost and duplicated results of the correlated result across partitions."""
    from rich.console import Console

    from bpm_app.bench.partition import PartitionBenchError, PartitionSettings, plot_partitions, run_partition_bench
    from bpm_app.progress import progress

    try:
        settings = PartitionSettings(lengths_s=tuple(float(x) for x in lengths.split(",") if x.strip()), cut=cut.value, cut_host=cut_host,
                                     bound_s=bound, window_s=window, lead_s=lead, recover_s=max(recover, bound), seed=seed)
    except ValueError as exc:
        fail(exc)
    err = Console(stderr=True)
    try:
        with tempfile.TemporaryDirectory(prefix="bpm-bench-partition-") as tmp:
            root = workdir or Path(tmp)
            root.mkdir(parents=True, exist_ok=True)
            with progress(console=err) as steps:
                step = steps.add("starting")
                result = run_partition_bench(settings, root, lambda what: steps.update(step, description=what))
    except PartitionBenchError as exc:
        fail(f"bench partition failed: {exc}", 1)
    if plot is not None:
        result["plot"] = str(plot_partitions(result, plot))
    if as_json:
        typer.echo(json.dumps(result))
        return
    from rich import box
    from rich.table import Table

    table = Table(title=f"Correlated result across partitions (bound {settings.bound_s:g} s)", box=box.SIMPLE_HEAD)
    columns = ("length_s", "max_first_result_delay_s", "tentative_rows", "stabilisation_s", "lost_results", "duplicate_results")
    for column in columns:
        table.add_column(column.replace("_", " "), justify="right")
    for p in result["partitions"]:
        table.add_row(*("-" if p[c] is None else str(p[c]) for c in columns))
    Console().print(table)
    Console().print(", ".join(f"{k} {'met' if v else 'NOT met'}" for k, v in result["goals"].items()))
    if plot is not None:
        Console().print(f"plot: {result['plot']}")
