"""Quotas: how much of the registry one participant, or one address, may use, so that none
crowds out the others. Past a quota the registry answers 429 with `Retry-After`, before it
does the work.

- `events`: events a participant reports (`POST /events`), per second, with a burst;
- `proposals`: contracts a participant proposes (`POST /contracts`), per second, with a burst;
- `bad_keys`: requests with a missing or unknown key from one address, per second, with a
  burst; past it the address gets 429 before any key it sends is looked up;
- `FEED_STREAMS`: change-feed streams (`GET /changes/stream`) open at once with one key.

The buckets live in the worker's memory: with several workers, each enforces its own, so a
participant gets up to that many times the rate. They hold no state another worker needs.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from api.errors import TooManyRequests


@dataclass(frozen=True)
class Rate:
    per_s: float
    burst: float


RATES = {
    "events": Rate(per_s=5.0, burst=50.0),
    "proposals": Rate(per_s=1.0, burst=20.0),
    "bad_keys": Rate(per_s=2.0, burst=20.0),
}
FEED_STREAMS = 16  # a person with a page open in several tabs, and the streams of pages just closed
_MAX_BUCKETS = 100_000  # forgotten oldest first: a full bucket is the same as none


class Quotas:
    """Token buckets per (action, who), and the change-feed streams open per key."""

    def __init__(self, rates: dict[str, Rate] | None = None, clock: Callable[[], float] = time.monotonic, feed_streams: int = FEED_STREAMS) -> None:
        self.rates = dict(RATES if rates is None else rates)
        self.clock = clock
        self.feed_streams = feed_streams
        self._buckets: dict[tuple[str, str], tuple[float, float]] = {}  # (tokens, at)
        self._streams: dict[str, int] = {}
        self._lock = threading.Lock()

    def _level(self, action: str, who: str, now: float) -> float:
        rate = self.rates[action]
        tokens, at = self._buckets.get((action, who), (rate.burst, now))
        return min(rate.burst, tokens + (now - at) * rate.per_s)

    def check(self, action: str, who: str) -> None:
        """429 if `who` has no `action` left now (takes none)."""
        with self._lock:
            if self._level(action, who, self.clock()) < 1.0:
                raise self._refusal(action, who)

    def take(self, action: str, who: str) -> None:
        """Take one `action` for `who`, or 429 with how long until one is free."""
        with self._lock:
            now = self.clock()
            tokens = self._level(action, who, now)
            if tokens < 1.0:
                raise self._refusal(action, who)
            if len(self._buckets) >= _MAX_BUCKETS:
                self._buckets.pop(next(iter(self._buckets)))
            self._buckets.pop((action, who), None)
            self._buckets[(action, who)] = (tokens - 1.0, now)

    def _refusal(self, action: str, who: str) -> TooManyRequests:
        rate = self.rates[action]
        tokens = self._level(action, who, self.clock())
        wait = max(1, math.ceil((1.0 - tokens) / rate.per_s))
        return TooManyRequests(f"{who} is over its quota of {action}: {rate.per_s:g} a second (bursts of {rate.burst:g}); retry in {wait} s",
                               retry_after_s=wait)

    def open_stream(self, key_id: str, who: str) -> Callable[[], None]:
        """Count a change-feed stream open for a key (`key_id`, its hash); 429 past `feed_streams`.
        Returns the function that counts it closed."""
        with self._lock:
            if self._streams.get(key_id, 0) >= self.feed_streams:
                raise TooManyRequests(f"{who} has {self.feed_streams} change-feed streams open, the most one key may; close one first",
                                      retry_after_s=5)
            self._streams[key_id] = self._streams.get(key_id, 0) + 1
        closed = threading.Event()

        def close() -> None:
            if closed.is_set():
                return
            closed.set()
            with self._lock:
                left = self._streams.get(key_id, 1) - 1
                if left:
                    self._streams[key_id] = left
                else:
                    self._streams.pop(key_id, None)

        return close
