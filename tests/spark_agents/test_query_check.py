"""`bpm query check`'s run: a query over a sample as a stream and as a batch, on the shared SparkSession."""

from __future__ import annotations

import itertools

import pytest

from bpm.query import Param, Query, load
from bpm.records import Records
from spark_agents.check import check_query


def _records(query: Query, rows) -> list:
    wire = Records(query)
    return [wire.parse(row) for row in rows]


@pytest.mark.slow
@pytest.mark.parametrize("reference, sample", [
    ("examples.sensors:query", {"seconds": 300, "devices": 12, "rate": 6.0}),
    ("examples.sessions:query", {"seconds": 300, "users": 12, "rate": 4.0}),
    ("examples.network_monitoring:query", {"seconds": 180, "rate": 30.0}),
])
def test_the_examples_stream_as_they_compute_in_batch(spark, tmp_path, reference, sample):
    query = load(reference)
    module = __import__(reference.split(":")[0], fromlist=["generate"])
    params = query.bind({"min_connections": 20, "min_ports": 5} if query.name == "network-monitoring" else {})
    report = check_query(spark, query, params, _records(query, module.generate(seed=3, **sample)), tmp_path, batches=4)
    assert report.problems == []
    assert report.batches >= 4 and len(report.streamed) > 5
    assert report.streamed == report.expected


def _compute_dedup(events, params):
    return events.dropDuplicatesWithinWatermark(["who"]).selectExpr("who", "at", "at AS seen")


def _compute_count(events, params):
    from pyspark.sql import functions as F

    return events.groupBy(F.window("at", "10 seconds"), "who").count().selectExpr("who", "window.start AS start", "window.end AS end", "count")


BASE = dict(name="mine", schema="at TIMESTAMP, who STRING", key="who", event_time="at", lateness=5)
SAMPLE = [{"at": 1_700_000_000 + k, "who": f"u{k % 3}"} for k in range(60)]


@pytest.mark.slow
@pytest.mark.parametrize("query, says", [
    (Query(**BASE, compute=_compute_dedup, result_key=("who",), result_time="seen"), "came out before they were final"),
    (Query(**BASE, compute=_compute_count, result_key=("who",), result_time="end"), "result_key does not identify one result"),
    (Query(**BASE, compute=_compute_count, result_key=("who", "start"), result_time="finish"), "its result has no column 'finish'"),
    (Query(**BASE, compute=lambda events, params: events.groupBy("who").count(), result_key=("who",), result_time="at"),
     "its result has no column 'at'"),
    (Query(**BASE, compute=lambda events, params: events.groupBy("who").count().withColumn("at", events["at"]),
           result_key=("who",), result_time="at"), "compute failed"),
    (Query(**BASE, compute=lambda events, params: events.orderBy("at"), result_key=("who",), result_time="at",
           params={"n": Param(int, 3)}), "Spark does not run it as a streaming query"),
])
def test_a_query_the_federation_cannot_move_exactly_is_refused_with_the_reason(spark, tmp_path, query, says):
    report = check_query(spark, query, query.bind(), _records(query, SAMPLE), tmp_path, batches=3)
    assert not report.ok
    assert says in report.problems[0], report.problems


@pytest.mark.slow
def test_late_records_are_refused_before_the_stream_and_the_results_still_agree(spark, tmp_path):
    query = load("examples.sensors:query")
    rows = [{"ts": 1_700_000_000 + s, "device": f"d{s % 4}", "temperature": float(s)} for s in range(0, 400, 2)]
    late = [{"ts": 1_700_000_100, "device": "d9", "temperature": 99.0}]  # far behind the newest (lateness 30 s)
    records = _records(query, itertools.chain(rows[:150], late, rows[150:]))
    report = check_query(spark, query, query.bind(), records, tmp_path, batches=5)
    assert report.ok, report.problems
    assert report.late == 1 and report.records == len(rows)
    assert all(r.key[0] != "d9" for r in report.streamed)
