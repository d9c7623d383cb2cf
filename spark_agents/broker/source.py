"""A Spark streaming source over a participant's JetStream input (Spark's Python data source API).

`spark.readStream.format("bpm_jetstream")` with the options `url`, `user`, `password`,
`filter` (the subject filter of the task's key groups, `bpm.keygroups.subject_filter`) and
optionally `startSeq` (the stream sequence to start after: a task started from the newest
input, or replaying from an acknowledged position), `maxMessagesPerTrigger` (bounds a
micro-batch while catching up) and `owedBatch` ("true": the checkpoint the query resumes
from owes the batch of a new watermark, `JetStreamReader.latestOffset`).

An offset is `{"seq": n}`: every message of the stream up to sequence `n` that the filter
selects has been read (`{"seq": n, "resumed": k}` after the k-th resumption that owed a
batch with nothing new: see `JetStreamReader.latestOffset`). Offsets live in Spark's checkpoint, so a checkpoint handed to
another host resumes exactly where it stopped, reading the origin's stream over the
network. Each micro-batch reads its range through a short-lived consumer of the
origin's server, filtered to the task's key groups, and yields Arrow record batches
parsed from the messages' CSV lines (`bpm.records`) with the columns the reading query
gives (`readStream.schema(...)`). Nothing of the stream is kept on the reader's side.
"""

from __future__ import annotations

import io
import re
import threading
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace

from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition

from bpm.keygroups import MAIN, StreamLocation, check_prefix
from bpm.negotiation.granularity import split_time
from bpm.records import MARK_END, mark_and_time
from spark_agents.broker.stream import Broker
from spark_agents.broker.subjects import INPUT
from spark_agents.session import register_source

NAME = "bpm_jetstream"
FETCH = 256  # messages per pull request
READER_IDLE_S = 30.0  # a reader's consumer left behind (its reader died) is gone after this long unused
_COLUMN = re.compile(r"^\s*`?([^`\s]+)`?\s+(\w+)\s*$")


@dataclass
class SeqRange(InputPartition):
    """Messages with sequence in (`after`, `last`] that the filter selects."""

    after: int
    last: int


def columns(ddl: str) -> list[tuple[str, str]]:
    """(name, SQL type) of each column of a flat DDL schema: the stream's lines (`bpm.records`)."""
    out = []
    for part in ddl.split(","):
        match = _COLUMN.match(part)
        if match is None:
            raise ValueError(f"bad column {part.strip()!r} in the stream's schema {ddl!r}")
        out.append((match.group(1), match.group(2).upper()))
    return out


def _arrow_types(schema: list[tuple[str, str]]) -> dict:
    import pyarrow as pa

    types = {"BIGINT": pa.int64(), "LONG": pa.int64(), "INT": pa.int32(), "INTEGER": pa.int32(), "SMALLINT": pa.int16(),
             "TINYINT": pa.int8(), "DOUBLE": pa.float64(), "FLOAT": pa.float32(), "BOOLEAN": pa.bool_(), "STRING": pa.string()}
    return {name: types[sql] for name, sql in schema}


def parse(chunks: list[bytes], schema: list[tuple[str, str]]):
    """One Arrow record batch from messages of the stream's lines with columns `schema`, (name,
    SQL type) each (none for no rows)."""
    from pyarrow import csv

    data = b"".join(chunks)
    if not data:
        return None
    table = csv.read_csv(io.BytesIO(data), read_options=csv.ReadOptions(column_names=[name for name, _ in schema]),
                         parse_options=csv.ParseOptions(), convert_options=csv.ConvertOptions(column_types=_arrow_types(schema), strings_can_be_null=False,
                                                                                               quoted_strings_can_be_null=False))
    return table.combine_chunks().to_batches()[0] if table.num_rows else None


_brokers: dict[tuple[str, str, str, str | None], Broker] = {}
_brokers_lock = threading.Lock()


def connection(url: str, user: str, password: str, tls: str | None = None) -> Broker:
    """This process's connection to the server at `url` as `user` (over TLS pinned to the
    certificate `tls`, `Broker`), made on first use and kept: Spark reuses its Python
    workers, and the driver's source runner lives as long as the query."""
    key = (url, user, password, tls)
    with _brokers_lock:
        broker = _brokers.get(key)
        if broker is None or broker.nc.is_closed:
            broker = _brokers[key] = Broker(url, user, password, tls=tls)
        return broker


