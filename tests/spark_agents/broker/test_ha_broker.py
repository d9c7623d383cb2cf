"""The HA roles on the broker: a task cut off mid-stream and taken over from what its mode
keeps gives exactly the plain computation's rows on its origin's results stream, with the
origin's stream trimmed to what the mode acknowledged (so the takeover could not have read
anything older)."""

import dataclasses

import pytest

from bpm.zeek.definitions import QueryParams
from bpm.zeek.generator import TrafficProfile, generate
from examples.network_monitoring import bind, expected
from examples.network_monitoring import query as MONITORING
from spark_agents.broker.results import broker_outputs
from spark_agents.broker.retention import Retention
from spark_agents.broker.source import JetStreamInput
from spark_agents.broker.stream import Broker, BrokerStream
from spark_agents.ha.delta import DeltaShipper
from spark_agents.ha.fence import FencedError
from spark_agents.broker.inputs import OwnAcks, TaskInput
from spark_agents.ha.roles import PassiveBackup, take_over
from spark_agents.host import SparkHost
from spark_agents.query import start_query
from tests.spark_agents.conns import Feeder

pytestmark = pytest.mark.slow

PARAMS = QueryParams(window_s=10, min_connections=15, min_ports=8, lateness_s=5)
TASK = "a.t"


def feed(feeder, conns):
    feeder.feed(conns, rows_per_flush=100)


# The CI tier takes over from upstream backup on the broker in the two-query failover test
# (test_two_queries_ha_split.py); this one's upstream case replays 90 s of traffic: second tier.
@pytest.mark.parametrize("mode", ["passive_standby", pytest.param("upstream_backup", marks=pytest.mark.full)])
def test_a_takeover_from_what_the_mode_keeps_is_exact_on_the_broker(spark, tmp_path, nats_server, mode):
    server, owner = nats_server
    traffic = generate(TrafficProfile(duration_s=90, rate=40, sources=60, scan_ports=30), seed=5)
    with Broker(server.url, owner.name, owner.password) as mine:
        feeder = Feeder(BrokerStream(mine, "a"), PARAMS)
        retention = Retention(mine, "a")
        source = JetStreamInput(server.url, owner.name, owner.password, "a", "", max_messages=150)
        stream = TaskInput(source, OwnAcks(retention, ""))
        stream.register("a.t.a")
        third = len(traffic) // 3
        feed(feeder, traffic[:third])
        primary = stream.sink(TASK, 1, MONITORING.lateness_s(bind(PARAMS)))
        query = start_query(spark, TASK, source, tmp_path / "a", MONITORING, bind(PARAMS), primary)
        try:
            query.processAllAvailable()
            shipper = DeltaShipper(tmp_path / "a")
            backup = PassiveBackup(tmp_path / "b")
            delta = shipper.pack()
            backup.apply(delta.data)
            shipper.confirm(delta)
            ack = delta.ack_position if mode == "passive_standby" else stream.replay_from(tmp_path / "a", MONITORING, bind(PARAMS))
            assert ack is not None and 0 < ack <= mine.last_seq()
            if mode == "upstream_backup":
                assert ack < stream.processed(tmp_path / "a"), "a replay starts before what the committed batches read"
            stream.ack("a.t.a", ack)
            # The host runs on past its last copy and acknowledgement, then dies.
            feed(feeder, traffic[third:2 * third])
            query.processAllAvailable()
        finally:
            query.stop()
        assert primary.written > 0
        assert set(retention.trim().values()) == {ack}, "every key group trimmed to the acknowledgement"

        host = SparkHost(spark, tmp_path / "work-b", interval_s=60)
        try:
            took = take_over(host, TASK, mode, epoch=2, stream=stream, consumer="a.t.b", failed_consumer="a.t.a",
                             query=MONITORING, params=bind(PARAMS), trigger_s=None, backup=backup if mode == "passive_standby" else None)
            assert took.start_position == ack and {c: a.seq for c, a in retention.acks().items()} == {"a.t.b": ack}
            feed(feeder, traffic[2 * third:])
            feeder.close()
            host.tasks()[0].query.processAllAvailable()
            assert took.sink.dropped > 0, "the takeover replayed windows the failed host had written"
        finally:
            host.close()
        out = broker_outputs(mine, [TASK])
        want = expected(traffic, PARAMS)
        assert out.lost(want) == [] and out.duplicates == [] and out.extra(want) == []
        with pytest.raises(FencedError):
            primary(999, want[-1:])


def test_a_fresh_start_after_a_sequence_reads_nothing_before_it(spark, tmp_path, nats_server):
    """`none` takes over from the newest input: the restarted query reads only what comes after."""
    server, owner = nats_server
    with Broker(server.url, owner.name, owner.password) as mine:
        feeder = Feeder(BrokerStream(mine, "a"), PARAMS)
        feed(feeder, generate(TrafficProfile(duration_s=30, rate=40), seed=2))
        stream = TaskInput(JetStreamInput(server.url, owner.name, owner.password, "a", ""), OwnAcks(Retention(mine, "a"), ""))
        newest = stream.newest()
        assert newest == mine.last_seq() > 0
        host = SparkHost(spark, tmp_path / "work", interval_s=60)
        try:
            took = take_over(host, TASK, "none", epoch=1, stream=stream, consumer="a.t.a", failed_consumer=None,
                             query=MONITORING, params=bind(PARAMS), trigger_s=None, checkpoint_dir=tmp_path / "ck")
            assert took.start_position == newest
            task = host.tasks()[0]
            assert task.source == dataclasses.replace(stream.source, start_seq=newest)
            task.query.processAllAvailable()
            assert task.rows == 0, "nothing before the newest sequence is read"
        finally:
            host.close()
