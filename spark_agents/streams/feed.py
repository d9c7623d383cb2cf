"""Feeding connection summaries into a participant's stream (`spark_agents.broker.stream.BrokerStream`).

The feeder applies the lateness rule in input order (before partitioning, so the result does
not depend on the number of key groups), routes each connection by its source prefix to its
key group, and ends every chunk with a time-advance tick carrying the newest timestamp admitted so far: a
key group that receives no connections for a while still sees event time move, so its
windows close. `close()` writes an end-of-input mark that moves event time past every window holding a row.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Iterator
from typing import Protocol

from spark_agents.streams.records import MARK_END, MARK_TICK, StreamRecord
from bpm.zeek.conn import Conn
from bpm.zeek.definitions import MICROS, Admission, QueryParams, partition_of, source_prefix, ts_micros, window_end


def amplified(conns: Iterable[Conn], copies: int) -> Iterator[Conn]:
    """Each connection `copies` times; copy i gets its source moved to another address space
    (IPv4: first octet + 17·i mod 256; IPv6: + i·2^80) so load multiplies while each copy keeps
    the per-source shape of the original."""
    if copies < 1:
        raise ValueError("copies must be at least 1")
    for conn in conns:
        yield conn
        ip = ipaddress.ip_address(conn.orig_h)
        for i in range(1, copies):
            if ip.version == 4:
                octets = ip.packed
                moved = ipaddress.IPv4Address(bytes([(octets[0] + 17 * i) % 256]) + octets[1:])
            else:
                moved = ipaddress.IPv6Address((int(ip) + (i << 80)) % (1 << 128))
            yield Conn(conn.ts, moved.compressed, conn.orig_p, conn.resp_h, conn.resp_p, conn.proto, conn.extra)


def end_mark_us(newest_us: int, params: QueryParams) -> int:
    """The end-of-input mark after the newest event `newest_us`: an event time that brings the
    watermark one second past the end of the window holding it, short of the next window's
    end. That window closes and no later one, so streams whose newest rows fall in one window
    close the same windows (a correlation waits for every partner's, `spark_agents.correlation`)."""
    return (window_end(newest_us, params.window_s) + params.lateness_s + 1) * MICROS


def write_end(stream: Stream, end_us: int, key_groups: Iterable[int]) -> int:
    """Append the end-of-input mark `end_us` (`end_mark_us`) to each of `key_groups`; returns how many."""
    count = 0
    for k in key_groups:
        stream.append(k, [StreamRecord(end_us, mark=MARK_END)])
        count += 1
    return count


def end_watermark_ms(end_us: int, params: QueryParams) -> int:
    """The watermark (epoch ms) a query reaches after reading the end mark `end_us`: every
    window of the input has ended by then, so the batch that runs with it emits the last ones."""
    return (end_us - params.lateness_s * MICROS) // 1000


class Stream(Protocol):
    """What a feeder writes to: `partitions` parts (key groups), each appended a chunk of rows at a time."""

    partitions: int

    def append(self, k: int, records: Iterable[StreamRecord]) -> int: ...


class Feeder:
    """Buffers connections per key group and appends them to the stream in chunks.

    Attributes:
        admission: the lateness rule (its `late` counts refused rows).
        written: connections written per key group.
        files: chunks written (messages, on the broker).
        offered: connections given to `add` (admitted or not).
        key_groups: the key groups fed (None: all). A key group not fed gets nothing, not even
            a time tick: a task over it has nothing to read and runs no micro-batch.
            `feed_key_groups` adds some while the feeder runs.
    """

    def __init__(self, stream: Stream, params: QueryParams, key_groups: Iterable[int] | None = None) -> None:
        self.stream = stream
        self.params = params
        self.key_groups: frozenset[int] | None = None if key_groups is None else frozenset(key_groups)
        self.admission = Admission(params.lateness_s)
        self.buffers: list[list[StreamRecord]] = [[] for _ in range(stream.partitions)]
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

    def feeds(self, conn: Conn) -> bool:
        """Whether the connection's key group is fed."""
        return self.key_groups is None or partition_of(source_prefix(conn.orig_h), self.stream.partitions) in self.key_groups

    def add(self, conn: Conn) -> bool:
        """Buffer a connection; returns False when the lateness rule refuses it. (Whether its key
        group is fed is the caller's to ask first, `feeds`.)"""
        self.offered += 1
        ts_us = ts_micros(conn.ts)
        if not self.admission.admit(ts_us):
            return False
        prefix = source_prefix(conn.orig_h)
        k = partition_of(prefix, self.stream.partitions)
        self.buffers[k].append(StreamRecord(ts_us, conn.orig_h, prefix, conn.resp_h, conn.resp_p, conn.proto))
        return True

    def flush(self) -> int:
        """Append one chunk per key group that has rows or whose event time moved; returns chunks written."""
        newest = self.admission.newest_us
        if newest is None:
            return 0
        written = 0
        for k, rows in enumerate(self.buffers):
            if (not rows and self.ticked[k] == newest) or not self._fed(k):
                continue
            self.stream.append(k, [*rows, StreamRecord(newest, mark=MARK_TICK)])
            self.written[k] += len(rows)
            self.buffers[k] = []
            self.ticked[k] = newest
            written += 1
        self.files += written
        return written

    def feed(self, conns: Iterable[Conn], rows_per_flush: int = 200_000) -> None:
        """Add finite input at once (no pacing), flushing whenever `rows_per_flush` rows are
        buffered and once at the end; the stream stays open."""
        for conn in conns:
            if self.feeds(conn):
                self.add(conn)
            if self.buffered >= rows_per_flush:
                self.flush()
        self.flush()

    def close(self) -> None:
        """Flush and write the end-of-input mark to every key group fed, closing all windows."""
        self.flush()
        if self.admission.newest_us is not None:
            fed = [k for k in range(self.stream.partitions) if self._fed(k)]
            self.files += write_end(self.stream, end_mark_us(self.admission.newest_us, self.params), fed)
        self.closed = True


def feed_all(stream: Stream, conns: Iterable[Conn], params: QueryParams, rows_per_flush: int = 200_000) -> Feeder:
    """Write finite input at once (no pacing), closing the stream at the end."""
    feeder = Feeder(stream, params)
    feeder.feed(conns, rows_per_flush)
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
    feeder: Feeder,
    conns: Iterable[Conn],
    rate: float,
    speedup: float | None = None,
    flush_interval_s: float = 1.0,
    clock=None,
    sleep=None,
    stop=None,
    on_flush=None,
    fed: list[Conn] | None = None,
) -> Feeder:
    """Feed connections at a paced rate, appending one chunk per key group every `flush_interval_s`.

    `clock`/`sleep` default to `time.monotonic`/`time.sleep`; `stop` is an optional
    `threading.Event` that ends the replay early (without an end mark); `on_flush(rows_done)`
    is called after each flush. The stream is closed (end mark) when the input is exhausted.
    A connection whose key group is not fed (`Feeder.key_groups`) is passed over, on time;
    `fed`, if given, receives every connection given to the feeder.
    """
    import time

    clock = clock or time.monotonic
    sleep = sleep or time.sleep
    started = clock()
    next_flush = started + flush_interval_s
    first_ts: float | None = None
    done = 0
    for index, conn in enumerate(conns):
        if first_ts is None:
            first_ts = conn.ts
        due = started + due_time(index, conn.ts, first_ts, rate, speedup)
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
        if feeder.feeds(conn):
            feeder.add(conn)
            if fed is not None:
                fed.append(conn)
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
