"""Parsing and writing Zeek `conn.log` connection summaries.

Zeek writes `conn.log` either as tab-separated values with a `#fields` header or as
JSON lines. Both forms are read line by line; a line that does not parse is counted
with its reason in `ParseStats` and never stops the read.
"""

from __future__ import annotations

import gzip
import io
import ipaddress
import json
import math
import re
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import IO, TextIO

# The fields the query needs; every other column of conn.log is carried through untouched by Zeek and ignored here.
_TS, _ORIG_H, _ORIG_P, _RESP_H, _RESP_P, _PROTO = "ts", "id.orig_h", "id.orig_p", "id.resp_h", "id.resp_p", "proto"
_PROTO_RE = re.compile(r"^[a-z][a-z0-9_]{0,31}$")
REQUIRED_FIELDS = (_TS, _ORIG_H, _RESP_H, _RESP_P, _PROTO)

# Zeek's full conn.log column set (Zeek 6/7), used when writing logs.
CONN_FIELDS = (
    "ts", "uid", "id.orig_h", "id.orig_p", "id.resp_h", "id.resp_p", "proto", "service", "duration",
    "orig_bytes", "resp_bytes", "conn_state", "local_orig", "local_resp", "missed_bytes", "history",
    "orig_pkts", "orig_ip_bytes", "resp_pkts", "resp_ip_bytes", "tunnel_parents",
)
CONN_TYPES = (
    "time", "string", "addr", "port", "addr", "port", "enum", "string", "interval", "count", "count",
    "string", "bool", "bool", "count", "string", "count", "count", "count", "count", "set[string]",
)


@dataclass(frozen=True, slots=True)
class Conn:
    """One connection summary, reduced to what the monitoring query reads.

    Attributes:
        ts: start of the connection, seconds since the epoch (Zeek's `ts`).
        orig_h: originator (source) address, in canonical text form.
        orig_p: originator port (0 when Zeek left it unset).
        resp_h: responder (destination) address, canonical text form.
        resp_p: responder port; for ICMP Zeek stores the ICMP code here.
        proto: transport protocol: `tcp`, `udp`, `icmp` or `unknown_transport`.
        extra: the remaining conn.log fields when known (used only when writing logs).
    """

    ts: float
    orig_h: str
    orig_p: int
    resp_h: str
    resp_p: int
    proto: str
    extra: tuple[tuple[str, str], ...] = ()


@dataclass
class ParseStats:
    """What a read saw: data lines, parsed records, and skipped lines by reason.

    Attributes:
        lines: data lines read (header and comment lines excluded, blank lines excluded).
        parsed: lines that became a `Conn`.
        skipped: lines that did not parse; `reasons` counts them by cause.
        examples: up to five `(source, line number, reason)` of skipped lines, for error messages.
    """

    lines: int = 0
    parsed: int = 0
    skipped: int = 0
    reasons: Counter = field(default_factory=Counter)
    examples: list[tuple[str, int, str]] = field(default_factory=list)

    def skip(self, source: str, lineno: int, reason: str) -> None:
        self.skipped += 1
        self.reasons[reason] += 1
        if len(self.examples) < 5:
            self.examples.append((source, lineno, reason))

    def merge(self, other: ParseStats) -> None:
        self.lines += other.lines
        self.parsed += other.parsed
        self.skipped += other.skipped
        self.reasons.update(other.reasons)
        self.examples.extend(other.examples[: max(0, 5 - len(self.examples))])

    def summary(self) -> str:
        """One line for stderr: how many lines were skipped and why."""
        why = ", ".join(f"{n} {reason}" for reason, n in self.reasons.most_common())
        text = f"skipped {self.skipped} of {self.lines} lines that did not parse"
        return f"{text} ({why})" if why else text


class BadLine(ValueError):
    """A line that is not a valid connection summary; the message is the reason."""


def canonical_address(text: str) -> str:
    """The canonical text form of an IPv4 or IPv6 address; raises `BadLine` otherwise."""
    try:
        return ipaddress.ip_address(text.strip()).compressed
    except ValueError:
        raise BadLine("bad address") from None


