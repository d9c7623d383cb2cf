"""`bpm bench view-reads`: what an agent's read of its view costs the database as the registry's history grows."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from bpm_app.commands import bench_app, fail


@bench_app.command("view-reads")
def bench_view_reads_command(
    server: Annotated[str, typer.Option(envvar="BPM_BENCH_POSTGRES", help="A PostgreSQL server, as the URL of any database on it: the command makes a database of its own there and drops it at the end.")] = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres",
    participants: Annotated[int, typer.Option(min=2, help="Participants, each with 5 tasks and a contract with its neighbour on a ring.")] = 1000,
    movements: Annotated[int, typer.Option(min=0, help="Movements ever made among them (all ended but each participant's last).")] = 200_000,
    failovers: Annotated[int, typer.Option(min=0, help="Failovers ever recorded among them (a neighbour failed while hosting a participant's task).")] = 20_000,
    repeat: Annotated[int, typer.Option(min=1, help="Times each read is run; medians are reported.")] = 20,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Read one participant's view (`GET /participants/{name}/view`) in a registry of N
    participants, M movements and F failovers, and report each statement's execution time in PostgreSQL
    (`EXPLAIN ANALYZE`, median) and plan: a read that grows with M or F reads a table whole."""
    from bpm_app.bench.reads import bench_view_reads

    try:
        result = bench_view_reads(server, participants, movements, failovers, repeat, on_step=lambda step: typer.echo(step, err=True))
    except ValueError as exc:
        fail(str(exc))
    if as_json:
        typer.echo(json.dumps(result))
        return
    for key, value in result.items():
        if key != "reads":
            typer.echo(f"{key:>20}: {value}")
    for read in result["reads"]:
        typer.echo(f"{read['median_ms']:>9.3f} ms  {read['rows']!s:>6} rows  {' > '.join(read['plan'][:4])}\n            {read['statement']}")
