"""What a participant's agent must read again, from the change notices its heartbeats bring
(pure bookkeeping: the agent does the reading).

The registry leaves a notice for every change that concerns a participant, of one kind
(`api.services.changes.KINDS`); a heartbeat brings the notices not acknowledged yet and
acknowledges those the agent has read since. A kind is stale from its notice (or from a
write of the agent's own, or a lost race) until the agent reads it again; every
`resync_s` everything is read again whatever the notices said, and the signing keys are
read before anything else (the ones that verify its callers' tokens).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field

# The kinds of record an agent reads, in the order it reads them again: an offer newly
# accepted means tasks moved, so tasks come after offers.
KINDS = ("contract", "offer", "task")
KEYS = "keys"  # a rotation of the registry's signing keys: not a record, read before the rest


@dataclass
class Reads:
    """One agent's bookkeeping of what to read.

    Attributes:
        stale: the kinds to read again before acting on them (at first, all).
        notices: change notices not read yet, by id: their kind.
        acknowledge: the ids of the notices read since the last heartbeat, to acknowledge with the next.
        resync_s: how often everything is read again, whatever the notices said.
        read_all_at: when everything was last due.
    """

    resync_s: float
    read_all_at: float
    stale: set[str] = field(default_factory=lambda: set(KINDS))
    notices: dict[int, str] = field(default_factory=dict)
    acknowledge: set[int] = field(default_factory=set)

    def mark(self, kinds: Iterable[str]) -> None:
        """Read `kinds` again before acting on them."""
        self.stale.update(kinds)

    def noticed(self, notices: Iterable[Mapping]) -> None:
        """A heartbeat's change notices (`{"id", "kind"}`): their kinds are stale until read."""
        for notice in notices:
            self.notices[int(notice["id"])] = str(notice["kind"])
            self.stale.add(str(notice["kind"]))

    def due(self, now_s: float) -> Iterator[str]:
        """What to read now, in order: the keys first if they changed, then the stale kinds
        (every kind once `resync_s` has passed since everything was last read). Each is
        checked when its turn comes: reading one may make a later one stale (an accepted
        offer of mine: my tasks moved)."""
        if now_s - self.read_all_at >= self.resync_s:
            self.stale |= set(KINDS)
            self.read_all_at = now_s
        for kind in (KEYS, *KINDS):
            if kind in self.stale:
                yield kind

    def read(self, kind: str) -> None:
        """`kind` was read again: no longer stale, and its notices go out acknowledged with the next heartbeat."""
        self.stale.discard(kind)
        done = {i for i, k in self.notices.items() if k == kind}
        for i in done:
            del self.notices[i]
        self.acknowledge |= done

    def sent(self, acknowledged: Iterable[int]) -> None:
        """A heartbeat acknowledged these notices."""
        self.acknowledge -= set(acknowledged)

    def unread(self) -> list[str]:
        """The kinds with a change not read yet, for a person reading the agent's status."""
        return sorted(set(self.notices.values()) | self.stale)
