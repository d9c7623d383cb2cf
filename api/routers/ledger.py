from __future__ import annotations

from fastapi import Query

from api import schemas
from api.deps import Caller, DbSession, Now, Quota
from api.services import events as event_service
from api.services import ledger as service
from api.services import participants as participant_service
from api.routing import Router

router = Router(tags=["ledger and events"])


@router.get("/ledger", response_model=schemas.LedgerOut)
def get_ledger(session: DbSession, caller: Caller, now: Now, participant: schemas.NameQuery = None):
    """What each movement has accrued (price x load x seconds away), and balances per participant."""
    return service.ledger(session, caller, participant, now)


@router.get("/events", response_model=list[schemas.EventOut])
def list_events(
    session: DbSession,
    caller: Caller,
    participant: schemas.NameQuery = None,
    kind: schemas.WordQuery = None,
    after_id: schemas.IdQuery = None,
    limit: int = Query(default=200, ge=1, le=2000),
):
    """The readable record of offers, refusals, movements and errors, oldest first."""
    rows = event_service.list_events(session, caller, participant=participant, kind=kind, after_id=after_id, limit=limit)
    return [schemas.EventOut.model_validate(e, from_attributes=True) for e in rows]


@router.post("/events", status_code=201, response_model=schemas.EventOut)
def report_event(body: schemas.EventCreate, session: DbSession, caller: Caller, now: Now, quotas: Quota):
    """Record something a participant's agent did or suffered, in its own name (at most
    `api.quotas.RATES["events"]` a second: 429 past it)."""
    quotas.take(session.connection(), "events", caller.name)
    event = participant_service.report_event(session, caller, body.kind, body.message, body.subject, body.data, now)
    return schemas.EventOut.model_validate(event, from_attributes=True)
