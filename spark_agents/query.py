"""The network-monitoring query in Structured Streaming, as a task over its key groups of a stream.

Per task, the streaming part reads its share of a participant's JetStream stream
(`spark_agents.broker.source.JetStreamInput`, which carries its own start and batch bound),
sets the watermark on the event time (delay = the query's lateness), removes punctuation rows
*after* the watermark (they only move event time), and aggregates per tumbling window and
source: connection count and the set of distinct TCP/UDP destination ports. In append mode
a window's rows are emitted once, in the micro-batch where the watermark passes its end, all
sources of the window together. Each micro-batch then derives the alerts and the per-prefix
counts of port alerts (complete, since a closed window's sources all arrive in one batch)
and hands them to the task's sink: the output fence on the origin's broker
(`spark_agents.ha.fence`), which takes each window once, or a standby's, which holds them back.
"""

from __future__ import annotations

import threading
import time
import zlib
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from bpm.records import MARK, MARK_DATA, TIME
from bpm.zeek.definitions import PORT_PROTOCOLS, QueryParams, ResultRow
from spark_agents.checkpoint import batch_watermark_ms, owes_watermark_batch

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from spark_agents.broker.source import JetStreamInput
    from pyspark.sql.streaming import StreamingQuery

Sink = Callable[[int, list[ResultRow]], None]


def per_source(raw: DataFrame, params: QueryParams, since_s: int | None = None, until_s: int | None = None) -> DataFrame:
    """The streaming aggregate of the stream rows `raw`: one row per (window, source) once the
    window closes; with `since_s` / `until_s` (window starts), of the rows in that span of
    event time only (a task made by a split or a merge, or one split or merged at that time).
    Every row moves the watermark, those out of the span too."""
    from pyspark.sql import functions as F

    events = raw.withColumn("event_time", F.timestamp_micros(TIME)).withWatermark(
        "event_time", f"{params.lateness_s} seconds"
    )
    # The filter must mention event_time: Spark pushes filters that do not reference the
    # watermark column below the watermark, and then punctuation would never move it.
    keep = F.col("event_time").isNotNull()
    if since_s is not None:
        keep &= F.col(TIME) >= since_s * 1_000_000
    if until_s is not None:
        keep &= F.col(TIME) < until_s * 1_000_000
    data = events.where(F.when(F.col(MARK) == MARK_DATA, keep).otherwise(F.lit(False)))
    port = F.when(F.col("proto").isin(*PORT_PROTOCOLS), F.col("dport"))
    return data.groupBy(F.window("event_time", f"{params.window_s} seconds"), "src", "prefix").agg(
        F.count(F.lit(1)).alias("connections"), F.size(F.collect_set(port)).alias("ports")
    )


def batch_results(batch: DataFrame, params: QueryParams) -> list[ResultRow]:
    """The result rows of one micro-batch of `per_source` output.

    Spark filters the closed windows' per-source rows down to the alerting sources; the
    per-prefix count of port alerts is then taken over those few rows here. The batch is
    read once: reading a foreachBatch frame twice would run the stateful stage twice, and a
    second Spark job (a window function over prefixes) would add a shuffle to every batch.
    """
    from pyspark.sql import functions as F

    alerting = batch.where((F.col("connections") > params.min_connections) | (F.col("ports") > params.min_ports)).select(
        F.col("window.start").cast("long").alias("start"), F.col("window.end").cast("long").alias("end"),
        "src", "prefix", "connections", "ports",
    )
    rows: list[ResultRow] = []
    port_alerts: Counter[tuple[int, int, str]] = Counter()
    for r in alerting.collect():
        if r.connections > params.min_connections:
            rows.append(ResultRow("connections", r.start, r.end, r.src, r.connections))
        if r.ports > params.min_ports:
            rows.append(ResultRow("ports", r.start, r.end, r.src, r.ports))
            port_alerts[(r.start, r.end, r.prefix)] += 1
    rows += [ResultRow("prefix", start, end, prefix, n) for (start, end, prefix), n in port_alerts.items()]
    return sorted(rows)


def closed_window_end(watermark_ms: int, params: QueryParams) -> int:
    """The end (epoch seconds) of the newest window a batch running with `watermark_ms` has
    closed: windows that end before the watermark are out of the state (one ending exactly
    at it counts at the next batch)."""
    return (watermark_ms - 1) // 1000 // params.window_s * params.window_s


