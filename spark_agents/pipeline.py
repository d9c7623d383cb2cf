"""Running a query over finite input to completion (every result out).

The input is published into a participant's stream on a NATS server started for the run
(its own storage in a temporary folder), closed with an end-of-input mark, and one task
per share of the stream's key groups runs the very same streaming query as a hosted
task, through the same source, until it has processed everything; its results go to the
run's results stream through the output fence, as a hosted task's do. The result is the
union of the tasks' results.
"""

from __future__ import annotations

import secrets
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from bpm.keygroups import shares
from bpm.query import Params, Query
from bpm.results import Result
from spark_agents.query import start_query
from spark_agents.streams.feed import RecordFeeder

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

PARTICIPANT = "pipeline"  # whose stream the run's input is


@dataclass
class PipelineResult:
    """The results of a finite run and what the input held.

    Attributes:
        rows: every result, sorted.
        records: records written to the stream.
        late: records refused by the lateness rule.
        duplicates: results written by more than one batch (always empty unless the output is broken).
    """

    rows: list[Result]
    records: int
    late: int
    duplicates: list[Result]


def run_pipeline(
    spark: SparkSession,
    query: Query,
    params: Params,
    records: Iterable[tuple[int, tuple]],
    partitions: int = 1,
    work_dir: str | Path | None = None,
    on_task: Callable[[int], None] | None = None,
) -> PipelineResult:
    """Run `query` with `params` over `records` (`bpm.records.Records.parse`'s, in input order)
    with one task per share of the stream (`partitions`: a power of two up to 64,
    `bpm.keygroups.shares`; KeyGroupError otherwise) and return the merged results."""
    from spark_agents.broker.results import broker_outputs, broker_sink
    from spark_agents.broker.server import NatsServer, User
    from spark_agents.broker.source import JetStreamInput
    from spark_agents.broker.stream import Broker, BrokerStream

    prefixes = shares(partitions)
    owner = User(PARTICIPANT, secrets.token_urlsafe(16))
    with tempfile.TemporaryDirectory(prefix="bpm-pipeline-", dir=work_dir) as tmp:
        root = Path(tmp)
        with NatsServer.on_free_ports(PARTICIPANT, root / "broker", [owner]) as server, Broker(server.url, owner.name, owner.password) as broker:
            feeder = RecordFeeder(BrokerStream(broker, PARTICIPANT), query, params)
            feeder.feed(records)
            feeder.close()
            tasks = [f"{PARTICIPANT}.task-{k}" for k in range(len(prefixes))]
            for k, (task, prefix) in enumerate(zip(tasks, prefixes)):
                source = JetStreamInput(server.url, owner.name, owner.password, PARTICIPANT, prefix)
                sink = broker_sink(broker, task, 0)
                running = start_query(spark, task, source, root / "checkpoints" / str(k), query, params, sink)
                try:
                    running.processAllAvailable()
                finally:
                    running.stop()
                if on_task:
                    on_task(k)
            output = broker_outputs(broker, tasks)
        return PipelineResult(sorted(output.rows), sum(feeder.written), feeder.admission.late, output.duplicates)
