"""Offers and movements: the run-time half of the mechanism as the registry records it.

A participant offers tasks that run at it: its own, or tasks it hosts for others, which it
passes on as a movement of its own (it pays the next host, and its origin still pays it).
A task's active movements form a chain from its origin to where it runs. Ending one
unwinds the chain after it: the task comes back to the participant that moved it away.

Decisions on offers are made exactly once: the pending -> decided change is a
conditional UPDATE, so of two concurrent accepts (or an accept and a reject) one
changes the row and the other sees that it changed nothing and gets a 409. Moving a
task is conditional on its host in the same way.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from datetime import datetime, timedelta

from sqlalchemy import and_, bindparam, case, func, insert, or_, select, text, union, update
from sqlalchemy.orm import Session

from api import schemas
from api.auth import Principal, get_private, private
from api.db import insert_on_conflict
from api.errors import Conflict, Forbidden, Invalid, NotFound
from api.limits import BILLED_LOAD_SLACK
from api.models import Contract, Movement, Offer, Participant, Task
from api.pages import PageQuery
from api.services import changes, events, participants
from api.services import contracts as contract_service
from api.services.ha import mode_of
from bpm.negotiation import MovementState, OfferState, not_offerable


def _one_per_task(what: str, values: list, body: schemas.OfferCreate, task_ids: list[int]) -> None:
    """422 unless `values` has one value per task of the offer, none named twice."""
    if len(values) != len(body.task_ids) or len(task_ids) != len(body.task_ids):
        raise Invalid(f"{what} needs one value per task, with no task named twice: {len(values)} {what} for tasks {body.task_ids}")


def _caps(body: schemas.OfferCreate, task_ids: list[int], contract) -> list[float]:
    """The offerer's cap for each leading part of its tasks: given, or `price` for every one."""
    if body.caps is None:
        return [body.price] * len(task_ids)
    _one_per_task("caps", body.caps, body, task_ids)
    if any(later > earlier for earlier, later in zip(body.caps, body.caps[1:])):
        raise Invalid(f"caps {body.caps} increase: shedding more tasks cannot be worth more per unit of load")
    if body.caps[-1] != body.price:
        raise Invalid(f"the last cap {body.caps[-1]:g} is the cap for the whole set and must equal price {body.price:g}")
    if not (contract.price_min <= body.caps[-1] and body.caps[0] <= contract.price_max):
        raise Invalid(f"caps {body.caps} leave contract #{contract.id}'s range [{contract.price_min:g}, {contract.price_max:g}]")
    return list(body.caps)


def _loads(body: schemas.OfferCreate, task_ids: list[int], tasks: Mapping) -> list[float]:
    """Each task's load as the offerer declares it: given, or what the registry last heard."""
    if body.loads is None:
        return [tasks[t].load for t in task_ids]
    _one_per_task("loads", body.loads, body, task_ids)
    return list(body.loads)


def billed_load(measured: float, declared: float | None, total: float | None = None) -> float:
    """The load a movement is paid on: what its host measured, but no more than
    `BILLED_LOAD_SLACK` times what the offer declared, nor more than the host's own total."""
    bounds = [measured]
    if declared is not None:
        bounds.append(declared * BILLED_LOAD_SLACK)
    if total is not None:
        bounds.append(total)
    return min(bounds)


# An offer and its answer are the registry's hot path: they read and write with Core
# statements, most of them built once, and no ORM object graph (an ORM task drags its
# origin's and host's rows along, a contract three participants'): besides the caller's
# lookup, an offer takes six statements and an accept eight, the notices and the event included.
_offers, _tasks, _contracts, _participants = Offer.__table__, Task.__table__, Contract.__table__, Participant.__table__
_movements = Movement.__table__


def _with_parties(table, key: str, **parties: str):
    """The row of `table` whose id is the bind parameter `key`, with the name of the
    participant each of its columns `parties` names (label -> column), one statement."""
    query = select(table)
    for label, column in parties.items():
        party = _participants.alias(label)
        query = query.add_columns(party.c.name.label(label)).join(party, party.c.id == table.c[column])
    return query.where(table.c.id == bindparam(key))


