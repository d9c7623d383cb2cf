"""A query's records on a participant's stream: parsed from a user's JSON or CSV, written as one CSV line each.

A line is `__ts_us,__mark,<the query's other columns in schema order>`: the event time in
microseconds since the epoch, the mark (0 a record, 1 a tick that only moves event time,
2 the end of the input), then the record's values (RFC 4180 quoting where a value needs it).
The federation's two columns come first, so that a reader finds the event time and the
mark of any query's line without knowing its schema (`mark_and_time`); the task host turns
`__ts_us` back into the query's event-time column. Punctuation lines leave the values empty.

Values are checked against the schema here, where they enter the federation: a record that
does not parse is refused with the column and the reason (`RecordError`), and the producer
counts and reports it.
"""

from __future__ import annotations

import csv
import io
import json
import math
import zlib
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from bpm.keygroups import KEY_GROUPS
from bpm.query import Column, Query

MARK_DATA, MARK_TICK, MARK_END = 0, 1, 2
TIME, MARK = "__ts_us", "__mark"
MICROS = 1_000_000
_INTS = {"BIGINT": 63, "INT": 31, "SMALLINT": 15, "TINYINT": 7}
_TRUE, _FALSE = ("true", "1", "yes"), ("false", "0", "no")
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
# A time travels as microseconds since the epoch; the task host makes it a TIMESTAMP again.
_WIRE = {"TIMESTAMP": "BIGINT"}


class RecordError(ValueError):
    """A record that does not fit its query's schema; the message names the column."""


def event_time_us(value: object) -> int:
    """An event time in microseconds since the epoch from epoch seconds (a number) or an
    ISO 8601 text (UTC unless it says otherwise); truncated, as Spark's `timestamp_seconds` does."""
    if isinstance(value, bool):
        raise RecordError(f"{value!r} is not a time")
    if isinstance(value, int | float):
        if not math.isfinite(value):
            raise RecordError(f"{value!r} is not a time")
        return int(value * MICROS) if isinstance(value, float) else value * MICROS
    if isinstance(value, datetime):  # a naive one is local time, as PySpark gives a TIMESTAMP
        return round(value.timestamp() * MICROS)
    if isinstance(value, str):
        text = value.strip()
        try:
            return event_time_us(float(text))
        except ValueError:
            pass
        try:
            moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
        except ValueError:
            raise RecordError(f"{value!r} is neither epoch seconds nor an ISO 8601 time") from None
        return event_time_us(moment if moment.tzinfo else moment.replace(tzinfo=UTC))
    raise RecordError(f"{value!r} is not a time")


def _value(column: Column, value: object) -> object:
    """`value` as `column`'s type (None stays None: a missing value)."""
    if value is None or (isinstance(value, str) and value == "" and column.type != "STRING"):
        return None
    sql = column.type
    if sql == "STRING":
        return value if isinstance(value, str) else str(value)
    if sql in _INTS:
        if isinstance(value, str):
            try:
                value = int(value.strip())
            except ValueError:
                raise RecordError(f"{column.name}: {value!r} is not a whole number") from None
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if not isinstance(value, int) or isinstance(value, bool):
            raise RecordError(f"{column.name}: {value!r} is not a whole number")
        if not -(1 << _INTS[sql]) <= value < 1 << _INTS[sql]:
            raise RecordError(f"{column.name}: {value} is out of range for {sql}")
        return value
    if sql in ("DOUBLE", "FLOAT"):
        try:
            number = float(value.strip()) if isinstance(value, str) else value
        except ValueError:
            raise RecordError(f"{column.name}: {value!r} is not a number") from None
        if not isinstance(number, int | float) or isinstance(number, bool) or not math.isfinite(number):
            raise RecordError(f"{column.name}: {value!r} is not a finite number")
        return float(number)
    if sql == "BOOLEAN":
        if isinstance(value, bool):
            return value
        text = str(value).strip().lower()
        if text in _TRUE or text in _FALSE:
            return text in _TRUE
        raise RecordError(f"{column.name}: {value!r} is not true or false")
    if sql == "TIMESTAMP":
        try:
            return event_time_us(value)
        except RecordError as exc:
            raise RecordError(f"{column.name}: {exc}") from None
    raise RecordError(f"{column.name}: type {sql} is not supported")  # parse_schema admits none other