def _port(value: object) -> int:
    try:
        port = int(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise BadLine("bad port") from None
    if not 0 <= port <= 65535:
        raise BadLine("bad port")
    return port


def _timestamp(value: object) -> float:
    if isinstance(value, str) and ("T" in value or "-" in value[1:]):
        # Zeek's JSON writer emits ISO 8601 timestamps when JSON::TimestampFormat is iso8601.
        try:
            return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
        except ValueError:
            raise BadLine("bad timestamp") from None
    try:
        ts = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise BadLine("bad timestamp") from None
    if not math.isfinite(ts) or ts < 0:
        raise BadLine("bad timestamp")
    return ts


def _proto(value: object) -> str:
    proto = str(value).lower()
    if not _PROTO_RE.match(proto):
        raise BadLine("bad proto")
    return proto


def conn_from_fields(values: dict[str, object], unset: str = "-") -> Conn:
    """Build a `Conn` from a mapping of conn.log field names to values; raises `BadLine`."""
    for name in REQUIRED_FIELDS:
        if values.get(name) in (None, unset, ""):
            raise BadLine(f"missing {name}")
    orig_p = values.get(_ORIG_P)
    return Conn(
        ts=_timestamp(values[_TS]),
        orig_h=canonical_address(str(values[_ORIG_H])),
        orig_p=0 if orig_p in (None, unset, "") else _port(orig_p),
        resp_h=canonical_address(str(values[_RESP_H])),
        resp_p=_port(values[_RESP_P]),
        proto=_proto(values[_PROTO]),
    )


def parse_lines(lines: Iterable[str], stats: ParseStats | None = None, source: str = "<input>") -> Iterator[Conn]:
    """Yield the connections of a conn.log in either form; count what does not parse in `stats`.

    The form is decided per line: a line starting with `{` is JSON, any other data line is
    TSV under the most recent `#fields` header (Zeek may append several header blocks to one file).
    """
    stats = stats if stats is not None else ParseStats()
    fields: list[str] | None = None
    separator, unset = "\t", "-"
    for lineno, raw in enumerate(lines, start=1):
        line = raw.rstrip("\r\n")
        if not line.strip():
            continue
        if line.startswith("#"):
            key, _, value = line.partition(separator if not line.startswith("#separator") else " ")
            if key == "#separator":
                separator = value.strip().encode().decode("unicode_escape") or "\t"
            elif key == "#fields":
                fields = value.split(separator)
            elif key == "#unset_field":
                unset = value
            continue
        stats.lines += 1
        try:
            if line.lstrip().startswith("{"):
                try:
                    record = json.loads(line)
                except json.JSONDecodeError:
                    raise BadLine("bad JSON") from None
                if not isinstance(record, dict):
                    raise BadLine("bad JSON")
                conn = conn_from_fields(record)
            else:
                if fields is None:
                    raise BadLine("TSV line before #fields header")
                values = line.split(separator)
                if len(values) != len(fields):
                    raise BadLine("wrong number of columns")
                conn = conn_from_fields(dict(zip(fields, values)), unset)
        except BadLine as bad:
            stats.skip(source, lineno, str(bad))
            continue
        stats.parsed += 1
        yield conn


def open_log(path: str | Path) -> TextIO:
    """Open a conn.log for reading, transparently decompressing `.gz` (Zeek's rotated logs)."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"no such file: {path}")
    if path.suffix == ".gz":
        return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8", errors="replace")
    return path.open("r", encoding="utf-8", errors="replace")


def read_logs(paths: Iterable[str | Path], stats: ParseStats | None = None) -> Iterator[Conn]:
    """Yield the connections of several conn.log files in order, counting bad lines in `stats`."""
    for path in paths:
        with open_log(path) as handle:
            yield from parse_lines(handle, stats, source=str(path))


def _tsv_values(conn: Conn) -> dict[str, str]:
    """A connection's conn.log fields as text: its own, else what `extra` holds."""
    values = dict(conn.extra)
    direct = (("ts", f"{conn.ts:.6f}"), ("id.orig_h", conn.orig_h), ("id.orig_p", str(conn.orig_p)),
              ("id.resp_h", conn.resp_h), ("id.resp_p", str(conn.resp_p)), ("proto", conn.proto))
    values.update((name, value) for name, value in direct if value)
    return values


def write_tsv(conns: Iterable[Conn], out: IO[str], opened: str = "1970-01-01-00-00-00") -> int:
    """Write connections as a Zeek TSV conn.log with its header block; returns the number written."""
    out.write("#separator \\x09\n#set_separator\t,\n#empty_field\t(empty)\n#unset_field\t-\n#path\tconn\n")
    out.write(f"#open\t{opened}\n#fields\t" + "\t".join(CONN_FIELDS) + "\n#types\t" + "\t".join(CONN_TYPES) + "\n")
    n = 0
    for conn in conns:
        values = _tsv_values(conn)
        out.write("\t".join([values.get(name, "-") for name in CONN_FIELDS]) + "\n")
        n += 1
    out.write(f"#close\t{opened}\n")
    return n


def tsv_lines_kept(lines: Iterable[str], keep: Callable[[float], bool]) -> Iterator[str]:
    """The lines of a conn.log that `write_tsv` wrote, each as it is: its header block, and
    the connections whose time (`ts`, its first field) `keep` keeps, read no further than
    that. A line without a time is left out, as `parse_lines` would skip it."""
    for line in lines:
        if line.startswith("#"):
            yield line
            continue
        try:
            ts = float(line.split("\t", 1)[0])
        except ValueError:
            continue
        if keep(ts):
            yield line


_NUMERIC = {"duration", "orig_bytes", "resp_bytes", "missed_bytes", "orig_pkts", "orig_ip_bytes", "resp_pkts", "resp_ip_bytes"}


def write_json(conns: Iterable[Conn], out: IO[str]) -> int:
    """Write connections as Zeek JSON lines (unset fields omitted, as Zeek does); returns the number written."""
    n = 0
    for conn in conns:
        record: dict[str, object] = {
            "ts": round(conn.ts, 6), "id.orig_h": conn.orig_h, "id.orig_p": conn.orig_p,
            "id.resp_h": conn.resp_h, "id.resp_p": conn.resp_p, "proto": conn.proto,
        }
        for name, value in conn.extra:
            if value == "-":
                continue
            record[name] = float(value) if name == "duration" else int(value) if name in _NUMERIC else value
        ordered = {name: record[name] for name in CONN_FIELDS if name in record}
        out.write(json.dumps(ordered, separators=(",", ":")) + "\n")
        n += 1
    return n
