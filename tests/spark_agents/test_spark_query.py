"""The streaming query against the plain computation, and the idempotence of its output through the fence."""

import shutil
from pathlib import Path

import pytest

from spark_agents.broker.results import broker_outputs, broker_sink
from spark_agents.broker.source import JetStreamInput
from spark_agents.broker.stream import BrokerStream
from tests.spark_agents.conns import end_mark_us, end_watermark_ms, feed_all
from bpm.zeek.conn import read_logs
from bpm.zeek.definitions import QueryParams
from bpm.zeek.generator import TrafficProfile, generate
from bpm.zeek.reference import compute
from examples.network_monitoring import bind, expected, records
from examples.network_monitoring import query as MONITORING
from spark_agents.checkpoint import committed_watermark_ms
from spark_agents.pipeline import run_pipeline
from spark_agents.query import staggered_trigger_s, start_query

FIXTURES = Path(__file__).parents[1] / "fixtures" / "zeek"
FIXTURE_PARAMS = QueryParams(window_s=60, min_connections=3, min_ports=2, lateness_s=60)


def test_fixture_through_spark_equals_the_plain_computation(spark):
    conns = list(read_logs([FIXTURES / "conn.log"]))
    result = run_pipeline(spark, MONITORING, bind(FIXTURE_PARAMS), records(conns))
    assert result.rows == expected(conns, FIXTURE_PARAMS)
    assert len(result.rows) == 7 and result.late == 1 and result.duplicates == []


@pytest.mark.parametrize("partitions", [1, 4])
def test_generated_traffic_through_spark_equals_the_plain_computation(spark, partitions):
    conns = generate(TrafficProfile(duration_s=240, rate=80, sources=150, late_fraction=0.01), seed=11)
    params = QueryParams(window_s=30, min_connections=40, min_ports=10, lateness_s=20)
    assert {r.kind for r in compute(conns, params)} == {"connections", "ports", "prefix"}
    result = run_pipeline(spark, MONITORING, bind(params), records(conns), partitions=partitions)
    assert result.rows == expected(conns, params) and result.late > 0


def test_a_replayed_batch_writes_nothing_twice(spark, tmp_path, nats_server, broker):
    server, owner = nats_server
    conns = generate(TrafficProfile(duration_s=120, rate=40, sources=60), seed=12)
    params = QueryParams()
    feeder = feed_all(BrokerStream(broker, "a"), conns, params, rows_per_flush=1000)
    source = JetStreamInput(server.url, owner.name, owner.password, "a", max_messages=64)
    checkpoint = tmp_path / "ck"

    def run_to_end():
        sink = broker_sink(broker, "a.t0", 1)  # a restart of the task at its epoch: a new writer
        query = start_query(spark, "t0", source, checkpoint, MONITORING, bind(params), sink)
        try:
            query.processAllAvailable()
        finally:
            query.stop()
        return sink

    first = run_to_end()
    end_ms = end_watermark_ms(end_mark_us(feeder.admission.newest_us, params), params)
    assert committed_watermark_ms(checkpoint) == end_ms, "the last batch ran with the end mark's watermark"
    written = broker_outputs(broker, ["a.t0"])
    assert written.rows == set(expected(conns, params)) and first.dropped == 0
    # Forget that the last batches committed: a restart from this checkpoint runs them again.
    commits = sorted((checkpoint / "commits").iterdir(), key=lambda p: int(p.name) if p.name.isdigit() else -1)
    for path in [p for p in commits if p.name.isdigit()][-2:]:
        path.unlink()
    shutil.rmtree(checkpoint / "commits" / ".tmp", ignore_errors=True)
    for crc in (checkpoint / "commits").glob(".*.crc"):
        crc.unlink()
    assert (committed_watermark_ms(checkpoint) or 0) < end_ms, "no completed batch with it now"
    again = run_to_end()
    assert again.dropped > 0 and again.written == 0, "the replayed batches' windows were written: the fence dropped them"
    out = broker_outputs(broker, ["a.t0"])
    assert out.rows == written.rows and out.duplicates == []


def test_tasks_trigger_at_intervals_a_few_milliseconds_apart_fixed_by_their_id():
    """Spark fires processing-time triggers at multiples of the interval: with one interval
    every query on the machine would start its batches at the same instants."""
    intervals = [staggered_trigger_s(f"a.p{k}", 10.0) for k in range(14)]
    assert all(10.0 <= i < 11.0 for i in intervals), intervals
    assert len(set(intervals)) == len(intervals), "no two of one participant's tasks share an interval"
    assert staggered_trigger_s("a.p3", 10.0) == intervals[3], "a moved task keeps its interval"
    assert all(round(i * 1000) == i * 1000 for i in intervals), "whole milliseconds, as Spark takes them"
    assert staggered_trigger_s("p0", 0.001) == 0.001
