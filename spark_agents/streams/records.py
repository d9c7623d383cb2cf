"""The rows of a participant's input stream: connections, and punctuation marks that only
move event time (a time-advance tick, or the end of input)."""

from __future__ import annotations

from dataclasses import dataclass

MARK_DATA, MARK_TICK, MARK_END = 0, 1, 2
# The rows' columns as Spark reads them (`spark_agents.broker.source`).
STREAM_SCHEMA_DDL = "ts_us BIGINT, src STRING, prefix STRING, dst STRING, dport INT, proto STRING, mark INT"


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
        return f"{self.ts_us},{self.src},{self.prefix},{self.dst},{self.dport},{self.proto},{self.mark}\n"

    @classmethod
    def from_line(cls, line: str) -> StreamRecord:
        ts, src, prefix, dst, dport, proto, mark = line.rstrip("\n").split(",")
        return cls(int(ts), src, prefix, dst, int(dport), proto, int(mark))
