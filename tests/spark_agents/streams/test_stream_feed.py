import pytest

from spark_agents.query import closed_through_us
from bpm.records import END_US
from spark_agents.streams.feed import RecordFeeder, write_end
from bpm.records import Records
from examples.network_monitoring import query as MONITORING
from tests.spark_agents.conns import Feeder, end_mark_us, end_watermark_ms, feed_all
from bpm.zeek.generator import amplified
from bpm.zeek.stream import MARK_DATA, MARK_END, MARK_TICK, StreamRecord
from bpm.zeek.conn import Conn
from bpm.zeek.definitions import QueryParams, partition_of, source_prefix
from bpm.zeek.generator import TrafficProfile, generate
from bpm.zeek.reference import compute

PARAMS = QueryParams(lateness_s=10)


def conn(ts, src="10.0.0.1"):
    return Conn(ts, src, 1, "10.9.9.9", 80, "tcp")


class Chunks:
    """A stream that keeps what the feeder appends, per part (`spark_agents.streams.feed.Stream`)."""

    def __init__(self, partitions: int) -> None:
        self.partitions = partitions
        self.parts: list[list[list]] = [[] for _ in range(partitions)]

    def append(self, k, lines):
        self.parts[k].append([StreamRecord.from_line(line) for line in lines])
        return len(self.parts[k])


def records(stream, k):
    return [r for chunk in stream.parts[k] for r in chunk]


def test_rows_go_to_the_key_group_of_their_prefix_and_every_chunk_ends_with_a_tick():
    stream = Chunks(3)
    feeder = Feeder(stream, PARAMS)
    sources = [f"10.0.{i}.7" for i in range(12)]
    for i, src in enumerate(sources):
        assert feeder.add(conn(100 + i, src))
    assert feeder.flush() == 3
    for k in range(3):
        rows = records(stream, k)
        assert rows[-1].mark == MARK_TICK and rows[-1].ts_us == 111_000_000
        assert all(partition_of(source_prefix(r.src), 3) == k and r.prefix == source_prefix(r.src)
                   for r in rows if r.mark == MARK_DATA)
    assert sum(feeder.written) == 12


def test_idle_key_groups_get_a_tick_only_when_event_time_moved():
    stream = Chunks(2)
    feeder = Feeder(stream, PARAMS)
    feeder.add(conn(100))
    feeder.flush()
    assert feeder.flush() == 0
    feeder.add(conn(101))
    assert feeder.flush() == 2


def test_late_rows_are_refused_before_partitioning_and_the_end_mark_closes_every_window():
    stream = Chunks(2)
    feeder = feed_all(stream, [conn(100), conn(200), conn(190.5), conn(190)], PARAMS)
    assert feeder.admission.late == 1 and sum(feeder.written) == 3
    for k in range(2):
        last = records(stream, k)[-1]
        assert last.mark == MARK_END and last.ts_us == end_mark_us(200_000_000, PARAMS)


@pytest.mark.parametrize("newest_s", [180, 200, 239.999999])
def test_the_end_mark_closes_the_window_of_the_newest_row_and_no_later_one(newest_s):
    # Streams whose newest rows fall in one window close the same windows, wherever in it they fall.
    watermark_ms = end_watermark_ms(end_mark_us(int(newest_s * 10**6), PARAMS), PARAMS)
    assert closed_through_us(watermark_ms, PARAMS.window_s) == 240_000_000  # PARAMS: 60 s windows


def test_write_end_marks_the_key_groups_given():
    stream = Chunks(3)
    assert write_end(stream, 5 * 10**6, [0, 2], Records(MONITORING)) == 2
    assert [r.mark for r in records(stream, 0)] == [MARK_END] and records(stream, 1) == []


def test_key_groups_not_fed_get_nothing_until_they_are_fed():
    stream = Chunks(3)
    sources = [f"10.0.{i}.7" for i in range(30)]
    fed_k = partition_of(source_prefix(sources[0]), 3)
    feeder = Feeder(stream, PARAMS, key_groups=[fed_k])
    feeder.feed([conn(100 + i, src) for i, src in enumerate(sources)])
    assert [bool(stream.parts[k]) for k in range(3)] == [k == fed_k for k in range(3)], "no rows, no ticks elsewhere"
    assert feeder.offered == sum(feeder.written) == sum(partition_of(source_prefix(s), 3) == fed_k for s in sources)
    later = (fed_k + 1) % 3
    feeder.feed_key_groups([later])
    feeder.feed([conn(200 + i, src) for i, src in enumerate(sources)])
    feeder.close()
    assert records(stream, later)[-1].mark == MARK_END and any(r.mark == MARK_DATA for r in records(stream, later))
    assert not stream.parts[3 - fed_k - later], "the key group never fed gets no end mark either"


def test_results_do_not_depend_on_the_number_of_key_groups():
    conns = generate(TrafficProfile(duration_s=120, rate=50, sources=80), seed=4)
    late = {feed_all(Chunks(k), conns, QueryParams()).admission.late for k in (1, 2, 5)}
    assert len(late) == 1


def test_amplification_multiplies_sources_and_keeps_their_shape():
    base = [Conn(100.0 + i, "10.0.0.1", 1, "10.9.9.9", 1000 + i, "tcp") for i in range(12)] + [conn(101, "2001:db8::1")]
    copies = list(amplified(base, 3))
    assert len(copies) == 39
    assert {c.orig_h for c in copies} == {"10.0.0.1", "27.0.0.1", "44.0.0.1", "2001:db8::1", "2001:db8:1::1", "2001:db8:2::1"}
    rows = compute(copies, QueryParams())
    assert sorted(r.key for r in rows if r.kind == "ports") == ["10.0.0.1", "27.0.0.1", "44.0.0.1"]
    with pytest.raises(ValueError):
        list(amplified(base, 0))


def test_any_query_s_records_go_to_the_key_group_of_their_key_and_close_past_every_result():
    from bpm.query import load
    from bpm.records import Records, mark_and_time

    query = load("examples.sessions:query")  # no grain: its end mark is past any session
    wire = Records(query)
    lines: list[list[str]] = [[] for _ in range(4)]

    class Lines:
        partitions = 4

        def append(self, k, chunk):
            lines[k].extend(chunk)
            return len(lines[k])

    feeder = RecordFeeder(Lines(), query, query.bind({"lateness_s": 5}))
    records = [wire.parse({"ts": 100 + i, "user": f"u{i % 6}", "page": "/a,b"}) for i in range(12)]
    feeder.feed([*records, wire.parse({"ts": 90, "user": "u0", "page": "/late"})])
    feeder.close()
    assert feeder.admission.late == 1 and sum(feeder.written) == 12
    for k in range(4):
        data = [line for line in lines[k] if mark_and_time(line)[0] == MARK_DATA]
        assert all(wire.key_group(wire.parse({"ts": 1, "user": line.split(",")[2]})[1], 4) == k for line in data)
        assert '"/a,b"' in "".join(data) or not data
        assert mark_and_time(lines[k][-1]) == (MARK_END, END_US)


def test_a_connection_is_a_record_of_the_network_monitoring_query():
    from bpm.query import load
    from bpm.records import Records
    from bpm.zeek.definitions import stream_values

    wire = Records(load("examples.network_monitoring:query"))
    c = conn(100.5, "10.1.2.3")
    assert stream_values(c) == wire.parse({"ts": c.ts, "src": c.orig_h, "prefix": source_prefix(c.orig_h), "dst": c.resp_h,
                                           "dport": c.resp_p, "proto": c.proto})
