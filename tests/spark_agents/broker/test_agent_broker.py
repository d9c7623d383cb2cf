"""Agents on the broker: the origin lets in exactly the hosts of its tasks, on the registry's
token, and a task moved between agents that share no folder reads its origin's stream and
writes its results there, exactly once."""

from __future__ import annotations

import secrets
import threading
from contextlib import contextmanager

import pytest
from fastapi.testclient import TestClient

from bpm.costs import MM1Cost
from bpm.keygroups import MAIN
from bpm.zeek.definitions import QueryParams
from bpm.zeek.generator import TrafficProfile, generate
from examples.network_monitoring import expected
from examples.network_monitoring import query as MONITORING
from bpm_http.client import RegistryClient, RegistryError
from spark_agents.broker.access import OwnBroker
from spark_agents.broker.results import broker_outputs
from spark_agents.broker.server import BrokerError, free_port
from spark_agents.broker.source import JetStreamInput, _fetch
from spark_agents.broker.stream import Broker, BrokerStream
from spark_agents.broker.subjects import INPUT
from spark_agents.server import create_agent_app
from tests.spark_agents.conns import Feeder
from tests.spark_agents.stepped import stepped_federation
from tests.spark_agents.test_agent import SteppedHost
from tests.spark_agents.test_agent_ha import Fences, SteppedHAHost

pytestmark = pytest.mark.slow


@pytest.fixture
def own_brokers(tmp_path):
    """Participant a's broker, in a's own folder, stopped at the end."""
    broker = OwnBroker("a", tmp_path / "a" / "broker", secrets.token_urlsafe(16), port=free_port(), http_port=free_port()).start()
    try:
        yield {"a": broker}
    finally:
        broker.stop()


def _move(clients, task, to="b", **terms):
    """An offer of `task` from a to `to`, accepted: the registry moves it (the next epoch)."""
    contract = clients["a"].propose(to, 1.0, 2.0, 5.0, **terms)
    clients[to].contract_action(contract["id"], "accept")
    clients[to].accept_offer(clients["a"].offer(contract["id"], [task["id"]], 1.5)["id"])
    return clients["a"].tasks(origin="a")[0]


def _clients(operator, a, names):
    transport = operator._http._transport
    clients = {"a": a.client}
    for name in names:
        clients[name] = RegistryClient("http://testserver", operator.add_participant(name, f"http://127.0.0.1:9000/{name}")["api_key"], transport=transport)
    return clients


def _reads(broker: OwnBroker, user: str, password: str, filter_: str = "in.a.main.>") -> int:
    """How many messages `user` reads of a's stream through `filter_` (BrokerError when refused):
    all it holds there (a partner may not ask for the stream's newest sequence)."""
    with Broker(broker.url, user, password, timeout_s=2) as theirs:
        return len(theirs.call(_fetch(theirs, INPUT, filter_, 0, 2**62)))


