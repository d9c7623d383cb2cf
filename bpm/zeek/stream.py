"""The network-monitoring query's lines on a participant's stream: connections, and
punctuation marks that only move event time (a time-advance tick, or the end of input), in
the stream's format (`bpm.records`: event time and mark first, then the record's columns,
here those of `CONN_RECORD_SCHEMA` after `ts`). What reads them back as connections (tests,
tools) uses `StreamRecord.from_line`; what writes them is any query's feeder
(`spark_agents.streams.feed.RecordFeeder`)."""

from __future__ import annotations

from dataclasses import dataclass

from bpm.records import MARK, MARK_DATA, MARK_END, MARK_TICK, TIME

__all__ = ["MARK_DATA", "MARK_END", "MARK_TICK", "STREAM_SCHEMA_DDL", "StreamRecord"]
# The lines' columns as the stream's source reads them (`bpm.records.Records.wire_ddl`).
STREAM_SCHEMA_DDL = f"{TIME} BIGINT, {MARK} INT, src STRING, prefix STRING, dst STRING, dport INT, proto STRING"


@dataclass(frozen=True, slots=True)
class StreamRecord:
    """One row of the stream: a connection, or a punctuation mark that only advances event time.

    Attributes:
        ts_us: event time in microseconds since the epoch.
        src: source address (empty for punctuation).
        prefix: the source's prefix, the partitioning key (empty for punctuation).
        dst: destination address.
        dport: destination port.
        proto: transport protocol.
        mark: 0 for a connection, 1 for a time-advance tick, 2 for end of input.
    """

    ts_us: int
    src: str = ""
    prefix: str = ""
    dst: str = ""
    dport: int = 0
    proto: str = ""
    mark: int = MARK_DATA

    def to_line(self) -> str:
        return f"{self.ts_us},{self.mark},{self.src},{self.prefix},{self.dst},{self.dport},{self.proto}\n"

    @classmethod
    def from_line(cls, line: str) -> StreamRecord:
        ts, mark, src, prefix, dst, dport, proto = line.rstrip("\n").split(",")
        return cls(int(ts), src, prefix, dst, int(dport or 0), proto, int(mark))
