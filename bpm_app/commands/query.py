"""`bpm query`: what a query declares, and whether the federation can run it (`bpm.query`)."""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from bpm_app.commands import app, fail

query_app = typer.Typer(help="Queries written against the query API (bpm.query): check one, show what it declares.", no_args_is_help=True)
app.add_typer(query_app, name="query")

REFERENCE_HELP = "The query: module:attribute (e.g. examples.sensors:query) or path/to/file.py:attribute."


def parse_params(given: list[str] | None) -> dict[str, str]:
    """`--param name=value` options as a dictionary; exits 2 on one without '='."""
    from bpm.query import QueryError, parse_values

    try:
        return parse_values(given)
    except QueryError as exc:
        fail(f"--param: {exc}")


def load_query(reference: str):
    """The query `reference` names (`bpm.query.load`), a module in the folder the command runs in
    found as `python -m` finds it; QueryError says what is wrong."""
    import os

    from bpm.query import load

    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    return load(reference)


def load_bound(reference: str, params: list[str] | None):
    """The query `reference` names and its parameters bound from `--param`s; exits 2 with the reason."""
    from bpm.query import QueryError

    try:
        query = load_query(reference)
        return query, query.bind(parse_params(params))
    except QueryError as exc:
        fail(str(exc))


def read_records(files: list[Path], records, fmt: str | None, bad, err: Console) -> list:
    """The records of `files` (`bpm.records.parse_lines`; '-' is standard input), in order; those
    that do not fit are counted in `bad`. Exits 2 on a missing file or an unknown format."""
    from bpm.records import FORMATS, parse_lines

    if fmt is not None and fmt not in FORMATS:
        fail(f"--format {fmt!r}: one of {', '.join(FORMATS)}")
    missing = [str(f) for f in files if str(f) != "-" and not f.is_file()]
    if missing:
        fail(f"no such file: {', '.join(missing)}")
    out: list = []
    with err.status(f"reading {', '.join(str(f) for f in files)}"):
        for path in files:
            kind = fmt or ("csv" if path.suffix.lower() == ".csv" else "jsonl")
            stream = sys.stdin if str(path) == "-" else path.open(newline="", encoding="utf-8")
            try:
                out.extend(parse_lines(records, stream, kind, bad))
            finally:
                if stream is not sys.stdin:
                    stream.close()
    return out


@query_app.command("show")
def show(
    reference: str = typer.Argument(..., help=REFERENCE_HELP),
    params: list[str] = typer.Option(None, "--param", help="A parameter, name=value (repeat for several)."),
    as_json: bool = typer.Option(False, "--json", help="Print the declaration as JSON."),
) -> None:
    """Print what a query declares: its input, result, parameters (with the values given) and digest."""
    query, bound = load_bound(reference, params)
    declared = {
        "name": query.name, "version": query.version, "digest": query.digest, "description": query.description,
        "schema": query.schema, "key": query.key, "event_time": query.event_time, "lateness_s": query.lateness_s(bound),
        "result_key": list(query.result_key), "result_time": query.result_time, "output_mode": query.output_mode,
        "splits_at_s": query.align_s(bound),
        "params": {name: {"type": p.type.__name__, "value": bound[name], "default": p.default, "help": p.help}
                   for name, p in query.params.items()},
    }
    if as_json:
        print(json.dumps(declared))
        return
    out = Console()
    out.print(f"[bold]{query.name}[/] {query.version} (digest {query.digest}){': ' + query.description if query.description else ''}")
    out.print(f"input: {query.schema}; key {query.key}, event time {query.event_time}, lateness {query.lateness_s(bound)} s")
    out.print(f"result: identified by {', '.join(query.result_key)}, final at {query.result_time}, {query.output_mode} mode; "
              + (f"tasks split at multiples of {query.align_s(bound)} s" if query.align_s(bound) else "tasks move whole, never split"))
    if query.params:
        table = Table("parameter", "type", "value", "default", "meaning")
        for name, p in query.params.items():
            table.add_row(name, p.type.__name__, str(bound[name]), str(p.default), p.help)
        out.print(table)


EXAMPLES = ("examples.network_monitoring:query", "examples.sensors:query", "examples.sessions:query")


