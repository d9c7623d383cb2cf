"""Contract terms and the negotiation state machine.

A contract is proposed by one participant, may be countered back and forth, and becomes
active when the side that did not make the last proposal accepts it. Either side may
terminate it at any time; a terminated or rejected contract never comes back.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum


class ContractState(StrEnum):
    PROPOSED = "proposed"
    COUNTERED = "countered"
    ACTIVE = "active"
    REJECTED = "rejected"
    TERMINATED = "terminated"


NEGOTIATING = frozenset({ContractState.PROPOSED, ContractState.COUNTERED})


class TermsError(ValueError):
    """The terms themselves are invalid (a 422 for the API)."""


class TransitionError(Exception):
    """The action is not allowed in the contract's state, or not for this side.

    `forbidden` is True when the actor is the wrong side (a 403), False when the state
    does not allow the action (a 409).
    """

    def __init__(self, message: str, *, forbidden: bool = False) -> None:
        super().__init__(message)
        self.forbidden = forbidden


@dataclass(frozen=True)
class ContractTerms:
    """Price range per unit of load per second, and the minimum movement duration."""

    price_min: float
    price_max: float
    min_duration_s: float
    valid_until: datetime | None = None


def validate_terms(terms: ContractTerms, now: datetime) -> None:
    """Raise TermsError unless 0 < price_min <= price_max, all finite, duration > 0, not expired."""
    for name in ("price_min", "price_max", "min_duration_s"):
        value = getattr(terms, name)
        if not math.isfinite(value):
            raise TermsError(f"{name} must be a finite number, got {value!r}")
    if terms.price_min <= 0:
        raise TermsError(f"price_min must be positive, got {terms.price_min}")
    if terms.price_min > terms.price_max:
        raise TermsError(f"price_min ({terms.price_min}) must not exceed price_max ({terms.price_max})")
    if terms.min_duration_s <= 0:
        raise TermsError(f"min_duration_s must be positive, got {terms.min_duration_s}")
    if terms.valid_until is not None and _aware(terms.valid_until) <= _aware(now):
        raise TermsError("valid_until must be in the future")


def next_state(
    state: ContractState | str,
    action: str,
    *,
    actor_is_last_proposer: bool,
) -> ContractState:
    """The state after `action` by a party, or TransitionError.

    `counter`, `accept` and `reject` belong to the side that did not make the last
    proposal; `terminate` belongs to either side, while the contract is not yet final.
    """
    state = ContractState(state)
    if action == "terminate":
        if state in NEGOTIATING or state is ContractState.ACTIVE:
            return ContractState.TERMINATED
        raise TransitionError(f"a {state} contract cannot be terminated")
    targets = {
        "counter": ContractState.COUNTERED,
        "accept": ContractState.ACTIVE,
        "reject": ContractState.REJECTED,
    }
    if action not in targets:
        raise ValueError(f"unknown contract action {action!r}")
    if state not in NEGOTIATING:
        raise TransitionError(f"a {state} contract cannot be {_past(action)}")
    if actor_is_last_proposer:
        raise TransitionError(
            f"only the other party may {action} this contract: you made the last proposal",
            forbidden=True,
        )
    return targets[action]


def _past(action: str) -> str:
    return {"counter": "countered", "accept": "accepted", "reject": "rejected"}[action]


def _aware(moment: datetime) -> datetime:
    from datetime import UTC

    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)