_OFFER = _with_parties(_offers, "offer_id", from_name="from_id", to_name="to_id")
_CONTRACT = _with_parties(_contracts, "contract_id", proposer_name="proposer_id", counterparty_name="counterparty_id")

_origin = _participants.alias("origin")
# What an offer needs to know of each task it names (`_check_offerable`, `ha.mode_of`).
_OFFERED = (
    select(_tasks.c.id, _tasks.c.host_id, _tasks.c.origin_id, _tasks.c.until_s, _tasks.c.ha_mode, _tasks.c.epoch, _tasks.c.load,
           _origin.c.name.label("origin_name"))
    .join(_origin, _origin.c.id == _tasks.c.origin_id)
    .where(_tasks.c.id.in_(bindparam("task_ids", expanding=True)))
)
# The maker's offers past their expiry are stored as expired before it offers again: the
# unique index on pending offers counts what is stored.
_EXPIRE = (
    update(_offers)
    .where(_offers.c.from_id == bindparam("me"), _offers.c.state == OfferState.PENDING, _offers.c.expires_at <= bindparam("now"))
    .values(state=OfferState.EXPIRED)
)
_PENDING_ID = select(_offers.c.id).where(_offers.c.from_id == bindparam("me"), _offers.c.state == OfferState.PENDING).limit(1)


def _insert_pending(session: Session, values: dict):
    """INSERT of a pending offer that the database leaves undone, returning no row, when its
    maker has one pending already (the partial unique index `uq_offers_one_pending`), on
    PostgreSQL and SQLite alike; a concurrent offer of the same maker waits for the first's
    transaction and then finds it there."""
    return (insert_on_conflict(session.get_bind().dialect.name, _offers).values(values)
            .on_conflict_do_nothing(index_elements=[_offers.c.from_id], index_where=text(f"state = '{OfferState.PENDING}'"))
            .returning(*_offers.c))


def create(session: Session, caller: Principal, body: schemas.OfferCreate, now: datetime) -> schemas.OfferOut:
    me = caller.require_participant()
    contract = session.execute(_CONTRACT, {"contract_id": body.contract_id}).first()
    if contract is None or not caller.may_see(contract.proposer_id, contract.counterparty_id):
        raise NotFound(f"no contract #{body.contract_id} of yours")
    if not contract_service.in_force(contract, now):
        raise Conflict(f"contract #{contract.id} is {contract.state}{'' if contract.state != 'active' else ' but expired'}; offers need an active contract")
    if not contract.price_min <= body.price <= contract.price_max:
        raise Invalid(
            f"price {body.price:g} is outside contract #{contract.id}'s range [{contract.price_min:g}, {contract.price_max:g}]"
        )
    task_ids = list(dict.fromkeys(body.task_ids))
    caps = _caps(body, task_ids, contract)
    tasks = {t.id: t for t in session.execute(_OFFERED, {"task_ids": task_ids})}
    missing = [t for t in task_ids if t not in tasks]
    if missing:
        raise NotFound(f"no tasks {missing}")
    loads = _loads(body, task_ids, tasks)
    if contract.proposer_id == me.id:
        partner_id, partner_name = contract.counterparty_id, contract.counterparty_name
    else:
        partner_id, partner_name = contract.proposer_id, contract.proposer_name
    _check_offerable(session, me, partner_name, contract, [tasks[t] for t in task_ids])
    session.execute(_EXPIRE, {"me": me.id, "now": now})
    offer = session.execute(_insert_pending(session, {
        "contract_id": contract.id, "from_id": me.id, "to_id": partner_id, "task_ids": task_ids, "price": body.price, "caps": caps,
        "loads": loads, "state": OfferState.PENDING, "created_at": now, "expires_at": now + timedelta(seconds=body.ttl_s),
    })).first()
    if offer is None:
        outstanding = session.scalar(_PENDING_ID, {"me": me.id})
        raise Conflict(f"{me.name} already has an outstanding offer (#{outstanding}); one at a time", offer_id=outstanding)
    changes.offer_changed(session, offer)
    events.record(
        session,
        "offer.made",
        f"{me.name} offered tasks {task_ids} to {partner_name} at {body.price:g} under contract #{contract.id}",
        actor=me.name,
        subject=partner_name,
        data={"offer_id": offer.id, "contract_id": contract.id, "task_ids": task_ids, "price": body.price, "loads": loads},
        at=now,
    )
    return to_out(offer, me.name, partner_name, now, [])


