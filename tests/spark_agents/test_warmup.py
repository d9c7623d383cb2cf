"""Priming a driver: each query it can run over records made up from the query's schema, then nothing left behind."""

import pytest

from bpm.records import Records
from examples import sensors
from examples.network_monitoring import query as MONITORING
from spark_agents.broker.source import columns, parse
from spark_agents.warmup import BATCHES, KEYS, ROWS_PER_BATCH, prime, rows, step_s

SENSORS = sensors.query.bind({"window_s": 10, "lateness_s": 25})


def test_made_up_records_parse_with_the_query_s_columns_over_its_keys_one_event_time_a_batch():
    schema = columns(Records(sensors.query).wire_ddl)
    batch = parse([rows(schema, 0, 30, 3)], schema)
    assert batch.num_rows == ROWS_PER_BATCH
    assert batch.schema.names == ["__ts_us", "__mark", "device", "temperature"]
    assert set(batch.column("__ts_us").to_pylist()) == {(1_700_000_000 + 3 * 30) * 1_000_000}, "one event time per batch"
    assert len(set(batch.column("device").to_pylist())) == KEYS
    assert all(isinstance(t, float) for t in batch.column("temperature").to_pylist())


def test_batches_are_far_enough_apart_that_each_closes_the_grain_of_the_one_before():
    assert step_s(sensors.query, SENSORS) == 40, "ten-second windows, 25 s late: four windows"
    assert step_s(sensors.query, sensors.query.bind({"window_s": 10, "lateness_s": 0})) == 10
    with_defaults = MONITORING.bind()
    assert step_s(MONITORING, with_defaults) == 120


@pytest.mark.parametrize("query, params", [(sensors.query, SENSORS),
                                           (MONITORING, MONITORING.bind({"window_s": 1, "min_connections": 0, "lateness_s": 0}))],
                         ids=["sensors", "network-monitoring"])
def test_priming_runs_the_query_batch_after_batch_emits_results_and_leaves_nothing(spark, tmp_path, query, params):
    ran = prime(spark, 1.0, tmp_path, query, params)
    assert ran["query"] == query.name and ran["batches"] >= BATCHES, ran
    assert ran["results"] > 0, "closed grains emitted their results"
    assert not any(q.name and q.name.startswith("prime-") for q in spark.streams.active)
    assert list(tmp_path.iterdir()) == [], "its checkpoint is removed"
    again = prime(spark, 0.0, tmp_path, query, params)  # stopped between batches: the driver's output functions still run
    assert again["batches"] >= BATCHES and again["results"] > 0, again


@pytest.mark.serial
def test_the_first_queries_benchmark_measures_each_query_s_cpu_after_priming(spark, tmp_path):
    from bpm_app.bench.dataplane import first_queries

    result = first_queries(spark, tmp_path, prime_s=0.5, queries=2, seconds=2.0, trigger_s=1.0)
    assert result["query"] == MONITORING.name
    assert result["primed"]["batches"] >= BATCHES and result["primed"]["cpu_s"] > 0
    assert [q["query"] for q in result["queries"]] == [1, 2]
    assert all(0 < q["first_trigger_cpu_s"] <= q["cpu_s"] and q["batches"] >= 1 for q in result["queries"]), result
    assert result["first_over_later"] == round(result["queries"][0]["first_trigger_cpu_s"] / result["queries"][1]["first_trigger_cpu_s"], 2)
    assert not any(q.name and q.name.startswith("first-") for q in spark.streams.active)


def test_an_agent_primes_each_query_it_can_run_with_its_own_tasks_parameters_else_the_defaults(tmp_path):
    from spark_agents.agent import AgentConfig, OwnTask
    from spark_agents.runtime import priming

    queries = {MONITORING.name: MONITORING, sensors.query.name: sensors.query}
    own = OwnTask("g", "nats://127.0.0.1:4222/a", {"window_s": 10}, sensors.query.name, sensors.query.digest)
    config = AgentConfig("a", tmp_path, "http://127.0.0.1:1", tasks=[own], queries=queries)
    assert priming(config) == [(MONITORING, MONITORING.bind()), (sensors.query, sensors.query.bind({"window_s": 10}))]
    assert priming(AgentConfig("a", tmp_path, "http://127.0.0.1:1")) == [], "an agent of no query primes nothing"
