"""Failure detection by heartbeat timeout, over the network.

A host process beats (`HeartbeatSender`: a UDP datagram to the watcher's address every
interval, from a thread of the process itself, so the beats stop when the process dies or
hangs, and when its host is cut off from the watcher). Each beat is signed with a key the
two share (HMAC-SHA256 over the sender's name and a counter, the sender's time in
nanoseconds, never repeated); `HeartbeatReceiver` keeps, per sender, when (on its own clock)
it last received a valid beat, and drops forged, malformed and replayed ones: a counter
not above the sender's last, or further than `FRESH_S` from the receiver's own time (a beat
recorded and sent again later, even to a receiver that restarted since). A watcher (`HeartbeatWatcher`) reads the last beat through any
function (a receiver, the registry's liveness, an HTTP status) and calls its `on_failure`
once the host has been silent for longer than the timeout. It asks no one: the failover
starts as soon as one watcher notices, and fencing makes a wrong guess (a host that was
only slow, or only unreachable) safe.
"""

from __future__ import annotations

import hashlib
import hmac
import socket
import struct
import threading
import time
from collections.abc import Callable

from bpm.names import check_participant, is_participant

DEFAULT_TIMEOUT_S = 3.0
FRESH_S = 30.0  # a beat's time may differ this much from its receiver's: clocks of separate hosts differ a little
_COUNTER = struct.Struct("!Q")
_MAC_BYTES = 32


def silent(last_beat: float | None, since: float, now: float, timeout_s: float) -> bool:
    """Whether a host has been silent past the timeout: no beat for `timeout_s` (counted from
    its last beat, or from `since`, when the watch began, if it never beat)."""
    return now - (last_beat if last_beat is not None else since) > timeout_s


def _mac(key: bytes, body: bytes) -> bytes:
    return hmac.new(key, body, hashlib.sha256).digest()


def beat_datagram(key: bytes, name: str, counter: int) -> bytes:
    """One beat: the counter, the sender's name, and their MAC under `key`."""
    body = _COUNTER.pack(counter) + name.encode()
    return body + _mac(key, body)


def parse_beat(key: bytes, data: bytes) -> tuple[str, int] | None:
    """(sender, counter) of a valid beat; None for anything forged or malformed."""
    if len(data) < _COUNTER.size + 1 + _MAC_BYTES:
        return None
    body, mac = data[:-_MAC_BYTES], data[-_MAC_BYTES:]
    if not hmac.compare_digest(mac, _mac(key, body)):
        return None
    name = body[_COUNTER.size:].decode("ascii", errors="replace")
    return (name, _COUNTER.unpack(body[:_COUNTER.size])[0]) if is_participant(name) else None


class HeartbeatReceiver:
    """Receives signed beats on a UDP port of `address`; `last_beat(name)` is when the last valid one from `name` arrived."""

    def __init__(self, key: bytes, address: str = "127.0.0.1", port: int = 0, clock: Callable[[], float] = time.time) -> None:
        self.key = key
        self.clock = clock
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self._sock.bind((address, port))
        self.address: tuple[str, int] = self._sock.getsockname()
        self._last: dict[str, tuple[int, float]] = {}  # sender -> (its newest counter, when it arrived)
        self.refused = 0
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bpm-heartbeat-receive", daemon=True)

    def start(self) -> HeartbeatReceiver:
        self._thread.start()
        return self

    def _run(self) -> None:
        while True:
            try:
                data = self._sock.recv(512)
            except OSError:
                return  # closed
            if self._closed.is_set():
                return
            beat = parse_beat(self.key, data)
            with self._lock:
                newest = self._last.get(beat[0]) if beat else None
                now = self.clock()
                if beat is None or (newest is not None and beat[1] <= newest[0]) or abs(beat[1] / 1e9 - now) > FRESH_S:
                    self.refused += 1  # forged, malformed, or a replay of an older beat
                    continue
                self._last[beat[0]] = (beat[1], now)

    def last_beat(self, name: str) -> float | None:
        with self._lock:
            newest = self._last.get(name)
        return None if newest is None else newest[1]

    def close(self) -> None:
        self._closed.set()
        try:
            self._sock.shutdown(socket.SHUT_RDWR)  # wakes the receiving thread
        except OSError:
            pass
        self._sock.close()
        if self._thread.is_alive():
            self._thread.join(timeout=1)


class HeartbeatSender:
    """Beats as `name` to `to` (address, port) every `interval_s`, on a daemon thread of this
    process. A beat that cannot be sent (no route while the host is cut off) is skipped."""

    def __init__(self, name: str, key: bytes, to: tuple[str, int], interval_s: float = 0.25) -> None:
        check_participant(name)
        self.name, self.key, self.to, self.interval_s = name, key, to, interval_s
        self._counter = 0
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bpm-heartbeat", daemon=True)

    def beat(self) -> None:
        self._counter = max(self._counter + 1, time.time_ns())  # the time of the beat, growing across restarts
        try:
            self._sock.sendto(beat_datagram(self.key, self.name, self._counter), self.to)
        except OSError:
            pass  # unreachable: the watcher hears silence, which is the point

    def _run(self) -> None:
        while True:
            self.beat()
            if self._stop.wait(self.interval_s):
                return

    def start(self) -> HeartbeatSender:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=self.interval_s + 1)
        self._sock.close()


class HeartbeatWatcher:
    """Watches one host and calls `on_failure(detected_at, last_beat)` once it is silent past `timeout_s`.

    It sleeps until the moment the host would become silent past the timeout (checking at
    least every `poll_s`), so detection comes at most a few milliseconds after that moment.

    Attributes:
        detected_at: when the failure was detected (None while the host lives).
        last_beat: the host's last beat as of the detection.
    """

    def __init__(self, last_beat: Callable[[], float | None], timeout_s: float = DEFAULT_TIMEOUT_S,
                 on_failure: Callable[[float, float | None], None] | None = None, poll_s: float = 0.05,
                 clock: Callable[[], float] = time.time) -> None:
        self.last_beat_of = last_beat
        self.timeout_s = timeout_s
        self.on_failure = on_failure
        self.poll_s = poll_s
        self.clock = clock
        self.detected_at: float | None = None
        self.last_beat: float | None = None
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bpm-heartbeat-watch", daemon=True)

    def start(self) -> HeartbeatWatcher:
        self._since = self.clock()
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            now = self.clock()
            beat = self.last_beat_of()
            if silent(beat, self._since, now, self.timeout_s):
                self.detected_at, self.last_beat = now, beat
                if self.on_failure is not None:
                    try:
                        self.on_failure(now, beat)
                    except BaseException as exc:  # noqa: BLE001 - kept for the caller, which reports it
                        self.error = exc
                return
            due = (beat if beat is not None else self._since) + self.timeout_s - now
            self._stop.wait(min(self.poll_s, max(0.001, due + 0.001)))

    def wait(self, timeout_s: float | None = None) -> float | None:
        """Wait until a failure was detected (and its handler ran); returns when it was detected."""
        self._thread.join(timeout_s)
        return self.detected_at

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=self.poll_s + 1)