def _check_offerable(session: Session, me: Participant, partner: str, contract, tasks: list) -> None:
    """Tasks (`_OFFERED` rows) may be offered only where they run, and under the contract only
    as `bpm.negotiation.not_offerable` allows (the rule the agents decide with)."""
    elsewhere = [t.id for t in tasks if t.host_id != me.id]
    if elsewhere:
        raise Conflict(f"tasks {elsewhere} do not run at {me.name}; a participant offers only tasks it hosts")
    ending = [t.id for t in tasks if t.until_s is not None]
    if ending:
        raise Conflict(f"tasks {ending} hand their key groups over to the tasks a split or merge made: they end where they run")
    for t in tasks:
        own = t.origin_id == me.id
        why = not_offerable(me=me.name, partner=partner, origin=t.origin_name, task_mode=t.ha_mode if own else mode_of(session, t),
                            contract_id=str(contract.id), contract_mode=contract.ha_mode)
        if why is not None:
            raise Conflict(f"task #{t.id} may not be offered to {partner}: {why}")


def _parties(record: Offer | Movement) -> tuple[int, int]:
    return record.from_id, record.to_id


def _offer(session: Session, caller: Principal, offer_id: int):
    """The offer with its parties' names (`_OFFER`), if the caller is one of them or the operator."""
    return private(caller, session.execute(_OFFER, {"offer_id": offer_id}).first(), offer_id, "offer", _parties)


def get_out(session: Session, caller: Principal, offer_id: int, now: datetime) -> schemas.OfferOut:
    """One offer and the movements it created, if the caller may see it."""
    offer = _offer(session, caller, offer_id)
    return to_out(offer, offer.from_name, offer.to_name, now, movement_ids(session, [offer.id])[offer.id])


def list_offers(session: Session, caller: Principal, state: str | None, now: datetime, page: PageQuery | None = None) -> list[Offer]:
    query = select(Offer)
    if not caller.is_operator:
        me = caller.participant.id
        query = query.where(or_(Offer.from_id == me, Offer.to_id == me))
    if state == OfferState.PENDING:
        query = query.where(Offer.state == OfferState.PENDING, Offer.expires_at > now)
    elif state == OfferState.EXPIRED:  # stored as expired, or pending past its expiry
        query = query.where(or_(Offer.state == OfferState.EXPIRED, and_(Offer.state == OfferState.PENDING, Offer.expires_at <= now)))
    elif state:
        query = query.where(Offer.state == state)
    return (page or PageQuery.whole()).rows(session, query, Offer.id)


def state_of(offer: Offer, now: datetime) -> str:
    """An offer's state (an ORM object or a row) at `now`: a pending one past its expiry has expired."""
    return OfferState.EXPIRED if offer.state == OfferState.PENDING and offer.expires_at <= now else offer.state


def state_sql(now: datetime):
    """`state_of` as an SQL expression, for counting offers by state in the database."""
    return case((and_(Offer.state == OfferState.PENDING, Offer.expires_at <= now), OfferState.EXPIRED), else_=Offer.state)


def _decide(session: Session, offer, new_state: str, now: datetime, **values):
    """Move the offer out of 'pending' once and only once, whatever runs concurrently: the
    conditional UPDATE changes the row for one decision only. The offer's row as decided."""
    decided = session.execute(
        update(_offers)
        .where(_offers.c.id == offer.id, _offers.c.state == OfferState.PENDING, _offers.c.expires_at > now)
        .values(state=new_state, decided_at=now, **values)
        .returning(*_offers.c)
    ).first()
    if decided is None:
        state = state_of(session.execute(select(_offers.c.state, _offers.c.expires_at).where(_offers.c.id == offer.id)).one(), now)
        raise Conflict(f"offer #{offer.id} is already {state}", state=state)
    return decided