def _reader(broker: Broker, filter_subject: str, after: int | None):
    """A short-lived consumer's configuration: the messages after `after` that `filter_subject`
    selects (None: the newest of them only). A consumer is how a partner reads (its broker user
    may create consumers on its key groups' filters only), so it is also how a reader learns
    whether its key groups have anything new. Its name begins with the user's tag
    (`consumer_tag`): the origin deletes any consumer of its stream that no grant covers."""
    from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

    where = {"deliver_policy": DeliverPolicy.LAST} if after is None else {"deliver_policy": DeliverPolicy.BY_START_SEQUENCE, "opt_start_seq": after + 1}
    return ConsumerConfig(name=f"{broker.tag}-{uuid.uuid4().hex[:12]}", filter_subject=filter_subject, ack_policy=AckPolicy.NONE,
                          inactive_threshold=READER_IDLE_S, mem_storage=True, **where)


def _marks_and_times(data: bytes) -> list[tuple[int, int]]:
    """(mark, event time) of each line of a message, whatever the query's columns; a line that
    does not start with two whole numbers (another participant's stream may hold anything) is
    passed over."""
    out = []
    for line in data.splitlines():
        try:
            out.append(mark_and_time(line))
        except (ValueError, UnicodeDecodeError):
            continue
    return out


def _is_end(data: bytes) -> bool:
    """Whether a message's rows are end-of-input marks (the feeder ends each key group with one)."""
    marks = _marks_and_times(data)
    return bool(marks) and all(mark == MARK_END for mark, _ in marks)


async def _pending(broker: Broker, stream: str, filter_subject: str, after: int) -> int:
    """How many messages after sequence `after` `filter_subject` selects."""
    js, config = broker.js, _reader(broker, filter_subject, after)
    info = await js.add_consumer(stream, config)
    await js.delete_consumer(stream, config.name)
    return info.num_pending


async def _end_message(broker: Broker, stream: str, filter_subject: str, *, oldest: bool = False) -> tuple[int, bytes] | None:
    """(sequence, payload) of the message at one end of what `filter_subject` selects: the
    newest, or with `oldest` the oldest it still holds (None: none). Read through a consumer, as a partner
    reads: the stream's own state (its newest sequence over every key group, its size) is
    the origin's, and no partner may ask for it."""
    js, config = broker.js, _reader(broker, filter_subject, 0 if oldest else None)
    info = await js.add_consumer(stream, config)
    try:
        if not info.num_pending:
            return None
        sub = await js.pull_subscribe_bind(config.name, stream=stream)
        try:
            [msg] = await sub.fetch(1, timeout=10)
            return msg.metadata.sequence.stream, msg.data
        finally:
            await sub.unsubscribe()
    finally:
        await js.delete_consumer(stream, config.name)


async def _fetch(broker: Broker, stream: str, filter_subject: str, after: int, last: int) -> list[bytes]:
    """The payloads of the messages in (after, last] that `filter_subject` selects, in order."""
    js, config = broker.js, _reader(broker, filter_subject, after)
    name = config.name
    info = await js.add_consumer(stream, config)
    out: list[bytes] = []
    sub = None
    try:
        pending, upto = info.num_pending, after
        sub = await js.pull_subscribe_bind(name, stream=stream) if pending else None
        while pending:
            # Never more than the range can hold: a bounded batch leaves the rest to the next one.
            for msg in await sub.fetch(min(FETCH, pending, last - upto), timeout=10):
                upto = msg.metadata.sequence.stream
                if upto > last:
                    return out
                out.append(msg.data)
                pending = msg.metadata.num_pending
                if upto == last:
                    return out
        return out
    finally:
        if sub is not None:
            await sub.unsubscribe()
        await js.delete_consumer(stream, name)


