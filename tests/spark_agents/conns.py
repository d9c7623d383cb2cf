"""Zeek connections fed to a participant's stream as the network-monitoring query's records:
what the tests of that query feed (`spark_agents.streams.feed.RecordFeeder` takes records;
`examples.network_monitoring.records` makes them of connections)."""

from __future__ import annotations

from collections.abc import Iterable

from bpm import records
from bpm.zeek.conn import Conn
from bpm.zeek.definitions import QueryParams, stream_values
from examples.network_monitoring import bind
from examples.network_monitoring import query as MONITORING
from spark_agents.streams.feed import RecordFeeder, Stream


class Feeder(RecordFeeder):
    """A `RecordFeeder` of the network-monitoring query with `params` that takes connections."""

    def __init__(self, stream: Stream, params: QueryParams, key_groups: Iterable[int] | None = None) -> None:
        super().__init__(stream, MONITORING, bind(params), key_groups)
        self.params = params

    def feeds(self, conn: Conn) -> bool:  # type: ignore[override]
        return super().feeds(stream_values(conn))

    def add(self, conn: Conn) -> bool:  # type: ignore[override]
        return super().add(stream_values(conn))

    @staticmethod
    def time_s(conn: Conn) -> float:  # type: ignore[override]
        return conn.ts


def feed_all(stream: Stream, conns: Iterable[Conn], params: QueryParams, rows_per_flush: int = 200_000) -> Feeder:
    """Write finite input at once (no pacing), closing the stream at the end."""
    feeder = Feeder(stream, params)
    feeder.feed(conns, rows_per_flush)
    feeder.close()
    return feeder


def end_mark_us(newest_us: int, params: QueryParams) -> int:
    """The end-of-input mark after the newest connection `newest_us`."""
    return records.end_mark_us(newest_us, params.lateness_s, params.window_s)


def end_watermark_ms(end_us: int, params: QueryParams) -> int:
    """The watermark (epoch ms) the query reaches after reading the end mark `end_us`."""
    return records.end_watermark_ms(end_us, params.lateness_s)
