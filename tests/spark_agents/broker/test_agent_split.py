"""The agent splits a running task over its key groups, one half moves to a partner and comes
back, and the halves merge: on Spark, through the registry, each window of each key group
written once, and together the plain computation's rows."""

from __future__ import annotations

import time

import pytest

from bpm.agent.machine import Merge, Split
from bpm.federation.views import key_groups, split_groups
from bpm.keygroups import MAIN
from bpm.negotiation import Task
from bpm.zeek.definitions import QueryParams
from bpm.zeek.generator import TrafficProfile, generate
from examples.network_monitoring import expected
from spark_agents.broker.results import broker_outputs, read_results
from spark_agents.broker.stream import Broker, BrokerStream
from tests.spark_agents.conns import Feeder
from tests.spark_agents.broker.test_agent_broker import _drain, own_brokers, spark_hosts  # noqa: F401 - the fixture
from tests.spark_agents.stepped import stepped_federation

pytestmark = pytest.mark.slow


def _until_running(agent, keys: set[str], rounds: int = 60) -> None:
    """Sync `agent` until it runs exactly `keys` (one query over a broker stream starts at a time)."""
    for _ in range(rounds):
        agent.reads.mark(["task"])
        agent.sync()
        if agent.host.running() == keys and not agent.host.starting():
            return
        time.sleep(0.5)
    raise AssertionError(f"{agent.config.name} runs {agent.host.running()}, not {keys}")


def _tasks(agent) -> dict[str, dict]:
    return {t["name"]: t for t in agent.client.tasks(origin="a")}


def _as_task(record: dict) -> Task:
    """The task as the state machine names it in a `Split` or `Merge`."""
    return Task(str(record["id"]), 0.1, record["origin"], groups=key_groups(record))


@pytest.mark.full
def test_an_agent_splits_a_task_moves_a_half_and_merges_the_halves_with_each_window_once(tmp_path, own_brokers, spark):
    broker = own_brokers["a"]
    params = QueryParams(window_s=10, lateness_s=5)
    conns = list(generate(TrafficProfile(duration_s=240, rate=40, scanners=3), 11))
    third = len(conns) // 3
    with Broker(broker.url, "a", broker.password) as mine, spark_hosts(spark, tmp_path) as (hosts, make_host):
        feeder = Feeder(BrokerStream(mine, "a"), params)
        with stepped_federation(tmp_path, make_host, task_params=params.to_dict(), brokers=own_brokers) as (operator, agents, add, clock):
            a = add("a", 1)
            b = add("b", 0)
            feeder.feed(conns[:third], rows_per_flush=500)
            _until_running(a, {"a.g"})
            _drain(hosts["a"], "a.g")
            whole = _tasks(a)["g"]

            # The split: g ends at the split time; its halves take the rows from it on.
            a._execute(Split(_as_task(whole)))
            split = _tasks(a)
            low, high = split[f"g0-{whole['id']}"], split[f"g1-{whole['id']}"]
            split_at = split["g"]["until_s"]
            assert low["since_s"] == high["since_s"] == split_at and low["from_tasks"] == high["from_tasks"] == [whole["id"]]
            _until_running(a, {"a.g", f"a.{low['name']}", f"a.{high['name']}"})
            assert hosts["a"].host._task("a.g").source.until_s == split_at, "g runs on over its ended input"
            assert {hosts["a"].host._task(f"a.{t['name']}").source.start_seq for t in (low, high)} == {mine.last_seq()}, \
                "the halves read the stream after its end at the split"
            assert split_groups("a", split.values()) == ((MAIN, ""),)
            feeder.feed(conns[third:2 * third], rows_per_flush=500)
            for key in hosts["a"].running():
                _drain(hosts["a"], key)
            _until_running(a, {f"a.{low['name']}", f"a.{high['name']}"})  # g's windows are out: it retires
            assert _tasks(a)["g"]["retired"]

            # One half moves to b and comes back.
            contract = a.client.propose("b", 1.0, 2.0, 5.0)
            b.client.contract_action(contract["id"], "accept")
            b.client.accept_offer(a.client.offer(contract["id"], [high["id"]], 1.5)["id"])
            assert _tasks(a)[high["name"]]["host"] == "b"
            _until_running(a, {f"a.{low['name']}"})
            _until_running(b, {f"a.{high['name']}"})
            _drain(hosts["b"], f"a.{high['name']}")
            clock.advance(6.0)  # past the contract's minimum duration
            a.client.end_movement(a.client.movements(state="active")[0]["id"])
            _until_running(b, set())
            _until_running(a, {f"a.{low['name']}", f"a.{high['name']}"})

            # The merge: both halves end at the merge time; one task over all key groups takes the rest.
            a._execute(Merge((_as_task(low), _as_task(high))))
            merged = _tasks(a)[f"g-{low['id']}"]
            merge_at = merged["since_s"]
            assert merge_at >= split_at and sorted(merged["from_tasks"]) == sorted([low["id"], high["id"]])
            _until_running(a, {f"a.{low['name']}", f"a.{high['name']}", f"a.{merged['name']}"})
            assert {hosts["a"].host._task(f"a.{t['name']}").source.until_s for t in (low, high)} == {merge_at}
            feeder.feed(conns[2 * third:], rows_per_flush=500)
            feeder.close()
            _until_running(a, {f"a.{merged['name']}"}, rounds=240)  # the halves' windows are out: they retire
            _drain(hosts["a"], f"a.{merged['name']}")
            final = _tasks(a)
            assert final[low["name"]]["retired"] and final[high["name"]]["retired"] and not final[merged["name"]]["retired"]
            keys = [f"a.{name}" for name in final]
            rows = {key: [r for batch in read_results(mine, key) for r in batch.rows] for key in keys}
            out = broker_outputs(mine, keys)
            events = [e["kind"] for e in operator.events()]
    want = expected(conns, params)
    assert all(r["window_start"] < split_at for r in rows["a.g"])
    assert all(split_at <= r["window_start"] < merge_at for r in rows[f"a.{low['name']}"] + rows[f"a.{high['name']}"])
    assert all(r["window_start"] >= merge_at for r in rows[f"a.{merged['name']}"])
    assert rows["a.g"] and rows[f"a.{merged['name']}"], "the first and the last task wrote results"
    assert want and out.rows == set(want) and out.duplicates == [], "each window once, none lost"
    assert events.count("task.split") == 1 and events.count("task.merge") == 1 and events.count("task.retired") == 3
    assert a.counts["splits"] == a.counts["merges"] == 1 and a.counts["tasks_retired"] == 3
