"""`bpm pipeline run`: the monitoring query over finite Zeek input, printed when every window closed."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.console import Console
from rich.table import Table

from bpm_app.commands import app, fail

if TYPE_CHECKING:
    from bpm.zeek.conn import Conn, ParseStats

pipeline_app = typer.Typer(help="Run the network-monitoring query on Spark.", no_args_is_help=True)
app.add_typer(pipeline_app, name="pipeline")


def read_input(files: list[Path], err: Console) -> tuple[list[Conn], ParseStats]:
    """All connections of the files and the parse statistics; exits with status 2 when a file is missing."""
    from bpm.zeek.conn import ParseStats, read_logs

    missing = [str(f) for f in files if not f.is_file()]
    if missing:
        fail(f"no such file: {', '.join(missing)}")
    stats = ParseStats()
    with err.status("reading Zeek logs"):
        conns = list(read_logs(files, stats))
    return conns, stats


@pipeline_app.command("run")
def run(
    files: list[Path] = typer.Argument(..., help="Zeek conn.log files (TSV or JSON lines, optionally .gz)."),
    window: int = typer.Option(60, "--window", min=1, help="Tumbling window in seconds, aligned to the epoch."),
    min_connections: int = typer.Option(100, "--min-connections", min=0, help="Alert when a source has more connections than this."),
    min_ports: int = typer.Option(10, "--min-ports", min=0, help="Alert when a source touches more distinct ports than this."),
    lateness: int = typer.Option(60, "--lateness", min=0, help="Seconds a row may lag the newest one seen and still count."),
    shares: int = typer.Option(1, "--shares", min=1, max=64, help="Equal shares of the stream's key groups, one task each: 1, 2, 4, ... or 64."),
    spark_master: str = typer.Option("local[*]", "--spark-master", help="Spark master URL."),
    as_json: bool = typer.Option(False, "--json", help="One JSON object per result row."),
) -> None:
    """Run the monitoring query over finite input to completion and print every result row."""
    from bpm.keygroups import KeyGroupError
    from bpm.keygroups import shares as key_shares
    from bpm.zeek.definitions import QueryParams

    err = Console(stderr=True)
    try:
        key_shares(shares)
    except KeyGroupError as exc:
        fail(str(exc))
    params = QueryParams(window_s=window, min_connections=min_connections, min_ports=min_ports, lateness_s=lateness)
    conns, stats = read_input(files, err)
    if not conns:
        fail(f"no connection records in the input ({stats.summary()})", 1)
    from spark_agents.pipeline import run_pipeline
    from spark_agents.session import make_session

    with err.status("starting Spark") as status:
        spark = make_session(spark_master, "bpm-pipeline")
        status.update(f"running the query over {len(conns)} connections in {shares} task(s)")
        result = run_pipeline(spark, conns, params, shares,
                              on_task=lambda k: status.update(f"task {k + 1} of {shares} done"))
    if as_json:
        for row in result.rows:
            print(json.dumps(row.to_json()))
    else:
        _print_table(result.rows)
    if stats.skipped:
        err.print(f"[yellow]warning:[/] {stats.summary()}")
        for source, lineno, reason in stats.examples:
            err.print(f"  {source}:{lineno}: {reason}")
    if result.late:
        err.print(f"[yellow]warning:[/] {result.late} connections arrived more than {lateness} s behind the newest and were not counted")
    err.print(f"{result.connections} connections, {len(result.rows)} result rows")


def _print_table(rows: list) -> None:
    from datetime import UTC, datetime

    table = Table(title="Network monitoring results")
    for column in ("window (UTC)", "kind", "key", "value"):
        table.add_column(column, justify="right" if column == "value" else "left", no_wrap=True)
    for row in sorted(rows, key=lambda r: (r.window_start, r.kind, r.key)):
        start, end = (datetime.fromtimestamp(t, UTC) for t in (row.window_start, row.window_end))
        table.add_row(f"{start:%Y-%m-%d %H:%M:%S}-{end:%H:%M:%S}", row.kind, row.key, str(row.value))
    Console().print(table)
