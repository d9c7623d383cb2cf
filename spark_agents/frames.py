"""A query's records as its `compute` sees them, and a micro-batch's results as the federation takes them.

The stream's lines (`bpm.records`) carry the federation's columns first. `events` turns them
into the query's own columns — the event time back into a TIMESTAMP with the watermark set
at the query's lateness — and removes the punctuation rows after the watermark has seen
them (they only move event time); `batch_results` collects one micro-batch of the query's result,
applies its `finish` and makes each row a `bpm.results.Result`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from bpm.query import Params, Query
from bpm.records import MARK, MARK_DATA, TIME, Records
from bpm.results import Result, results

if TYPE_CHECKING:
    from pyspark.sql import DataFrame


def events(raw: DataFrame, query: Query, params: Params, since_s: int | None = None, until_s: int | None = None) -> DataFrame:
    """The records of `raw` (the stream's columns, `Records.wire_ddl`) in the query's schema,
    watermarked; with `since_s` / `until_s`, those with event time in that span only (a
    task made by a split or a merge, or one split or merged then). Every row moves the
    watermark, punctuation and rows out of the span too."""
    from pyspark.sql import functions as F

    wire = Records(query)
    frame = raw.withColumn(query.event_time, F.timestamp_micros(F.col(TIME)))
    for column in wire.columns:
        if column.type == "TIMESTAMP":
            frame = frame.withColumn(column.name, F.timestamp_micros(F.col(column.name)))
    frame = frame.withWatermark(query.event_time, f"{query.lateness_s(params)} seconds")
    # The filter must mention the event time: Spark pushes filters that do not reference the
    # watermark column below the watermark, and then punctuation would never move it.
    keep = F.col(query.event_time).isNotNull()
    if since_s is not None:
        keep &= F.col(TIME) >= since_s * 1_000_000
    if until_s is not None:
        keep &= F.col(TIME) < until_s * 1_000_000
    data = frame.where(F.when(F.col(MARK) == MARK_DATA, keep).otherwise(F.lit(False)))
    # Each column the query reads mentions the event time too, so that a filter of the query's
    # own (on any column) stays above the watermark with this one: below it, it would remove
    # the punctuation before the watermark sees it.
    time = F.col(f"`{query.event_time}`")
    return data.select(*(time if c.name == query.event_time else F.when(time.isNotNull(), F.col(f"`{c.name}`")).alias(c.name)
                         for c in query.columns))


def batch_results(batch: DataFrame, query: Query, params: Params) -> list[Result]:
    """The results of one micro-batch of the query's result DataFrame (read once: reading a
    foreachBatch frame twice would run its stateful stage twice)."""
    rows = [row.asDict(recursive=True) for row in batch.collect()]
    if query.finish is not None:
        rows = list(query.finish(rows, params))
    return results(rows, query)