@query_app.command("list")
def list_queries(
    config: Path | None = typer.Option(None, "--config", help="An agent's configuration file (bpm agent run --config): the queries that agent runs, its own first."),
    references: list[str] = typer.Option(None, "--query", help="A query to list (repeat for several); without --config or --query: the project's examples."),
    as_json: bool = typer.Option(False, "--json", help="One JSON object per query."),
) -> None:
    """List queries: what an agent with a configuration file can run (its own tasks' queries with
    their parameters and inputs, and the others it runs for partners), or the queries named,
    with their digests: a partner hosts a task only with the same digest."""
    from bpm.keygroups import MAIN
    from spark_agents.settings import AgentSettings, SettingsError

    if config is not None:
        try:
            settings = AgentSettings.load(config)
        except SettingsError as exc:
            fail(str(exc))
        # (reference, its parameters, the input of the participant's own it runs over; None: for partners)
        listed = [(settings.query, settings.param, MAIN), *((q.query, q.param, q.input) for q in settings.queries or []),
                  *((ref, None, None) for ref in settings.can_run or [])]
    else:
        listed = [(ref, None, None) for ref in references or EXAMPLES]
    rows = []
    for ref, params, input in listed:
        query, bound = load_bound(ref, params)
        rows.append({"reference": ref, "name": query.name, "version": query.version, "digest": query.digest,
                     "own": input is not None, "input": input, "params": dict(bound), "description": query.description})
    if as_json:
        for row in rows:
            print(json.dumps(row))
        return
    table = Table("query", "version", "digest", "parameters")
    for row in rows:
        own = "" if not row["own"] else " (own tasks)" if row["input"] == MAIN else f" (own tasks, input {row['input']})"
        table.add_row(f"{row['name']}{own}\n[dim]{row['reference']}[/]", row["version"], row["digest"],
                      "\n".join(f"{k}={v}" for k, v in row["params"].items()))
    out = Console()
    out.print(table)
    for row in rows:
        if row["description"]:
            out.print(f"{row['name']}: {row['description']}")


@query_app.command("check")
def check(
    reference: str = typer.Argument(..., help=REFERENCE_HELP),
    sample: Path | None = typer.Option(None, "--sample", help="Records to run it over: JSON lines, or CSV with a header ('-': standard input). Without it, the query runs over no records: Spark still checks that it is a valid streaming query."),
    fmt: str | None = typer.Option(None, "--format", help="The sample's format, jsonl or csv (default: by its name, .csv or else JSON lines)."),
    params: list[str] = typer.Option(None, "--param", help="A parameter, name=value (repeat for several)."),
    batches: int = typer.Option(4, "--batches", min=1, max=100, help="Micro-batches the streaming run spreads the sample over."),
    spark_master: str = typer.Option("local[2]", "--spark-master", help="Spark master URL."),
    as_json: bool = typer.Option(False, "--json", help="Print the outcome as one JSON object."),
) -> None:
    """Check that the federation can run a query: its declaration and parameters, then a run over
    a sample as a stream and as a batch computation, without any federation.

    It passes when Spark runs it as a streaming query, its results carry the declared columns,
    none comes out before the watermark reaches its result_time, none comes out twice, and
    the streaming results equal the batch computation's. Exits 1 when it does not pass."""
    from bpm.records import FORMATS, BadRecords, Records

    query, bound = load_bound(reference, params)
    if fmt is not None and fmt not in FORMATS:
        fail(f"--format {fmt!r}: one of {', '.join(FORMATS)}")
    err = Console(stderr=True)
    bad = BadRecords()
    records: list = []
    if sample is not None:
        records = read_records([sample], Records(query), fmt, bad, err)
        if not records:
            fail(f"no record of {sample} fits query {query.name!r}" + (f" ({bad.count} refused; {bad.first[0]})" if bad.first else ""), 1)

    from spark_agents.check import check_query
    from spark_agents.session import make_session

    with err.status("starting Spark") as status, tempfile.TemporaryDirectory(prefix="bpm-query-check-") as work:
        spark = make_session(spark_master, "bpm-query-check")
        status.update(f"running {query.name} over {len(records)} records as a stream and as a batch")
        report = check_query(spark, query, bound, records, Path(work), batches=batches)
    if as_json:
        print(json.dumps({"query": query.name, "digest": query.digest, "ok": report.ok, "records": report.records,
                          "refused": bad.count, "late": report.late, "batches": report.batches, "results": len(report.streamed),
                          "expected": len(report.expected), "problems": report.problems}))
    else:
        for line in bad.first:
            err.print(f"[yellow]refused:[/] {line}")
        err.print(f"{query.name} (digest {query.digest}): {report.records} records ({bad.count} refused, {report.late} late), "
                  f"{report.batches} micro-batches, {len(report.streamed)} results, the batch computation {len(report.expected)}")
        for problem in report.problems:
            err.print(f"[red]problem:[/] {problem}")
        err.print("[green]ok:[/] the federation can run it" if report.ok else "[red]not movable as it is[/]")
    if not report.ok:
        raise typer.Exit(1)
