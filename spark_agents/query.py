"""A task's streaming query in Structured Streaming: a user's query (`bpm.query.Query`) over its key groups of a stream.

Per task, the streaming part reads its share of a participant's JetStream stream
(`spark_agents.broker.source.JetStreamInput`, which carries its own start and batch bound),
turns the stream's lines into the query's records with the watermark set at its lateness
(`spark_agents.frames.events`, which removes the federation's punctuation rows *after* the
watermark has seen them), and runs the query's `compute` in append mode. Each micro-batch's
result rows go through the query's `finish` and become `bpm.results.Result`s
(`spark_agents.frames.batch_results`), which the batch hands to the task's sink: the output
fence on the origin's broker (`spark_agents.ha.fence`), which takes each result once, or a
standby's, which holds them back.
"""

from __future__ import annotations

import threading
import time
import zlib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bpm.query import Params, Query, QueryError
from bpm.records import Records
from bpm.results import Result
from spark_agents.checkpoint import batch_watermark_ms, owes_watermark_batch
from spark_agents.frames import batch_results, events

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from spark_agents.broker.source import JetStreamInput
    from pyspark.sql.streaming import StreamingQuery

Sink = Callable[[int, list[Result]], None]


def bind_task(queries: Mapping[str, Query], task_id: str, query: str | None, params: Mapping[str, Any]) -> tuple[Query, Params, float | None]:
    """The query task `task_id` runs, its parameters and its trigger interval (None: not set),
    from its record: `query` names one of `queries`, `params` holds the query's parameters and
    the federation's `trigger_s`. QueryError when the query is not among `queries` or the
    parameters are not the query's."""
    if query not in queries:
        raise QueryError(f"task {task_id} runs query {query!r}, which this participant does not have (it has {', '.join(sorted(queries)) or 'none'})")
    values = dict(params)
    trigger_s = values.pop("trigger_s", None)
    definition = queries[query]
    return definition, definition.bind(values), trigger_s


def closed_through_us(watermark_ms: int, align_s: int | None) -> int:
    """The newest time (microseconds) through which a batch running with `watermark_ms` has put
    out every result: a result comes out in the batch whose watermark passes its time, and one
    exactly at the watermark may come at the next. With `align_s` (the query's `align`), the
    time is rounded down to its multiples, so that the fence hears of it once per multiple."""
    closed = watermark_ms * 1000 - 1
    return closed // (align_s * 1_000_000) * align_s * 1_000_000 if align_s else closed


class BatchWriter:
    """The foreachBatch function of a task: hands each batch's results (also an empty list) to
    `sink(batch_id, results)`; an exception it raises fails the query. A sink that says how far
    its results are out (`closed_through(time_us)`, the output fence) is told after each
    batch, from the watermark the batch ran with (read in `checkpoint_dir`): a reader of the
    results then knows a time without results from one still open.

    `on_cpu(task_id, batch_id, seconds)`, when given, receives the CPU time the function used
    in this process (Spark calls it on a callback thread, so the thread's CPU clock is its own).
    """

    def __init__(self, task_id: str, query: Query, params: Params, sink: Sink, on_cpu: Callable[[str, int, float], None] | None = None,
                 checkpoint_dir: str | Path | None = None) -> None:
        self.task_id, self.query, self.params, self.sink, self.on_cpu = task_id, query, params, sink, on_cpu
        self.checkpoint_dir = checkpoint_dir
        self.align_s = query.align_s(params)

    def __call__(self, batch, batch_id: int) -> None:
        started = time.thread_time()
        self.sink(batch_id, batch_results(batch, self.query, self.params))
        closed_through = getattr(self.sink, "closed_through", None)
        if closed_through is not None and self.checkpoint_dir is not None:
            watermark = batch_watermark_ms(self.checkpoint_dir, batch_id)
            if watermark:
                closed_through(closed_through_us(watermark, self.align_s))
        if self.on_cpu is not None:
            self.on_cpu(self.task_id, batch_id, time.thread_time() - started)


def start_query(
    spark: SparkSession,
    task_id: str,
    source: JetStreamInput,
    checkpoint_dir: str | Path,
    query: Query,
    params: Params,
    sink: Sink,
    trigger_s: float | None = None,
    on_cpu: Callable[[str, int, float], None] | None = None,
) -> StreamingQuery:
    """Start the task's streaming query, `query` with `params`, over `source`
    (`source.read(spark, ddl)`: the stream's lines as the query's records, in its span of event time), its results to
    `sink`, resuming from `checkpoint_dir` when it holds a checkpoint (the source's start
    applies only to a fresh one; a checkpoint that owes the batch of a new watermark gets
    it, `spark_agents.checkpoint.owes_watermark_batch`).

    `trigger_s` sets a processing-time trigger; None runs micro-batches back to back.
    """
    raw = source.read(spark, Records(query).wire_ddl, owed_batch=owes_watermark_batch(checkpoint_dir))
    writer = (
        query.compute(events(raw, query, params, source.since_s, source.until_s), params)
        .writeStream.queryName(task_id)
        .outputMode(query.output_mode)
        .option("checkpointLocation", str(checkpoint_dir))
        .foreachBatch(BatchWriter(task_id, query, params, sink, on_cpu, checkpoint_dir))
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
