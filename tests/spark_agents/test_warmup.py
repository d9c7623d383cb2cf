"""Priming a driver: the tasks' query over generated rows, then nothing left behind."""

import pytest

from spark_agents.broker.source import parse
from spark_agents.warmup import BATCHES, PARAMS, ROWS_PER_BATCH, prime, rows


def test_a_generated_second_parses_as_the_stream_s_rows_and_makes_sources_alert():
    batch = parse([rows(3)])
    assert batch.num_rows == ROWS_PER_BATCH
    assert batch.schema.names == ["__ts_us", "__mark", "src", "prefix", "dst", "dport", "proto"]
    seconds = {t // 1_000_000 for t in batch.column("__ts_us").to_pylist()}
    assert len(seconds) == 1, "one second of event time per batch"
    per_source = {}
    for src in batch.column("src").to_pylist():
        per_source[src] = per_source.get(src, 0) + 1
    assert min(per_source.values()) > PARAMS.min_connections


def test_priming_runs_the_query_batch_after_batch_emits_alerts_and_leaves_nothing(spark, tmp_path):
    ran = prime(spark, 1.0, tmp_path)
    assert ran["batches"] >= BATCHES, ran
    assert ran["alerts"] > 0, "closed windows emitted their alerts"
    assert not any(q.name and q.name.startswith("prime-") for q in spark.streams.active)
    assert list(tmp_path.iterdir()) == [], "its checkpoint is removed"
    again = prime(spark, 0.0, tmp_path)  # stopped between batches: the driver's output functions still run
    assert again["batches"] >= BATCHES and again["alerts"] > 0, again


@pytest.mark.serial
def test_the_first_queries_benchmark_measures_each_query_s_cpu_after_priming(spark, tmp_path):
    from spark_agents.benchmarks import first_queries

    result = first_queries(spark, tmp_path, prime_s=0.5, queries=2, seconds=2.0, trigger_s=1.0)
    assert result["primed"]["batches"] >= BATCHES and result["primed"]["cpu_s"] > 0
    assert [q["query"] for q in result["queries"]] == [1, 2]
    assert all(0 < q["first_trigger_cpu_s"] <= q["cpu_s"] and q["batches"] >= 1 for q in result["queries"]), result
    assert result["first_over_later"] == round(result["queries"][0]["first_trigger_cpu_s"] / result["queries"][1]["first_trigger_cpu_s"], 2)
    assert not any(q.name and q.name.startswith("first-") for q in spark.streams.active)
