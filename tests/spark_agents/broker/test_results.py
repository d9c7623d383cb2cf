"""Results on the origin's broker through an epoch fence the broker enforces: a late write of
a fenced host is refused by the broker itself, every result is written once, and a task
moved with its checkpoint (no shared folder) gives the plain computation's rows."""

from __future__ import annotations

import pytest

from bpm.results import Result
from bpm.zeek.definitions import QueryParams, ResultRow
from bpm.zeek.generator import TrafficProfile, generate
from examples.network_monitoring import bind, expected
from examples.network_monitoring import query as MONITORING
from spark_agents import handover
from spark_agents.broker.results import BrokerFence, read_messages, read_results
from spark_agents.broker.source import JetStreamInput
from spark_agents.broker.stream import BrokerStream
from spark_agents.ha.fence import FencedError, FencedSink
from spark_agents.query import start_query
from tests.spark_agents.conns import Feeder

pytestmark = pytest.mark.slow


def _row(end: int, key: str = "10.0.0.1") -> Result:
    return ResultRow("connections", end - 10, end, key, 101).as_result()


def test_the_broker_refuses_a_fenced_host_s_late_write_and_each_window_is_written_once(broker):
    old, new = BrokerFence(broker, "a.t0"), BrokerFence(broker, "a.t0")
    old.claim(1)
    assert old.write(1, 0, [_row(10), _row(20)], "b")[1] == 0
    stale_state, stale_seq = old._last()
    new.claim(2)  # the failover: the new host claims before it writes anything
    # The late writer read the fence before the claim: the broker refuses its publish all the same.
    assert old._publish({"kind": "batch", "epoch": 1, "written_us": 30_000_000, "rows": []}, stale_seq) is None
    with pytest.raises(FencedError, match="epoch 1 is fenced"):
        old.write(1, 1, [_row(30)], "b")
    with pytest.raises(FencedError):
        old.claim(1)
    # The new host replays from an older checkpoint: windows already out are dropped.
    seq, dropped = new.write(2, 0, [_row(20), _row(30)], "c")
    assert seq is not None and dropped == 1
    assert new.write(2, 1, [_row(30)], "c") == (None, 1)
    written = read_results(broker, "a.t0")
    assert [(b.epoch, b.batch_id, b.rows) for b in written] == [(1, 0, [_row(10), _row(20)]), (2, 0, [_row(30)])]
    assert [b.rows for b in read_results(broker, "a.t0", after=written[0].seq)] == [[_row(30)]], "from a sequence on"
    assert new.state().epoch == 2 and new.state().written_us == 30_000_000
    assert read_results(broker, "a.other") == []


def test_a_primary_says_how_far_its_results_are_out_through_the_fence_once_per_time(broker):
    sink = FencedSink(BrokerFence(broker, "a.t1"), 1)
    sink.closed_through(60_000_000)
    sink.closed_through(60_000_000)  # nothing new closed: nothing published
    sink(0, [_row(90)])
    sink.closed_through(120_000_000)
    FencedSink(BrokerFence(broker, "a.t1"), None).closed_through(180_000_000)  # a standby says nothing
    bodies = [body for _, body, _ in read_messages(broker, "a.t1")]
    assert [(b["kind"], b.get("closed_us")) for b in bodies] == [("claim", None), ("progress", 60_000_000), ("batch", None), ("progress", 120_000_000)]
    assert bodies[-1]["written_us"] == 90_000_000, "a progress mark keeps the newest result's time written"
    BrokerFence(broker, "a.t1").claim(2)
    with pytest.raises(FencedError):
        sink.closed_through(180_000_000)  # a host that lost its task says nothing more either


def test_a_task_moved_with_its_checkpoint_gives_the_plain_computation_s_rows(spark, nats_server, broker, tmp_path):
    server, owner = nats_server
    params = QueryParams()
    conns = generate(TrafficProfile(duration_s=240.0, rate=150.0), seed=3)
    stream = BrokerStream(broker, "a")
    feeder = Feeder(stream, params)
    source = JetStreamInput(server.url, owner.name, owner.password, "a", max_messages=64)
    want = expected(conns, params)
    assert want, "the traffic raises alerts"

    def run(host: str, epoch: int) -> FencedSink:
        sink = FencedSink(BrokerFence(broker, "a.t0"), epoch, run=host)
        query = start_query(spark, f"t0-{host}", source, tmp_path / host / "checkpoint", MONITORING, bind(params), sink)
        try:
            query.processAllAvailable()
        finally:
            query.stop()
        return sink

    half = len(conns) // 2
    feeder.feed(conns[:half], 2000)
    at_b = run("b", 1)
    # The task moves: its checkpoint crosses as bytes into c's own folder; c claims epoch 2.
    handover.unpack(handover.pack(tmp_path / "b" / "checkpoint"), tmp_path / "c" / "checkpoint", 2)
    feeder.feed(conns[half:], 2000)
    feeder.close()
    at_c = run("c", 2)
    assert at_b.written > 0 and at_c.written > 0, "both hosts wrote part of the results"
    with pytest.raises(FencedError):
        at_b(99, [_row(at_c.fence.state().written_us // 1_000_000 + 10)])
    got = sorted(r for batch in read_results(broker, "a.t0") for r in batch.rows)
    assert got == want
