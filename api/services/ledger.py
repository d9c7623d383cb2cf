"""The ledger: what each movement has accrued, and every participant's paid, earned and balance."""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime

from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from api import schemas
from api.auth import Principal
from api.errors import Forbidden
from api.models import Movement
from api.services import participants
from api.services.offers import accrued


def ledger(session: Session, caller: Principal, participant: str | None, now: datetime) -> schemas.LedgerOut:
    """Entries per movement; the operator's unfiltered view balances: total paid equals total earned."""
    if not caller.is_operator:
        if participant and participant != caller.name:
            raise Forbidden(f"{caller.name} may read only its own ledger")
        participant = caller.name
    query = select(Movement).order_by(Movement.id)
    if participant:
        pid = participants.get(session, participant).id
        query = query.where(or_(Movement.from_id == pid, Movement.to_id == pid))
    paid: dict[str, float] = defaultdict(float)
    earned: dict[str, float] = defaultdict(float)
    entries = []
    for movement in session.scalars(query):
        seconds, amount = accrued(movement, now)
        payer, payee = movement.from_participant.name, movement.to_participant.name
        paid[payer] += amount
        earned[payee] += amount
        entries.append(
            schemas.LedgerEntry(
                movement_id=movement.id,
                task_id=movement.task_id,
                from_=payer,
                to=payee,
                price=movement.price,
                load=movement.load,
                seconds=seconds,
                amount=amount,
                state=movement.state,
            )
        )
    names = sorted(set(paid) | set(earned))
    if participant:
        names = [participant]
    balances = [
        schemas.LedgerBalance(participant=n, paid=paid[n], earned=earned[n], balance=earned[n] - paid[n]) for n in names
    ]
    return schemas.LedgerOut(as_of=now, balances=balances, entries=entries)
