from __future__ import annotations

from fastapi import Response

from api import schemas
from api.deps import Caller, DbSession, Now, Quota
from api.pages import Page
from api.services import contracts as service
from api.routing import Router

router = Router(prefix="/contracts", tags=["contracts"])


@router.post("", status_code=201, response_model=schemas.ContractOut)
def propose_contract(body: schemas.ContractCreate, session: DbSession, caller: Caller, now: Now, quotas: Quota):
    """Propose a bounded-price contract to a counterparty (at most `api.quotas.RATES["proposals"]`
    a second: 429 past it)."""
    quotas.take(session.connection(), "proposals", caller.name)
    return service.to_out(service.propose(session, caller, body, now), now)


@router.get("", response_model=list[schemas.ContractOut])
def list_contracts(session: DbSession, caller: Caller, now: Now, page: Page, response: Response,
                   participant: schemas.NameQuery = None, state: schemas.WordQuery = None):
    """Contracts the caller may read, optionally of one participant and in one state (a page of them with `limit`)."""
    contracts = service.list_contracts(session, caller, participant, state, page)
    page.tell(response)
    return [service.to_out(c, now) for c in contracts]


@router.get("/{contract_id}", response_model=schemas.ContractOut)
def get_contract(contract_id: schemas.IdPath, session: DbSession, caller: Caller, now: Now):
    """One contract's terms and state (its two parties and the operator only)."""
    return service.to_out(service.get_visible(session, caller, contract_id), now)


@router.post("/{contract_id}/counter", response_model=schemas.ContractOut)
def counter_contract(contract_id: schemas.IdPath, body: schemas.ContractTermsIn, session: DbSession, caller: Caller, now: Now):
    """Answer the last proposal with other terms."""
    return service.to_out(service.act(session, caller, contract_id, "counter", now, body), now)


@router.post("/{contract_id}/accept", response_model=schemas.ContractOut)
def accept_contract(contract_id: schemas.IdPath, session: DbSession, caller: Caller, now: Now):
    """Accept the last proposal: the contract becomes active."""
    return service.to_out(service.act(session, caller, contract_id, "accept", now), now)


@router.post("/{contract_id}/reject", response_model=schemas.ContractOut)
def reject_contract(contract_id: schemas.IdPath, session: DbSession, caller: Caller, now: Now):
    """Reject the last proposal: the negotiation ends."""
    return service.to_out(service.act(session, caller, contract_id, "reject", now), now)


@router.post("/{contract_id}/terminate", response_model=schemas.ContractOut)
def terminate_contract(contract_id: schemas.IdPath, session: DbSession, caller: Caller, now: Now):
    """End the contract (either party): no new offers under it."""
    return service.to_out(service.act(session, caller, contract_id, "terminate", now), now)