class Records:
    """The records of `query`: parsing, the stream's lines, key groups.

    Attributes:
        query: the query.
        columns: its columns other than event time, in schema order (the line's values).
        wire_ddl: the schema of a line, as the stream source reads it.
    """

    def __init__(self, query: Query) -> None:
        self.query = query
        every = query.columns
        self.time = next(c for c in every if c.name == query.event_time)
        self.columns = tuple(c for c in every if c.name != query.event_time)
        self.key_index = next(i for i, c in enumerate(self.columns) if c.name == query.key)
        self.wire_ddl = ", ".join([f"{TIME} BIGINT", f"{MARK} INT", *(f"`{c.name}` {_WIRE.get(c.type, c.type)}" for c in self.columns)])

    def parse(self, record: Mapping[str, object]) -> tuple[int, tuple]:
        """(event time in µs, the other values in order) of one record given by column name
        (a JSON object, or a CSV row read with its header); RecordError when it does not fit."""
        if not isinstance(record, Mapping):
            raise RecordError(f"a record is an object of columns, not {type(record).__name__}")
        unknown = [name for name in record if name != self.time.name and name not in {c.name for c in self.columns}]
        if unknown:
            raise RecordError(f"{unknown[0]}: not a column of query {self.query.name!r}")
        if record.get(self.time.name) in (None, ""):
            raise RecordError(f"{self.time.name}: the event time is missing")
        try:
            ts_us = event_time_us(record[self.time.name])
        except RecordError as exc:
            raise RecordError(f"{self.time.name}: {exc}") from None
        values = tuple(_value(c, record.get(c.name)) for c in self.columns)
        if values[self.key_index] in (None, ""):
            raise RecordError(f"{self.query.key}: the key is missing")
        return ts_us, values

    def as_json(self, ts_us: int, values: Sequence[object]) -> dict[str, object]:
        """A record (`parse`'s) as a JSON object that `parse` reads back exactly: times as ISO 8601 UTC."""
        record: dict[str, object] = {self.time.name: iso_us(ts_us)}
        for column, value in zip(self.columns, values, strict=True):
            record[column.name] = iso_us(value) if column.type == "TIMESTAMP" and value is not None else value
        return record

    def key_group(self, values: Sequence[object], parts: int = KEY_GROUPS) -> int:
        """The key group of a record with `values` (`parse`'s): a stable hash (CRC-32) of its key's
        text, the same in every process, over `parts` parts (the stream's 64 key groups)."""
        return zlib.crc32(_text(values[self.key_index]).encode()) % parts

    def line(self, ts_us: int, values: Sequence[object] = (), mark: int = MARK_DATA) -> str:
        """The stream's line of a record (`values`), or of a punctuation mark (no values)."""
        cells = [_text(v) for v in values] if values else [""] * len(self.columns)
        text = ",".join(cells)
        if text.count(",") == len(cells) - 1 and '"' not in text and "\n" not in text and "\r" not in text:
            return f"{ts_us},{mark},{text}\n"
        out = io.StringIO()
        # With "\r\n" as the terminator the writer quotes a value holding either character;
        # the stream's lines end with "\n".
        csv.writer(out, lineterminator="\r\n").writerow([ts_us, mark, *cells])
        return out.getvalue()[:-2] + "\n"


# An event time far past any record's: an end of input after which every window, session
# and join state of any query has closed.
END_US = 1 << 53


