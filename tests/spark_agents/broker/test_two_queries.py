"""Two different queries in one federation: a's task runs the network-monitoring query over a's
stream, b's task the sensors query over an input of b's stream of its own, `readings` (beside
b's main input, which holds other readings that no task of this test reads). Each agent can run both; each task moves to the
other participant through the same path whatever its query (the checkpoint handed over, the
origin's stream read as a partner, the results through the fence on the origin's broker), and
each origin's results are its query's plain computation, each result once."""

from __future__ import annotations

import secrets

import pytest

from bpm.records import Records
from bpm.zeek.definitions import QueryParams
from bpm.zeek.generator import TrafficProfile, generate
from examples import sensors
from examples.network_monitoring import expected
from examples.network_monitoring import query as MONITORING
from spark_agents.agent import OwnTask
from spark_agents.broker.access import OwnBroker
from spark_agents.broker.results import broker_outputs
from spark_agents.broker.stream import Broker, BrokerStream
from spark_agents.check import plain_results
from spark_agents.host import SparkHost
from spark_agents.runtime import SparkTasks
from spark_agents.streams.feed import RecordFeeder
from tests.spark_agents.conns import Feeder
from spark_agents.broker.server import free_port
from tests.spark_agents.broker.test_agent_broker import _drain
from tests.spark_agents.stepped import stepped_federation

pytestmark = pytest.mark.slow

QUERIES = {MONITORING.name: MONITORING, sensors.query.name: sensors.query}
ZEEK = QueryParams(window_s=10, lateness_s=5, min_connections=20, min_ports=5)
SENSORS = {"window_s": 10, "lateness_s": 5}


@pytest.fixture
def brokers(tmp_path):
    started = {n: OwnBroker(n, tmp_path / n / "broker", secrets.token_urlsafe(16), port=free_port(), http_port=free_port()).start() for n in "ab"}
    try:
        yield started
    finally:
        for broker in started.values():
            broker.stop()


def test_tasks_of_two_queries_move_between_agents_and_each_origin_gets_its_query_s_results_once(tmp_path, brokers, spark):
    hosts: dict[str, SparkTasks] = {}

    def make_host(now):
        name = "ab"[len(hosts)]
        hosts[name] = SparkTasks(SparkHost(spark, tmp_path / name, interval_s=60), trigger_s=0.2, queries=QUERIES)
        return hosts[name]

    readings = sensors.query
    b_task = OwnTask("readings-g", brokers["b"].location("", "readings"), dict(SENSORS), readings.name, readings.digest)
    settings = {"a": {"queries": QUERIES}, "b": {"queries": QUERIES, "tasks": [b_task]}}
    conns = list(generate(TrafficProfile(duration_s=120, rate=40, scanners=2), 7))
    wire = Records(readings)
    records = [wire.parse(r) for r in sensors.generate(seconds=120, devices=20, rate=20.0, seed=3)]
    others = [wire.parse(r) for r in sensors.generate(seconds=120, devices=30, rate=20.0, seed=4)]
    try:
        with Broker(brokers["a"].url, "a", brokers["a"].password) as at_a, Broker(brokers["b"].url, "b", brokers["b"].password) as at_b, \
                stepped_federation(tmp_path, make_host, task_params=ZEEK.to_dict(), brokers=brokers, settings=settings) as (operator, agents, add, clock):
            zeek_feed = Feeder(BrokerStream(at_a, "a"), ZEEK)
            sensor_feed = RecordFeeder(BrokerStream(at_b, "b", "readings"), readings, readings.bind(SENSORS))
            main_feed = RecordFeeder(BrokerStream(at_b, "b"), readings, readings.bind(SENSORS))
            main_feed.feed(others, rows_per_flush=500)
            main_feed.close()
            a, b = add("a", 1), add("b", 1)
            zeek_feed.feed(conns[: len(conns) // 2], rows_per_flush=500)
            sensor_feed.feed(records[: len(records) // 2], rows_per_flush=500)
            for agent in (a, b):
                agent.sync()
            assert (a.host.running(), b.host.running()) == ({"a.g"}, {"b.readings-g"})
            assert {(t["origin"], t["query"], t["query_digest"]) for t in operator.tasks()} == {
                ("a", MONITORING.name, MONITORING.digest), ("b", readings.name, readings.digest)}
            _drain(hosts["a"], "a.g")
            _drain(hosts["b"], "b.readings-g")

            # A contract between a and b; each offers its task to the other, who accepts.
            contract = a.client.propose("b", 1.0, 2.0, 5.0)
            b.client.contract_action(contract["id"], "accept")
            for origin, partner in ((a, b), (b, a)):
                [task] = origin.client.tasks(origin=origin.config.name)
                partner.client.accept_offer(origin.client.offer(contract["id"], [task["id"]], 1.5)["id"])
            for _ in range(3):  # releases at batch boundaries, then fetches the checkpoints and starts them
                for agent in (a, b):
                    agent.reads.mark(["task"])
                    agent.sync()
            assert (a.host.running(), b.host.running()) == ({"b.readings-g"}, {"a.g"})
            assert hosts["a"].host._task("b.readings-g").definition is readings and hosts["b"].host._task("a.g").definition is MONITORING

            zeek_feed.feed(conns[len(conns) // 2:], rows_per_flush=500)
            zeek_feed.close()
            sensor_feed.feed(records[len(records) // 2:], rows_per_flush=500)
            sensor_feed.close()
            _drain(hosts["b"], "a.g")
            _drain(hosts["a"], "b.readings-g")
            hosts["b"].stop_task("a.g")
            hosts["a"].stop_task("b.readings-g")
            zeek_out, sensor_out = broker_outputs(at_a, ["a.g"]), broker_outputs(at_b, ["b.readings-g"])
    finally:
        for tasks in hosts.values():
            tasks.host.close(stop_tasks=True)
    want_zeek = expected(conns, ZEEK)
    assert want_zeek and zeek_out.rows == set(want_zeek) and zeek_out.duplicates == []
    want_sensors = plain_results(spark, readings, readings.bind(SENSORS), records, tmp_path / "plain")
    assert want_sensors and sensor_out.rows == set(want_sensors) and sensor_out.duplicates == []
