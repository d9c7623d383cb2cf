"""What the registry records, counted in the database when its metrics are scraped.

Aggregate queries (`COUNT ... GROUP BY`) rather than counters kept in the process, so the
figures are the same whichever worker answers and survive restarts. States follow the
API's: an offer still stored as pending past its expiry counts as expired, a participant's
status is its liveness at the registry's clock.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from api.models import Contract, Failover, Movement, Participant, Replica, Task
from api.services import offers, participants


@dataclass(frozen=True)
class Totals:
    """Counts by label values (a tuple when there are several labels); absent states count 0.

    Attributes:
        participants: by status (`new`, `alive`, `suspected`, `failed`).
        contracts: by state.
        tasks: by whether the task runs away from its origin (`"true"`, `"false"`).
        offers: by state, as the API reports it.
        movements: by state.
        accrued: what movements have accrued, by movement state, as the ledger counts it.
        replicas: by (role, state).
        failovers: failover and repair records by (kind, `in_progress` or `completed`).
        recovery: by kind, (completed records with a recovery time, sum of those times in seconds).
    """

    participants: dict[str, int]
    contracts: dict[str, int]
    tasks: dict[str, int]
    offers: dict[str, int]
    movements: dict[str, int]
    accrued: dict[str, float]
    replicas: dict[tuple[str, str], int]
    failovers: dict[tuple[str, str], int]
    recovery: dict[str, tuple[int, float]]


def _count_by(session: Session, *columns) -> dict:
    rows = session.execute(select(*columns, func.count()).group_by(*columns))
    return {(tuple(row[:-1]) if len(columns) > 1 else row[0]): row[-1] for row in rows}


def _liveness(session: Session, now: datetime, timeout_s: float) -> dict[str, int]:
    counts: dict[str, int] = defaultdict(int)
    # A federation has few participants. The row has the one column liveness reads.
    for row in session.execute(select(Participant.heartbeat_at)):
        counts[participants.liveness(row, now, timeout_s)[0]] += 1  # type: ignore[arg-type]
    return dict(counts)


def _offers(session: Session, now: datetime) -> dict[str, int]:
    # Grouped over a subquery: PostgreSQL would not match a GROUP BY expression with its own bound parameters.
    states = select(offers.state_sql(now).label("state")).subquery()
    return _count_by(session, states.c.state)


def _accrued(session: Session, now: datetime) -> dict[str, float]:
    """One narrow row per movement, summed with the ledger's own rule (`offers.accrued`)."""
    amounts: dict[str, float] = defaultdict(float)
    # The row has the columns accrued reads.
    query = select(Movement.state, Movement.amount, Movement.price, Movement.load, Movement.accrued_at, Movement.started_at, Movement.ended_at)
    for row in session.execute(query):
        amounts[row.state] += offers.accrued(row, now)[1]  # type: ignore[arg-type]
    return dict(amounts)


def totals(session: Session, now: datetime, heartbeat_timeout_s: float) -> Totals:
    away = Task.host_id != Task.origin_id
    completed = Failover.completed_at.is_not(None)
    recovered = session.execute(
        select(Failover.kind, func.count(Failover.recovery_s), func.sum(Failover.recovery_s))
        .where(Failover.recovery_s.is_not(None))
        .group_by(Failover.kind)
    ).all()
    return Totals(
        participants=_liveness(session, now, heartbeat_timeout_s),
        contracts=_count_by(session, Contract.state),
        tasks={("true" if is_away else "false"): n for is_away, n in _count_by(session, away).items()},
        offers=_offers(session, now),
        movements=_count_by(session, Movement.state),
        accrued=_accrued(session, now),
        replicas=_count_by(session, Replica.role, Replica.state),
        failovers={(kind, "completed" if done else "in_progress"): n for (kind, done), n in _count_by(session, Failover.kind, completed).items()},
        recovery={kind: (n, float(total or 0.0)) for kind, n, total in recovered},
    )
