"""Retention on the broker: what a consumer still needs stays, the rest is purged on acknowledgement."""

from __future__ import annotations

import pytest

from bpm.keygroups import MAIN, groups, key_group
from bpm.zeek.definitions import QueryParams
from spark_agents.broker.retention import Ack, Retention
from spark_agents.broker.source import _fetch
from spark_agents.broker.stream import Broker, BrokerStream
from spark_agents.broker.subjects import INPUT
from tests.spark_agents.conns import Feeder
from bpm.zeek.stream import MARK_DATA, StreamRecord
from tests.spark_agents.broker.test_source import _conns

pytestmark = pytest.mark.slow


def _prefixes(broker, filter_, after=0) -> list[str]:
    chunks = broker.call(_fetch(broker, INPUT, filter_, after, broker.last_seq()))
    return [r.prefix for chunk in chunks for r in map(StreamRecord.from_line, chunk.decode().splitlines()) if r.mark == MARK_DATA]


def test_acknowledged_messages_are_purged_and_the_rest_stays(nats_server):
    server, owner = nats_server
    with Broker(server.url, owner.name, owner.password) as broker:
        feeder = Feeder(BrokerStream(broker, "a"), QueryParams())
        other = Feeder(BrokerStream(broker, "a", "readings"), QueryParams())  # another input of a's stream
        feeder.feed(_conns(300))
        other.feed(_conns(300))
        middle = broker.last_seq()
        feeder.feed(_conns(300, start_ts=1_700_000_050.0))
        other.feed(_conns(300, start_ts=1_700_000_050.0))
        before = {p: _prefixes(broker, f"in.a.main.{p}.>") for p in "01"}
        readings = _prefixes(broker, "in.a.readings.>")
        retention = Retention(broker, "a")
        assert retention.trim() == {}, "nobody reads anything yet: nothing goes"
        retention.register("a.t0.b", "0")
        retention.register("a.t1.c", "1")
        assert retention.trim() == {}, "registered, not acknowledged: everything stays"
        retention.ack("a.t0.b", "0", middle)
        retention.ack("a.t0.b", "0", 1)  # never moves back
        assert retention.acks()["a.t0.b"] == Ack("0", middle)
        assert set(retention.trim()) == {(MAIN, g) for g in groups("0")}
        after = {p: _prefixes(broker, f"in.a.main.{p}.>") for p in "01"}
        assert _prefixes(broker, "in.a.readings.>") == readings, "nobody reads the other input: it stays whole"
        assert after["1"] == before["1"], "c has acknowledged nothing: its key groups stay whole"
        assert 0 < len(after["0"]) < len(before["0"]) and all(key_group(p) in groups("0") for p in after["0"])
        assert after["0"] == _prefixes(broker, "in.a.main.0.>", middle), "exactly what comes after b's acknowledgement"
        retention.release("a.t1.c")
        assert set(retention.acks()) == {"a.t0.b"}
        retention.register("a.t1.c", "1")  # registered again after a release
        assert retention.acks()["a.t1.c"] == Ack("1", 0)
        # A consumer of key groups 1 of the other input holds back those, not main's.
        retention.register("a.s-g1.b", "1", "readings")
        retention.ack("a.s-g1.b", "1", middle, "readings")
        assert retention.acks()["a.s-g1.b"] == Ack("1", middle, "readings")
        retention.release("a.t1.c")
        assert set(retention.trim()) == {(MAIN, g) for g in groups("0")} | {("readings", g) for g in groups("1")}
        assert _prefixes(broker, "in.a.main.1.>") == before["1"], "main's key groups 1: nobody reads them now, they stay"
        kept = _prefixes(broker, "in.a.readings.1.>")
        assert 0 < len(kept) < len([p for p in readings if key_group(p) in groups("1")])
        assert kept == _prefixes(broker, "in.a.readings.1.>", middle)
        with pytest.raises(ValueError, match="input name"):
            retention.register("a.t3.d", "0", "in.put")
        with pytest.raises(ValueError):
            retention.ack("../x", "0", 5)
        with pytest.raises(ValueError):
            retention.register("a.t2.d", "012")


def test_concurrent_acknowledgements_keep_the_highest(nats_server):
    from concurrent.futures import ThreadPoolExecutor

    server, owner = nats_server
    with Broker(server.url, owner.name, owner.password) as broker:
        BrokerStream(broker, "a")
        retention = Retention(broker, "a")
        retention.register("a.t0.b", "")
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda seq: retention.ack("a.t0.b", "", seq), [5, 90, 12, 64, 3, 77, 41, 8] * 3))
        assert retention.acks()["a.t0.b"] == Ack("", 90)


def test_every_registered_consumer_is_listed_on_every_read(nats_server):
    """Registered consumers are listed on every read, released ones never. (The listing once came
    from `KeyValue.keys()`, whose watcher reported no keys now and then under load, so that
    `trim` purged nothing; that race needs a busy machine and this test does not provoke it.)"""
    server, owner = nats_server
    with Broker(server.url, owner.name, owner.password) as broker:
        BrokerStream(broker, "a")
        retention = Retention(broker, "a")
        for i in range(6):
            retention.register(f"a.t{i}.b", "")
        retention.release("a.t5.b")
        retention.ack("a.t0.b", "", 7)
        for _ in range(100):
            assert set(retention.acks()) == {f"a.t{i}.b" for i in range(5)}
        assert Retention(broker, "a").acks()["a.t0.b"] == Ack("", 7), "read again from the bucket by another reader"
