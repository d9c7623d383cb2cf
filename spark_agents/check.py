"""Checking a query before a federation runs it: `bpm query check`.

The sample's records (late ones refused by the lateness rule, as a producer refuses them)
are written as the stream's lines into a few files and read twice:

* as a stream, one file per micro-batch, closed by an end-of-input mark, through the same
  `spark_agents.frames.events` a task reads its stream with, in the query's output mode;
* as a plain batch computation of the same `compute` over the same records.

The query passes when Spark accepts it as a streaming query, its results carry the columns
it declares, no result comes out before it is final (its `result_time` is at or behind the
watermark of the micro-batch that emits it: what lets the output fence take each result
exactly once after a move or a failover), no result key comes out twice, and the streaming
results equal the batch's.
"""

from __future__ import annotations

import os
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from bpm.query import Params, Query
from bpm.records import END_US, MARK_END, MARK_TICK, Admission, Records
from bpm.results import OutputSet, Result
from spark_agents.checkpoint import batch_watermark_ms
from spark_agents.frames import batch_results, events

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


@dataclass
class CheckReport:
    """What a check of a query found.

    Attributes:
        records: sample records the stream carried; late: those refused as late.
        batches: micro-batches the streaming run took.
        streamed: results of the streaming run; expected: of the batch computation.
        problems: what is wrong, each a sentence (none: the query passes).
    """

    records: int = 0
    late: int = 0
    batches: int = 0
    streamed: list[Result] = field(default_factory=list)
    expected: list[Result] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def _write_input(folder: Path, wire: Records, records: Sequence[tuple[int, tuple]], files: int) -> None:
    """The records as the stream's lines in `files` files in order, then the end of input
    (a mark, and a tick after it so that a batch runs with the mark's watermark)."""
    folder.mkdir(parents=True)
    size = max(1, -(-len(records) // max(1, files)))
    chunks = [records[k:k + size] for k in range(0, len(records), size)]
    texts = ["".join(wire.line(ts, values) for ts, values in chunk) for chunk in chunks]
    texts += [wire.line(END_US, mark=MARK_END), wire.line(END_US, mark=MARK_TICK)]
    start = time.time() - len(texts)
    for number, text in enumerate(texts):
        path = folder / f"part-{number:05d}.csv"
        path.write_text(text)
        # Spark's file source takes files in the order of their modification times.
        os.utime(path, (start + number, start + number))


def _csv_frame(reader, wire: Records, folder: Path):
    """The stream's lines in `folder` as a DataFrame (`reader`: `spark.read` or `spark.readStream`)."""
    return reader.schema(wire.wire_ddl).option("header", "false").option("escape", '"').option("mode", "FAILFAST").csv(str(folder))


def plain_results(spark: SparkSession, query: Query, params: Params, records: Iterable[tuple[int, tuple]], work_dir: Path) -> list[Result]:
    """The results of `query` with `params` over `records` (in input order; those the lateness
    rule refuses, `bpm.records.Admission`, left out as a feeder leaves them out) as a plain
    batch computation of the same `compute` and `finish`: what its streaming run must give,
    each result once. The records are written as the stream's lines under `work_dir`."""
    wire = Records(query)
    admission = Admission(query.lateness_s(params))
    folder = work_dir / "plain"
    _write_input(folder, wire, [r for r in records if admission.admit(r[0])], 1)
    return sorted(set(batch_results(query.compute(events(_csv_frame(spark.read, wire, folder), query, params), params), query, params)))


def check_query(spark: SparkSession, query: Query, params: Params, records: Sequence[tuple[int, tuple]], work_dir: Path,
                batches: int = 4, timeout_s: float = 600.0) -> CheckReport:
    """Run `query` with `params` over `records` (`bpm.records.Records.parse`'s, in input order)
    as a stream of about `batches` micro-batches and as a batch computation; see the module."""
    wire = Records(query)
    admission = Admission(query.lateness_s(params))
    kept = [r for r in records if admission.admit(r[0])]
    report = CheckReport(records=len(kept), late=admission.late)
    folder, checkpoint = work_dir / "input", work_dir / "checkpoint"
    _write_input(folder, wire, kept, batches)

    try:
        result = query.compute(events(_csv_frame(spark.readStream.option("maxFilesPerTrigger", 1), wire, folder), query, params), params)
    except Exception as exc:  # noqa: BLE001 - the user's code: whatever it raises is the query's problem
        report.problems.append(f"compute failed on the stream of records: {type(exc).__name__}: {_first_line(exc)}")
        return report
    if query.finish is None:
        missing = [c for c in (*query.result_key, query.result_time) if c not in result.columns]
        if missing:
            report.problems.append(f"its result has no column {missing[0]!r} (it has {', '.join(result.columns)})")
            return report

    per_batch: list[tuple[int, list[Result]]] = []

    failures: list[BaseException] = []

    def collect(frame, batch_id: int) -> None:
        try:
            rows = batch_results(frame, query, params)
        except Exception as exc:
            failures.append(exc)
            raise
        per_batch.append((batch_id, rows))

    try:
        running = (result.writeStream.outputMode(query.output_mode).option("checkpointLocation", str(checkpoint))
                   .foreachBatch(collect).trigger(availableNow=True).start())
    except Exception as exc:  # noqa: BLE001 - Spark's analysis of the user's query
        report.problems.append(f"Spark does not run it as a streaming query in {query.output_mode} mode: {_first_line(exc)}")
        return report
    try:
        if not running.awaitTermination(timeout_s):
            report.problems.append(f"the streaming run did not finish in {timeout_s:.0f} s")
    except Exception as exc:  # noqa: BLE001 - the query failed: in the user's code (`failures`) or in Spark
        cause = failures[0] if failures else exc
        report.problems.append(f"the streaming run failed: {type(cause).__name__}: {_first_line(cause)}")
    finally:
        running.stop()
    if report.problems:
        return report
    report.batches = len(per_batch)
    out = OutputSet()
    for batch_id, rows in sorted(per_batch, key=lambda b: b[0]):
        out.add(rows)
        watermark_ms = batch_watermark_ms(checkpoint, batch_id) or 0
        early = [r for r in rows if r.time_us > watermark_ms * 1000]
        if early and not report.problems:
            report.problems.append(
                f"{len(early)} result(s) came out before they were final: in micro-batch {batch_id}, {_show(early[0])} "
                f"has {query.result_time} after the watermark; a movable query's results come out once the watermark passes them")
    report.streamed = sorted(out.rows)
    by_key = Counter(r.key for r in out.rows)
    twice = out.duplicates or sorted(r for r in out.rows if by_key[r.key] > 1)
    if twice:
        report.problems.append(f"a result came out twice, or its result_key does not identify one result: {_show(twice[0])}")

    try:
        plain = query.compute(events(_csv_frame(spark.read, wire, folder), query, params), params)
        report.expected = sorted(set(batch_results(plain, query, params)))
    except Exception as exc:  # noqa: BLE001
        report.problems.append(f"the batch computation failed: {type(exc).__name__}: {_first_line(exc)}")
        return report
    lost, extra = out.lost(report.expected), out.extra(report.expected)
    if lost or extra:
        report.problems.append(
            f"the streaming results differ from the batch computation's: {len(lost)} missing, {len(extra)} different or extra"
            + (f"; e.g. missing {_show(lost[0])}" if lost else "") + (f"; e.g. extra {_show(extra[0])}" if extra else ""))
    return report


def _show(result: Result) -> str:
    return ", ".join(f"{k}={v}" for k, v in result.row)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__

