"""Running the monitoring query over finite input to completion (every window emitted).

The input is fed into a fresh partitioned stream, closed with an end-of-input mark, and one
task per partition runs the very same streaming query as a hosted task until it has
processed everything. The result is the union of the tasks' outputs.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from spark_agents.streams import PartitionedStream
from spark_agents.streams.feed import feed_all
from bpm.zeek.conn import Conn
from bpm.zeek.definitions import QueryParams, ResultRow
from bpm.zeek.results import read_outputs
from spark_agents.query import start_query

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


@dataclass
class PipelineResult:
    """The rows of a finite run and what the input held.

    Attributes:
        rows: every result row, sorted.
        connections: connections written to the stream.
        late: connections refused by the lateness rule.
        duplicates: rows written by more than one batch (always empty unless the output is broken).
    """

    rows: list[ResultRow]
    connections: int
    late: int
    duplicates: list[ResultRow]


def run_pipeline(
    spark: SparkSession,
    conns: Iterable[Conn],
    params: QueryParams,
    partitions: int = 1,
    work_dir: str | Path | None = None,
    on_task: Callable[[int], None] | None = None,
) -> PipelineResult:
    """Run the query over `conns` with one task per partition and return the merged rows."""
    with tempfile.TemporaryDirectory(prefix="bpm-pipeline-", dir=work_dir) as tmp:
        root = Path(tmp)
        stream = PartitionedStream.create(root / "stream", partitions)
        feeder = feed_all(stream, conns, params)
        for k in range(partitions):
            query = start_query(spark, f"task-{k}", stream.partition_path(k), root / "checkpoints" / str(k), root / "output", params)
            try:
                query.processAllAvailable()
            finally:
                query.stop()
            if on_task:
                on_task(k)
        output = read_outputs(root / "output")
        return PipelineResult(sorted(output.rows), sum(feeder.written), feeder.admission.late, output.duplicates)