class BatchWriter:
    """The foreachBatch function of a task: hands each batch's rows (also an empty list) to
    `sink(batch_id, rows)`; an exception it raises fails the query. A sink that says how far
    its windows are closed (`closed_through(window_end)`, the output fence) is told after
    each batch, from the watermark the batch ran with (read in `checkpoint_dir`): a reader of
    the results then knows a window without rows from one still open.

    `on_cpu(task_id, batch_id, seconds)`, when given, receives the CPU time the function used
    in this process (Spark calls it on a callback thread, so the thread's CPU clock is its own).
    """

    def __init__(self, task_id: str, params: QueryParams, sink: Sink, on_cpu: Callable[[str, int, float], None] | None = None,
                 checkpoint_dir: str | Path | None = None) -> None:
        self.task_id, self.params, self.sink, self.on_cpu = task_id, params, sink, on_cpu
        self.checkpoint_dir = checkpoint_dir

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        started = time.thread_time()
        self.sink(batch_id, batch_results(batch, self.params))
        closed_through = getattr(self.sink, "closed_through", None)
        if closed_through is not None and self.checkpoint_dir is not None:
            watermark = batch_watermark_ms(self.checkpoint_dir, batch_id)
            if watermark:
                closed_through(closed_window_end(watermark, self.params))
        if self.on_cpu is not None:
            self.on_cpu(self.task_id, batch_id, time.thread_time() - started)


def start_query(
    spark: SparkSession,
    task_id: str,
    source: JetStreamInput,
    checkpoint_dir: str | Path,
    params: QueryParams,
    sink: Sink,
    trigger_s: float | None = None,
    on_cpu: Callable[[str, int, float], None] | None = None,
) -> StreamingQuery:
    """Start the task's streaming query over `source` (`source.read(spark)`: the stream's
    rows, in its span of event time), its rows to `sink`, resuming from `checkpoint_dir` when it holds a checkpoint (the
    source's start applies only to a fresh one; a checkpoint that owes the batch of a new
    watermark gets it, `spark_agents.checkpoint.owes_watermark_batch`).

    `trigger_s` sets a processing-time trigger; None runs micro-batches back to back.
    """
    writer = (
        per_source(source.read(spark, owed_batch=owes_watermark_batch(checkpoint_dir)), params, source.since_s, source.until_s)
        .writeStream.queryName(task_id)
        .outputMode("append")
        .option("checkpointLocation", str(checkpoint_dir))
        .foreachBatch(BatchWriter(task_id, params, sink, on_cpu, checkpoint_dir))
    )
    if trigger_s is not None:
        writer = writer.trigger(processingTime=f"{round(trigger_s * 1000)} milliseconds")
    return writer.start()


def stop_between_batches(query: StreamingQuery, output_done: threading.Event, timeout_s: float = 60.0) -> None:
    """Stop `query` while it waits for its next trigger or, when batches run back to back, the
    moment a batch's output function returns (`output_done`, which its `on_cpu` callback
    sets; waited for up to `timeout_s`): never inside that function, where an interrupt
    breaks the Python callback (and with it, later batches of the driver)."""
    deadline = time.monotonic() + timeout_s
    output_done.clear()
    while query.isActive and query.status.get("isTriggerActive") and time.monotonic() < deadline:
        if output_done.wait(0.01):
            break
    query.stop()


def staggered_trigger_s(task_id: str, trigger_s: float) -> float:
    """The processing-time trigger interval a task runs with: `trigger_s` plus up to a tenth
    of it, in whole milliseconds, fixed by the task's id (so it keeps it on every host).

    Spark fires a processing-time trigger at the multiples of its interval since the epoch:
    queries with one interval, in one JVM or in several on one machine, would all start
    their batches at the same instants and wait for the CPU the others hold, every
    interval. Intervals a few milliseconds apart have multiples that fall apart (at today's
    epoch their phases are as good as unrelated), and they drift only slowly.
    """
    base = round(trigger_s * 1000)
    return (base + zlib.crc32(task_id.encode()) % max(1, base // 10)) / 1000
