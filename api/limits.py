"""Bounds on what the registry stores: every number and date a caller sends fits the
database's columns and the arithmetic done with it (payments, deadlines), so no input
can raise a server error further down."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

MAX_INT = 2**63 - 1  # BIGINT: positions and byte counts; beyond it refused, not overflowed
MAX_ID = 2**31 - 1  # INTEGER: ids and epochs
MAX_PRICE = 1e9  # per unit of load per second
MAX_LOAD = 1e6  # fractions of a participant's capacity
MAX_DURATION_S = 10 * 365 * 86400.0  # ten years: contract durations, recovery times
MAX_HORIZON = timedelta(days=100 * 365)  # dates within a century of now
MAX_DEPTH = 32  # nesting of free-form JSON objects (task params, event data)
# A moved task's load varies from batch to batch around what its offer declared; its host is
# paid on what it measures, but on no more than this many times the declared load (nor more
# than its own total), so neither side alone decides the bill (`api.services.offers.billed_load`).
BILLED_LOAD_SLACK = 1.5


def check_json(value: Any, depth: int = 0) -> Any:
    """`value` unchanged when every string in it is free of NUL characters (PostgreSQL's text
    cannot hold them) and every integer fits 64 bits; else ValueError, which Pydantic turns
    into a 422."""
    if depth > MAX_DEPTH:
        raise ValueError(f"nested deeper than {MAX_DEPTH} levels")
    if isinstance(value, str):
        if "\x00" in value:
            raise ValueError("text may not contain NUL characters")
    elif isinstance(value, bool):
        pass
    elif isinstance(value, int):
        if not -MAX_INT - 1 <= value <= MAX_INT:
            raise ValueError(f"integer {value} does not fit in 64 bits")
    elif isinstance(value, dict):
        for key, item in value.items():
            check_json(key, depth + 1)
            check_json(item, depth + 1)
    elif isinstance(value, list | tuple):
        for item in value:
            check_json(item, depth + 1)
    return value


def sane_moment(value: datetime) -> datetime:
    """A date within a century of now (naive dates are taken as UTC)."""
    aware = value if value.tzinfo else value.replace(tzinfo=UTC)
    now = datetime.now(UTC)
    if not now - MAX_HORIZON <= aware <= now + MAX_HORIZON:
        raise ValueError("date must lie within 100 years of now")
    return value
