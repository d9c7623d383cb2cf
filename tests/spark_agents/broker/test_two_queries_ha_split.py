"""Two different queries in one federation, their tasks failed over and split: a's task runs the
network-monitoring query over a's stream, b's the sensors query over an input of b's stream of
its own (`readings`), on Spark, with the real agents and registry (`tests.spark_agents.stepped`).

- Failover: both tasks move to c under a contract with an HA mode; c runs on past what its
  mode kept, then crashes (its queries and duties stop dead, its agent goes silent); each
  origin detects it through the registry and takes its task back as its mode says.
- Split: each origin splits its running task over its key groups at its query's grain; the
  old task completes the windows before the split time, the halves take the rest.

Either way each origin's results stream holds its query's plain computation, each result
exactly once: compared as multisets (none missing, none extra, none twice)."""

from __future__ import annotations

import json
import uuid
from collections import Counter

import pytest

from bpm.agent.machine import Split
from bpm.keygroups import parse_location
from bpm.negotiation import Task
from bpm.records import Records
from bpm.results import Result
from bpm.zeek.generator import TrafficProfile, generate
from examples import network_monitoring, sensors
from examples.network_monitoring import expected
from examples.network_monitoring import query as MONITORING
from spark_agents.agent import OwnTask
from spark_agents.broker.results import read_results
from spark_agents.broker.stream import Broker, BrokerStream
from spark_agents.check import plain_results
from spark_agents.ha_agent import HADuties
from spark_agents.host import SparkHost
from spark_agents.runtime import SparkTasks
from spark_agents.streams.feed import RecordFeeder
from tests.spark_agents.broker.test_agent_broker import _drain
from tests.spark_agents.broker.test_agent_split import _until_running
from tests.spark_agents.broker.test_two_queries import QUERIES, SENSORS, ZEEK, brokers  # noqa: F401 - the fixture
from tests.spark_agents.stepped import stepped_federation
from tests.spark_agents.test_agent_ha import _round, delta_http

pytestmark = pytest.mark.slow

READINGS = sensors.query
# The agents trade nothing by themselves: every move, failover and split here is the test's doing
# (offers accepted by hand, the registry's detection, `Split` executed), none the mechanism's.
QUIET = {"queries": QUERIES, "warmup_s": 1e9}
# Each origin's own task: a's over its main input, b's over its input `readings`.
NAMES = {"a": "g", "b": "readings-g"}
KEYS = {o: f"{o}.{n}" for o, n in NAMES.items()}


def _b_task(brokers) -> OwnTask:
    return OwnTask(NAMES["b"], brokers["b"].location("", "readings"), dict(SENSORS), READINGS.name, READINGS.digest)


def _inputs():
    """(connections, the network-monitoring query's records of them, sensor records): 120 s of each."""
    conns = list(generate(TrafficProfile(duration_s=120, rate=40, scanners=2), 7))
    wire = Records(READINGS)
    readings = [wire.parse(r) for r in sensors.generate(seconds=120, devices=20, rate=20.0, seed=3)]
    return conns, list(network_monitoring.records(conns)), readings


