"""Quotas: how much of the registry one participant, or one address, may use, so that none
crowds out the others. Past a quota the registry answers 429 with `Retry-After`, before it
does the work.

- `events`: events a participant reports (`POST /events`), per second, with a burst;
- `proposals`: contracts a participant proposes (`POST /contracts`), per second, with a burst;
- `bad_keys`: requests with an unknown key from one address, per second, with a burst; past
  it the address gets 429, and a worker that refused it refuses it again before it looks up
  any key it sends, until a key is free again;
- `FEED_STREAMS`: change-feed streams (`GET /changes/stream`) open at once with one key.

The rates are token buckets kept in the database (`quota_buckets`), each taken from in one
statement, so that every worker of the registry, on one machine or several, counts against
the same bucket. So are the change-feed streams: a stream holds one of its key's
`FEED_STREAMS` slots (`feed_stream_slots`) for `FEED_SLOT_S`, renewed while it lasts
(`FEED_RENEW_S`), so that the streams a worker held when it died are free again by then.
"""

from __future__ import annotations

import math
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from sqlalchemy import bindparam, case, delete, select, update
from sqlalchemy.engine import Connection

from api.db import insert_on_conflict
from api.errors import TooManyRequests
from api.models import FeedStreamSlot, QuotaBucket


@dataclass(frozen=True)
class Slot:
    """A change-feed stream's slot: the key's (its hash), which one, and the stream's name."""

    key_id: str
    slot: int
    holder: str

    def params(self) -> dict:
        return {"its_key": self.key_id, "its_slot": self.slot, "its_holder": self.holder}


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
FEED_SLOT_S = 30.0  # how long a stream's slot is held without being renewed
FEED_RENEW_S = 10.0  # how often a stream renews its slot: a stalled renewal or two leaves it held
_WHO_LENGTH = QuotaBucket.who.type.length
_MAX_REMEMBERED = 100_000  # addresses a worker remembers refusing: forgotten oldest first
PRUNE_S = 60.0  # how often a worker deletes the buckets that have filled up again (a full bucket is the same as none)

_buckets = QuotaBucket.__table__
_now, _per_s, _burst = bindparam("now"), bindparam("per_s"), bindparam("burst")
_level = _buckets.c.tokens + (_now - _buckets.c.at) * _per_s  # of the stored bucket, refilled until now
_refilled = case((_level > _burst, _burst), else_=_level)
_LEVEL = select(_buckets.c.tokens, _buckets.c.at).where(_buckets.c.action == bindparam("action"), _buckets.c.who == bindparam("who"))


def _take(dialect: str):
    """One token of the bucket (action, who), made full, refilled and taken from in one
    statement: it returns the tokens left, or no row when none was there to take."""
    return (insert_on_conflict(dialect, _buckets).values(action=bindparam("action"), who=bindparam("who"), tokens=_burst - 1, at=_now)
            .on_conflict_do_update(index_elements=[_buckets.c.action, _buckets.c.who], set_={"tokens": _refilled - 1, "at": _now},
                                   where=_refilled >= 1)
            .returning(_buckets.c.tokens))


_TAKE = {dialect: _take(dialect) for dialect in ("postgresql", "sqlite")}

_slots = FeedStreamSlot.__table__
_HELD = select(_slots.c.slot).where(_slots.c.key_id == bindparam("key_id"), _slots.c.until >= _now)
# (bound names other than the columns': an UPDATE keeps those for its SET clause)
_ITS = (_slots.c.key_id == bindparam("its_key"), _slots.c.slot == bindparam("its_slot"), _slots.c.holder == bindparam("its_holder"))
_RENEW = update(_slots).where(*_ITS).values(until=bindparam("its_until"))
_FREE = delete(_slots).where(*_ITS)


def _claim(dialect: str):
    """Slot (key_id, slot) for stream `holder`, unless another stream holds it: one statement,
    which returns the slot, or no row when it is held (the database decides between two
    workers claiming it)."""
    values = {"holder": bindparam("holder"), "until": bindparam("until")}
    return (insert_on_conflict(dialect, _slots).values(key_id=bindparam("key_id"), slot=bindparam("slot"), **values)
            .on_conflict_do_update(index_elements=[_slots.c.key_id, _slots.c.slot], set_=values,
                                   where=_slots.c.until < _now)
            .returning(_slots.c.slot))


