import pytest

from spark_agents.streams import PartitionedStream, StreamError, StreamRecord, stream_path
from spark_agents.streams.partitioned import MARK_TICK

R1 = StreamRecord(1_000_000, "10.0.0.1", "10.0.0.0/24", "10.9.9.9", 80, "tcp")
R2 = StreamRecord(2_000_000, "2001:db8::1", "2001:db8::/64", "2001:db8::9", 53, "udp")
TICK = StreamRecord(3_000_000, mark=MARK_TICK)


@pytest.fixture
def stream(tmp_path):
    return PartitionedStream.create(tmp_path / "s", 2)


def test_appended_files_are_numbered_and_replayable_from_any_position(stream):
    assert [stream.append(0, [R1]), stream.append(0, [R2, TICK]), stream.append(1, [TICK])] == [0, 1, 0]
    assert list(stream.read(0)) == [(0, [R1]), (1, [R2, TICK])]
    assert list(stream.read(0, start=1)) == [(1, [R2, TICK])]
    assert stream.positions(1) == [0]
    names = sorted(p.name for p in stream.partition_path(0).iterdir())
    assert names == ["000000000000.csv", "000000000001.csv"], "no temporary file is left behind"


def test_reopening_keeps_the_partition_count_and_refuses_a_different_one(tmp_path, stream):
    assert PartitionedStream(f"file://{stream.root}").partitions == 2
    assert PartitionedStream.create(stream.root, 2).partitions == 2
    with pytest.raises(StreamError, match="already has 2 partitions"):
        PartitionedStream.create(stream.root, 3)
    with pytest.raises(StreamError, match="not a stream"):
        PartitionedStream(tmp_path)
    with pytest.raises(StreamError, match="out of range"):
        stream.partition_path(2)


def test_trim_deletes_only_below_the_slowest_consumer(stream):
    for _ in range(4):
        stream.append(0, [R1])
        stream.append(1, [R1])
    assert stream.trim() == {0: 0, 1: 0}, "no consumer yet: nothing may be deleted"
    stream.register("b")
    stream.ack("a", 0, 3)
    stream.ack("a", 1, 4)
    assert stream.trim() == {0: 0, 1: 0}, "consumer b registered but acknowledged nothing"
    stream.ack("b", 0, 2)
    stream.ack("b", 1, 1)
    stream.ack("b", 0, 1)  # an acknowledgement never moves back
    assert stream.acks() == {"a": {0: 3, 1: 4}, "b": {0: 2, 1: 1}}
    assert stream.trim() == {0: 2, 1: 1}
    assert stream.positions(0) == [2, 3] and stream.positions(1) == [1, 2, 3]
    assert [p for p, _ in stream.read(0, 2)] == [2, 3]
    with pytest.raises(StreamError, match="was trimmed"):
        list(stream.read(0, 1))


def test_numbering_survives_trimming_everything(stream):
    stream.append(0, [R1])
    stream.ack("a", 0, 1)
    stream.trim()
    assert stream.positions(0) == [] and stream.append(0, [R2]) == 1


def test_bad_acknowledgements_are_refused(stream):
    with pytest.raises(StreamError, match="beyond the end"):
        stream.ack("a", 0, 5)
    with pytest.raises(StreamError, match="bad consumer"):
        stream.ack("../x", 0, 0)


def test_uris(tmp_path):
    assert stream_path("file:///data/s") == stream_path("/data/s")
    with pytest.raises(StreamError, match="unsupported stream URI"):
        stream_path("s3://bucket/s")
    with pytest.raises(StreamError, match="not empty"):
        (tmp_path / "x").mkdir()
        (tmp_path / "x" / "f").write_text("")
        PartitionedStream.create(tmp_path / "x", 1)


def test_files_of_a_partition_get_increasing_millisecond_modification_times(stream):
    for _ in range(20):
        stream.append(0, [R1])
    times = [(stream.partition_path(0) / f"{p:012d}.csv").stat().st_mtime_ns // 1_000_000 for p in stream.positions(0)]
    assert all(a < b for a, b in zip(times, times[1:]))
