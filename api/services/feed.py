"""The change feed of the admin UI (`GET /api/v1/changes/stream`): which of the registry's
lists changed, so that a page reads again only those, when they change, instead of polling
every list.

Every so often the stream takes a mark of each list: a few aggregates that change whenever
the list, as the caller reads it, may have changed (its rows counted, their latest times and
ids, the change notices of its kind, and what changes by the clock alone: a participant's
liveness, an offer's expiry, the payment of an active movement). A list whose mark differs
from the last one is announced. A mark may change when the list did not (a notice
acknowledged, a heartbeat without news), never the other way round: a page reads a list
again too often at worst, never misses a change.

A participant's marks cover what it may read: its own contracts, offers, movements and
events, its own change notices, and the replicas and failovers of the tasks it is involved
in (`api.services.ha`'s rules); participants and tasks are the federation's.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

from sqlalchemy import and_, func, or_, select
from sqlalchemy.orm import Session

from api.models import Change, Contract, Event, Failover, LoadSample, Movement, Offer, Participant, Replica, Task
from api.services import events, participants
from api.services.ha import failovers_concerning, replicas_concerning
from bpm.negotiation import OfferState

# The lists a page may read again, by the name of their endpoint under /api/v1.
LISTS = ("participants", "contracts", "tasks", "offers", "movements", "ledger", "events", "replicas", "failovers")
# How often the payments of active movements are read again (they grow with time alone), seconds.
ACCRUAL_S = 10.0


def _row(session: Session, *columns, where=None) -> tuple:
    query = select(*columns)
    return tuple(session.execute(query if where is None else query.where(where)).one())


def marks(session: Session, participant_id: int | None, now: datetime, heartbeat_timeout_s: float) -> dict[str, Any]:
    """The mark of each of `LISTS` as the caller (a participant, or the operator: None) reads them at `now`."""
    def mine(*columns) -> Callable:
        return (lambda q: q) if participant_id is None else (lambda q: q.where(or_(*(c == participant_id for c in columns))))

    samples = session.scalar(select(func.max(LoadSample.id)))
    # A participant registered, its key revoked, a heartbeat (which brings its load report), its liveness.
    beats = session.execute(select(Participant.heartbeat_at).order_by(Participant.id)).all()
    revoked = session.scalar(select(func.count()).where(participants.key_revoked_sql()))
    latest = max((row.heartbeat_at for row in beats if row.heartbeat_at is not None), default=None)
    liveness = tuple(participants.liveness(row, now, heartbeat_timeout_s)[0] for row in beats)  # type: ignore[arg-type]
    notices = {kind: tuple(row) for kind, *row in session.execute(
        mine(Change.participant_id)(select(Change.kind, func.count(), func.max(Change.id)).group_by(Change.kind)))}
    movements = tuple(session.execute(mine(Movement.from_id, Movement.to_id)(
        select(func.count(), func.count(Movement.ended_at), func.max(Movement.ended_at), func.max(Movement.id)))).one())
    active = movements[0] - movements[1]
    accruing = int(now.timestamp() // ACCRUAL_S) if active else None
    expired = and_(Offer.state == OfferState.PENDING, Offer.expires_at <= now)
    return {
        "participants": (len(beats), revoked, latest, liveness, samples),
        "contracts": tuple(session.execute(mine(Contract.proposer_id, Contract.counterparty_id)(
            select(func.count(), func.max(Contract.updated_at), func.max(Contract.id)))).one()),
        "tasks": (session.scalar(select(func.count(Task.id))), notices.get("task"), samples),
        "offers": (tuple(session.execute(mine(Offer.from_id, Offer.to_id)(
            select(func.count(), func.max(Offer.decided_at), func.count().filter(expired)))).one()), notices.get("offer")),
        "movements": (movements, samples, accruing),
        "ledger": (movements, samples, accruing),
        "events": session.scalar(_events(session, participant_id)),
        "replicas": _row(session, func.count(Replica.id), func.max(Replica.updated_at), where=None if participant_id is None else replicas_concerning(participant_id)),
        "failovers": _row(session, func.count(Failover.id), func.max(Failover.id), func.count(Failover.completed_at),
                          where=None if participant_id is None else Failover.id.in_(failovers_concerning(participant_id))),
    }


def _events(session: Session, participant_id: int | None):
    """The latest event the caller may read."""
    query = select(func.max(Event.id))
    if participant_id is None:
        return query
    return query.where(events.concerning([session.scalar(select(Participant.name).where(Participant.id == participant_id))]))


def changed(before: dict[str, Any] | None, after: dict[str, Any]) -> list[str]:
    """The lists whose marks differ (every list when there is no mark before)."""
    return [name for name in LISTS if before is None or before.get(name) != after[name]]