def _require_receiver(caller: Principal, offer, action: str) -> None:
    me = caller.require_participant()
    if me.id != offer.to_id:
        raise Forbidden(f"only {offer.to_name}, to whom offer #{offer.id} was made, may {action} it")


def accept(session: Session, caller: Principal, offer_id: int, body: schemas.OfferAccept, now: datetime) -> schemas.OfferOut:
    offer = _offer(session, caller, offer_id)
    _require_receiver(caller, offer, "accept")
    chosen = list(dict.fromkeys(body.task_ids)) if body.task_ids else list(offer.task_ids)
    extra = [t for t in chosen if t not in offer.task_ids]
    if extra:
        raise Invalid(f"tasks {extra} are not part of offer #{offer.id}")
    contract = session.execute(select(_contracts).where(_contracts.c.id == offer.contract_id)).one()
    if not contract_service.in_force(contract, now):
        raise Conflict(f"contract #{contract.id} is no longer in force")
    cap = offer.caps[len(chosen) - 1]  # the offerer's cap for as many tasks as are taken
    price = cap if body.price is None else body.price
    if not contract.price_min <= price <= cap:
        raise Invalid(
            f"the settled price {price:g} must lie between the contract's price_min {contract.price_min:g} and the offered {cap:g} for {len(chosen)} task(s)"
        )
    decided = _decide(session, offer, OfferState.ACCEPTED, now, accepted_task_ids=chosen, settled_price=price)
    moved = session.execute(
        update(_tasks)
        .where(_tasks.c.id.in_(chosen), _tasks.c.host_id == offer.from_id, _tasks.c.until_s.is_(None))
        .values(host_id=offer.to_id, epoch=_tasks.c.epoch + 1)
        .returning(_tasks.c.id, _tasks.c.load)
    ).all()
    if len(moved) != len(chosen):
        raise Conflict(f"some of tasks {chosen} left {offer.from_name}, or began to hand their key groups over, since the offer; nothing moved")
    declared = dict(zip(offer.task_ids, offer.loads)) if offer.loads is not None else {}
    movements = list(session.scalars(insert(_movements).returning(_movements.c.id, sort_by_parameter_order=True), [
        {"offer_id": offer.id, "contract_id": contract.id, "task_id": task.id, "from_id": offer.from_id, "to_id": offer.to_id, "price": price,
         "load": declared.get(task.id, task.load),  # as declared, until its host measures it
         "declared_load": declared.get(task.id), "amount": 0.0, "accrued_at": now, "state": MovementState.ACTIVE, "started_at": now,
         "earliest_end_at": now + timedelta(seconds=contract.min_duration_s)}
        for task in sorted(moved, key=lambda t: t.id)
    ]))
    changes.offer_changed(session, offer)
    changes.task_changed(session, chosen, offer.from_id)
    events.record(
        session,
        "offer.accepted",
        f"{offer.to_name} accepted tasks {chosen} of offer #{offer.id} from {offer.from_name} at {price:g} (offered up to {offer.price:g})",
        actor=offer.to_name,
        subject=offer.from_name,
        data={"offer_id": offer.id, "task_ids": chosen, "movement_ids": movements, "price": price, "cap": offer.price},
        at=now,
    )
    return to_out(decided, offer.from_name, offer.to_name, now, movements)


def reject(session: Session, caller: Principal, offer_id: int, body: schemas.OfferReject, now: datetime) -> schemas.OfferOut:
    offer = _offer(session, caller, offer_id)
    _require_receiver(caller, offer, "reject")
    decided = _decide(session, offer, OfferState.REJECTED, now, reason=body.reason)
    changes.offer_changed(session, offer)
    events.record(
        session,
        "offer.rejected",
        f"{offer.to_name} refused offer #{offer.id} from {offer.from_name}" + (f": {body.reason}" if body.reason else ""),
        actor=offer.to_name,
        subject=offer.from_name,
        data={"offer_id": offer.id, "reason": body.reason},
        at=now,
    )
    return to_out(decided, offer.from_name, offer.to_name, now, [])


