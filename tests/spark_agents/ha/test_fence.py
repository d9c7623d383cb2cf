"""The output fence's sink on the origin's broker: each result once, only from the current
epoch, and a standby's rows held back until it takes over (no Spark)."""

import pytest

from bpm.results import Result
from spark_agents.broker.results import BrokerFence, broker_outputs, read_results
from spark_agents.ha.fence import FencedError, FencedSink, FenceState

pytestmark = pytest.mark.slow  # a NATS server per test


def rows(window_end: int, *keys: str) -> list[Result]:
    """Results of the window ending at `window_end` (seconds), one per key: final at its end."""
    return [Result(window_end * 1_000_000, (key, window_end), (("key", key), ("window_end", window_end), ("n", 101))) for key in keys]


def sink(broker, epoch: int | None) -> FencedSink:
    return FencedSink(BrokerFence(broker, "a.t"), epoch)


def test_a_replay_writes_only_the_windows_after_the_newest_written(broker):
    first = sink(broker, 1)
    first(0, rows(10, "a", "b"))
    first(1, [])
    first(2, rows(20, "a"))
    assert BrokerFence(broker, "a.t").state() == FenceState(1, 20_000_000)
    # A restart from an older checkpoint copy re-emits window 20, then goes on with window 30.
    replay = sink(broker, 2)
    replay(1, rows(20, "a"))
    replay(2, rows(30, "c"))
    out = broker_outputs(broker, ["a.t"])
    assert out.duplicates == [] and out.rows == set(rows(10, "a", "b") + rows(20, "a") + rows(30, "c"))
    assert (replay.written, replay.dropped) == (1, 1)
    # Batch ids restarted below the first writer's: both batches 2 stay, told apart by their epoch.
    assert [(b.batch_id, b.epoch) for b in read_results(broker, "a.t")] == [(0, 1), (2, 1), (2, 2)]


def test_a_task_whose_span_ended_writes_no_window_from_its_end_on(broker):
    """A split at 20: the old task's query read rows past it before its input was ended, and
    closes window 20-30 with them; that window is the new tasks'."""
    old = sink(broker, 1)
    old(0, rows(10, "a"))
    old.until_s = 20
    old(1, rows(20, "a") + rows(30, "a", "b"))
    old(2, rows(40, "c"))
    out = broker_outputs(broker, ["a.t"])
    assert out.rows == set(rows(10, "a") + rows(20, "a")) and old.written == 2


def test_an_older_epoch_is_refused_once_a_newer_one_claimed(broker):
    old = sink(broker, 3)
    old(0, rows(10, "a"))
    BrokerFence(broker, "a.t").claim(4)
    with pytest.raises(FencedError, match="epoch 3 is fenced"):
        old(1, rows(20, "a"))
    with pytest.raises(FencedError):
        old(2, [])  # a batch with no rows learns it too
    with pytest.raises(FencedError):
        sink(broker, 3)(5, rows(30, "z"))
    assert broker_outputs(broker, ["a.t"]).rows == set(rows(10, "a"))


def test_a_standby_holds_its_rows_back_and_takes_over_exactly_after_the_primary(broker):
    primary = sink(broker, 1)
    replica = sink(broker, None)
    primary(0, rows(10, "a"))
    replica(0, rows(10, "a"))
    replica(1, rows(20, "b"))  # the replica runs ahead of the primary
    assert broker_outputs(broker, ["a.t"]).rows == set(rows(10, "a")), "a standby writes nothing"
    assert replica.held == {1: rows(20, "b")}, "what the primary wrote is no longer held"
    primary(1, rows(20, "b"))
    replica(2, rows(30, "c"))
    assert replica.held == {2: rows(30, "c")}
    assert replica.promote(2) == 1
    replica(3, rows(40, "d"))
    with pytest.raises(FencedError):
        primary(2, rows(30, "c"))
    out = broker_outputs(broker, ["a.t"])
    assert out.duplicates == [] and out.rows == set(rows(10, "a") + rows(20, "b") + rows(30, "c") + rows(40, "d"))
