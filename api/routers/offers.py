from __future__ import annotations

from fastapi import Response

from api import schemas
from api.deps import Caller, DbSession, Now
from api.pages import Page
from api.services import offers as service
from api.routing import Router

router = Router(tags=["offers and movements"])


@router.post("/offers", status_code=201, response_model=schemas.OfferOut)
def make_offer(body: schemas.OfferCreate, session: DbSession, caller: Caller, now: Now):
    """Offer tasks that run at the caller (its own, or others' to pass on) to the partner of an active contract, at a price inside its range."""
    return service.create(session, caller, body, now)


@router.get("/offers", response_model=list[schemas.OfferOut])
def list_offers(session: DbSession, caller: Caller, now: Now, page: Page, response: Response, state: schemas.OfferStateQuery = None):
    """Offers the caller made or received (all, for the operator), optionally in one state (a page of them with `limit`)."""
    offers = service.list_offers(session, caller, state, now, page)
    page.tell(response)
    movements = service.movement_ids(session, [o.id for o in offers])
    return [service.to_out(o, o.from_participant.name, o.to_participant.name, now, movements[o.id]) for o in offers]


@router.get("/offers/{offer_id}", response_model=schemas.OfferOut)
def get_offer(offer_id: schemas.IdPath, session: DbSession, caller: Caller, now: Now):
    """One offer and the movements it created."""
    return service.get_out(session, caller, offer_id, now)


@router.post("/offers/{offer_id}/accept", response_model=schemas.OfferOut)
def accept_offer(offer_id: schemas.IdPath, session: DbSession, caller: Caller, now: Now, body: schemas.OfferAccept | None = None):
    """Accept the offer, or a subset of its tasks (receiver only; the first decision wins)."""
    return service.accept(session, caller, offer_id, body or schemas.OfferAccept(), now)


@router.post("/offers/{offer_id}/reject", response_model=schemas.OfferOut)
def reject_offer(offer_id: schemas.IdPath, session: DbSession, caller: Caller, now: Now, body: schemas.OfferReject | None = None):
    """Refuse the offer (receiver only; the first decision wins)."""
    return service.reject(session, caller, offer_id, body or schemas.OfferReject(), now)


@router.post("/offers/{offer_id}/withdraw", response_model=schemas.OfferOut)
def withdraw_offer(offer_id: schemas.IdPath, session: DbSession, caller: Caller, now: Now):
    """Take back a pending offer (its maker only)."""
    return service.withdraw(session, caller, offer_id, now)


@router.get("/movements", response_model=list[schemas.MovementOut])
def list_movements(session: DbSession, caller: Caller, now: Now, page: Page, response: Response,
                   participant: schemas.NameQuery = None, state: schemas.MovementStateQuery = None):
    """Movements the caller is party to or whose task it originates (all, for the operator; a page of them with `limit`)."""
    movements = service.list_movements(session, caller, participant, state, page)
    page.tell(response)
    return [service.movement_out(m, now) for m in movements]


@router.get("/movements/{movement_id}", response_model=schemas.MovementOut)
def get_movement(movement_id: schemas.IdPath, session: DbSession, caller: Caller, now: Now):
    """One movement and what it has accrued so far."""
    return service.movement_out(service.get_movement(session, caller, movement_id), now)


@router.post("/movements/{movement_id}/end", response_model=schemas.MovementOut)
def end_movement(movement_id: schemas.IdPath, session: DbSession, caller: Caller, now: Now):
    """End a movement after the contract's minimum duration: the task returns to the side that moved it, unwinding any chain after it."""
    return service.movement_out(service.end_movement(session, caller, movement_id, now), now)