def withdraw(session: Session, caller: Principal, offer_id: int, now: datetime) -> schemas.OfferOut:
    offer = _offer(session, caller, offer_id)
    me = caller.require_participant()
    if me.id != offer.from_id:
        raise Forbidden(f"only {offer.from_name}, who made offer #{offer.id}, may withdraw it")
    decided = _decide(session, offer, OfferState.WITHDRAWN, now)
    changes.offer_changed(session, offer)
    events.record(session, "offer.withdrawn", f"{me.name} withdrew offer #{offer.id}", actor=me.name, subject=offer.to_name, data={"offer_id": offer.id}, at=now)
    return to_out(decided, offer.from_name, offer.to_name, now, [])


def movement_ids(session: Session, offer_ids: list[int]) -> dict[int, list[int]]:
    result: dict[int, list[int]] = {oid: [] for oid in offer_ids}
    for offer_id, movement_id in session.execute(select(Movement.offer_id, Movement.id).where(Movement.offer_id.in_(offer_ids)).order_by(Movement.id)):
        result[offer_id].append(movement_id)
    return result


def to_out(offer, from_name: str, to_name: str, now: datetime, movements: list[int]) -> schemas.OfferOut:
    """The API's view of an offer (an ORM object or a row of the offers table) between `from_name` and `to_name`."""
    return schemas.OfferOut(
        id=offer.id,
        contract_id=offer.contract_id,
        from_=from_name,
        to=to_name,
        task_ids=offer.task_ids,
        accepted_task_ids=offer.accepted_task_ids,
        price=offer.price,
        caps=offer.caps,
        loads=offer.loads,
        settled_price=offer.settled_price,
        state=state_of(offer, now),
        reason=offer.reason,
        created_at=offer.created_at,
        expires_at=offer.expires_at,
        decided_at=offer.decided_at,
        movements=movements,
    )


# Movements


def _concerned(movement: Movement) -> tuple[int, int, int]:
    """A movement concerns its two parties and its task's origin, who follows the task down a chain."""
    return movement.from_id, movement.to_id, movement.task.origin_id


def get_movement(session: Session, caller: Principal, movement_id: int) -> Movement:
    return get_private(session, caller, Movement, movement_id, "movement", _concerned)


def movements_concerning(participant_id: int, *columns):
    """The movements a participant sees (their ids, or `columns` of them): those it made or
    hosts, and those of the tasks it originates (a chain's later links). A union of three
    index lookups: one filter with OR over them read the whole movements table, which keeps
    every movement ever made, at each agent's read of its view."""
    columns = columns or (Movement.id,)
    return union(
        select(*columns).where(Movement.from_id == participant_id),
        select(*columns).where(Movement.to_id == participant_id),
        select(*columns).join(Task, Task.id == Movement.task_id).where(Task.origin_id == participant_id),
    )


def movements_in_view(session: Session, participant_id: int) -> list[Movement]:
    """The movements in a participant's view: of those it sees (`movements_concerning`), the
    active ones and the newest of each task. That is all its agent decides on (where a task
    runs, where it comes back from, its HA mode: `bpm.federation.views`), and it stays this
    size however long the federation trades; the whole history is `list_movements`'.
    The ids first, then the records by id: in one statement PostgreSQL planned the records'
    joins for a whole table's rows."""
    seen = movements_concerning(participant_id, Movement.id, Movement.task_id, Movement.state).subquery()
    newest = func.row_number().over(partition_by=seen.c.task_id, order_by=seen.c.id.desc())
    ranked = select(seen.c.id, seen.c.state, newest.label("newest")).subquery()
    ids = session.scalars(select(ranked.c.id).where(or_(ranked.c.newest == 1, ranked.c.state == MovementState.ACTIVE))).all()
    return list(session.scalars(select(Movement).where(Movement.id.in_(ids)).order_by(Movement.id)))


