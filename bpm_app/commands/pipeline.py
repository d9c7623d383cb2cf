"""`bpm pipeline run`: a query over finite input on Spark, to completion, compared with its plain computation."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from bpm_app.commands import app, fail
from bpm_app.commands.query import REFERENCE_HELP, load_bound, read_records

pipeline_app = typer.Typer(help="Run a query over finite input on Spark, as the federation's tasks run it.", no_args_is_help=True)
app.add_typer(pipeline_app, name="pipeline")

DEFAULT_QUERY = "examples.network_monitoring:query"
ZEEK = "zeek"


def input_format(path: Path, given: str | None) -> str:
    """The format of an input file: `given`, else by its name (.csv, .jsonl/.json, Zeek's .log/.log.gz)."""
    if given is not None:
        return given
    name = path.name.lower()
    if name.endswith((".log", ".log.gz")):
        return ZEEK
    return "csv" if name.endswith(".csv") else "jsonl"


def read_input(files: list[Path], err: Console) -> tuple[list, object]:
    """All connections of Zeek conn.log files and the parse statistics (`bpm.zeek.conn.ParseStats`);
    exits with status 2 when a file is missing."""
    from bpm.zeek.conn import ParseStats, read_logs

    missing = [str(f) for f in files if not f.is_file()]
    if missing:
        fail(f"no such file: {', '.join(missing)}")
    stats = ParseStats()
    with err.status("reading Zeek logs"):
        conns = list(read_logs(files, stats))
    return conns, stats


def read_zeek(files: list[Path], query, err: Console) -> list:
    """The connections of Zeek conn.log files as the records of `query`, which must take them
    (the network-monitoring query's schema, `bpm.zeek.definitions.CONN_RECORD_SCHEMA`)."""
    from bpm.query import parse_schema
    from bpm.zeek.definitions import CONN_RECORD_SCHEMA, stream_values

    if parse_schema(query.schema) != parse_schema(CONN_RECORD_SCHEMA):
        fail(f"--format zeek gives connection records ({CONN_RECORD_SCHEMA}); query {query.name!r} takes {query.schema}")
    conns, stats = read_input(files, err)
    if stats.skipped:
        err.print(f"[yellow]warning:[/] {stats.summary()}")
        for source, lineno, reason in stats.examples:
            err.print(f"  {source}:{lineno}: {reason}")
    return [stream_values(conn) for conn in conns]


@pipeline_app.command("run")
def run(
    files: list[Path] = typer.Argument(None, help="Input files (or use --input): JSON lines, CSV with a header, or Zeek conn.log files (TSV or JSON, optionally .gz); '-' is standard input."),
    inputs: list[Path] = typer.Option(None, "--input", help="An input file, as the arguments (repeat for several)."),
    reference: str = typer.Option(DEFAULT_QUERY, "--query", help=REFERENCE_HELP),
    params: list[str] = typer.Option(None, "--param", help="A parameter of the query, name=value (repeat for several)."),
    fmt: str | None = typer.Option(None, "--format", help="The input's format: jsonl, csv or zeek (default: by the file's name; .log and .log.gz are Zeek's)."),
    shares: int = typer.Option(1, "--shares", min=1, max=64, help="Equal shares of the stream's key groups, one task each: 1, 2, 4, ... or 64."),
    spark_master: str = typer.Option("local[*]", "--spark-master", help="Spark master URL."),
    as_json: bool = typer.Option(False, "--json", help="One JSON object per result."),
) -> None:
    """Run a query over finite input to completion, as the federation's tasks run it (through a
    participant's stream and the output fence), print every result, and compare them with a
    plain batch computation of the same query: exits 1 when a result is missing, extra or
    written twice."""
    from bpm.keygroups import KeyGroupError
    from bpm.keygroups import shares as key_shares
    from bpm.records import FORMATS, BadRecords, Records

    paths = [*(files or []), *(inputs or [])]
    if not paths:
        fail("no input: give files as arguments or with --input")
    if fmt is not None and fmt not in (*FORMATS, ZEEK):
        fail(f"--format {fmt!r}: one of {', '.join((*FORMATS, ZEEK))}")
    try:
        key_shares(shares)
    except KeyGroupError as exc:
        fail(str(exc))
    query, bound = load_bound(reference, params)
    err = Console(stderr=True)
    formats = {input_format(p, fmt) for p in paths}
    if ZEEK in formats and len(formats) > 1:
        fail("Zeek logs and other records cannot be mixed in one run")
    bad = BadRecords()
    if ZEEK in formats:
        records = read_zeek(paths, query, err)
    else:
        records = [r for p in paths for r in read_records([p], Records(query), input_format(p, fmt), bad, err)]
    for line in bad.first:
        err.print(f"[yellow]refused:[/] {line}")
    if not records:
        fail(f"no record of the input fits query {query.name!r}" + (f" ({bad.count} refused)" if bad.count else ""), 1)

    from spark_agents.check import plain_results
    from spark_agents.pipeline import run_pipeline
    from spark_agents.session import make_session

    with err.status("starting Spark") as status, tempfile.TemporaryDirectory(prefix="bpm-pipeline-plain-") as work:
        spark = make_session(spark_master, "bpm-pipeline")
        status.update(f"running {query.name} over {len(records)} records in {shares} task(s)")
        result = run_pipeline(spark, query, bound, records, shares, on_task=lambda k: status.update(f"task {k + 1} of {shares} done"))
        status.update("the plain batch computation of the same query")
        expected = plain_results(spark, query, bound, records, Path(work))
    if as_json:
        for row in result.rows:
            print(json.dumps(row.to_json()))
    else:
        _print_table(query.name, result.rows)
    if result.late:
        err.print(f"[yellow]warning:[/] {result.late} records arrived more than {query.lateness_s(bound)} s behind the newest and were not counted")
    got = set(result.rows)
    lost, extra = sorted(set(expected) - got), sorted(got - set(expected))
    err.print(f"{query.name}: {result.records} records, {len(result.rows)} results; the plain computation {len(expected)}: "
              f"{len(lost)} missing, {len(extra)} extra, {len(result.duplicates)} written twice")
    if lost or extra or result.duplicates:
        raise typer.Exit(1)


def _print_table(name: str, rows: list) -> None:
    columns = list(dict(rows[0].row)) if rows else []
    table = Table(title=f"{name}: results")
    for column in columns:
        table.add_column(column, no_wrap=True)
    for row in rows:
        values = dict(row.row)
        table.add_row(*(str(values.get(c, "")) for c in columns))
    Console().print(table)
