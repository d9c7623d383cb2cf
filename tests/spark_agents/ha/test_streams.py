"""Stream hooks for HA: positions from a start, marks, per-partition consumers (no Spark)."""

import fnmatch
import re

import pytest

from spark_agents.streams import PartitionedStream, StreamError, StreamRecord, positions_glob
from spark_agents.streams.partitioned import MARK_TICK


def glob_matches(glob: str, name: str) -> bool:
    """Hadoop's `{a,b}` alternatives, each an fnmatch pattern (`?`, `[x-y]`)."""
    body = re.fullmatch(r"\{(.*)\}(.*)", glob)
    assert body
    return any(fnmatch.fnmatchcase(name, alt + body.group(2)) for alt in body.group(1).split(","))


@pytest.mark.parametrize("start", [0, 1, 9, 10, 11, 19, 99, 100, 101, 990, 12345, 999_999_999_999])
def test_the_positions_glob_takes_exactly_the_files_at_or_after_the_start(start):
    glob = positions_glob(start)
    for p in {0, 1, 8, 9, 10, 11, 12, 19, 20, 98, 99, 100, 101, 109, 110, 989, 990, 991, 12344, 12345, 12346, 10**11, start - 1, start, start + 1}:
        if 0 <= p < 10**12:
            assert glob_matches(glob, f"{p:012d}.csv") == (p >= start), (start, p)
    assert not glob_matches(glob, f".{start:012d}.csv.tmp")


def test_first_position_from_follows_the_marks(tmp_path):
    stream = PartitionedStream.create(tmp_path / "s", 1)
    for i in range(6):
        stream.append(0, [StreamRecord(i * 100 - 50, "10.0.0.1", "10.0.0.0/24", "1.1.1.1", 80, "tcp"), StreamRecord(i * 100, mark=MARK_TICK)])
    assert [stream.tick_us(0, p) for p in range(6)] == [0, 100, 200, 300, 400, 500]
    assert stream.first_position_from(0, -5) == 0
    assert stream.first_position_from(0, 250) == 3, "files 0..2 end with marks below 250"
    assert stream.first_position_from(0, 300) == 3
    assert stream.first_position_from(0, 501) == 6, "nothing retained may hold it: the next position"
    stream.append(0, [StreamRecord(700, "10.0.0.1", "10.0.0.0/24", "1.1.1.1", 80, "tcp")])
    assert stream.tick_us(0, 6) is None
    assert stream.first_position_from(0, 600) == 6, "a file without a mark may hold anything"


def test_a_consumer_holds_only_its_partitions_and_a_released_one_nothing(tmp_path):
    stream = PartitionedStream.create(tmp_path / "s", 2)
    for _ in range(4):
        stream.append(0, [StreamRecord(1, mark=MARK_TICK)])
        stream.append(1, [StreamRecord(1, mark=MARK_TICK)])
    stream.register("task0.a", [0])
    stream.ack("task1.a", 1, 3)
    assert stream.acks() == {"task0.a": {0: 0}, "task1.a": {1: 3}}
    assert stream.trim() == {0: 0, 1: 3}
    stream.ack("task0.b", 0, 2)
    stream.release("task0.a")
    assert stream.trim() == {0: 2, 1: 0}
    stream.register("everything")
    stream.register("everything", [0])  # registering again keeps what it acknowledged
    stream.ack("everything", 1, 4)
    assert stream.acks()["everything"] == {0: 0, 1: 4}
    with pytest.raises(StreamError):
        stream.register("x", [5])
    with pytest.raises(StreamError):
        stream.release("../x")