def list_movements(session: Session, caller: Principal, participant: str | None, state: str | None, page: PageQuery | None = None) -> list[Movement]:
    query = select(Movement)
    ids = []
    if not caller.is_operator:
        ids.append(caller.participant.id)
    if participant:
        ids.append(participants.get(session, participant).id)
    for pid in ids:
        query = query.where(Movement.id.in_(movements_concerning(pid)))
    if state:
        query = query.where(Movement.state == state)
    return (page or PageQuery.whole()).rows(session, query, Movement.id)


def end_movement(session: Session, caller: Principal, movement_id: int, now: datetime) -> Movement:
    """End a movement after its minimum duration: the task returns to the side that moved it.

    If that task was passed on, the chain after this movement unwinds first (those
    movements end too, whatever their minimum duration: the side that moved a task away
    may always take it back). A host may end only a movement whose task still runs at it.
    """
    movement = get_movement(session, caller, movement_id)
    if not caller.is_operator and caller.participant.id not in (movement.from_id, movement.to_id):
        raise Forbidden(
            f"only {movement.from_participant.name} and {movement.to_participant.name} may end movement #{movement.id}; "
            f"task #{movement.task_id}'s origin ends its own movement, which unwinds the chain after it"
        )
    if movement.state != MovementState.ACTIVE:
        raise Conflict(f"movement #{movement.id} already ended")
    if now < movement.earliest_end_at:
        remaining = (movement.earliest_end_at - now).total_seconds()
        raise Conflict(
            f"movement #{movement.id} cannot end before {movement.earliest_end_at.isoformat()} ({remaining:.1f} s left)",
            earliest_end_at=movement.earliest_end_at.isoformat(),
        )
    onward = list(
        session.scalars(
            select(Movement).where(Movement.task_id == movement.task_id, Movement.state == MovementState.ACTIVE, Movement.id > movement.id).order_by(Movement.id)
        )
    )
    if onward and caller.participant is not None and caller.participant.id == movement.to_id:
        raise Conflict(
            f"{movement.to_participant.name} passed task #{movement.task_id} on to {onward[0].to_participant.name} (movement #{onward[0].id}); "
            "a host returns only tasks that run at it",
            onward_movement_id=onward[0].id,
        )
    chain = [movement, *onward]
    # The task's row first, as every writer of a task and its movements does (accept, failover,
    # the heartbeat's accruals): two of them never wait for each other in opposite orders.
    session.execute(select(Task.id).where(Task.id == movement.task_id).with_for_update())
    # A heartbeat that took the task's row before this end did may have accrued past `now`
    # (read before the wait): the movement then ends where its accrual stopped, so what it
    # was paid covers exactly its start to its end.
    changed = session.execute(
        update(Movement)
        .where(Movement.id.in_([m.id for m in chain]), Movement.state == MovementState.ACTIVE)
        .values(state=MovementState.ENDED, ended_at=case((Movement.accrued_at > now, Movement.accrued_at), else_=now),
                ended_by_id=caller.participant.id if caller.participant else None)
        .execution_options(synchronize_session=False)
    ).rowcount
    if changed != len(chain):
        raise Conflict(f"movement #{movement.id} or one after it already ended")
    returned = session.execute(
        update(Task)
        .where(and_(Task.id == movement.task_id, Task.host_id == chain[-1].to_id))
        .values(host_id=movement.from_id, epoch=Task.epoch + 1)
        .execution_options(synchronize_session=False)
    ).rowcount
    if returned != 1:  # it was passed on meanwhile: nothing ends, the caller sees the new chain next time
        raise Conflict(f"task #{movement.task_id} moved on while movement #{movement.id} was ending; nothing ended")
    for m in chain:
        session.refresh(m)
    session.refresh(movement.task)
    changes.task_changed(session, [movement.task_id], *(p for m in chain for p in (m.from_id, m.to_id)))
    for m in reversed(onward):
        events.record(
            session,
            "movement.unwound",
            f"movement #{m.id} ended with movement #{movement.id}: task #{m.task_id} leaves {m.to_participant.name}",
            actor=caller.name,
            subject=m.to_participant.name,
            data={"movement_id": m.id, "task_id": m.task_id, "with_movement_id": movement.id},
            at=now,
        )
    events.record(
        session,
        "movement.ended",
        f"{caller.name} ended movement #{movement.id}: task #{movement.task_id} returns from {chain[-1].to_participant.name} to {movement.from_participant.name}",
        actor=caller.name,
        subject=movement.from_participant.name if caller.participant and caller.participant.id == movement.to_id else movement.to_participant.name,
        data={"movement_id": movement.id, "task_id": movement.task_id, "unwound": [m.id for m in onward]},
        at=now,
    )
    return movement


