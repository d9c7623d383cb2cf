"""Priming a Spark driver before it hosts tasks: the tasks' query over generated rows.

A driver that has run no query spends several times its tasks' steady CPU on its first ones:
it loads and compiles the code of the streaming engine, the state store, the Python data
source and the output function. In the demo, D (idle until it joined) used its whole 0.4-CPU
quota for the 25 s after it received two tasks that had used 0.08 CPU at C: a load read then
is far above what the tasks need, and an agent refuses offers or sheds on it. An agent that
starts without tasks and takes them later (`bpm agent run --prime SECONDS`) first runs the
same query (`spark_agents.query.start_query`) over rows this module makes up, micro-batches
back to back, and drops what it writes.

The rows come through a Python data source (`bpm_prime`) as Arrow batches parsed from CSV
(`spark_agents.broker.source.parse`), as the broker's do; each micro-batch is one second of
event time, so that with one-second windows every batch closes a window and emits alerts.
"""

from __future__ import annotations

import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition

from bpm.zeek.definitions import source_prefix
from examples.network_monitoring import query as MONITORING
from spark_agents.broker.source import parse
from spark_agents.streams.records import MARK_DATA, STREAM_SCHEMA_DDL, StreamRecord


NAME = "bpm_prime"
ROWS_PER_BATCH = 400
SOURCES = 16  # a few sources alert in every window, on connections and on ports
# One-second windows, no lateness: each batch's watermark closes the window of the batch before.
PARAMS = MONITORING.bind({"window_s": 1, "min_connections": ROWS_PER_BATCH // SOURCES // 2, "min_ports": 4, "lateness_s": 0})
EPOCH_S = 1_700_000_000  # event time of batch 0
BATCHES = 3


@dataclass
class Second(InputPartition):
    """The generated rows of one second of event time."""

    second: int


def rows(second: int) -> bytes:
    """One second of made-up connections as the stream's CSV lines: `ROWS_PER_BATCH` spread
    over `SOURCES` sources, to as many destinations and ports as the row number gives."""
    base = (EPOCH_S + second) * 1_000_000
    out = []
    for i in range(ROWS_PER_BATCH):
        src = f"10.9.{i % SOURCES}.{second % 250 + 1}"
        out.append(StreamRecord(base + i * (1_000_000 // ROWS_PER_BATCH), src, source_prefix(src), f"192.0.2.{i % 200}", i % 40,
                                "tcp" if i % 3 else "udp", MARK_DATA).to_line())
    return "".join(out).encode()


class PrimeReader(DataSourceStreamReader):
    """An endless stream: each offset is one more second of generated rows."""

    def initialOffset(self) -> dict:
        return {"second": 0}

    def latestOffset(self, start: dict | None = None, limit=None) -> dict:
        return {"second": (start or self.initialOffset())["second"] + 1}

    def partitions(self, start: dict, end: dict) -> list[Second]:
        return [Second(s) for s in range(start["second"], end["second"])]

    def read(self, partition: Second) -> Iterator:
        batch = parse([rows(partition.second)])
        if batch is not None:
            yield batch

    def commit(self, end: dict) -> None:
        pass


class PrimeSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> str:
        return STREAM_SCHEMA_DDL

    def streamReader(self, schema) -> PrimeReader:
        return PrimeReader()


@dataclass(frozen=True)
class GeneratedInput:
    """A task's input as `start_query` reads it (`read`, and no span of event time), made up."""

    since_s: int | None = None
    until_s: int | None = None

    def read(self, spark, ddl: str, owed_batch: bool = False):
        spark.dataSource.register(PrimeSource)
        return spark.readStream.format(NAME).load()


class Discard:
    """An output function's sink that counts the rows and keeps none (with the fence's `closed_through`)."""

    def __init__(self) -> None:
        self.rows = 0

    def __call__(self, batch_id: int, rows: list) -> None:
        self.rows += len(rows)

    def closed_through(self, time_us: int) -> None:
        """Told how far the results are out, as the fence is; nothing to keep."""


def prime(spark, seconds: float, folder: Path) -> dict:
    """Run the tasks' query over generated rows for about `seconds`, and at least `BATCHES`
    batches (the third is the first to close a window), its checkpoint in a temporary folder
    under `folder` that it removes; stopped between batches. Returns what ran: `batches`,
    `alerts` (rows written) and `seconds`. Raises RuntimeError when the query failed."""
    from spark_agents.query import start_query, stop_between_batches

    folder.mkdir(parents=True, exist_ok=True)
    checkpoint = Path(tempfile.mkdtemp(prefix="prime-", dir=folder))
    sink, done = Discard(), threading.Event()
    started = time.monotonic()
    query = start_query(spark, checkpoint.name, GeneratedInput(), checkpoint, MONITORING, PARAMS, sink,  # type: ignore[arg-type]
                        on_cpu=lambda *_: done.set())
    try:
        while query.isActive and (time.monotonic() - started < seconds or _batches(query) < BATCHES):
            time.sleep(0.2)
        if not query.isActive:
            raise RuntimeError(f"the priming query stopped: {query.exception()}")
        stop_between_batches(query, done)
        return {"batches": _batches(query), "alerts": sink.rows, "seconds": round(time.monotonic() - started, 1)}
    finally:
        query.stop()  # when it failed or was interrupted; again is harmless
        shutil.rmtree(checkpoint, ignore_errors=True)


def _batches(query) -> int:
    progress = query.lastProgress
    return 0 if progress is None else progress["batchId"] + 1
