"""The network-monitoring query in Structured Streaming, as a task over one stream partition.

Per task, the streaming part reads the partition's CSV files, sets the watermark on the
event time (delay = the query's lateness), removes punctuation rows *after* the watermark
(they only move event time), and aggregates per tumbling window and source: connection
count and the set of distinct TCP/UDP destination ports. In append mode a window's rows are
emitted once, in the micro-batch where the watermark passes its end, all sources of the
window together. Each micro-batch then derives the alerts and the per-prefix counts of port
alerts (complete, since a closed window's sources all arrive in one batch) and writes them to `<output>/<task>/batch-<id>.jsonl` (temp file, rename),
so a replayed batch overwrites its own file and never duplicates a result.

Two hooks serve high availability (`spark_agents.ha`): a `sink` takes each batch's rows
instead of the plain file writer (the output fence, or a standby that holds them back), and
a `start_position` makes a fresh query skip the stream files before it (a task restarted
from the newest input, or replayed from an acknowledged position). The start position is
kept in the checkpoint (`.bpm-start`), so the task keeps skipping those files wherever its
checkpoint goes.
"""

from __future__ import annotations

import time
import zlib
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from spark_agents.streams.partitioned import positions_glob
from bpm.zeek.definitions import PORT_PROTOCOLS, QueryParams, ResultRow
from bpm.zeek.results import write_batch

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from spark_agents.broker.source import JetStreamInput
    from pyspark.sql.streaming import StreamingQuery

STREAM_SCHEMA_DDL = "ts_us BIGINT, src STRING, prefix STRING, dst STRING, dport INT, proto STRING, mark INT"
START_FILE = ".bpm-start"

Sink = Callable[[int, list[ResultRow]], None]


def per_source(spark: SparkSession, input_path: str | Path | JetStreamInput, params: QueryParams, max_files_per_trigger: int | None = None,
               start_position: int | None = None) -> DataFrame:
    """The streaming aggregate: one row per (window, source) once the window closes.

    The input is a folder of the stream's files, or a share of a participant's JetStream
    input (`JetStreamInput`, which carries its own start and batch bound).

    `max_files_per_trigger` bounds how many stream files one micro-batch takes (None: all new files);
    `start_position` leaves out the stream files before that position.
    """
    from pyspark.sql import functions as F

    from spark_agents.broker.source import JetStreamInput

    if isinstance(input_path, JetStreamInput):
        raw = input_path.read(spark)
    else:
        reader = spark.readStream.schema(STREAM_SCHEMA_DDL)
        if max_files_per_trigger is not None:
            reader = reader.option("maxFilesPerTrigger", max_files_per_trigger)
        if start_position is not None:
            reader = reader.option("pathGlobFilter", positions_glob(start_position))
        raw = reader.csv(str(input_path))
    events = raw.withColumn("event_time", F.timestamp_micros("ts_us")).withWatermark(
        "event_time", f"{params.lateness_s} seconds"
    )
    # The filter must mention event_time: Spark pushes filters that do not reference the
    # watermark column below the watermark, and then punctuation would never move it.
    data = events.where(F.when(F.col("mark") == 0, F.col("event_time").isNotNull()).otherwise(F.lit(False)))
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


class BatchWriter:
    """The foreachBatch function of a task: writes each batch's rows to its own file.

    `on_cpu(task_id, batch_id, seconds)`, when given, receives the CPU time the function used
    in this process (Spark calls it on a callback thread, so the thread's CPU clock is its own).
    `sink(batch_id, rows)`, when given, takes every batch's rows (also an empty list) instead
    of the plain file writer; an exception it raises fails the query.
    """

    def __init__(self, output_dir: str | Path, task_id: str, params: QueryParams,
                 on_cpu: Callable[[str, int, float], None] | None = None, sink: Sink | None = None) -> None:
        self.output_dir, self.task_id, self.params, self.on_cpu, self.sink = Path(output_dir), task_id, params, on_cpu, sink

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        started = time.thread_time()
        rows = batch_results(batch, self.params)
        if self.sink is not None:
            self.sink(batch_id, rows)
        elif rows:
            write_batch(self.output_dir, self.task_id, batch_id, rows)
        if self.on_cpu is not None:
            self.on_cpu(self.task_id, batch_id, time.thread_time() - started)


def start_query(
    spark: SparkSession,
    task_id: str,
    input_path: str | Path | JetStreamInput,
    checkpoint_dir: str | Path,
    output_dir: str | Path,
    params: QueryParams,
    trigger_s: float | None = None,
    max_files_per_trigger: int | None = None,
    on_cpu: Callable[[str, int, float], None] | None = None,
    sink: Sink | None = None,
    start_position: int | None = None,
) -> StreamingQuery:
    """Start the task's streaming query, resuming from `checkpoint_dir` when it holds a checkpoint.

    `trigger_s` sets a processing-time trigger; None runs micro-batches back to back.
    `sink` and `start_position`: see the module text. Without `start_position`, the one kept
    in the checkpoint (if any) applies.
    """
    start_position = _start_position(Path(checkpoint_dir), start_position)
    writer = (
        per_source(spark, input_path, params, max_files_per_trigger, start_position)
        .writeStream.queryName(task_id)
        .outputMode("append")
        .option("checkpointLocation", str(checkpoint_dir))
        .foreachBatch(BatchWriter(output_dir, task_id, params, on_cpu, sink))
    )
    if trigger_s is not None:
        writer = writer.trigger(processingTime=f"{round(trigger_s * 1000)} milliseconds")
    return writer.start()


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


def _start_position(checkpoint_dir: Path, given: int | None) -> int | None:
    """The start position to apply: the one given (then kept in the checkpoint), else the one kept there."""
    marker = checkpoint_dir / START_FILE
    if given is None:
        try:
            return int(marker.read_text())
        except (OSError, ValueError):
            return None
    checkpoint_dir.mkdir(parents=True, exist_ok=True)
    marker.write_text(str(given))
    return given
