"""Recovery on the shared Spark session: a task cut off mid-stream and taken over from what its
HA mode keeps gives exactly the plain computation's rows, with the stream trimmed to what the
mode acknowledged (so the takeover could not have read anything older)."""

import pytest

from spark_agents.streams import PartitionedStream
from spark_agents.streams.feed import Feeder
from bpm.zeek.definitions import QueryParams
from bpm.zeek.generator import TrafficProfile, generate
from bpm.zeek.reference import compute
from bpm.zeek.results import read_outputs
from spark_agents.ha.delta import DeltaShipper
from spark_agents.ha.fence import FencedError, FencedSink
from spark_agents.ha.inputs import PartitionInput
from spark_agents.ha.roles import PassiveBackup, take_over
from spark_agents.ha.upstream import upstream_ack_position
from spark_agents.host import TaskHost
from spark_agents.query import start_query

pytestmark = pytest.mark.slow

PARAMS = QueryParams(window_s=10, min_connections=15, min_ports=8, lateness_s=5)


def feed(feeder, conns, per_file=300):
    for i, conn in enumerate(conns):
        feeder.add(conn)
        if i % per_file == per_file - 1:
            feeder.flush()
    feeder.flush()


def run_until_idle(query):
    query.processAllAvailable()


@pytest.fixture
def traffic():
    return generate(TrafficProfile(duration_s=90, rate=40, sources=60, scan_ports=30), seed=5)


@pytest.mark.parametrize("mode", ["passive_standby", "upstream_backup"])
def test_a_takeover_from_what_the_mode_keeps_is_exact(spark, tmp_path, traffic, mode):
    stream = PartitionedStream.create(tmp_path / "stream", 1)
    output = tmp_path / "output"
    feeder = Feeder(stream, PARAMS)
    third = len(traffic) // 3
    feed(feeder, traffic[:third])
    primary = FencedSink(output, "t", epoch=1)
    query = start_query(spark, "t", stream.partition_path(0), tmp_path / "a", output, PARAMS, None, 2, sink=primary)
    try:
        run_until_idle(query)
        shipper = DeltaShipper(tmp_path / "a")
        backup = PassiveBackup(tmp_path / "b")
        delta = shipper.pack()
        backup.apply(delta.data)
        shipper.confirm(delta)
        ack = delta.ack_position if mode == "passive_standby" else upstream_ack_position(stream, 0, tmp_path / "a", PARAMS.window_s)
        assert ack is not None and ack > 0
        stream.ack("t.a", 0, ack)
        # The host runs on past its last copy and acknowledgement, then dies.
        feed(feeder, traffic[third:2 * third])
        run_until_idle(query)
    finally:
        query.stop()
    written_before = read_outputs(output).rows
    assert primary.written > 0 and written_before
    assert stream.trim()[0] == ack

    host = TaskHost(spark, tmp_path / "work-b", output, interval_s=60)
    try:
        took = take_over(host, "t", mode, epoch=2, stream=PartitionInput(stream.root, 0), consumer="t.b", failed_consumer="t.a",
                         params=PARAMS, trigger_s=None, backup=backup if mode == "passive_standby" else None)
        assert took.start_position == ack and stream.acks() == {"t.b": {0: ack}}
        feed(feeder, traffic[2 * third:])
        feeder.close()
        run_until_idle(host.tasks()[0].query)
        assert took.sink.dropped > 0, "the takeover replayed windows the failed host had written"
    finally:
        host.close()
    out = read_outputs(output)
    expected = compute(traffic, PARAMS)
    assert out.lost(expected) == [] and out.duplicates == [] and out.extra(expected) == []
    with pytest.raises(FencedError):
        primary(999, sorted(expected)[-1:])