def accrued(movement: Movement, now: datetime) -> tuple[float, float]:
    """(seconds hosted away so far, amount the mover owes the host): price x load x seconds,
    summed over the host's reports, and the time since the last at the load it reported."""
    end = movement.ended_at or now
    seconds = max(0.0, (end - movement.started_at).total_seconds())
    since = max(0.0, (end - movement.accrued_at).total_seconds())
    return seconds, movement.amount + movement.price * movement.load * since


# Run at every heartbeat that reports loads: built once.
_ACTIVE_HOSTED = (
    select(Movement.id, Movement.task_id, Movement.price, Movement.load, Movement.declared_load, Movement.accrued_at, Movement.from_id)
    .join(Task, Task.id == Movement.task_id)
    .where(Movement.task_id.in_(bindparam("task_ids", expanding=True)), Movement.state == MovementState.ACTIVE, Task.host_id == bindparam("host"))
    .order_by(Movement.id)
)
_ACCRUE = (
    update(_movements)
    .where(_movements.c.id == bindparam("movement_id"), _movements.c.state == MovementState.ACTIVE, _movements.c.accrued_at == bindparam("seen_at"))
    .values(amount=_movements.c.amount + bindparam("added"), load=bindparam("billed"), accrued_at=bindparam("now"))
)


def accrue(session: Session, host: Participant, loads: Mapping[int, float], total: float, now: datetime) -> None:
    """The host measured each task's load (`loads`, by task id) over the time since its last
    report, and `total` for all it carries: every active movement of a task it hosts (a chain
    pays link by link) accrues that interval at the load `billed_load` allows. Conditional on
    the movement still being active and not accrued meanwhile, so a report racing an end or
    another report adds nothing twice. Two statements, however many tasks and movements; a
    movement whose measured load goes past the bound its offer's declared load sets is
    recorded as disputed when it does (not at every report), for both sides to see."""
    connection = session.connection()
    active = connection.execute(_ACTIVE_HOSTED, {"task_ids": sorted(loads), "host": host.id}).all()
    if not active:
        return
    rows = []
    for m in active:
        billed = billed_load(loads[m.task_id], m.declared_load, total)
        rows.append({"movement_id": m.id, "seen_at": m.accrued_at, "billed": billed, "now": now,
                     "added": m.price * billed * max(0.0, (now - m.accrued_at).total_seconds())})
        bound = billed_load(math.inf, m.declared_load)
        if loads[m.task_id] > bound and m.load < bound:
            payer = session.get(Participant, m.from_id)
            events.record(
                session, "movement.disputed",
                f"{host.name} measured task #{m.task_id} at load {loads[m.task_id]:.3g}, beyond the {m.declared_load:.3g} its offer declared: "
                f"movement #{m.id} is paid on {bound:.3g} while it lasts",
                actor=host.name, subject=payer.name,
                data={"movement_id": m.id, "task_id": m.task_id, "measured": loads[m.task_id], "declared": m.declared_load, "billed": bound},
                at=now,
            )
    connection.execute(_ACCRUE, rows)


def movement_out(movement: Movement, now: datetime) -> schemas.MovementOut:
    return schemas.MovementOut(
        id=movement.id,
        offer_id=movement.offer_id,
        contract_id=movement.contract_id,
        task_id=movement.task_id,
        task_name=movement.task.name,
        origin=movement.task.origin.name,
        from_=movement.from_participant.name,
        to=movement.to_participant.name,
        price=movement.price,
        load=movement.load,
        declared_load=movement.declared_load,
        state=movement.state,
        started_at=movement.started_at,
        earliest_end_at=movement.earliest_end_at,
        ended_at=movement.ended_at,
        accrued=accrued(movement, now)[1],
    )
