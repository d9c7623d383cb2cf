"""Failure detection by heartbeat timeout.

A host process beats (`HeartbeatFile`: the time, written to a file every interval, by a
thread of the process itself, so the beats stop when the process dies or hangs). A watcher
(`HeartbeatWatcher`) reads the last beat through any function (the file, the registry's
liveness, an HTTP status) and calls its `on_failure` once the host has been silent for
longer than the timeout. It asks no one: the failover starts as soon as one watcher
notices, and fencing makes a wrong guess (a host that was only slow) safe.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

DEFAULT_TIMEOUT_S = 3.0


def silent(last_beat: float | None, since: float, now: float, timeout_s: float) -> bool:
    """Whether a host has been silent past the timeout: no beat for `timeout_s` (counted from
    its last beat, or from `since`, when the watch began, if it never beat)."""
    return now - (last_beat if last_beat is not None else since) > timeout_s


class HeartbeatFile:
    """Beats by writing the time to `path` every `interval_s`, on a daemon thread of this process."""

    def __init__(self, path: str | Path, interval_s: float = 0.25) -> None:
        self.path = Path(path)
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bpm-heartbeat", daemon=True)

    def beat(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        temp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        temp.write_text(repr(time.time()))
        os.replace(temp, self.path)

    def _run(self) -> None:
        while True:
            self.beat()
            if self._stop.wait(self.interval_s):
                return

    def start(self) -> HeartbeatFile:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=self.interval_s + 1)


def read_heartbeat(path: str | Path) -> float | None:
    """The time of the last beat written to `path` (None: never, or unreadable)."""
    try:
        return float(Path(path).read_text())
    except (OSError, ValueError):
        return None


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