def test_the_origin_lets_in_only_its_task_s_host_and_only_for_that_task(tmp_path, own_brokers):
    broker = own_brokers["a"]
    with stepped_federation(tmp_path, lambda now: SteppedHost(MM1Cost(a=0.25, c=1.0)), brokers=own_brokers) as (operator, agents, add, clock):
        a = add("a", 1)
        clients = _clients(operator, a, "bc")
        with Broker(broker.url, "a", broker.password) as mine:
            Feeder(BrokerStream(mine, "a"), QueryParams()).feed(generate(TrafficProfile(duration_s=20, rate=20), 1))
        task = _move(clients, clients["a"].tasks(origin="a")[0])
        assert task["host"] == "b" and task["input_uri"] == broker.location("")
        with TestClient(create_agent_app(a), raise_server_exceptions=False) as http:
            def ask(token, epoch=1):
                return http.get("/broker/a.g", params={"epoch": epoch}, headers={"Authorization": f"Bearer {token}"} if token else {})

            assert ask(None).status_code == 401
            assert ask(clients["b"].call_token(task["id"], "handover", "a", 1)["token"]).status_code == 403  # a token for another call
            with pytest.raises(RegistryError) as refused:
                clients["c"].call_token(task["id"], "stream", "a", 1)  # not the task's host
            assert refused.value.status == 409
            with pytest.raises(RegistryError) as refused:
                clients["b"].call_token(task["id"], "stream", "c", 1)  # c is not the task's origin
            assert refused.value.status == 403
            granted = ask(clients["b"].call_token(task["id"], "stream", "a", 1)["token"])
            assert granted.status_code == 200, granted.text
            body = granted.json()
            assert body["user"] == "b" and body["url"] == broker.url

            # The host acknowledges a's stream at a's agent, with the same kind of token.
            a.reads.mark(["task"])
            a.sync()
            stream_token = clients["b"].call_token(task["id"], "stream", "a", 1)["token"]

            def ack(token, seq, epoch=1):
                return http.post("/broker/a.g/ack", params={"epoch": epoch, "seq": seq}, headers={"Authorization": f"Bearer {token}"})

            assert ack(stream_token, 3).status_code == 204
            assert broker.retention().acks()["a.g.b"].seq == 3
            assert ack(stream_token, 10**9).status_code == 422  # past the stream's end
            assert ack(stream_token, 3, epoch=2).status_code in (401, 403)  # the token is for epoch 1
            assert ack(clients["b"].call_token(task["id"], "handover", "a", 1)["token"], 3).status_code == 403
        assert broker.granted() == {"b": frozenset({("a.g", (MAIN, ""), True)})}
        assert _reads(broker, "b", body["password"]) > 0
        with pytest.raises(BrokerError, match="(?i)permissions violation"):
            _reads(broker, "b", body["password"], "in.z.main.>")
        # The task comes back to a: a's next read of its tasks lets b in no more.
        clock.advance(6.0)  # past the contract's minimum duration
        clients["a"].end_movement(clients["a"].movements(state="active")[0]["id"])
        a.reads.mark(["task"])
        a.sync()
        assert broker.granted() == {}
        with pytest.raises(BrokerError):
            _reads(broker, "b", body["password"])


@contextmanager
def spark_hosts(spark, tmp_path):
    """(hosts, make_host): `stepped_federation`'s hosts on Spark, one per participant in the
    order added (a, then b), each in its own folder, in `hosts` by name; closed at the end."""
    from spark_agents.host import SparkHost
    from spark_agents.runtime import SparkTasks

    hosts = {}

    def make_host(now):
        name = "ab"[len(hosts)]
        hosts[name] = SparkTasks(SparkHost(spark, tmp_path / name, interval_s=60), trigger_s=0.2, queries={MONITORING.name: MONITORING})
        return hosts[name]

    try:
        yield hosts, make_host
    finally:
        for host in hosts.values():
            host.host.close(stop_tasks=True)