class JetStreamReader(DataSourceStreamReader):
    def __init__(self, options: dict[str, str], schema: list[tuple[str, str]]) -> None:
        self.schema = schema
        options = {k.lower(): v for k, v in options.items()}  # Spark's option names are case-insensitive
        try:
            self.url, self.user, self.password, self.filter = (options[k] for k in ("url", "user", "password", "filter"))
        except KeyError as exc:
            raise ValueError(f"the {NAME} source needs the option {exc.args[0]!r}") from None
        self.tls = options.get("tls") or None
        self.stream = options.get("stream", INPUT)
        self.start = int(options.get("startseq", "0"))
        self.max_messages = int(options.get("maxmessagespertrigger", "0")) or None
        self._owed = options.get("owedbatch") == "true"  # until the first offset of this run of the query

    def initialOffset(self) -> dict:
        return {"seq": self.start}

    def latestOffset(self, start: dict | None = None, limit=None) -> dict:
        """The sequence of the newest message in this task's key groups, or `start` itself when
        nothing is newer: then Spark runs no micro-batch, and a task over key groups that receive
        nothing costs its participant next to nothing.

        Except when the query resumes from a checkpoint that owes a batch (`owedBatch`) with
        nothing new: then, once, an offset of the same sequence marked as one more
        resumption, which Spark plans as a batch without rows. Spark runs the batch that a
        new watermark owes (the one that emits the windows it closes) only after a batch of
        the same run; a query restarted from a checkpoint whose last batch moved the
        watermark on (`spark_agents.checkpoint.owes_watermark_batch`: a task stopped, failed
        or handed over just after reading the end of its input) would otherwise wait for
        input that may never come. The batch without rows runs with that watermark,
        restored from the commit log, and emits those windows."""
        broker = connection(self.url, self.user, self.password, self.tls)
        owed, self._owed = self._owed, False
        # Whether anything is new first (a consumer's count, the cheaper read), then where it ends.
        if start is not None and not broker.read(lambda: _pending(broker, self.stream, self.filter, int(start["seq"]))):
            return {**start, "resumed": int(start.get("resumed", 0)) + 1} if owed else start
        last = broker.read(lambda: _end_message(broker, self.stream, self.filter))
        newest = self.start if last is None else last[0]
        if start is not None:  # never back (what was new may be trimmed by the time its end is read)
            newest = max(newest, int(start["seq"]))
            if self.max_messages is not None:
                newest = min(newest, int(start["seq"]) + self.max_messages)
        return {"seq": newest}

    def partitions(self, start: dict, end: dict) -> list[SeqRange]:
        after, last = int(start["seq"]), int(end["seq"])
        return [SeqRange(after, last)] if last > after else []

    def read(self, partition: SeqRange) -> Iterator:
        broker = connection(self.url, self.user, self.password, self.tls)
        chunks = broker.read(lambda: _fetch(broker, self.stream, self.filter, partition.after, partition.last))
        batch = parse(chunks, self.schema)
        if batch is not None:
            yield batch

    def commit(self, end: dict) -> None:
        pass


class JetStreamSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> str:
        raise ValueError(f"the {NAME} source reads the columns its reader gives: read it with .schema(ddl), "
                         "the reading query's line schema (bpm.records.Records.wire_ddl)")

    def streamReader(self, schema) -> JetStreamReader:
        # The stream's lines have the columns the reading query gives (`JetStreamInput.ddl`).
        return JetStreamReader(dict(self.options), [(f.name, f.dataType.simpleString().upper()) for f in schema.fields])


def register(spark) -> str:
    """Make the `bpm_jetstream` source known to `spark` (again is harmless); the name to read it by there (`register_source`)."""
    return register_source(spark, JetStreamSource)


