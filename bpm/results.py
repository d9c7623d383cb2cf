"""A query's results as the federation compares, fences and stores them.

A result is one row of a query's result (a dictionary of columns, after `finish`) with two
things the query declares (`bpm.query.Query`): its identity (the `result_key` columns) and
the event time at which it is final (`result_time`). Values are made plain and hashable the
same way wherever a row comes from — a Spark `Row`, a JSON line read back from the results
stream, a plain computation — so that the same result compares equal in all three: times
become ISO 8601 UTC text, lists tuples, structures tuples of their fields.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from decimal import Decimal

from bpm.query import Query, QueryError
from bpm.records import RecordError, event_time_us

def plain(value: object) -> object:
    """`value` as JSON can carry it and a set can hold it."""
    if isinstance(value, datetime):
        # A naive time is the process's local time, as PySpark gives a TIMESTAMP.
        text = value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%f").rstrip("0").rstrip(".")
        return text + "Z"
    if isinstance(value, date):
        return value.isoformat()
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, Mapping):
        return tuple((str(k), plain(v)) for k, v in value.items())
    if isinstance(value, list | tuple):
        return tuple(plain(v) for v in value)
    return value


def time_us(value: object) -> int:
    """An event time in microseconds since the epoch, from a TIMESTAMP, epoch seconds or ISO text
    (`bpm.records.event_time_us`); ValueError when it is none of these."""
    try:
        return event_time_us(value)
    except RecordError:
        raise ValueError(f"{value!r} is not a time") from None


@dataclass(frozen=True)
class Result:
    """One result.

    Attributes:
        time_us: the event time at which it is final (microseconds since the epoch).
        key: the values of the query's `result_key` columns.
        row: every column of it, (name, plain value), in the row's order.
    """

    time_us: int
    key: tuple
    row: tuple[tuple[str, object], ...]

    def to_json(self) -> dict[str, object]:
        return dict(self.row)

    def __getitem__(self, column: str) -> object:
        """The plain value of one of its columns."""
        for name, value in self.row:
            if name == column:
                return value
        raise KeyError(column)

    def to_wire(self) -> dict[str, object]:
        """Its form on the results stream: self-describing, so that a reader needs no query."""
        return {"t": self.time_us, "k": list(self.key), "row": dict(self.row)}

    @classmethod
    def from_wire(cls, body: Mapping[str, object]) -> Result:
        """A result as `to_wire` wrote it; ValueError when `body` is not one."""
        t, k, row = body.get("t"), body.get("k"), body.get("row")
        if not isinstance(t, int) or isinstance(t, bool) or not isinstance(k, list) or not isinstance(row, dict):
            raise ValueError("a result is {'t': microseconds, 'k': [key values], 'row': {column: value}}")
        return cls(t, tuple(plain(v) for v in k), tuple((str(n), plain(v)) for n, v in row.items()))

    def order(self) -> tuple:
        """A total order for printing: by time, then identity (values of any type)."""
        return (self.time_us, tuple(repr(k) for k in self.key), repr(self.row))

    def __lt__(self, other: Result) -> bool:
        return self.order() < other.order()


def result(row: Mapping[str, object], query: Query) -> Result:
    """`row` (a result row of `query`, or its JSON form) as a Result; QueryError when it lacks
    a column the query says identifies it or makes it final."""
    values = tuple((str(name), plain(value)) for name, value in row.items())
    columns = dict(values)
    missing = [c for c in (*query.result_key, query.result_time) if c not in columns]
    if missing:
        raise QueryError(f"query {query.name!r}: its result has no column {missing[0]!r} (it has {', '.join(columns) or 'none'})")
    try:
        when = time_us(row[query.result_time])
    except ValueError as exc:
        raise QueryError(f"query {query.name!r}: result_time {query.result_time!r} holds {exc}") from None
    return Result(when, tuple(columns[c] for c in query.result_key), values)


def results(rows: Iterable[Mapping[str, object]], query: Query) -> list[Result]:
    return [result(row, query) for row in rows]


@dataclass
class OutputSet:
    """Results (`Result`s, or any hashable rows) merged from many batches, compared with what was expected.

    Attributes:
        rows: each distinct result once.
        copies: how many batches held each (more than one: duplicated output).
    """

    rows: set[Result] = field(default_factory=set)
    copies: Counter = field(default_factory=Counter)

    def add(self, rows: Iterable[Result]) -> None:
        """Merge one batch's results."""
        for row in rows:
            self.rows.add(row)
            self.copies[row] += 1

    @property
    def duplicates(self) -> list[Result]:
        """Results present in more than one batch."""
        return sorted(r for r, n in self.copies.items() if n > 1)

    def lost(self, expected: Iterable[Result]) -> list[Result]:
        """Expected results that no batch holds."""
        return sorted(set(expected) - self.rows)

    def extra(self, expected: Iterable[Result]) -> list[Result]:
        """Results that no expected one matches."""
        return sorted(self.rows - set(expected))
