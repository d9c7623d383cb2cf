"""The definitions of the network-monitoring query, shared by Spark and the plain computation.

Per tumbling window (aligned to the epoch):

* `connections`: a source IP with more than `min_connections` connections;
* `ports`: a source IP with more than `min_ports` distinct destination ports (TCP and UDP
  only: Zeek stores ICMP type/code in the port fields, which are not ports);
* `prefix`: a source prefix (/24 for IPv4, /64 for IPv6) with the number of its sources
  that raised a `ports` alert (rows only for prefixes with at least one).

Late rows: a row whose timestamp is at or below `newest seen so far - lateness_s`, in the
order of the input, is late and not counted (`admit`). The streaming watermark uses the
same lateness, so it never drops a row that `admit` kept.
"""

from __future__ import annotations

import ipaddress
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass

from bpm.records import Admission, grain_end, iso_utc, parse_iso_utc
from bpm.results import Result
from bpm.zeek.conn import Conn

KINDS = ("connections", "ports", "prefix")
PORT_PROTOCOLS = ("tcp", "udp")
MICROS = 1_000_000


@dataclass(frozen=True)
class QueryParams:
    """Parameters of the monitoring query.

    Attributes:
        window_s: length of the tumbling window in seconds (windows start at multiples of it since the epoch).
        min_connections: a source alerts when its connections in a window are strictly more than this.
        min_ports: a source alerts when its distinct destination ports are strictly more than this.
        lateness_s: how far behind the newest timestamp seen a row may be and still count; also the watermark delay.
    """

    window_s: int = 60
    min_connections: int = 100
    min_ports: int = 10
    lateness_s: int = 60

    def __post_init__(self) -> None:
        if self.window_s < 1:
            raise ValueError("window_s must be at least 1 second")
        if self.min_connections < 0 or self.min_ports < 0:
            raise ValueError("thresholds must not be negative")
        if self.lateness_s < 0:
            raise ValueError("lateness_s must not be negative")

    def to_dict(self) -> dict[str, int]:
        return asdict(self)


@dataclass(frozen=True, order=True)
class ResultRow:
    """One output row of the query: an alert or a prefix count for one window."""

    kind: str
    window_start: int
    window_end: int
    key: str
    value: int

    def to_json(self) -> dict[str, object]:
        """The JSON form printed by `bpm pipeline run --json` and written by tasks."""
        return {
            "kind": self.kind,
            "window_start": iso_utc(self.window_start),
            "window_end": iso_utc(self.window_end),
            "key": self.key,
            "value": self.value,
        }

    def as_result(self) -> Result:
        """This row as the network-monitoring query's result (`examples.network_monitoring`:
        identified by kind, window start and key; final at the window's end)."""
        row = (("kind", self.kind), ("window_start", self.window_start), ("window_end", self.window_end),
               ("key", self.key), ("value", self.value))
        return Result(self.window_end * 1_000_000, (self.kind, self.window_start, self.key), row)

    @classmethod
    def from_result(cls, result: Result) -> ResultRow:
        return cls(str(result["kind"]), int(result["window_start"]), int(result["window_end"]), str(result["key"]), int(result["value"]))

    @classmethod
    def from_json(cls, record: dict[str, object]) -> ResultRow:
        return cls(
            kind=str(record["kind"]),
            window_start=parse_iso_utc(str(record["window_start"])),
            window_end=parse_iso_utc(str(record["window_end"])),
            key=str(record["key"]),
            value=int(record["value"]),  # type: ignore[arg-type]
        )


def source_prefix(address: str) -> str:
    """The prefix a source belongs to: its /24 for IPv4, its /64 for IPv6."""
    ip = ipaddress.ip_address(address)
    bits = 24 if ip.version == 4 else 64
    return ipaddress.ip_network(f"{ip}/{bits}", strict=False).compressed


def partition_of(prefix: str, partitions: int) -> int:
    """The stream partition of a source prefix: a stable hash (CRC-32), the same in every process."""
    return zlib.crc32(prefix.encode()) % partitions


def ts_micros(ts: float) -> int:
    """Timestamp in whole microseconds, truncated as Spark's `timestamp_seconds` does."""
    return int(ts * MICROS)


def window_start(ts_us: int, window_s: int) -> int:
    """Start (epoch seconds) of the tumbling window holding a timestamp in microseconds."""
    return (ts_us // (window_s * MICROS)) * window_s


def window_end(ts_us: int, window_s: int) -> int:
    """End (epoch seconds) of the tumbling window holding a timestamp in microseconds: the
    first window start after it."""
    return grain_end(ts_us, window_s)


def counts_port(proto: str) -> bool:
    return proto in PORT_PROTOCOLS


# A connection as a record of the network-monitoring query (`stream_values`), as Spark DDL.
CONN_RECORD_SCHEMA = "ts TIMESTAMP, src STRING, prefix STRING, dst STRING, dport INT, proto STRING"


def stream_values(conn: Conn) -> tuple[int, tuple]:
    """A connection as a record of the network-monitoring query (`examples.network_monitoring`):
    (event time in µs, (src, prefix, dst, dport, proto)), its schema's order."""
    return ts_micros(conn.ts), (conn.orig_h, source_prefix(conn.orig_h), conn.resp_h, conn.resp_p, conn.proto)


def admitted(conns: Iterable[Conn], admission: Admission) -> Iterator[Conn]:
    """The connections that the lateness rule keeps, in order."""
    for conn in conns:
        if admission.admit(ts_micros(conn.ts)):
            yield conn


def as_results(rows: Iterable[ResultRow]) -> list[Result]:
    """`rows` as the network-monitoring query's results (`ResultRow.as_result`)."""
    return [r.as_result() for r in rows]