_CLAIM = {dialect: _claim(dialect) for dialect in ("postgresql", "sqlite")}


class Quotas:
    """Token buckets per (action, who) and change-feed streams' slots in the database; in this
    worker, the addresses it refused for unknown keys. `clock`: wall-clock seconds, the same
    on every worker."""

    def __init__(self, rates: dict[str, Rate] | None = None, clock: Callable[[], float] = time.time, feed_streams: int = FEED_STREAMS) -> None:
        self.rates = dict(RATES if rates is None else rates)
        self.clock = clock
        self.feed_streams = feed_streams
        self._refused: dict[str, float] = {}  # address -> until when it waits (bad keys)
        self._pruned_at = 0.0
        self._lock = threading.Lock()

    def take(self, db: Connection, action: str, who: str) -> None:
        """Take one `action` for `who` in `db`'s transaction, or 429 with how long until one is free."""
        rate, now = self.rates[action], self.clock()
        values = {"action": action, "who": who[:_WHO_LENGTH], "now": now, "per_s": rate.per_s, "burst": rate.burst}
        if db.execute(_TAKE[db.dialect.name], values).first() is None:
            stored = db.execute(_LEVEL, values).one()
            free_in_s = (1.0 - min(rate.burst, stored.tokens + (now - stored.at) * rate.per_s)) / rate.per_s
            wait = max(1, math.ceil(free_in_s))
            if action == "bad_keys":
                self._remember(who, now + free_in_s)
            raise TooManyRequests(f"{who} is over its quota of {action}: {rate.per_s:g} a second (bursts of {rate.burst:g}); retry in {wait} s",
                                  retry_after_s=wait)
        if now - self._pruned_at >= PRUNE_S:
            self._pruned_at = now
            for name, each in self.rates.items():  # full again by now: the same as no bucket
                db.execute(delete(_buckets).where(_buckets.c.action == name, _buckets.c.at < now - each.burst / each.per_s))
            db.execute(delete(_slots).where(_slots.c.until < now))  # the slots of streams whose worker died

    def check_address(self, address: str) -> None:
        """429 if this worker refused `address` for unknown keys and no key is free for it yet (takes none)."""
        with self._lock:
            until = self._refused.get(address)
            if until is None:
                return
            wait = until - self.clock()
            if wait <= 0:
                del self._refused[address]
                return
        rate = self.rates["bad_keys"]
        raise TooManyRequests(f"{address} is over its quota of bad_keys: {rate.per_s:g} a second (bursts of {rate.burst:g}); "
                              f"retry in {math.ceil(wait)} s", retry_after_s=math.ceil(wait))

    def _remember(self, address: str, until: float) -> None:
        with self._lock:
            if len(self._refused) >= _MAX_REMEMBERED:
                self._refused.pop(next(iter(self._refused)))
            self._refused[address] = until

    def open_stream(self, db: Connection, key_id: str, who: str) -> Slot:
        """Hold a change-feed stream's slot for a key (`key_id`, its hash) in `db`'s
        transaction, or 429 when the key's streams hold all `feed_streams`, on any worker.
        Returns the slot, to renew (`renew_stream`) and to free (`close_stream`)."""
        now = self.clock()
        held = set(db.scalars(_HELD, {"key_id": key_id, "now": now}))
        claim = {"key_id": key_id, "holder": secrets.token_hex(16), "now": now, "until": now + FEED_SLOT_S}
        for slot in range(self.feed_streams):
            if slot not in held and db.execute(_CLAIM[db.dialect.name], {**claim, "slot": slot}).first() is not None:
                return Slot(key_id, slot, claim["holder"])
        raise TooManyRequests(f"{who} has {self.feed_streams} change-feed streams open, the most one key may; close one first",
                              retry_after_s=5)

    def renew_stream(self, db: Connection, slot: Slot) -> bool:
        """Hold the slot `FEED_SLOT_S` more; False when the stream lost it (unrenewed past that, freed, maybe another's now)."""
        return db.execute(_RENEW, {**slot.params(), "its_until": self.clock() + FEED_SLOT_S}).rowcount == 1

    @staticmethod
    def close_stream(db: Connection, slot: Slot) -> None:
        """Free the slot of a stream that has ended."""
        db.execute(_FREE, slot.params())
