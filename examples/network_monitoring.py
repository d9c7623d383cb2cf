"""Network monitoring over Zeek connection records: per tumbling window, the sources with
more than `min_connections` connections or more than `min_ports` distinct TCP/UDP
destination ports, and per source prefix the number of its sources alerting on ports.

The definitions are `bpm.zeek.definitions`'; `bpm.zeek.reference` computes the same rows
without Spark.

    bpm query check examples.network_monitoring:query
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator, Mapping

from bpm.query import Param, Params, Query
from bpm.results import Result
from bpm.zeek import reference
from bpm.zeek.conn import Conn
from bpm.zeek.definitions import CONN_RECORD_SCHEMA, PORT_PROTOCOLS, QueryParams, as_results, source_prefix, stream_values
from bpm.zeek.generator import TrafficProfile
from bpm.zeek.generator import generate as generate_conns


def compute(events, params):
    """Per window and source, connections and distinct ports, of the sources that alert."""
    from pyspark.sql import functions as F

    port = F.when(F.col("proto").isin(*PORT_PROTOCOLS), F.col("dport"))
    per_source = events.groupBy(F.window("ts", f"{params.window_s} seconds"), "src", "prefix").agg(
        F.count(F.lit(1)).alias("connections"), F.size(F.collect_set(port)).alias("ports"))
    return per_source.where((F.col("connections") > params.min_connections) | (F.col("ports") > params.min_ports)).select(
        F.col("window.start").cast("long").alias("window_start"), F.col("window.end").cast("long").alias("window_end"),
        "src", "prefix", "connections", "ports")


def finish(rows, params):
    """The alerts of a batch's alerting sources, and the per-prefix counts of port alerts: all
    sources of a closed window come in one batch, so the counts are complete."""
    out = []
    per_prefix: Counter = Counter()
    for r in rows:
        window = {"window_start": r["window_start"], "window_end": r["window_end"]}
        if r["connections"] > params.min_connections:
            out.append({"kind": "connections", **window, "key": r["src"], "value": r["connections"]})
        if r["ports"] > params.min_ports:
            out.append({"kind": "ports", **window, "key": r["src"], "value": r["ports"]})
            per_prefix[(r["window_start"], r["window_end"], r["prefix"])] += 1
    out += [{"kind": "prefix", "window_start": s, "window_end": e, "key": p, "value": n} for (s, e, p), n in per_prefix.items()]
    return out


def alert(row):
    """The source a connection or port alert is about (prefix counts raise none): what
    participants that correlate compare."""
    return row["key"] if row["kind"] in ("connections", "ports") else None


query = Query(
    name="network-monitoring",
    description="connection and port alerts per source, port alerts per prefix, per window",
    schema=CONN_RECORD_SCHEMA,
    key="prefix",
    event_time="ts",
    lateness="lateness_s",
    compute=compute,
    finish=finish,
    result_key=("kind", "window_start", "key"),
    result_time="window_end",
    align="window_s",
    alert=alert,
    params={
        "window_s": Param(int, 60, "length of the tumbling window, seconds", minimum=1),
        "min_connections": Param(int, 100, "a source alerts with strictly more connections in a window", minimum=0),
        "min_ports": Param(int, 10, "a source alerts with strictly more distinct destination ports in a window", minimum=0),
        "lateness_s": Param(int, 60, "how late a connection may come, seconds; also the watermark's delay", minimum=0),
    },
)


# The parameters of short runs over generated traffic (the demo): ten-second windows, and
# thresholds its scanners cross and its ordinary sources do not.
SHORT_RUN = {"window_s": 10, "min_connections": 20, "min_ports": 5, "lateness_s": 5}


def bind(params: QueryParams) -> Params:
    """The query's parameters from the Zeek definitions' `QueryParams`."""
    return query.bind(params.to_dict())


def records(conns: Iterable[Conn]) -> Iterator[tuple[int, tuple]]:
    """Zeek connections as the query's records (`bpm.records.Records.parse`'s form), in order."""
    return map(stream_values, conns)


def expected(conns: Iterable[Conn], params: QueryParams | Mapping[str, object]) -> list[Result]:
    """The query's results over Zeek connections `conns` with `params` (the Zeek definitions'
    `QueryParams`, or the query's bound parameters), by the plain computation without Spark
    (`bpm.zeek.reference`), as the federation compares them."""
    if not isinstance(params, QueryParams):
        params = QueryParams(**{name: int(value) for name, value in params.items()})  # type: ignore[arg-type]
    return sorted(as_results(reference.compute(conns, params)))


def generate(seconds: int = 300, rate: float = 200.0, seed: int = 0) -> Iterator[dict]:
    """Connection records of generated traffic (`bpm.zeek.generator`), in input order."""
    for conn in generate_conns(TrafficProfile(duration_s=seconds, rate=rate), seed=seed):
        yield {"ts": conn.ts, "src": conn.orig_h, "prefix": source_prefix(conn.orig_h), "dst": conn.resp_h,
               "dport": conn.resp_p, "proto": conn.proto}
