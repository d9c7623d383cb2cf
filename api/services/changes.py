"""The change feed: what changed that concerns a participant, so that its agent reads again
only what changed instead of re-reading the federation.

Every write that changes a task (its host or epoch: an accepted offer, an ended movement, a
failover; a replica placed, dropped or promoted), an offer (made, answered, withdrawn) or a
contract (proposed, countered, accepted, ended) leaves one notice per participant it
concerns, in the same transaction. Who a change concerns is decided here and only here:

- a task: its origin, its host before and after, every participant holding a replica of
  it, and both sides of its active movements (those who see it in `GET /tasks?involving=`
  and `GET /movements`);
- an offer: the offerer and the receiver;
- a contract: its two parties;
- the registry's signing keys (a rotation): every participant, which reads `GET /keys` again.

A participant's heartbeat returns its notices (`pending`) and acknowledges those its agent
has acted on, which deletes them; a notice stays until acknowledged, so a change committed
after a later one (ids are handed out before commit) is never skipped. What happens by the
clock alone (an offer's expiry, a partner falling silent) leaves no notice: the agent keeps
the expiry of what it read, and the heartbeat carries its partners' liveness.
"""

from __future__ import annotations

from collections.abc import Iterable

from sqlalchemy import Row, bindparam, delete, insert, literal, or_, select, union
from sqlalchemy.orm import Session

from api.models import Change, Contract, Movement, Offer, Participant, Replica, Task
from bpm.negotiation import MovementState

KINDS = ("task", "offer", "contract", "keys")
# The most notices one heartbeat returns; the rest follow with the next one.
PAGE = 500
# Notices are written and read with Core statements on the table: the ORM's bulk insert
# costs more CPU than the statement itself.
_changes = Change.__table__


def notify(session: Session, kind: str, participant_ids: Iterable[int | None]) -> None:
    """One notice of `kind` for each participant (once each)."""
    assert kind in KINDS, kind
    ids = sorted({i for i in participant_ids if i is not None})
    if ids:
        session.execute(insert(_changes), [{"participant_id": i, "kind": kind} for i in ids])


def task_changed(session: Session, task_ids: Iterable[int], *also: int | None) -> None:
    """Tasks changed (host, epoch, replicas): notify everyone they concern, and `also` those
    they concerned before the change (a previous host, the sides of a movement that ended)."""
    ids = sorted(set(task_ids))
    if ids:
        session.execute(_TASK_CHANGED, {"ids": ids, "also": sorted({i for i in also if i is not None})})


# `task_changed` in one statement, built once: the notices are written from the union of
# those concerned, which also makes them one per participant.
_ids = bindparam("ids", expanding=True)
_task_concerned = union(
    select(Task.origin_id).where(Task.id.in_(_ids)),
    select(Task.host_id).where(Task.id.in_(_ids)),
    select(Replica.participant_id).where(Replica.task_id.in_(_ids)),
    select(Movement.from_id).where(Movement.task_id.in_(_ids), Movement.state == MovementState.ACTIVE),
    select(Movement.to_id).where(Movement.task_id.in_(_ids), Movement.state == MovementState.ACTIVE),
    select(Participant.id).where(Participant.id.in_(bindparam("also", expanding=True))),
).subquery()
_TASK_CHANGED = insert(_changes).from_select(["participant_id", "kind"], select(_task_concerned.c[0], literal("task")))


def keys_changed(session: Session) -> None:
    """The registry's signing keys changed (a rotation): every participant reads them again."""
    session.execute(insert(_changes).from_select(["participant_id", "kind"], select(Participant.id, literal("keys"))))


def offer_changed(session: Session, offer: Offer) -> None:
    notify(session, "offer", (offer.from_id, offer.to_id))


def contract_changed(session: Session, contract: Contract) -> None:
    notify(session, "contract", (contract.proposer_id, contract.counterparty_id))


# Read at every heartbeat: built once (building a statement costs more CPU than running it).
_ACKNOWLEDGE = delete(_changes).where(_changes.c.participant_id == bindparam("me"), _changes.c.id.in_(bindparam("done", expanding=True)))
_PENDING = select(_changes.c.id, _changes.c.kind).where(_changes.c.participant_id == bindparam("me")).order_by(_changes.c.id).limit(PAGE)


def involved_tasks(participant_id: int):
    """Ids of tasks a participant originates, hosts or holds a replica of: what concerns it.
    A union of three index lookups: one filter with OR over the three read the whole table
    at every heartbeat, a cost that grew with the federation."""
    return union(
        select(Task.id).where(Task.origin_id == participant_id),
        select(Task.id).where(Task.host_id == participant_id),
        select(Replica.task_id).where(Replica.participant_id == participant_id),
    )


def _partners_of(me):
    """The ids of the participants whose liveness concerns participant `me` (itself among
    them): its contract partners, the origins and hosts of the tasks it is involved in, and
    the holders of their replicas."""
    involved = involved_tasks(me)
    return union(
        select(Contract.proposer_id).where(Contract.counterparty_id == me, Contract.state == "active"),
        select(Contract.counterparty_id).where(Contract.proposer_id == me, Contract.state == "active"),
        select(Task.origin_id).where(Task.id.in_(involved)),
        select(Task.host_id).where(Task.id.in_(involved)),
        select(Replica.participant_id).where(Replica.task_id.in_(involved), or_(Replica.state == "active", Replica.state == "promoted")),
    )


_PARTNERS = (
    select(Participant.name, Participant.heartbeat_at)
    .where(Participant.id.in_(_partners_of(bindparam("me"))), Participant.id != bindparam("me"))
    .order_by(Participant.name)
)


def pending(session: Session, participant_id: int, acknowledged: Iterable[int] = ()) -> list[Row]:
    """Delete the participant's acknowledged notices; return those still pending, `(id, kind)`, oldest first."""
    done = sorted(set(acknowledged))
    if done:
        session.connection().execute(_ACKNOWLEDGE, {"me": participant_id, "done": done})
    return list(session.connection().execute(_PENDING, {"me": participant_id}))


def partners(session: Session, participant_id: int) -> list[Row]:
    """`(name, heartbeat_at)` of the participants whose liveness concerns this one."""
    return list(session.connection().execute(_PARTNERS, {"me": participant_id}))