def _parts(records: list, n: int) -> list[list]:
    """`records` in `n` consecutive parts."""
    size = -(-len(records) // n)
    return [records[i * size:(i + 1) * size] for i in range(n)]


def _feeding(at_a: Broker, at_b: Broker, zeek_parts: list[list], sensor_parts: list[list]):
    """(the feeders of a's and b's streams, `feed(part)`: part `part` of each query's input into its origin's stream)."""
    feeders = {"a": RecordFeeder(BrokerStream(at_a, "a"), MONITORING, network_monitoring.bind(ZEEK)),
               "b": RecordFeeder(BrokerStream(at_b, "b", "readings"), READINGS, READINGS.bind(SENSORS))}

    def feed(part: int) -> None:
        feeders["a"].feed(zeek_parts[part], rows_per_flush=500)
        feeders["b"].feed(sensor_parts[part], rows_per_flush=500)

    return feeders, feed


def _hosts(spark, tmp_path, hosts: dict[str, SparkTasks], sessions: bool = False):
    """`stepped_federation`'s `make_host`: Spark hosts that run both queries, named a, b, c in the
    order added, on the shared session; with `sessions`, each on a session of its own over the
    one Spark context, as each participant has its own Spark: a streaming query's name is its
    task's key, unique within a session only, and an active-standby replica runs at the origin
    under the key of the task its host runs. (A `newSession` of a context whose first session
    registered the stream's data source registers it under a name of its own:
    `spark_agents.session.register_source`.)"""

    def make_host(now):
        name = "abc"[len(hosts)]
        session = spark.newSession() if sessions else spark
        hosts[name] = SparkTasks(SparkHost(session, tmp_path / name, interval_s=60), trigger_s=0.2, queries=QUERIES)
        return hosts[name]

    return make_host


@pytest.fixture
def replica_query_ids(monkeypatch):
    """An active-standby replica's copy of the checkpoint gets a streaming query id of its own.

    Here every participant's Spark session is over one Spark context, and Spark lets one query
    id run once per context: the task's host starting from the handed-over checkpoint stopped
    the origin's replica, started from a copy of that same checkpoint (Spark's
    `stopActiveRunOnRestart`), which participants with Spark applications of their own never
    see. The id names the run in the context, nothing in the checkpoint's data."""
    original = HADuties._replica_copy

    def copy(self, task, replica_id):
        folder = original(self, task, replica_id)
        if (folder / "metadata").exists():
            (folder / "metadata").write_text(json.dumps({"id": str(uuid.uuid4())}))
        return folder

    monkeypatch.setattr(HADuties, "_replica_copy", copy)


def _written(broker: Broker, keys) -> tuple[Counter, dict[str, list]]:
    """(every result the tasks `keys` wrote to the results stream on `broker`, counted by how
    many times it was written; each task's batches)."""
    batches = {key: read_results(broker, key) for key in keys}
    return Counter(r for written in batches.values() for b in written for r in b.rows), batches


def _exactly_once(written: Counter, want: list[Result], what: str) -> None:
    """`written` is `want` as a multiset: every result of the plain computation once, nothing else."""
    assert want and len(set(want)) == len(want), f"{what}: the plain computation gives distinct results"
    lost = sorted(set(want) - set(written))
    extra = sorted(set(written) - set(want))
    twice = sorted(r for r, n in written.items() if n > 1)
    assert (lost, extra, twice) == ([], [], []), f"{what}: {len(lost)} lost, {len(extra)} extra, {len(twice)} written twice of {len(want)}"
    assert written == Counter(want)


# One run per row: each query fails over under each precise mode once, and in each run the two
# queries' tasks are under different modes. The first tier runs the first row (each mode of the
# network-monitoring query alone has tests of its own there); the second tier all three.
MODES = [
    pytest.param({"a": "passive_standby", "b": "upstream_backup"}, id="monitoring-passive-sensors-upstream"),
    pytest.param({"a": "upstream_backup", "b": "active_standby"}, id="monitoring-upstream-sensors-active", marks=pytest.mark.full),
    pytest.param({"a": "active_standby", "b": "passive_standby"}, id="monitoring-active-sensors-passive", marks=pytest.mark.full),
]


@pytest.mark.parametrize("modes", MODES)
def test_tasks_of_two_queries_fail_over_from_a_crashed_host_and_each_origin_gets_its_query_s_results_once(tmp_path, brokers, spark, modes,
                                                                                                          replica_query_ids):
    hosts: dict[str, SparkTasks] = {}
    b_task = _b_task(brokers)
    # c's duties run only when the test steps them: the copy (passive standby) or the
    # acknowledgement (upstream backup) is taken at a known point, and c runs on past it.
    settings = {"a": QUIET, "b": {**QUIET, "tasks": [b_task]}, "c": {**QUIET, "ha_interval_s": 3600.0}}
    conns, zeek_records, readings = _inputs()
    zeek_parts, sensor_parts = _parts(zeek_records, 4), _parts(readings, 4)
    keys = KEYS
    try:
        with Broker(brokers["a"].url, "a", brokers["a"].password) as at_a, Broker(brokers["b"].url, "b", brokers["b"].password) as at_b, \
                stepped_federation(tmp_path, _hosts(spark, tmp_path, hosts, "active_standby" in modes.values()), task_params=ZEEK.to_dict(),
                                   brokers=brokers, settings=settings) as (operator, agents, add, clock):
            feeders, feed = _feeding(at_a, at_b, zeek_parts, sensor_parts)

            a, b, c = add("a", 1), add("b", 1), add("c", 0)
            for agent in (a, b, c):
                agent.peers.transport = delta_http(agents)  # deltas between agents in process; a health probe gets no answer
            feed(0)
            _until_running(a, {KEYS["a"]})
            _until_running(b, {KEYS["b"]})
            for origin, key in keys.items():
                _drain(hosts[origin], key)

            # Each origin moves its task to c under a contract of its mode.
            for origin in "ab":
                contract = agents[origin].client.propose("c", 1.0, 2.0, 3600.0, ha_mode=modes[origin])  # outlasts the test
                c.client.contract_action(contract["id"], "accept")
                [task] = agents[origin].client.tasks(origin=origin)
                c.client.accept_offer(agents[origin].client.offer(contract["id"], [task["id"]], 1.5)["id"])
            for _ in range(40):  # releases at batch boundaries, c fetches and starts, replicas and duties
                _round(agents, clock, "abc")
                ready = set(keys.values()) <= c.hosting() and set(c.ha.duties) == set(keys.values()) and all(
                    keys[o] in agents[o].ha.standby_keys() for o in "ab" if modes[o] == "active_standby")
                if ready:
                    break
            assert ready, ([(r.kind, r.message) for r in c.records][-10:], c.hosting(), c.ha.duties)
            assert {t["host"] for t in operator.tasks()} == {"c"} and not any(x.host.running() - x.ha.standby_keys() for x in (a, b))
            assert hosts["c"].host._task(KEYS["a"]).definition is MONITORING and hosts["c"].host._task(KEYS["b"]).definition is READINGS
            assert {k: d.mode for k, d in c.ha.duties.items()} == {keys[o]: modes[o] for o in "ab"}
            moved_epochs = {f"{t['origin']}.{t['name']}": t["epoch"] for t in operator.tasks()}

            feed(1)
            kept = {}
            for key in keys.values():
                _drain(hosts["c"], key)
                kept[key] = hosts["c"]._duties[key].step()  # a copy to the origin (passive), an acknowledgement (upstream, active)
            for origin, key in keys.items():
                if modes[origin] == "passive_standby":
                    assert agents[origin].ha.backups[key].applied is not None, f"{key}: the copy reached {origin}"

            # c runs on past what its modes kept, then crashes: its duties and queries stop dead, its agent is silent.
            feed(2)
            for key in keys.values():
                _drain(hosts["c"], key)
                assert hosts["c"].host._task(key).read_position() > kept[key] > 0, f"{key}: c read on past what its mode kept"
            hosts["c"].close()
            for key in keys.values():
                hosts["c"].host._task(key).query.stop()
            assert not c.host.running()

            # Each origin sees c fail through the registry and takes its task back as its mode says.
            for _ in range(30):
                _round(agents, clock, "ab")
                failovers = {f["task"]: f for f in operator.failovers() if f["kind"] == "failover"}
                if set(failovers) == set(keys.values()) and all(keys[o] in agents[o].hosting() for o in "ab"):
                    break
            assert {k: (f["failed"], f["to_host"], f["mode"]) for k, f in failovers.items()} == \
                {keys[o]: ("c", o, modes[o]) for o in "ab"}, [(r.kind, r.message) for r in a.records + b.records if "fail" in r.kind]
            for origin, key in keys.items():
                assert key in agents[origin].hosting(), [(r.kind, r.message) for r in agents[origin].records][-10:]
                took = [r for r in agents[origin].records if r.kind == "task.taken_over"]
                assert len(took) == 1, [(r.kind, r.message) for r in agents[origin].records if r.kind not in ("agent.race",)][-25:]
                took = took[0]
                # As its mode says: from the copy's or the acknowledged position, or the replica promoted;
                # the replicated modes' replica (the copy, the running replica) is what the registry promoted.
                start = None if modes[origin] == "active_standby" else kept[key]
                assert f"({modes[origin]}) at epoch {moved_epochs[key] + 1}: start position {start}," in took.message, took.message
                assert bool(failovers[key]["details"]["promoted_replica_ids"]) == (modes[origin] != "upstream_backup"), failovers[key]
            assert {f"{t['origin']}.{t['name']}": t["host"] for t in operator.tasks()} == {KEYS["a"]: "a", KEYS["b"]: "b"}

            feed(3)
            for feeder in feeders.values():
                feeder.close()
            for origin, key in keys.items():
                _drain(hosts[origin], key)
            for origin, key in keys.items():
                hosts[origin].stop_task(key)
            zeek_out, zeek_batches = _written(at_a, [KEYS["a"]])
            sensor_out, sensor_batches = _written(at_b, [KEYS["b"]])
            epochs = {f"{t['origin']}.{t['name']}": t["epoch"] for t in operator.tasks()}
    finally:
        for tasks in hosts.values():
            tasks.host.close(stop_tasks=True)

    # Results came from c before the crash and from the origin after it, at its new epoch:
    # the crash fell in the middle of each task's output.
    for key, batches in ((KEYS["a"], zeek_batches[KEYS["a"]]), (KEYS["b"], sensor_batches[KEYS["b"]])):
        by_epoch = Counter()
        for batch in batches:
            by_epoch[batch.epoch] += len(batch.rows)
        assert by_epoch[moved_epochs[key]] > 0, f"{key}: c wrote results before it crashed ({dict(by_epoch)})"
        assert epochs[key] > moved_epochs[key] and by_epoch[epochs[key]] > 0, f"{key}: the new host wrote after the failover ({dict(by_epoch)})"
    _exactly_once(zeek_out, expected(conns, ZEEK), "network monitoring")
    _exactly_once(sensor_out, plain_results(spark, READINGS, READINGS.bind(SENSORS), readings, tmp_path / "plain"), "sensors")


def _own(agent) -> dict[str, dict]:
    """The agent's own tasks in the registry, by name."""
    return {t["name"]: t for t in agent.client.tasks(origin=agent.config.name)}


def _as_task(record: dict) -> Task:
    """The task as the state machine names it in a `Split`."""
    where = parse_location(record["input_uri"])
    return Task(str(record["id"]), 0.1, record["origin"], groups=where.prefix, input=where.input)


def test_tasks_of_two_queries_split_at_their_grain_and_each_origin_gets_its_query_s_results_once(tmp_path, brokers, spark):
    hosts: dict[str, SparkTasks] = {}
    b_task = _b_task(brokers)
    settings = {"a": QUIET, "b": {**QUIET, "tasks": [b_task]}}
    conns, zeek_records, readings = _inputs()
    zeek_parts, sensor_parts = _parts(zeek_records, 3), _parts(readings, 3)
    try:
        with Broker(brokers["a"].url, "a", brokers["a"].password) as at_a, Broker(brokers["b"].url, "b", brokers["b"].password) as at_b, \
                stepped_federation(tmp_path, _hosts(spark, tmp_path, hosts), task_params=ZEEK.to_dict(), brokers=brokers,
                                   settings=settings) as (operator, agents, add, clock):
            feeders, feed = _feeding(at_a, at_b, zeek_parts, sensor_parts)

            a, b = add("a", 1), add("b", 1)
            feed(0)
            _until_running(a, {KEYS["a"]})
            _until_running(b, {KEYS["b"]})
            for origin in "ab":
                _drain(hosts[origin], KEYS[origin])

            # Each origin splits its task: g ends at the split time; its halves take the rows from it on.
            wholes, halves, split_at = {}, {}, {}
            for agent in (a, b):
                origin = agent.config.name
                wholes[origin] = _own(agent)[NAMES[origin]]
                agent._execute(Split(_as_task(wholes[origin])))
                split = _own(agent)
                halves[origin] = [split[f"g{i}-{wholes[origin]['id']}"] for i in (0, 1)]
                split_at[origin] = split[NAMES[origin]]["until_s"]
                assert all(h["since_s"] == split_at[origin] and h["from_tasks"] == [wholes[origin]["id"]] for h in halves[origin])
                assert all((h["query"], h["query_digest"]) == (wholes[origin]["query"], wholes[origin]["query_digest"]) for h in halves[origin])
            assert split_at["a"] % ZEEK.window_s == 0 and split_at["b"] % SENSORS["window_s"] == 0, "at the query's grain"
            half_keys = {o: {f"{o}.{h['name']}" for h in halves[o]} for o in "ab"}
            _until_running(a, {KEYS["a"]} | half_keys["a"])
            _until_running(b, {KEYS["b"]} | half_keys["b"])
            for origin in "ab":
                assert hosts[origin].host._task(KEYS[origin]).source.until_s == split_at[origin], "g runs on over its ended input"
                assert {hosts[origin].host._task(k).source.input for k in half_keys[origin]} == {"main" if origin == "a" else "readings"}
                assert all(hosts[origin].host._task(k).definition is QUERIES[wholes[origin]["query"]] for k in half_keys[origin])

            feed(1)
            for origin in "ab":
                for key in hosts[origin].running():
                    _drain(hosts[origin], key)
            _until_running(a, half_keys["a"])  # g's windows are out: it retires
            _until_running(b, half_keys["b"])
            assert _own(a)[NAMES["a"]]["retired"] and _own(b)[NAMES["b"]]["retired"]

            feed(2)
            for feeder in feeders.values():
                feeder.close()
            for origin in "ab":
                for key in half_keys[origin]:
                    _drain(hosts[origin], key)
                    hosts[origin].stop_task(key)
            zeek_out, zeek_batches = _written(at_a, {KEYS["a"]} | half_keys["a"])
            sensor_out, sensor_batches = _written(at_b, {KEYS["b"]} | half_keys["b"])
            events = [e["kind"] for e in operator.events()]
    finally:
        for tasks in hosts.values():
            tasks.host.close(stop_tasks=True)

    # The old task wrote every result final by the split time, the halves every one after it.
    for origin, batches in (("a", zeek_batches), ("b", sensor_batches)):
        at_us = split_at[origin] * 1_000_000
        old = [r for batch in batches[KEYS[origin]] for r in batch.rows]
        new = [r for key in half_keys[origin] for batch in batches[key] for r in batch.rows]
        assert old and all(r.time_us <= at_us for r in old), f"{origin}.g wrote only windows before the split"
        assert new and all(r.time_us > at_us for r in new), f"{origin}'s halves wrote only windows from the split on"
    assert events.count("task.split") == 2 and events.count("task.retired") == 2
    _exactly_once(zeek_out, expected(conns, ZEEK), "network monitoring")
    _exactly_once(sensor_out, plain_results(spark, READINGS, READINGS.bind(SENSORS), readings, tmp_path / "plain"), "sensors")
