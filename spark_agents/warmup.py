"""Priming a Spark driver before it hosts tasks: its queries over made-up records.

A driver that has run no query spends several times its tasks' steady CPU on its first ones:
it loads and compiles the code of the streaming engine, the state store, the Python data
source and the output function. In the demo, D (idle until it joined) used its whole 0.4-CPU
quota for the 25 s after it received two tasks that had used 0.08 CPU at C: a load read then
is far above what the tasks need, and an agent refuses offers or sheds on it. An agent that
starts without tasks and takes them later (`bpm agent run --prime SECONDS`) first runs each
query it can run (`spark_agents.query.start_query`) over records this module makes up from
the query's schema, micro-batches back to back, and drops what it writes.

The records come through a Python data source (`bpm_prime`) as Arrow batches parsed from the
stream's lines (`spark_agents.broker.source.parse`), as the broker's do. Each micro-batch
holds `ROWS_PER_BATCH` records over `KEYS` keys at one event time, far enough after the
batch before (`step_s`) that every batch closes a grain and the query emits what it closes.
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

from bpm.query import Params, Query
from bpm.records import MARK_DATA, Records
from spark_agents.broker.source import parse
from spark_agents.session import register_source

NAME = "bpm_prime"
ROWS_PER_BATCH = 400
KEYS = 16
EPOCH_S = 1_700_000_000  # event time of batch 0
BATCHES = 3


@dataclass
class Second(InputPartition):
    """The made-up records of one batch."""

    second: int


def made_up(schema: list[tuple[str, str]], key_index: int, index: int) -> list[str]:
    """The values of record `index` of a batch, one per column of `schema` (name, SQL type;
    the line's columns after event time and mark), as the line's text: the key one of
    `KEYS`, strings over 200 values, numbers over 40."""
    values = []
    for position, (_, sql) in enumerate(schema):
        n = index % (KEYS if position == key_index else 200 if sql == "STRING" else 40)
        values.append(f"v{n}" if sql == "STRING" else ("true" if n % 2 else "false") if sql == "BOOLEAN" else str(n))
    return values


def rows(schema: list[tuple[str, str]], key_index: int, step_s: int, second: int) -> bytes:
    """Batch `second`'s made-up records as the stream's lines (`schema`: the line's columns, the
    event time's and the mark's first)."""
    ts_us = (EPOCH_S + second * step_s) * 1_000_000
    return "".join(f"{ts_us},{MARK_DATA},{','.join(made_up(schema[2:], key_index, i))}\n" for i in range(ROWS_PER_BATCH)).encode()


class PrimeReader(DataSourceStreamReader):
    """An endless stream: each offset is one more batch of made-up records."""

    def __init__(self, schema: list[tuple[str, str]], key_index: int, step_s: int) -> None:
        self.schema, self.key_index, self.step_s = schema, key_index, step_s

    def initialOffset(self) -> dict:
        return {"second": 0}

    def latestOffset(self, start: dict | None = None, limit=None) -> dict:
        return {"second": (start or self.initialOffset())["second"] + 1}

    def partitions(self, start: dict, end: dict) -> list[Second]:
        return [Second(s) for s in range(start["second"], end["second"])]

    def read(self, partition: Second) -> Iterator:
        batch = parse([rows(self.schema, self.key_index, self.step_s, partition.second)], self.schema)
        if batch is not None:
            yield batch

    def commit(self, end: dict) -> None:
        pass


class PrimeSource(DataSource):
    """Read with the line's schema and the options `key` (the key's position among the
    record's columns) and `step` (seconds of event time between batches): `MadeUpInput`."""

    @classmethod
    def name(cls) -> str:
        return NAME

    def streamReader(self, schema) -> PrimeReader:
        return PrimeReader([(f.name, f.dataType.simpleString().upper()) for f in schema.fields],
                           int(self.options["key"]), int(self.options["step"]))


@dataclass(frozen=True)
class MadeUpInput:
    """A task's input as `start_query` reads it (`read`, and no span of event time): records
    of `records`' query made up, batches `step_s` of event time apart."""

    records: Records
    step_s: int
    since_s: int | None = None
    until_s: int | None = None

    @classmethod
    def of(cls, query: Query, params: Params) -> MadeUpInput:
        """`query`'s made-up records with `params`, batches `step_s` apart."""
        return cls(Records(query), step_s(query, params))

    def read(self, spark, ddl: str, owed_batch: bool = False):
        options = {"key": str(self.records.key_index), "step": str(self.step_s)}
        return spark.readStream.format(register_source(spark, PrimeSource)).schema(ddl).options(**options).load()


class Discard:
    """An output function's sink that counts the rows and keeps none (with the fence's `closed_through`)."""

    def __init__(self) -> None:
        self.rows = 0

    def __call__(self, batch_id: int, rows: list) -> None:
        self.rows += len(rows)

    def closed_through(self, time_us: int) -> None:
        """Told how far the results are out, as the fence is; nothing to keep."""


def step_s(query: Query, params: Params) -> int:
    """Event time between batches: the smallest multiple of the grain (`align`, else one
    second) that is at least the grain and the lateness together, so that each batch's
    watermark closes the grain of the batch before."""
    grain = query.align_s(params) or 1
    return grain * -(-(grain + query.lateness_s(params)) // grain)


def prime(spark, seconds: float, folder: Path, query: Query, params: Params) -> dict:
    """Run `query` with `params` over made-up records for about `seconds`, and at least
    `BATCHES` batches, its checkpoint in a temporary folder under `folder` that it removes;
    stopped between batches. Returns what ran: `batches`, `results` (rows written) and
    `seconds`. Raises RuntimeError when the query failed."""
    from spark_agents.query import start_query, stop_between_batches

    folder.mkdir(parents=True, exist_ok=True)
    checkpoint = Path(tempfile.mkdtemp(prefix="prime-", dir=folder))
    sink, done = Discard(), threading.Event()
    started = time.monotonic()
    made_up = MadeUpInput.of(query, params)
    running = start_query(spark, checkpoint.name, made_up, checkpoint, query, params, sink,  # type: ignore[arg-type]
                          on_cpu=lambda *_: done.set())
    try:
        while running.isActive and (time.monotonic() - started < seconds or _batches(running) < BATCHES):
            time.sleep(0.2)
        if not running.isActive:
            raise RuntimeError(f"the priming query stopped: {running.exception()}")
        stop_between_batches(running, done)
        return {"query": query.name, "batches": _batches(running), "results": sink.rows, "seconds": round(time.monotonic() - started, 1)}
    finally:
        running.stop()  # when it failed or was interrupted; again is harmless
        shutil.rmtree(checkpoint, ignore_errors=True)


def _batches(query) -> int:
    progress = query.lastProgress
    return 0 if progress is None else progress["batchId"] + 1
