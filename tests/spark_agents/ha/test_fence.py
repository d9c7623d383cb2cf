"""The output fence: each window once, only from the current epoch (no Spark)."""

import pytest

from bpm.zeek.definitions import ResultRow
from bpm.zeek.results import batch_file, read_outputs, write_batch
from spark_agents.ha.fence import FencedError, FencedSink, FenceState, OutputFence


def rows(window_end: int, *keys: str) -> list[ResultRow]:
    return [ResultRow("connections", window_end - 10, window_end, key, 101) for key in keys]


def test_a_replay_writes_only_the_windows_after_the_newest_written(tmp_path):
    first = FencedSink(tmp_path, "t", epoch=1)
    first(0, rows(10, "a", "b"))
    first(1, [])
    first(2, rows(20, "a"))
    assert OutputFence(tmp_path, "t").state() == FenceState(1, 20)
    # A restart from an older checkpoint copy re-emits window 20, then goes on with window 30.
    replay = FencedSink(tmp_path, "t", epoch=2)
    replay(1, rows(20, "a"))
    replay(2, rows(30, "c"))
    out = read_outputs(tmp_path)
    assert out.duplicates == [] and out.rows == set(rows(10, "a", "b") + rows(20, "a") + rows(30, "c"))
    assert (replay.written, replay.dropped) == (1, 1)
    # Batch ids restarted below the first writer's: its files are still there, next to the new ones.
    assert sorted(p.name.split(".")[0] for p in out.files) == ["batch-0", "batch-2", "batch-2"]


def test_an_older_epoch_is_refused_once_a_newer_one_claimed(tmp_path):
    old = FencedSink(tmp_path, "t", epoch=3)
    old(0, rows(10, "a"))
    OutputFence(tmp_path, "t").claim(4)
    with pytest.raises(FencedError, match="epoch 3 is fenced"):
        old(1, rows(20, "a"))
    with pytest.raises(FencedError):
        FencedSink(tmp_path, "t", epoch=3)(5, rows(30, "z"))
    assert read_outputs(tmp_path).rows == set(rows(10, "a"))


def test_a_new_writer_looks_at_the_files_when_the_fence_is_behind(tmp_path):
    # A writer killed after writing its file but before updating the fence.
    FencedSink(tmp_path, "t", epoch=1)(0, rows(10, "a"))
    write_batch(tmp_path, "t", 1, rows(20, "b"), epoch=1, run="dead")
    assert OutputFence(tmp_path, "t").state().window_end == 10
    again = FencedSink(tmp_path, "t", epoch=1)
    again(1, rows(20, "b"))
    again(2, rows(30, "c"))
    out = read_outputs(tmp_path)
    assert out.duplicates == [] and len(out.rows) == 3


def test_plain_batch_files_count_as_written(tmp_path):
    write_batch(tmp_path, "t", 0, rows(10, "a"))
    sink = FencedSink(tmp_path, "t", epoch=1)
    sink(0, rows(10, "a") + rows(20, "b"))
    out = read_outputs(tmp_path)
    assert out.duplicates == [] and batch_file(tmp_path, "t", 0).exists()
    assert out.rows == set(rows(10, "a") + rows(20, "b"))


def test_a_standby_holds_its_rows_back_and_takes_over_exactly_after_the_primary(tmp_path):
    primary = FencedSink(tmp_path, "t", epoch=1)
    replica = FencedSink(tmp_path, "t", epoch=None)
    primary(0, rows(10, "a"))
    replica(0, rows(10, "a"))
    replica(1, rows(20, "b"))  # the replica runs ahead of the primary
    assert read_outputs(tmp_path).rows == set(rows(10, "a")), "a standby writes nothing"
    assert replica.held == {1: rows(20, "b")}, "what the primary wrote is no longer held"
    primary(1, rows(20, "b"))
    replica(2, rows(30, "c"))
    assert replica.held == {2: rows(30, "c")}
    assert replica.promote(2) == 1
    replica(3, rows(40, "d"))
    with pytest.raises(FencedError):
        primary(2, rows(30, "c"))
    out = read_outputs(tmp_path)
    assert out.duplicates == [] and out.rows == set(rows(10, "a") + rows(20, "b") + rows(30, "c") + rows(40, "d"))


def test_fenced_file_names_name_the_epoch_and_the_writer(tmp_path):
    assert batch_file(tmp_path, "t", 7, 2, "ab12").name == "batch-7.e2.ab12.jsonl"
    with pytest.raises(ValueError):
        batch_file(tmp_path, "t", 7, 2, "../x")
