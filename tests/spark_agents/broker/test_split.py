"""A task splits over its key groups at a window boundary, one half moves to another host with
its checkpoint, and the halves merge back: every window of every key group is computed by
exactly one task, and together they give the plain computation's rows."""

from __future__ import annotations

from dataclasses import replace

import pytest

from bpm.keygroups import KeyGroupError, halves, merged, subject
from bpm.negotiation.granularity import split_time
from bpm.zeek.definitions import QueryParams
from bpm.zeek.generator import TrafficProfile, generate
from examples.network_monitoring import bind, expected
from examples.network_monitoring import query as MONITORING
from spark_agents import handover
from spark_agents.broker.results import BrokerFence, read_results
from spark_agents.broker.source import InputEnded, JetStreamInput, hand_over
from spark_agents.broker.stream import BrokerStream
from spark_agents.ha.fence import FencedSink
from spark_agents.query import start_query
from tests.spark_agents.conns import Feeder


def test_the_split_time_is_the_first_window_start_after_the_newest_event():
    assert split_time(59_999_999, 10) == 60
    assert split_time(60_000_000, 10) == 70, "a row at the window start already holds that window"
    assert split_time(0, 10) == 10


def test_halves_merge_back_into_their_share_only():
    assert merged("010", "011") == merged("011", "010") == "01"
    assert merged(*halves("")) == ""
    for first, second in (("0", "0"), ("00", "11"), ("0", "10"), ("", "0"), ("2", "3")):
        with pytest.raises(KeyGroupError):
            merged(first, second)


@pytest.mark.slow
def test_the_split_time_comes_from_the_newest_message_with_rows(nats_server, broker, monkeypatch):
    server, owner = nats_server
    whole = JetStreamInput(server.url, owner.name, owner.password, "a")
    broker.ensure_stream("a")
    assert whole.present_end() == (0, None)
    assert hand_over([whole], halves(""), 10)[0][0].until_s == 0, "an empty stream: nothing before the time"
    Feeder(BrokerStream(broker, "a"), QueryParams()).feed(list(generate(TrafficProfile(duration_s=30.0, rate=20.0), seed=5)), 100)
    last, newest = whole.present_end()
    assert newest is not None and newest > 0
    empty = broker.publish(subject("a", 0), b"")  # a last message without rows
    assert whole.present_end() == (empty, newest), "read from the message before it"
    assert whole.present_end(look_back=1) == (empty, None)
    # Another input of the stream, ended and later in time: it says nothing of this input's time.
    other = Feeder(BrokerStream(broker, "a", "readings"), QueryParams())
    other.feed(list(generate(TrafficProfile(start_ts=1_900_000_000.0, duration_s=30.0, rate=20.0), seed=6)), 100)
    other.close()
    last_other, _ = whole.present_end()
    assert last_other > empty and whole.present_end() == (last_other, newest)
    readings = replace(whole, input="readings")
    with pytest.raises(InputEnded, match="has ended"):
        readings.present_end()
    with pytest.raises(ValueError, match="one input of one stream"):
        hand_over([replace(whole, prefix="0"), replace(readings, prefix="1")], [""], 10)
    monkeypatch.setattr(JetStreamInput, "present_end", lambda self: (last_other, None))
    with pytest.raises(ValueError, match="no event time"):
        hand_over([whole], halves(""), 10)


@pytest.mark.slow
def test_a_stream_whose_input_has_ended_hands_no_key_groups_over(nats_server, broker):
    """After the end-of-input mark a split would end the old task past its last window (it
    would wait for it forever) and start the halves after the mark (they would never see
    their input end): none is made. Rows written after the mark open the stream again."""
    server, owner = nats_server
    whole = JetStreamInput(server.url, owner.name, owner.password, "a")
    feeder = Feeder(BrokerStream(broker, "a"), QueryParams())
    connections = list(generate(TrafficProfile(duration_s=30.0, rate=20.0), seed=5))
    feeder.feed(connections[: len(connections) // 2], 100)
    _, open_newest = whole.present_end()
    feeder.close()
    with pytest.raises(InputEnded, match="has ended"):
        whole.present_end()
    with pytest.raises(InputEnded):
        hand_over([whole], halves(""), 10)
    feeder.feed(connections[len(connections) // 2 :], 100)
    _, newest = whole.present_end()
    assert newest is not None and newest > open_newest, "fed again, it hands over at its new end"


@pytest.mark.slow
@pytest.mark.full
def test_a_task_split_with_a_half_moved_and_merged_back_gives_the_plain_computation_s_rows(spark, nats_server, broker, tmp_path):
    server, owner = nats_server
    params = QueryParams()
    conns = generate(TrafficProfile(duration_s=360.0, rate=80.0), seed=5)
    feeder = Feeder(BrokerStream(broker, "a"), params)
    want = expected(conns, params)
    assert want, "the traffic raises alerts"
    whole = JetStreamInput(server.url, owner.name, owner.password, "a", max_messages=64)

    def run(task: str, source: JetStreamInput, host: str, epoch: int = 1) -> None:
        sink = FencedSink(BrokerFence(broker, f"a.{task}"), epoch, run=host)
        query = start_query(spark, f"{task}-{host}", source, tmp_path / host / task, MONITORING, bind(params), sink)
        try:
            query.processAllAvailable()
        finally:
            query.stop()

    third = len(conns) // 3
    feeder.feed(conns[:third], 2000)
    run("t", whole, "b")
    with pytest.raises(ValueError, match="each once"):
        hand_over([whole, replace(whole, until_s=10)], [""], params.window_s)

    # The split: t keeps the rows before the split time, its halves t-0 and t-1 take the rest.
    (whole,), (low, high) = hand_over([whole], halves(""), params.window_s)
    split_at = whole.until_s
    assert (low.prefix, high.prefix) == ("0", "1") and low.since_s == high.since_s == split_at
    assert low.start_seq == high.start_seq == broker.last_seq()
    feeder.feed(conns[third:2 * third], 2000)
    run("t", whole, "b")  # resumes its checkpoint with its span ended
    run("t-0", low, "b")
    run("t-1", high, "b")
    # One half moves to c: its checkpoint crosses as bytes into c's own folder, at epoch 2.
    handover.unpack(handover.pack(tmp_path / "b" / "t-1"), tmp_path / "c" / "t-1", 2)

    # The merge: the halves (one at b, one at c) keep the rows before the merge time; t-m the rest.
    (low, high), (whole_again,) = hand_over([low, high], [merged(low.prefix, high.prefix)], params.window_s)
    merge_at = whole_again.since_s
    assert whole_again.prefix == "" and merge_at == low.until_s == high.until_s > split_at
    feeder.feed(conns[2 * third:], 2000)
    feeder.close()
    run("t", whole, "b")
    run("t-0", low, "b")
    run("t-1", high, "c", 2)
    run("t-m", whole_again, "b")

    rows = {task: [r for batch in read_results(broker, f"a.{task}") for r in batch.rows] for task in ("t", "t-0", "t-1", "t-m")}
    assert all(rows.values()), f"every task wrote results: { {t: len(r) for t, r in rows.items()} }"
    assert all(r["window_start"] < split_at for r in rows["t"])
    assert all(split_at <= r["window_start"] < merge_at for r in rows["t-0"] + rows["t-1"])
    assert all(r["window_start"] >= merge_at for r in rows["t-m"])
    assert sorted(r for task_rows in rows.values() for r in task_rows) == want, "each window once, none lost"