def grain_end(ts_us: int, align_s: int) -> int:
    """The end (epoch seconds) of the grain of `align_s` seconds (a tumbling window) holding
    the event time `ts_us`: the first multiple of `align_s` after it."""
    return (ts_us // (align_s * MICROS) + 1) * align_s


def end_mark_us(newest_us: int, lateness_s: int, align_s: int | None) -> int:
    """The end-of-input mark after the newest record `newest_us`: for a query with a grain
    (`align_s`, `bpm.query.Query.align`), an event time that brings the watermark one second
    past the end of the grain holding it, short of the next one's end: that grain's results
    close and no later ones', so streams whose newest records fall in one grain close the
    same results (a correlation waits for every partner's). Without a grain, `END_US`."""
    if align_s is None:
        return END_US
    return (grain_end(newest_us, align_s) + lateness_s + 1) * MICROS


def end_watermark_ms(end_us: int, lateness_s: int) -> int:
    """The watermark (epoch ms) a task reaches after reading the end mark `end_us`: every
    result of the input is final by then, so the batch that runs with it emits the last ones."""
    return (end_us - lateness_s * MICROS) // 1000


FORMATS = ("jsonl", "csv")


@dataclass
class BadRecords:
    """The records of an input that did not parse: how many, by reason, and the first few.

    Attributes:
        count: records refused.
        reasons: refusals by reason (the reason's text up to its first value).
        first: the first refusals, "line N: reason".
    """

    count: int = 0
    reasons: Counter = field(default_factory=Counter)
    first: list[str] = field(default_factory=list)

    def add(self, line: int, reason: str) -> None:
        self.count += 1
        self.reasons[reason.split(":")[0]] += 1
        if len(self.first) < 5:
            self.first.append(f"line {line}: {reason}")


def parse_lines(records: Records, lines: Iterable[str], fmt: str, bad: BadRecords) -> Iterator[tuple[int, tuple]]:
    """The records of a user's input — JSON lines (an object per line) or CSV with a header
    line naming the columns — parsed (`Records.parse`); those that do not parse are counted in
    `bad` and passed over."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown input format {fmt!r}: {' or '.join(FORMATS)}")
    if fmt == "csv":
        reader = csv.DictReader(lines)
        for record in reader:
            try:
                if None in record:
                    raise RecordError("more values than the header names")
                yield records.parse(record)
            except RecordError as exc:
                bad.add(reader.line_num, str(exc))
        return
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            yield records.parse(json.loads(line))
        except json.JSONDecodeError as exc:
            bad.add(number, f"not JSON: {exc.msg}")
        except RecordError as exc:
            bad.add(number, str(exc))


def iso_us(ts_us: int) -> str:
    """A time in µs since the epoch as ISO 8601 UTC text, to the microsecond."""
    return (_EPOCH + timedelta(microseconds=ts_us)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _text(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)
    return str(value)


def mark_and_time(line: bytes | str) -> tuple[int, int]:
    """(the mark, the event time in µs) of one stream line of any query."""
    text = line.decode() if isinstance(line, bytes) else line
    ts, mark = text.rstrip("\n").split(",", 2)[:2]
    return int(mark), int(ts)


class Admission:
    """The lateness rule applied in input order: keeps records not more than `lateness_s` behind the newest
    (at or below `newest - lateness_s` is late). The watermark has the same delay and a batch's
    watermark trails the newest record seen before it, so a task never drops a record it keeps.

    Attributes:
        newest_us: the newest timestamp admitted so far (microseconds), None before the first row.
        late: how many rows were refused as late.
    """

    def __init__(self, lateness_s: int, newest_us: int | None = None) -> None:
        self.lateness_us = lateness_s * MICROS
        self.newest_us = newest_us
        self.late = 0

    def admit(self, ts_us: int) -> bool:
        if self.newest_us is not None and ts_us <= self.newest_us - self.lateness_us:
            self.late += 1
            return False
        if self.newest_us is None or ts_us > self.newest_us:
            self.newest_us = ts_us
        return True


def iso_utc(epoch_s: int) -> str:
    """Epoch seconds as ISO 8601 UTC text, to the second: `2026-12-05T23:30:00Z`."""
    return datetime.fromtimestamp(epoch_s, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_iso_utc(text: str) -> int:
    """Epoch seconds from ISO 8601 text (`Z` or an offset); ValueError when it is none."""
    return int(datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp())
