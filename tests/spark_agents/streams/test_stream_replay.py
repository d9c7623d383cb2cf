from spark_agents.streams.feed import due_time, replay
from tests.spark_agents.conns import Feeder
from bpm.zeek.stream import MARK_DATA, MARK_END, StreamRecord
from bpm.zeek.conn import Conn
from bpm.zeek.definitions import QueryParams


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now

    def sleep(self, seconds):
        self.now += max(seconds, 1e-3)


def test_due_time_follows_rate_and_recorded_time():
    assert due_time(10, 0, 0, rate=5, speedup=None) == 2.0
    assert due_time(10, 100, 0, rate=0, speedup=None) == 0.0
    assert due_time(1, 100, 0, rate=5, speedup=10) == 10.0
    assert due_time(1000, 100, 0, rate=5, speedup=10) == 200.0


class MemoryStream:
    """A one-partition stream that keeps what the feeder appends, in order."""

    partitions = 1

    def __init__(self):
        self.chunks: list[list] = []

    def append(self, k, lines):
        self.chunks.append([StreamRecord.from_line(line) for line in lines])


def test_replay_paces_rows_and_writes_one_chunk_per_flush():
    stream = MemoryStream()
    clock = FakeClock()
    conns = [Conn(100.0 + i / 10, "10.0.0.1", 1, "10.9.9.9", 80, "tcp") for i in range(50)]
    feeder = replay(Feeder(stream, QueryParams()), conns, rate=10, flush_interval_s=1.0, clock=clock, sleep=clock.sleep)
    assert 4.9 <= clock.now <= 5.1, "50 rows at 10 rows/s take 5 s"
    assert 5 <= len(stream.chunks) <= 7
    assert [len([r for r in rows if r.mark == MARK_DATA]) for rows in stream.chunks[1:4]] == [10, 10, 10]
    assert stream.chunks[-1][-1].mark == MARK_END and sum(feeder.written) == 50
