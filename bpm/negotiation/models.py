"""The small immutable views the decision functions work on.

They carry only what a decision needs, from one participant's point of view (`partner`
is always the other side), so the live agent can build them from the registry and the
simulator from its arrays.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum

from bpm.keygroups import MAIN, check_input, check_prefix

DEFAULT_HYSTERESIS = 0.1
"""Relative margin on ending movements (Borealis used 0.1); see `bpm.negotiation.decisions`."""

DEFAULT_MARGIN = 0.0
"""Relative margin on offering and accepting load; see `bpm.negotiation.decisions`."""


class OfferState(StrEnum):
    """An offer's state in the registry: pending until the receiver decides, the maker
    withdraws it or it expires (past its time to live, also while still stored as pending)."""

    PENDING = "pending"
    ACCEPTED = "accepted"
    REJECTED = "rejected"
    WITHDRAWN = "withdrawn"
    EXPIRED = "expired"


class MovementState(StrEnum):
    """A movement's state in the registry: active while its task runs away from the side that
    moved it, ended when the task went back, failed when its host failed."""

    ACTIVE = "active"
    ENDED = "ended"
    FAILED = "failed"


@dataclass(frozen=True, slots=True)
class Contract:
    """A bilateral contract seen from one side.

    Attributes:
        id: the contract's id (shared by both sides).
        partner: the other participant.
        price_min, price_max: the price range per unit of load per second; equal for a
            fixed-price contract.
        min_duration_s: a movement under this contract lasts at least this long.
        ha_mode: how tasks moved under it are replicated ("none": not at all).
    """

    id: str
    partner: str
    price_min: float
    price_max: float
    min_duration_s: float = 0.0
    ha_mode: str = "none"

    def __post_init__(self) -> None:
        if not (math.isfinite(self.price_min) and math.isfinite(self.price_max)):
            raise ValueError(f"contract {self.id}: prices must be finite")
        if not 0 <= self.price_min <= self.price_max:
            raise ValueError(f"contract {self.id}: need 0 <= price_min <= price_max, got [{self.price_min}, {self.price_max}]")
        if not self.min_duration_s >= 0:
            raise ValueError(f"contract {self.id}: min_duration_s must be >= 0")

    @property
    def fixed_price(self) -> bool:
        return self.price_min == self.price_max


@dataclass(frozen=True, slots=True)
class Task:
    """A unit of load that can move.

    Attributes:
        load: its measured share of a participant's capacity.
        origin: the participant it belongs to ("" when the caller does not say); a task
            is never offered to its own origin, which gets it back by ending a movement.
        ha_mode: its effective HA mode where it runs (`bpm.ha.effective_mode`).
        groups: the key groups of its origin's stream it covers, as a prefix
            (`bpm.keygroups`: "" all, "0" the first half, ...), when it may split and merge
            over them (`bpm.negotiation.granularity`); None when it does not.
        input: which input of its origin's stream those key groups are of (`bpm.keygroups`):
            halves of two inputs never merge.
        query: the query it runs and the digest of its definition (`bpm.query`), as the
            registry records them; None for a task of no query (a simulated one).
        unrunnable: why the participant it is offered to cannot run it although it has its
            query (its parameters do not fit the query there); None: nothing known against it.
    """

    id: str
    load: float
    origin: str = ""
    ha_mode: str = "none"
    groups: str | None = None
    input: str = MAIN
    query: tuple[str, str] | None = None
    unrunnable: str | None = None

    def __post_init__(self) -> None:
        if not (self.load > 0 and math.isfinite(self.load)):
            raise ValueError(f"task {self.id}: load must be a finite number > 0, got {self.load!r}")
        if self.groups is not None:
            check_prefix(self.groups)
            check_input(self.input)

    @property
    def share(self) -> tuple[str, str] | None:
        """(input, key groups) when it splits and merges over them (`groups`), else None."""
        return None if self.groups is None else (self.input, self.groups)


@dataclass(frozen=True, slots=True)
class Movement:
    """An accepted offer: tasks of `origin` running at `host` for `price` per unit load per second.

    Attributes:
        load: the total load of `task_ids` when the movement started.
        started_s, earliest_end_s: times in seconds on the caller's clock; the
            movement may end only at or after `earliest_end_s`.
    """

    id: str
    task_ids: tuple[str, ...]
    origin: str
    host: str
    price: float
    load: float
    started_s: float
    earliest_end_s: float
    contract_id: str = ""


@dataclass(frozen=True, slots=True)
class Offer:
    """A proposal to move `tasks` (or a leading part of them) to `partner` under one contract.

    Attributes:
        tasks: in the order the offerer would give them up.
        caps: for each k, the most the offerer pays per unit load to shed the first k
            tasks (never above `price_max`, always above `price_min`). Shedding fewer
            tasks saves more per unit, so the caps do not increase.
    """

    contract_id: str
    partner: str
    tasks: tuple[Task, ...]
    caps: tuple[float, ...]
    price_min: float
    price_max: float

    def __post_init__(self) -> None:
        if not self.tasks or len(self.caps) != len(self.tasks):
            raise ValueError("an offer needs at least one task and one cap per task")

    @property
    def price_cap(self) -> float:
        """The offerer's limit for the whole set."""
        return self.caps[-1]

    @property
    def load(self) -> float:
        return sum(t.load for t in self.tasks)

    @property
    def task_ids(self) -> tuple[str, ...]:
        return tuple(t.id for t in self.tasks)


@dataclass(frozen=True, slots=True)
class Acceptance:
    """The receiver's answer: how many leading tasks of the offer it takes (none: refused),
    their ids and load, and the least it takes per unit load for them."""

    task_ids: tuple[str, ...]
    load: float
    price_floor: float
    count: int = 0

    @property
    def accepted(self) -> bool:
        return bool(self.task_ids)