@pytest.mark.full
def test_a_task_over_the_broker_moves_between_agents_that_share_no_folder_and_writes_each_result_once(tmp_path, own_brokers, spark):
    broker = own_brokers["a"]
    params = QueryParams(window_s=10, lateness_s=5)
    conns = list(generate(TrafficProfile(duration_s=120, rate=40, scanners=2), 7))
    first, rest = conns[: len(conns) // 2], conns[len(conns) // 2:]
    with Broker(broker.url, "a", broker.password) as mine, spark_hosts(spark, tmp_path) as (hosts, make_host):
        feeder = Feeder(BrokerStream(mine, "a"), params)
        with stepped_federation(tmp_path, make_host, task_params=params.to_dict(), brokers=own_brokers) as (operator, agents, add, clock):
            a = add("a", 1)
            b = add("b", 0)
            clients = {"a": a.client, "b": b.client}
            feeder.feed(first, rows_per_flush=500)
            a.sync()
            assert a.host.running() == {"a.g"}
            _drain(hosts["a"], "a.g")
            task = _move(clients, clients["a"].tasks(origin="a")[0])
            a.reads.mark(["task"])
            a.sync()  # releases the task at a batch boundary
            b.reads.mark(["task"])
            b.sync()  # fetches the checkpoint from a, asks a for the stream, starts
            assert b.host.running() == {"a.g"} and a.host.running() == set()
            running = hosts["b"].host._task("a.g").source
            assert isinstance(running, JetStreamInput) and running.user == "b"
            feeder.feed(rest, rows_per_flush=500)
            feeder.close()
            _drain(hosts["b"], "a.g")
            hosts["b"].stop_task("a.g")
            out = broker_outputs(mine, ["a.g"])
    want = expected(conns, params)
    assert want and out.rows == set(want) and out.duplicates == []
    assert task["epoch"] == 1


def _drain(tasks, key: str, timeout_s: float = 120.0) -> None:
    """Let the task process everything its stream holds now."""
    query = tasks.host._task(key).query
    worker = threading.Thread(target=query.processAllAvailable, daemon=True)
    worker.start()
    worker.join(timeout_s)
    assert not worker.is_alive(), f"{key} did not catch up within {timeout_s:.0f} s"


class _SlowStarts(SteppedHost):
    """Every task it runs is still starting until `started` is set."""

    started = False

    def start_task(self, task_id, source, checkpoint_dir, params, epoch, query=None):
        assert isinstance(source, JetStreamInput) and epoch == 0, "a broker task reads as the owner and writes through the fence"
        super().start_task(task_id, source, checkpoint_dir, params, epoch)

    def starting(self):
        return set() if self.started else set(self._running)


def test_an_agent_starts_one_query_over_a_broker_stream_at_a_time(tmp_path, own_brokers):
    with stepped_federation(tmp_path, lambda now: _SlowStarts(MM1Cost(a=0.25, c=1.0)), brokers=own_brokers) as (operator, agents, add, clock):
        a = add("a", 2)
        a.sync()
        assert a.host.running() == {"a.g0"}
        a.sync()
        assert a.host.running() == {"a.g0"}, "the second waits while the first starts"
        a.host.started = True
        a.sync()
        assert a.host.running() == {"a.g0", "a.g1"}


def test_the_origin_keeps_its_stream_for_the_host_of_a_replicated_task_and_takes_its_acknowledgements(tmp_path, own_brokers):
    broker = own_brokers["a"]
    fences = Fences()
    with stepped_federation(tmp_path, lambda now: SteppedHAHost(fences, now), brokers=own_brokers) as (operator, agents, add, clock):
        a = add("a", 1)
        b = add("b", 0)
        with Broker(broker.url, "a", broker.password) as mine:
            Feeder(BrokerStream(mine, "a"), QueryParams()).feed(generate(TrafficProfile(duration_s=20, rate=20), 1))
            last = mine.last_seq()
        task = _move({"a": a.client, "b": b.client}, a.client.tasks(origin="a")[0], ha_mode="upstream_backup")
        assert task["host"] == "b"
        b.sync()  # b starts the task,
        b.sync()  # then its duties: its acknowledgements go to a's agent
        a.reads.mark(["task"])
        a.sync()
        retention = broker.retention()
        assert {c: ack.seq for c, ack in retention.acks().items()} == {"a.g.b": 0}, "the host's consumer holds everything until it acknowledges"
        b.host.streams["a.g"].ack("a.g.b", last - 1)
        assert retention.acks()["a.g.b"].seq == last - 1
        assert set(retention.trim().values()) == {last - 1}
        # The task comes home, where its own mode is none: a's next read releases b's consumer.
        clock.advance(6.0)
        a.client.end_movement(a.client.movements(state="active")[0]["id"])
        a.reads.mark(["task"])
        a.sync()
        assert retention.acks() == {}


def test_a_broker_whose_stream_holds_input_of_before_named_inputs_says_so_when_it_starts(tmp_path, caplog):
    """Messages on the subjects of a stream of one unnamed input (`in.a.<bits>`) are read by
    no task: the participant's broker says how many, and how to publish them again."""
    import logging

    password = secrets.token_urlsafe(16)
    broker = OwnBroker("a", tmp_path / "broker", password, port=free_port(), http_port=free_port()).start()
    try:
        with Broker(broker.url, "a", password) as owner:
            owner.publish("in.a.0.1.1.0.1.0", b"1,0,x\n")
            owner.publish("in.a.1.0.0.0.0.0", b"1,0,y\n")
            BrokerStream(owner, "a").append(3, ["1,0,z\n"])  # the main input: read as ever
    finally:
        broker.stop()
    with caplog.at_level(logging.WARNING, logger="spark_agents.broker.access"):
        broker = OwnBroker("a", tmp_path / "broker", password, port=free_port(), http_port=free_port()).start()
        broker.stop()
    said = [r.getMessage() for r in caplog.records if r.name == "spark_agents.broker.access"]
    assert len(said) == 1 and "holds 2 messages published before its inputs had names" in said[0], said
