"""Feeding a query's records into a participant's stream (`spark_agents.broker.stream.BrokerStream`).

The feeder applies the lateness rule in input order (before partitioning, so the result does
not depend on the number of key groups), routes each record by its key to its key group,
and ends every chunk with a time-advance tick carrying the newest event time admitted so
far: a key group that receives no records for a while still sees event time move, so its
results close. `close()` writes an end-of-input mark that makes every result final
(`bpm.records.end_mark_us`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol

from bpm.query import Params, Query
from bpm.records import MARK_END, MARK_TICK, Admission, Records, end_mark_us


def write_end(stream: Stream, end_us: int, key_groups: Iterable[int], records: Records) -> int:
    """Append the end-of-input mark `end_us` to each of `key_groups`, as a line of `records`;
    returns how many."""
    count = 0
    line = records.line(end_us, mark=MARK_END)
    for k in key_groups:
        stream.append(k, [line])
        count += 1
    return count


class Stream(Protocol):
    """What a feeder writes to: `partitions` parts (key groups), each appended a chunk of lines at a time."""

    partitions: int

    def append(self, k: int, lines: Sequence[str]) -> int: ...


class RecordFeeder:
    """Buffers a query's records per key group and appends them to the stream in chunks.

    A record is (event time in µs, the values of the query's other columns), as
    `bpm.records.Records.parse` gives it.

    Attributes:
        records: the query's records (lines, key groups).
        admission: the lateness rule (its `late` counts refused records).
        written: records written per key group.
        files: chunks written (messages, on the broker).
        offered: records given to `add` (admitted or not).
        key_groups: the key groups fed (None: all). A key group not fed gets nothing, not even
            a time tick: a task over it has nothing to read and runs no micro-batch.
            `feed_key_groups` adds some while the feeder runs.
    """

    def __init__(self, stream: Stream, query: Query, params: Params, key_groups: Iterable[int] | None = None) -> None:
        self.stream = stream
        self.records = Records(query)
        self.lateness_s, self.align_s = query.lateness_s(params), query.align_s(params)
        self.key_groups: frozenset[int] | None = None if key_groups is None else frozenset(key_groups)
        self.admission = Admission(self.lateness_s)
        self.buffers: list[list[str]] = [[] for _ in range(stream.partitions)]
        self.ticked: list[int | None] = [None] * stream.partitions
        self.written = [0] * stream.partitions
        self.files = 0
        self.offered = 0
        self.closed = False

    @property
    def buffered(self) -> int:
        return sum(len(b) for b in self.buffers)

    def feed_key_groups(self, key_groups: Iterable[int]) -> None:
        """Feed these key groups too from now on (safe from another thread)."""
        if self.key_groups is not None:
            self.key_groups = self.key_groups | frozenset(key_groups)

    def _fed(self, k: int) -> bool:
        return self.key_groups is None or k in self.key_groups

    def feeds(self, record: tuple[int, tuple]) -> bool:
        """Whether the record's key group is fed."""
        return self.key_groups is None or self.records.key_group(record[1], self.stream.partitions) in self.key_groups

    def add(self, record: tuple[int, tuple]) -> bool:
        """Buffer a record; returns False when the lateness rule refuses it. (Whether its key
        group is fed is the caller's to ask first, `feeds`.)"""
        self.offered += 1
        ts_us, values = record
        if not self.admission.admit(ts_us):
            return False
        self.buffers[self.records.key_group(values, self.stream.partitions)].append(self.records.line(ts_us, values))
        return True

    def flush(self) -> int:
        """Append one chunk per key group that has records or whose event time moved; returns chunks written."""
        newest = self.admission.newest_us
        if newest is None:
            return 0
        written = 0
        tick = self.records.line(newest, mark=MARK_TICK)
        for k, rows in enumerate(self.buffers):
            if (not rows and self.ticked[k] == newest) or not self._fed(k):
                continue
            self.stream.append(k, [*rows, tick])
            self.written[k] += len(rows)
            self.buffers[k] = []
            self.ticked[k] = newest
            written += 1
        self.files += written
        return written

    def feed(self, records: Iterable, rows_per_flush: int = 200_000) -> None:
        """Add finite input at once (no pacing), flushing whenever `rows_per_flush` records are
        buffered and once at the end; the stream stays open."""
        for record in records:
            if self.feeds(record):
                self.add(record)
            if self.buffered >= rows_per_flush:
                self.flush()
        self.flush()

    def end_us(self) -> int | None:
        """The end-of-input mark after what was admitted (None: nothing was)."""
        newest = self.admission.newest_us
        return None if newest is None else end_mark_us(newest, self.lateness_s, self.align_s)

    def close(self) -> None:
        """Flush and write the end-of-input mark to every key group fed, making every result final."""
        self.flush()
        end = self.end_us()
        if end is not None:
            fed = [k for k in range(self.stream.partitions) if self._fed(k)]
            self.files += write_end(self.stream, end, fed, self.records)
        self.closed = True

    @staticmethod
    def time_s(record: tuple[int, tuple]) -> float:
        """A record's event time in seconds (what a replay paces by)."""
        return record[0] / 1_000_000


def feed_all(stream: Stream, query: Query, params: Params, records: Iterable[tuple[int, tuple]], rows_per_flush: int = 200_000) -> RecordFeeder:
    """Write `query`'s finite input `records` at once (no pacing), closing the stream at the end."""
    feeder = RecordFeeder(stream, query, params)
    feeder.feed(records, rows_per_flush)
    feeder.close()
    return feeder


def due_time(index: int, ts: float, first_ts: float, rate: float, speedup: float | None) -> float:
    """Seconds after the start at which row `index` (timestamp `ts`) is due: at most `rate` rows
    per second (0: no limit), and with `speedup`, not before its recorded time divided by it."""
    due = index / rate if rate > 0 else 0.0
    if speedup:
        due = max(due, (ts - first_ts) / speedup)
    return due


def replay(
    feeder: RecordFeeder,
    items: Iterable,
    rate: float,
    speedup: float | None = None,
    flush_interval_s: float = 1.0,
    clock=None,
    sleep=None,
    stop=None,
    on_flush=None,
    fed: list | None = None,
    record: Callable[[Any], tuple[int, tuple]] | None = None,
) -> RecordFeeder:
    """Feed items at a paced rate, appending one chunk per key group every `flush_interval_s`:
    the feeder's records, or anything `record` makes one of (then `fed` keeps the items).

    `clock`/`sleep` default to `time.monotonic`/`time.sleep`; `stop` is an optional
    `threading.Event` that ends the replay early (without an end mark); `on_flush(rows_done)`
    is called after each flush. The stream is closed (end mark) when the input is exhausted.
    A record whose key group is not fed (`RecordFeeder.key_groups`) is passed over, on time;
    `fed`, if given, receives every item whose record was given to the feeder.
    """
    import time

    clock = clock or time.monotonic
    sleep = sleep or time.sleep
    started = clock()
    next_flush = started + flush_interval_s
    first_ts: float | None = None
    done = 0
    for index, item in enumerate(items):
        rec = item if record is None else record(item)
        ts = feeder.time_s(rec)
        if first_ts is None:
            first_ts = ts
        due = started + due_time(index, ts, first_ts, rate, speedup)
        while clock() < due:
            if stop is not None and stop.is_set():
                feeder.flush()
                return feeder
            if clock() >= next_flush:
                feeder.flush()
                next_flush += flush_interval_s
                if on_flush:
                    on_flush(done)
            sleep(max(0.0, min(due, next_flush) - clock()))
        if feeder.feeds(rec):
            feeder.add(rec)
            if fed is not None:
                fed.append(item)
        done += 1
        if clock() >= next_flush:
            feeder.flush()
            next_flush = max(next_flush + flush_interval_s, clock())
            if on_flush:
                on_flush(done)
    feeder.close()
    if on_flush:
        on_flush(done)
    return feeder
