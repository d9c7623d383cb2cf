"""The readable record: every negotiation step, movement and reported error is an event."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import insert, or_, select
from sqlalchemy.orm import Session

from api.auth import Principal
from api.db import utcnow
from api.models import Event


def record(
    session: Session,
    kind: str,
    message: str,
    *,
    actor: str | None = None,
    subject: str | None = None,
    data: dict | None = None,
    at: datetime | None = None,
) -> int:
    """Record an event in the request's transaction, written at once (one Core statement: no
    ORM object to flush on the hot paths that record one each); its id."""
    return session.execute(_RECORD, {"kind": kind, "message": message, "actor": actor, "subject": subject, "data": data or {},
                                     "at": at or utcnow()}).scalar_one()


_events = Event.__table__
_RECORD = insert(_events).returning(_events.c.id)  # built once: building a statement costs more CPU than running it


def concerning(names: list[str]):
    """The events a participant may read, as an SQL condition: those it caused or that concern it."""
    return or_(Event.actor.in_(names), Event.subject.in_(names))


def list_events(
    session: Session,
    caller: Principal,
    *,
    participant: str | None,
    kind: str | None,
    after_id: int | None,
    limit: int,
) -> list[Event]:
    """Newest last; a participant sees only events it caused or that concern it."""
    query = select(Event)
    names = [caller.name] if not caller.is_operator else ([participant] if participant else [])
    if names:
        query = query.where(concerning(names))
    if kind:
        query = query.where(Event.kind.startswith(kind))
    if after_id is not None:
        query = query.where(Event.id > after_id).order_by(Event.id).limit(limit)
        return list(session.scalars(query))
    newest = list(session.scalars(query.order_by(Event.id.desc()).limit(limit)))
    return newest[::-1]