@dataclass(frozen=True)
class JetStreamInput:
    """A task's input: the key groups `prefix` of input `input` of `participant`'s stream on the server at `url`,
    read as `user` (the password never shows in its repr), over TLS pinned to the server's
    certificate `tls` (PEM; None: plain text), after sequence `start_seq` for a fresh task;
    of its rows, those with event time in [`since_s`, `until_s`) (epoch seconds, window
    starts; None: unbounded), for tasks split or merged (`hand_over`)."""

    url: str
    user: str
    password: str = field(repr=False)
    participant: str
    prefix: str = ""
    start_seq: int = 0
    max_messages: int | None = None
    since_s: int | None = None
    until_s: int | None = None
    tls: str | None = field(default=None, repr=False)
    input: str = MAIN

    @classmethod
    def at(cls, where: StreamLocation, user: str, password: str, tls: str | None = None) -> JetStreamInput:
        """The input of the key groups `where` names, read as `user`."""
        return cls(where.url, user, password, where.participant, where.prefix, tls=tls, input=where.input)

    @property
    def where(self) -> StreamLocation:
        return StreamLocation(self.url, self.participant, self.prefix, self.input)

    @property
    def location(self) -> str:
        """Where it reads, without the credential (`bpm.keygroups.StreamLocation`)."""
        return str(self.where)

    def connection(self) -> Broker:
        """This process's connection to the server as the input's user."""
        return connection(self.url, self.user, self.password, self.tls)

    def _end_message(self, oldest: bool = False) -> tuple[int, bytes] | None:
        """(sequence, payload) of the message at one end of its key groups: the newest (with
        `oldest`, the oldest they still hold), read as a partner reads, through a consumer on them (None: none yet)."""
        broker = self.connection()
        return broker.read(lambda: _end_message(broker, INPUT, self.where.filter, oldest=oldest))

    def newest_time_us(self) -> int | None:
        """The newest event time its key groups hold, microseconds: the time of the last line
        of their newest message, the feeder's tick or end-of-input mark (None: they hold
        nothing): what bounds the time of a task's results (`spark_agents.broker.results.final_bound`)."""
        last = self._end_message()
        return max((ts for _, ts in _marks_and_times(last[1])), default=None) if last else None

    def oldest_time_us(self) -> int | None:
        """The oldest event time its key groups still hold, microseconds: of the first line of
        their oldest message (None: they hold nothing)."""
        first = self._end_message(oldest=True)
        return min((ts for _, ts in _marks_and_times(first[1])), default=None) if first else None

    def newest_seq(self) -> int:
        """The sequence of the newest message in its key groups (0: none yet)."""
        last = self._end_message()
        return 0 if last is None else last[0]

    def has_ended(self) -> bool:
        """Whether the newest message of its key groups is an end-of-input mark (the feeder ends
        each key group's input with one): a host asks it of the stream of a task it hosts for another."""
        last = self._end_message()
        return last is not None and _is_end(last[1])

    def pending(self, after: int) -> int:
        """How many messages of its key groups the stream holds after sequence `after`."""
        broker = self.connection()
        return broker.read(lambda: _pending(broker, INPUT, self.where.filter, after))

    def present_end(self, look_back: int = 256) -> tuple[int, int | None]:
        """(the stream's newest sequence, the newest event time its input holds then, None when
        empty): from the input's last message that holds rows, which the feeder ends each flush
        with a tick at the newest event time it admitted; up to `look_back` of the input's
        messages back (a split on a stream of 3,600 connections a second once read no rows in
        its last message, and ended the old task at time 0). The input's messages are read
        through a consumer on its subjects, from ever further back: the other inputs of the
        stream, however busy, are neither read nor counted.

        Raises `InputEnded` when that message is an end-of-input mark: the input is closed,
        and no time hands key groups over (the old task would wait for windows past its
        last, and new tasks reading after the mark would never see their input end)."""
        broker = self.connection()
        last = broker.last_seq()
        whole = replace(self.where, prefix="").filter  # every key group of the input
        span = look_back
        while True:
            after = max(0, last - span)
            tail = broker.read(lambda: _fetch(broker, INPUT, whole, after, last))[-look_back:]
            for data in reversed(tail):
                marks = _marks_and_times(data) if data else []
                if marks:
                    if _is_end(data):
                        raise InputEnded(f"input {self.input} of {self.participant}'s stream has ended (an end-of-input mark)")
                    return last, max(ts for _, ts in marks)
            if after == 0 or len(tail) >= look_back:
                return last, None
            span *= 4

    def options(self, owed_batch: bool = False) -> dict[str, str]:
        options = {"url": self.url, "user": self.user, "password": self.password,
                   "filter": self.where.filter, "startSeq": str(self.start_seq)}
        if self.tls is not None:
            options["tls"] = self.tls
        if self.max_messages is not None:
            options["maxMessagesPerTrigger"] = str(self.max_messages)
        if owed_batch:
            options["owedBatch"] = "true"
        return options

    def read(self, spark, ddl: str, owed_batch: bool = False):
        """The streaming DataFrame of the rows, whose lines have the columns `ddl`
        (`bpm.records.Records.wire_ddl` of the task's query); `owed_batch`: the query resumes
        from a checkpoint that owes the batch of a new watermark."""
        return spark.readStream.format(register(spark)).schema(ddl).options(**self.options(owed_batch)).load()


class InputEnded(ValueError):
    """A stream whose input has ended (its newest records are end-of-input marks)."""


def hand_over(old: Sequence[JetStreamInput], prefixes: Sequence[str], window_s: int) -> tuple[list[JetStreamInput], list[JetStreamInput]]:
    """The tasks over `old` hand their key groups over to new tasks over `prefixes` (the
    halves of one old task: a split; the one share two old halves make: a merge), at
    `bpm.negotiation.granularity.split_time`: (the old inputs, each now ending at that time,
    the new ones, from that time on, read after the stream's present end). The old tasks
    resume from their checkpoints over their new inputs and complete every window before
    the time; the new ones start fresh. A stream whose input has ended hands nothing over
    (`InputEnded`)."""
    first = old[0]
    if any((o.url, o.participant, o.input, o.until_s) != (first.url, first.participant, first.input, None) for o in old):
        raise ValueError("only running tasks of one input of one stream hand their key groups over, each once")
    after, newest = first.present_end()
    if newest is None and after:
        raise ValueError(f"the last messages of {first.participant}'s stream hold no event time: no time to hand key groups over at")
    at = 0 if newest is None else split_time(newest, window_s)
    return ([replace(o, until_s=at) for o in old],
            [replace(first, prefix=check_prefix(p), start_seq=after, since_s=at, until_s=None) for p in prefixes])
