"""Contracts: proposal, counter-proposal, acceptance, rejection, termination; only parties read terms."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import or_, select, update
from sqlalchemy.orm import Session

from api import schemas
from api.auth import Principal, get_private
from api.errors import Conflict, Forbidden, Invalid
from api.models import Contract
from api.pages import PageQuery
from api.services import changes, events, participants
from bpm.contracts import ContractState, ContractTerms, TermsError, TransitionError, next_state, validate_terms


def _check_terms(body: schemas.ContractTermsIn, valid_until: datetime | None, now: datetime) -> None:
    try:
        validate_terms(ContractTerms(body.price_min, body.price_max, body.min_duration_s, valid_until), now)
    except TermsError as exc:
        raise Invalid(str(exc)) from exc


def in_force(contract: Contract, now: datetime) -> bool:
    return contract.state == ContractState.ACTIVE and (contract.valid_until is None or contract.valid_until > now)


def active_between(session: Session, a: int, b: int) -> Contract | None:
    lo, hi = sorted((a, b))
    return session.scalar(
        select(Contract).where(Contract.pair_lo == lo, Contract.pair_hi == hi, Contract.state == ContractState.ACTIVE)
    )


def propose(session: Session, caller: Principal, body: schemas.ContractCreate, now: datetime) -> Contract:
    me = caller.require_participant()
    counterparty = participants.get(session, body.counterparty)
    if counterparty.id == me.id:
        raise Invalid("a participant cannot sign a contract with itself")
    _check_terms(body, body.valid_until, now)
    existing = active_between(session, me.id, counterparty.id)
    if existing is not None:
        raise Conflict(
            f"{me.name} and {counterparty.name} already have an active contract (#{existing.id}); terminate it first",
            contract_id=existing.id,
        )
    lo, hi = sorted((me.id, counterparty.id))
    contract = Contract(
        proposer=me,
        counterparty=counterparty,
        last_proposed_by=me,
        pair_lo=lo,
        pair_hi=hi,
        price_min=body.price_min,
        price_max=body.price_max,
        min_duration_s=body.min_duration_s,
        valid_until=body.valid_until,
        ha_mode=body.ha_mode,
        state=ContractState.PROPOSED,
        created_at=now,
        updated_at=now,
    )
    session.add(contract)
    session.flush()
    changes.contract_changed(session, contract)
    events.record(
        session,
        "contract.proposed",
        f"{me.name} proposed contract #{contract.id} to {counterparty.name}: "
        f"price [{body.price_min:g}, {body.price_max:g}], min duration {body.min_duration_s:g} s",
        actor=me.name,
        subject=counterparty.name,
        data={"contract_id": contract.id},
        at=now,
    )
    return contract


def get_visible(session: Session, caller: Principal, contract_id: int) -> Contract:
    return get_private(session, caller, Contract, contract_id, "contract", lambda c: (c.proposer_id, c.counterparty_id))


def list_contracts(
    session: Session, caller: Principal, participant: str | None, state: str | None, page: PageQuery | None = None
) -> list[Contract]:
    query = select(Contract)
    if not caller.is_operator:
        me = caller.participant.id
        query = query.where(or_(Contract.proposer_id == me, Contract.counterparty_id == me))
    if participant:
        other = participants.get(session, participant)
        query = query.where(or_(Contract.proposer_id == other.id, Contract.counterparty_id == other.id))
    if state:
        query = query.where(Contract.state == state)
    return (page or PageQuery.whole()).rows(session, query, Contract.id)


def act(
    session: Session,
    caller: Principal,
    contract_id: int,
    action: str,
    now: datetime,
    terms: schemas.ContractTermsIn | None = None,
) -> Contract:
    """Carry out counter/accept/reject/terminate by a party, per `bpm.contracts.next_state`."""
    me = caller.require_participant()
    contract = get_visible(session, caller, contract_id)
    try:
        state = next_state(contract.state, action, actor_is_last_proposer=contract.last_proposed_by_id == me.id)
    except TransitionError as exc:
        raise (Forbidden if exc.forbidden else Conflict)(str(exc)) from exc
    other = contract.counterparty if contract.proposer_id == me.id else contract.proposer
    values: dict = {"state": state, "updated_at": now}
    if action == "counter":
        assert terms is not None
        _check_terms(terms, contract.valid_until, now)
        values.update(price_min=terms.price_min, price_max=terms.price_max, min_duration_s=terms.min_duration_s, last_proposed_by_id=me.id)
    if action == "accept":
        if contract.valid_until is not None and contract.valid_until <= now:
            raise Conflict(f"contract #{contract.id} expired at {contract.valid_until.isoformat()}")
        existing = active_between(session, contract.proposer_id, contract.counterparty_id)
        if existing is not None:
            raise Conflict(
                f"{contract.proposer.name} and {contract.counterparty.name} already have an active contract (#{existing.id})",
                contract_id=existing.id,
            )
    _transition(session, contract, values)
    changes.contract_changed(session, contract)
    events.record(
        session,
        f"contract.{state}",
        f"{me.name} {_verb(action)} contract #{contract.id} with {other.name}"
        + (f": price [{contract.price_min:g}, {contract.price_max:g}], min duration {contract.min_duration_s:g} s" if action == "counter" else ""),
        actor=me.name,
        subject=other.name,
        data={"contract_id": contract.id},
        at=now,
    )
    return contract


def _transition(session: Session, contract: Contract, values: dict) -> None:
    """Apply a party's action only to the contract as the party saw it: of two concurrent
    actions (accept and terminate, accept and counter) the one that comes second finds the
    state or the last proposer changed, changes nothing and gets a 409. The partial unique
    index on active pairs refuses a second active contract in the same way (IntegrityError)."""
    seen_state, seen_proposer = contract.state, contract.last_proposed_by_id
    changed = session.execute(
        update(Contract)
        .where(Contract.id == contract.id, Contract.state == seen_state, Contract.last_proposed_by_id == seen_proposer)
        .values(**values)
        .execution_options(synchronize_session=False)
    ).rowcount
    session.refresh(contract)
    if changed != 1:
        raise Conflict(f"contract #{contract.id} changed meanwhile (it is {contract.state} now); look again and retry", state=contract.state)


def _verb(action: str) -> str:
    return {"counter": "countered", "accept": "accepted", "reject": "rejected", "terminate": "terminated"}[action]


def to_out(contract: Contract, now: datetime) -> schemas.ContractOut:
    negotiating = contract.state in (ContractState.PROPOSED, ContractState.COUNTERED)
    awaiting = None
    if negotiating:
        awaiting = (
            contract.counterparty.name if contract.last_proposed_by_id == contract.proposer_id else contract.proposer.name
        )
    return schemas.ContractOut(
        id=contract.id,
        proposer=contract.proposer.name,
        counterparty=contract.counterparty.name,
        last_proposed_by=contract.last_proposed_by.name,
        awaiting=awaiting,
        price_min=contract.price_min,
        price_max=contract.price_max,
        min_duration_s=contract.min_duration_s,
        valid_until=contract.valid_until,
        ha_mode=contract.ha_mode,
        state=contract.state,
        in_force=in_force(contract, now),
        created_at=contract.created_at,
        updated_at=contract.updated_at,
    )
