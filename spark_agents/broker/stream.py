"""A participant's input stream in its own NATS JetStream, and a blocking client for it.

The stream `INPUT` on the participant's server holds every key group's subject
(`bpm.keygroups`). A message is a chunk of rows of one key group — lines in the stream's
format (`bpm.records`), the last a punctuation mark that moves the key group's event time — so a
reader takes thousands of rows per message. `BrokerStream.append(k, lines)` publishes one
such chunk to key group k, which is what `spark_agents.streams.feed.RecordFeeder` writes through
(partitioning rule: crc32 of the record's key).

nats-py is asynchronous; `Broker` runs its connection on a loop in a thread of its own so
that agents, feeders and tests call it from ordinary code.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Sequence
from typing import Any, TypeVar

import nats
from nats.js.api import StorageType, StreamConfig

from bpm.keygroups import KEY_GROUPS, MAIN, stream_subjects, subject
from spark_agents.broker.server import BrokerError
from spark_agents.broker.subjects import INPUT, consumer_tag, inbox_prefix

T = TypeVar("T")


# How long a read waits out a server whose JetStream answers no request (`through_reload`).
RELOAD_WAIT_S = 5.0


async def through_reload(make: Callable[[], Awaitable[T]], refusals: Sequence[str] = (), wait_s: float = RELOAD_WAIT_S) -> T:
    """`await make()`, made again while the server's JetStream answers no request
    (ServiceUnavailableError: no responders, or "JetStream not enabled for account") for up
    to `wait_s`, and once more after a request went unanswered (a timeout) unless the server
    reported a permission refused meanwhile (a new entry in `refusals`, the connection's
    list of them): that answer stands. A server reloading its accounts
    (`BrokerServer.reload`: a grant or a revoke of a partner's access) answers so for a
    moment, or drops a request: a read then failed a task's micro-batch, or the demo's read
    of the results. For reads only, which change nothing when unanswered."""
    loop = asyncio.get_running_loop()
    deadline, pause, timed_out = loop.time() + wait_s, 0.05, False
    while True:
        seen = len(refusals)
        try:
            return await make()
        except nats.js.errors.ServiceUnavailableError:
            if loop.time() + pause > deadline:
                raise
        except nats.errors.TimeoutError:
            if timed_out or len(refusals) > seen:
                raise
            timed_out = True
        await asyncio.sleep(pause)
        pause = min(2 * pause, 1.0)


def _not_a_tls_close(record: logging.LogRecord) -> bool:
    """asyncio warns each time a TLS peer closes a NATS connection (nats-py's protocol asks to
    keep it half open, which TLS cannot): the connection closes as it should, and a broker
    that stops or a partner that leaves would fill the logs with it."""
    return not record.getMessage().startswith("returning true from eof_received() has no effect when using ssl")


logging.getLogger("asyncio").addFilter(_not_a_tls_close)


CONNECT_TRIES = 4  # a server that refuses the first connection (not up yet, restarting) is tried again
CONNECT_PAUSE_S = 2.0


async def connect(url: str, user: str, password: str, tls: str | None, *, reconnect_attempts: int, **options: Any) -> nats.NATS:
    """A connection to the server at `url` as `user`: over TLS that trusts the certificate
    `tls` (PEM) and nothing else, or in plain text for None. A refused connection is tried
    `CONNECT_TRIES` times, a failed TLS handshake not at all: nats-py, left to retry one
    itself, waits forever. Once connected, a lost connection is made again up to
    `reconnect_attempts` times (-1: forever), as nats-py does."""
    import ssl

    if tls is not None:
        from spark_agents.tls import pinned_context

        options["tls"] = pinned_context(tls)
    for attempt in range(1, CONNECT_TRIES + 1):
        try:
            nc = await nats.connect(url, user=user, password=password, allow_reconnect=False, inbox_prefix=inbox_prefix(user), **options)
            break
        except (OSError, asyncio.TimeoutError) as exc:
            if isinstance(exc, ssl.SSLError) or attempt == CONNECT_TRIES:
                raise
            await asyncio.sleep(CONNECT_PAUSE_S)
    nc.options["allow_reconnect"] = True  # read by the client when a connection is lost
    nc.options["max_reconnect_attempts"] = reconnect_attempts
    return nc


class Broker:
    """A blocking connection to one NATS server, as one user; over TLS to a server that shows
    the certificate `tls` (PEM, `spark_agents.tls.pinned_context`), else in plain text."""

    def __init__(self, url: str, user: str, password: str, *, tls: str | None = None, timeout_s: float = 10.0) -> None:
        self.url = url
        self.user = user
        self.tag = consumer_tag(user, password)  # begins the names of the consumers it makes
        self.timeout_s = timeout_s
        self._refusals: list[str] = []  # permission violations the server reported, newest last
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name=f"nats {url}", daemon=True)
        self._thread.start()
        try:
            self.nc = self.call(connect(url, user, password, tls, reconnect_attempts=3, connect_timeout=timeout_s, error_cb=self._on_error))
        except Exception as exc:
            self._stop_loop()
            raise BrokerError(f"cannot connect to {url} as {user} (is the server up, the user's password right, and its TLS "
                              f"{'the certificate pinned' if tls else 'off'}?): {type(exc).__name__}: {exc}") from exc
        self.js = self.nc.jetstream(timeout=timeout_s)

    async def _on_error(self, exc: Exception) -> None:
        if "permissions violation" in str(exc).lower():
            self._refusals.append(str(exc).strip())

    def call(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run `coro` on the connection's loop; a request the server refused for the user's
        permissions (it answers nothing, so the request times out) raises BrokerError saying so."""
        seen = len(self._refusals)
        try:
            return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout=self.timeout_s * 3)
        except nats.errors.TimeoutError:
            if len(self._refusals) > seen:
                raise BrokerError(f"refused by {self.url}: {self._refusals[-1]}") from None
            raise

    def read(self, make: Callable[[], Awaitable[T]]) -> T:
        """`call` of the read `make()` makes, through a reload of the server's accounts (`through_reload`)."""
        return self.call(through_reload(make, self._refusals))

    def ensure_stream(self, participant: str, max_bytes: int = 1 << 30) -> None:
        """Create the participant's input stream if it does not exist (its server's storage, files)."""
        config = StreamConfig(name=INPUT, subjects=[stream_subjects(participant)], storage=StorageType.FILE, max_bytes=max_bytes)

        async def ensure() -> None:
            try:
                await self.js.stream_info(INPUT)
            except nats.js.errors.NotFoundError:
                await self.js.add_stream(config)

        self.call(ensure())

    def last_seq(self, stream: str = INPUT) -> int:
        """The sequence of the newest message of the stream (0 when empty)."""
        return self.call(self.js.stream_info(stream)).state.last_seq

    def publish(self, subject_: str, payload: bytes) -> int:
        """Publish and wait for the stream's acknowledgement; returns the message's sequence."""
        return self.call(self.js.publish(subject_, payload, stream=INPUT)).seq

    def close(self) -> None:
        try:
            if not self.nc.is_closed:
                self.call(self.nc.drain())
        finally:
            self._stop_loop()

    def _stop_loop(self) -> None:
        async def cancel_the_rest() -> None:
            rest = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in rest:
                task.cancel()
            await asyncio.gather(*rest, return_exceptions=True)

        try:
            asyncio.run_coroutine_threadsafe(cancel_the_rest(), self._loop).result(timeout=5)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=5)

    def __enter__(self) -> Broker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class BrokerStream:
    """Input `input` of `participant`'s stream as the feeder writes it: `append(k, lines)`
    publishes one message of key group `k`'s lines (`bpm.records`)."""

    partitions = KEY_GROUPS

    def __init__(self, broker: Broker, participant: str, input: str = MAIN) -> None:
        self.broker = broker
        self.participant = participant
        self.subjects = [subject(participant, k, input) for k in range(KEY_GROUPS)]
        broker.ensure_stream(participant)

    def append(self, k: int, lines: Iterable[str]) -> int:
        return self.broker.publish(self.subjects[k], "".join(lines).encode())
