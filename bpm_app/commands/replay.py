"""`bpm replay`: publish a query's records (Zeek logs by default) into a participant's stream at a paced rate; `bpm generate-traffic`: write realistic logs."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import typer
from rich.console import Console

from bpm_app.commands import BrokerCert, InsecureBroker, LogFormat, app, broker_tls, fail
from bpm_app.logs import teller
from bpm_app.progress import progress


@app.command("replay")
def replay_command(
    files: list[Path] = typer.Argument(..., help="Zeek conn.log files (TSV or JSON lines, optionally .gz), replayed in order; with --query, files of its records (JSON lines or CSV with a header; '-' for standard input)."),
    query_ref: str | None = typer.Option(None, "--query", help="Publish records of this query (module:attribute or path/to/file.py:attribute, bpm.query) instead of Zeek connections."),
    params: list[str] = typer.Option(None, "--param", help="With --query: one of its parameters, name=value (repeat for several); its lateness and grain size the end of input."),
    fmt: str | None = typer.Option(None, "--format", help="With --query: the files' format, jsonl or csv (default: by each file's name, .csv or else JSON lines)."),
    stream: str = typer.Option(..., "--stream", help="The participant's stream on its broker: nats://HOST:PORT/PARTICIPANT, or nats://HOST:PORT/PARTICIPANT/INPUT for one of its named inputs, the input of a query in its agent's [[queries]] (password in BPM_NATS_PASSWORD)."),
    user: str | None = typer.Option(None, "--user", help="The broker's user (default: the participant)."),
    broker_cert: BrokerCert = None,
    insecure: InsecureBroker = False,
    rate: float = typer.Option(..., "--rate", min=0, help="Rows per second at most; 0 for no limit."),
    speedup: float | None = typer.Option(None, "--speedup", min=0.001, help="Also follow recorded time, X times faster."),
    amplify: int = typer.Option(1, "--amplify", min=1, help="Replay each connection N times from distinct sources (Zeek logs only)."),
    window: int | None = typer.Option(None, "--window", min=1, help="Query window in seconds (sizes the end-of-input mark; default 60; Zeek logs only)."),
    lateness: int | None = typer.Option(None, "--lateness", min=0, help="Rows further behind the newest are late and not written (default 60; Zeek logs only)."),
    flush_interval: float = typer.Option(1.0, "--flush-interval", min=0.01, help="Seconds between flushes (one message per key group that got rows)."),
    fed_log: Path | None = typer.Option(None, "--fed-log", help="Write the rows fed so far here at the end (also when stopped): a Zeek log, or with --query JSON lines of its records."),
    feed: list[str] = typer.Option([], "--feed", help="Feed only the key groups whose bits start with PREFIX (as a task names its share, e.g. 0110); repeat for several. Default: every key group."),
    feed_from_stdin: bool = typer.Option(False, "--feed-from-stdin", help="Also feed, from the moment each arrives, the key-group prefixes read from standard input, one a line (with no --feed, none at first)."),
    log_format: LogFormat = typer.Option(LogFormat.text, "--log-format", help="text, or json: what it tells (progress included) as one JSON object per line on stderr."),
) -> None:
    """Publish recorded or generated conn.logs into a participant's stream (its 64 key groups).

    SIGTERM or Ctrl-C stops the replay early: what was read so far is written, the stream is
    closed (every window ends), and `--fed-log` receives exactly the connections fed, so a
    reference run (`bpm pipeline run`) sees the same input as the stream's readers.

    With `--feed` or `--feed-from-stdin` only some key groups are fed: the connections of the
    others are passed over (their traffic is not monitored, and tasks over them have nothing
    to do) until their prefix comes on standard input; so the load of a participant's tasks
    can grow while they run.
    """
    import os
    import signal
    import sys
    import threading

    from bpm.keygroups import MAIN, PASSWORD_ENV, KeyGroupError, groups, parse_location
    from bpm.records import BadRecords, Records
    from bpm.zeek.definitions import stream_values
    from bpm.zeek.generator import amplified
    from bpm_app.commands.pipeline import read_input
    from bpm_app.commands.query import load_bound, read_records
    from examples.network_monitoring import query as monitoring
    from spark_agents.broker.server import BrokerError
    from spark_agents.broker.stream import Broker, BrokerStream
    from spark_agents.streams.feed import RecordFeeder, replay

    err = Console(stderr=True)
    say = teller(log_format.value, "bpm.replay", console=err)
    try:
        if not stream.startswith("nats://"):
            raise ValueError(f"{stream}: a participant's stream is on its broker, nats://HOST:PORT/PARTICIPANT[/INPUT]")
        located = parse_location(stream)
        if located.prefix:
            raise ValueError(f"{stream}: a replay publishes to a whole input of a participant's stream, not to key groups {located.prefix!r}")
        fed_groups = {g for prefix in feed for g in groups(prefix)} if feed or feed_from_stdin else None
        password = os.environ.get(PASSWORD_ENV)
        if not password:
            raise ValueError(f"set {PASSWORD_ENV} to the broker user's password")
        tls = broker_tls(broker_cert, insecure, say)
        try:
            broker = Broker(located.url, user or located.participant, password, tls=tls)
        except BrokerError as exc:
            raise ValueError(str(exc)) from None
    except ValueError as exc:
        fail(exc)
    target = BrokerStream(broker, located.participant, located.input)
    where = f"{located.participant}'s stream at {located.url}" + (f", input {located.input}" if located.input != MAIN else "")
    if query_ref is None:
        recorded, stats = read_input(files, err)
        items = amplified(recorded, amplify)  # copied as they are fed, never all held at once
        total = len(recorded) * amplify
        window, lateness = window or 60, 60 if lateness is None else lateness
        feeder = RecordFeeder(target, monitoring, monitoring.bind({"window_s": window, "lateness_s": lateness}), fed_groups)
        record = stream_values  # a connection as the query's record; `fed` keeps the connections
    else:
        if amplify != 1 or window is not None or lateness is not None:
            fail("--amplify, --window and --lateness are for Zeek logs; a query's parameters are --param name=value")
        if feed_from_stdin and any(str(f) == "-" for f in files):
            fail("records come from standard input ('-'): --feed-from-stdin cannot read key groups from it too")
        query, bound = load_bound(query_ref, params)
        bad = BadRecords()
        items = read_records(files, Records(query), fmt, bad, err)
        total = len(items)
        lateness = query.lateness_s(bound)
        feeder = RecordFeeder(target, query, bound, fed_groups)
        record = None
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())

    def more_from_stdin() -> None:
        for line in sys.stdin:
            try:
                feeder.feed_key_groups(groups(line.strip()))
                say(f"feeding key groups {line.strip()}*")
            except KeyGroupError as exc:
                say(f"[yellow]warning:[/] {exc}; line ignored", logging.WARNING)

    if feed_from_stdin:
        threading.Thread(target=more_from_stdin, name="feed-from-stdin", daemon=True).start()
    fed: list = []
    with progress("rows", console=err, say=say if log_format == LogFormat.json else None) as steps:
        bar = steps.add("replaying", total)
        replay(feeder, items, rate, speedup, flush_interval, stop=stop, on_flush=lambda done: steps.update(bar, completed=done), fed=fed,
               record=record)
    if not feeder.closed:
        feeder.close()
        say(f"stopped after {len(fed)} rows fed of {total}; the stream is closed")
    if fed_log is not None:
        from bpm.zeek.conn import write_tsv

        with fed_log.open("w", encoding="utf-8") as out:
            if query_ref is None:
                write_tsv(fed, out)
            else:
                out.writelines(json.dumps(feeder.records.as_json(ts_us, values)) + "\n" for ts_us, values in fed)
    if query_ref is None and stats.skipped:
        say(f"[yellow]warning:[/] {stats.summary()}", logging.WARNING)
    if query_ref is not None and bad.count:
        say(f"[yellow]warning:[/] {bad.count} records did not fit query {query.name!r} and were not written; "
            + "; ".join(bad.first), logging.WARNING)
    if feeder.admission.late:
        say(f"[yellow]warning:[/] {feeder.admission.late} rows more than {lateness} s behind the newest were not written", logging.WARNING)
    broker.close()
    say(f"wrote {sum(feeder.written)} rows in {feeder.files} messages to {where} "
              f"({sum(1 for n in feeder.written if n)} of {len(feeder.written)} key groups)")


@app.command("generate-traffic")
def generate_command(
    out: Path = typer.Argument(..., help="File to write (a Zeek conn.log)."),
    duration: float = typer.Option(300.0, "--duration", min=1, help="Seconds of traffic."),
    rate: float = typer.Option(200.0, "--rate", min=0, help="Mean connections per second of ordinary sources."),
    sources: int = typer.Option(400, "--sources", min=1, help="Ordinary sources (heavy-tailed activity)."),
    scanners: int = typer.Option(6, "--scanners", min=0, help="Port scanners."),
    shared_scanners: int = typer.Option(0, "--shared-scanners", min=0, help="Further scanners whose addresses come from --shared-seed alone: logs generated with the same shared seed are probed by the same sources."),
    shared_seed: int = typer.Option(0, "--shared-seed", help="Seed of the shared scanners' addresses."),
    start: float = typer.Option(1_717_200_000.0, "--start", help="First timestamp (epoch seconds)."),
    seed: int = typer.Option(0, "--seed", help="Random seed; the same seed gives the same log."),
    fmt: str = typer.Option("tsv", "--format", help="tsv (with #fields header) or json (JSON lines)."),
) -> None:
    """Write realistic Zeek conn.log traffic: heavy-tailed sources, scanners, busy /24s."""
    from bpm.zeek.conn import write_json, write_tsv
    from bpm.zeek.generator import TrafficProfile, generate

    if fmt not in ("tsv", "json"):
        fail(f"--format must be tsv or json, not {fmt!r}")
    profile = TrafficProfile(start_ts=start, duration_s=duration, rate=rate, sources=sources, scanners=scanners,
                             shared_scanners=shared_scanners, shared_seed=shared_seed)
    conns = generate(profile, seed)
    with out.open("w", encoding="utf-8") as handle:
        n = write_tsv(conns, handle) if fmt == "tsv" else write_json(conns, handle)
    Console(stderr=True).print(f"wrote {n} connections to {out}")
