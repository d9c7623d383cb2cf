"""A replayable, partitioned stream on a file system.

Layout of a stream at `<root>`:

* `_stream.json`: the number of partitions and the partitioning rule;
* `partition=<k>/<position>.csv`: immutable files of records, numbered from 0 per partition.
  A file is written under a hidden temporary name and renamed, so Spark's file source
  (which ignores names starting with `.` or `_`) never sees half a file;
* `_positions/<k>`: the next position of partition k, so numbering survives trimming;
* `_acks/<consumer>.json`: per partition, the position from which the consumer still needs
  input (every lower position is processed and checkpointed).

Trimming deletes, per partition, the files below the smallest acknowledged position of the
consumers of that partition (those that registered for it or acknowledged it), and nothing
when no consumer has. Any retained position can be read again.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlparse

from bpm.names import is_safe

MARK_DATA, MARK_TICK, MARK_END = 0, 1, 2
_FILE = re.compile(r"^(\d{12})\.csv$")
PARTITIONER = "crc32(source prefix) mod partitions"


def _check_consumer(consumer: str) -> None:
    if not is_safe(consumer):
        raise StreamError(f"bad consumer name {consumer!r}")


class StreamError(ValueError):
    """A stream that cannot be opened or used as asked; the message says why."""


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


def stream_path(uri: str | Path) -> Path:
    """The local folder of a stream given as a path or a `file://` URI."""
    text = str(uri)
    parsed = urlparse(text)
    if parsed.scheme in ("", "file") or len(parsed.scheme) == 1:  # one letter: a Windows drive, not a scheme
        return Path(unquote(parsed.path) if parsed.scheme == "file" else text)
    raise StreamError(f"unsupported stream URI {text!r}: use a local path or a file:// URI")


def positions_glob(start: int) -> str:
    """A file-name glob (Hadoop syntax, for Spark's `pathGlobFilter`) of the stream files at or after `start`.

    Spark's file source cannot start from a position; this filter makes a fresh query skip
    the files before it. Positions are 12 zero-padded digits: a name is at least `start`
    when it is `start` itself, or agrees on the first i digits and is greater at digit i.
    """
    if not 0 <= start < 10**12:
        raise StreamError(f"position {start} out of range")
    digits = f"{start:012d}"
    alternatives = [digits]
    for i, d in enumerate(digits):
        if d != "9":
            alternatives.append(f"{digits[:i]}[{int(d) + 1}-9]{'?' * (11 - i)}")
    return "{" + ",".join(alternatives) + "}.csv"


def _write_atomic(path: Path, text: str) -> None:
    temp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with temp.open("w", encoding="utf-8") as out:
        out.write(text)
    os.replace(temp, path)


def closing_mark(path: str | Path) -> StreamRecord | None:
    """The mark (tick or end of input) a stream file ends with; None when it ends with a connection."""
    with open(path, "rb") as handle:
        size = handle.seek(0, os.SEEK_END)
        handle.seek(max(0, size - 256))
        tail = handle.read().decode("utf-8", errors="replace")
    try:
        record = StreamRecord.from_line(tail.rstrip("\n").rsplit("\n", 1)[-1])
    except ValueError:
        return None
    return record if record.mark != MARK_DATA else None


class PartitionedStream:
    """A stream folder with `partitions` partitions; see the module text for the layout."""

    def __init__(self, root: str | Path) -> None:
        self.root = stream_path(root)
        meta = self.root / "_stream.json"
        if not meta.exists():
            raise StreamError(f"{self.root} is not a stream (no _stream.json); create it with a number of partitions")
        self.partitions = int(json.loads(meta.read_text())["partitions"])

    @classmethod
    def create(cls, root: str | Path, partitions: int) -> PartitionedStream:
        """Create the stream, or open it when it exists with the same number of partitions."""
        if partitions < 1:
            raise StreamError("a stream needs at least one partition")
        path = stream_path(root)
        meta = path / "_stream.json"
        if meta.exists():
            stream = cls(path)
            if stream.partitions != partitions:
                raise StreamError(f"{path} already has {stream.partitions} partitions, not {partitions}")
            return stream
        if path.exists() and any(path.iterdir()):
            raise StreamError(f"{path} exists, is not empty and is not a stream")
        for k in range(partitions):
            (path / f"partition={k}").mkdir(parents=True, exist_ok=True)
        (path / "_positions").mkdir(exist_ok=True)
        (path / "_acks").mkdir(exist_ok=True)
        _write_atomic(meta, json.dumps({"partitions": partitions, "partitioner": PARTITIONER, "format": "csv"}))
        return cls(path)

    def _check(self, k: int) -> None:
        if not 0 <= k < self.partitions:
            raise StreamError(f"partition {k} out of range 0..{self.partitions - 1}")

    def partition_path(self, k: int) -> Path:
        """The folder a task over partition k reads."""
        self._check(k)
        return self.root / f"partition={k}"

    def positions(self, k: int) -> list[int]:
        """The retained positions of partition k, in order."""
        found = (_FILE.match(name) for name in os.listdir(self.partition_path(k)))
        return sorted(int(m.group(1)) for m in found if m)

    def next_position(self, k: int) -> int:
        marker = self.root / "_positions" / str(k)
        return int(marker.read_text()) if marker.exists() else 0

    def append(self, k: int, records: Iterable[StreamRecord]) -> int:
        """Write records as the next file of partition k; returns its position."""
        position = self.next_position(k)
        target = self.partition_path(k) / f"{position:012d}.csv"
        _write_atomic(target, "".join(r.to_line() for r in records))
        self._order_after(target, self.partition_path(k) / f"{position - 1:012d}.csv")
        _write_atomic(self.root / "_positions" / str(k), str(position + 1))
        return position

    @staticmethod
    def _order_after(target: Path, previous: Path) -> None:
        """Give `target` a modification time at least 1 ms after `previous`: Spark's file source
        orders new files by modification time in milliseconds, and with `maxFilesPerTrigger`
        two files in the same millisecond could be taken out of order."""
        try:
            before = previous.stat().st_mtime_ns
        except FileNotFoundError:
            return
        now = target.stat().st_mtime_ns
        if now // 1_000_000 <= before // 1_000_000:
            later = (before // 1_000_000 + 1) * 1_000_000
            os.utime(target, ns=(later, later))

    def read(self, k: int, start: int = 0) -> Iterator[tuple[int, list[StreamRecord]]]:
        """Replay partition k from a retained position: `(position, records)` per file."""
        retained = self.positions(k)
        if start < self.next_position(k) and (not retained or start < retained[0]):
            raise StreamError(f"position {start} of partition {k} was trimmed (oldest retained: {retained[0] if retained else 'none'})")
        for position in retained:
            if position >= start:
                with (self.partition_path(k) / f"{position:012d}.csv").open(encoding="utf-8") as handle:
                    yield position, [StreamRecord.from_line(line) for line in handle if line.strip()]

    def ack(self, consumer: str, k: int, position: int) -> None:
        """Record that `consumer` needs partition k only from `position` on; acknowledgements never move back."""
        _check_consumer(consumer)
        self._check(k)
        if not 0 <= position <= self.next_position(k):
            raise StreamError(f"position {position} beyond the end of partition {k}")
        acks = self.acks().get(consumer, {})
        acks[k] = max(position, acks.get(k, 0))
        _write_atomic(self.root / "_acks" / f"{consumer}.json", json.dumps({str(p): v for p, v in sorted(acks.items())}))

    def register(self, consumer: str, partitions: Iterable[int] | None = None) -> None:
        """Make `consumer` hold every retained file of the given partitions (default: all) until it acknowledges."""
        _check_consumer(consumer)
        wanted = range(self.partitions) if partitions is None else list(partitions)
        for k in wanted:
            self._check(k)
        acks = self.acks().get(consumer, {})
        if any(k not in acks for k in wanted):
            acks = {**{k: 0 for k in wanted}, **acks}
            _write_atomic(self.root / "_acks" / f"{consumer}.json", json.dumps({str(p): v for p, v in sorted(acks.items())}))

    def release(self, consumer: str) -> None:
        """Forget `consumer`: it holds nothing any more (a failed host whose successor has acknowledged)."""
        _check_consumer(consumer)
        (self.root / "_acks" / f"{consumer}.json").unlink(missing_ok=True)

    def acks(self) -> dict[str, dict[int, int]]:
        """Per consumer, the acknowledged position of each partition it registered for or acknowledged."""
        result: dict[str, dict[int, int]] = {}
        for path in sorted((self.root / "_acks").glob("*.json")):
            result[path.stem] = {int(p): int(v) for p, v in json.loads(path.read_text()).items()}
        return result

    def trim_point(self, k: int) -> int:
        """The lowest position still needed by a consumer of partition k (0 without consumers).

        Only consumers that registered for k or acknowledged it count: a task that reads one
        partition does not hold the others.
        """
        acks = self.acks()
        held = [a[k] for a in acks.values() if k in a]
        return min(held, default=0)

    def tick_us(self, k: int, position: int) -> int | None:
        """The event time that retained file `position` of partition k ends with, when it ends with a mark.

        The feeder ends every file with a tick (or the end mark) carrying the newest
        timestamp admitted so far, so no row of the file, nor of any earlier file, is newer.
        None for a file that does not end with a mark.
        """
        record = closing_mark(self.partition_path(k) / f"{position:012d}.csv")
        return None if record is None else record.ts_us

    def first_position_from(self, k: int, ts_us: int) -> int:
        """The first position of partition k that may hold a row at or after `ts_us`.

        Every file before it ends with a mark older than `ts_us`, so reading partition k from
        here loses no row at or after `ts_us`. Marks grow with the position (the feeder's
        newest timestamp never moves back), which allows a binary search; a file without a
        mark counts as holding such a row. `next_position(k)` when no retained file may.
        """
        retained = self.positions(k)
        lo, hi = 0, len(retained)
        while lo < hi:
            mid = (lo + hi) // 2
            tick = self.tick_us(k, retained[mid])
            if tick is not None and tick < ts_us:
                lo = mid + 1
            else:
                hi = mid
        return retained[lo] if lo < len(retained) else self.next_position(k)

    def trim(self) -> dict[int, int]:
        """Delete, per partition, the files below the trim point; returns how many were deleted."""
        deleted: dict[int, int] = {}
        for k in range(self.partitions):
            point = self.trim_point(k)
            gone = [p for p in self.positions(k) if p < point]
            for position in gone:
                (self.partition_path(k) / f"{position:012d}.csv").unlink(missing_ok=True)
            deleted[k] = len(gone)
        return deleted
