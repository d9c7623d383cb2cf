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
- a contract: its two parties.

A participant's heartbeat returns its notices (`pending`) and acknowledges those its agent
has acted on, which deletes them; a notice stays until acknowledged, so a change committed
after a later one (ids are handed out before commit) is never skipped. What happens by the
clock alone (an offer's expiry, a partner falling silent) leaves no notice: the agent keeps
the expiry of what it read, and the heartbeat carries its partners' liveness.
"""

from __future__ import annotations

from collections.abc import Iterable

from sqlalchemy import delete, insert, or_, select, union
from sqlalchemy.orm import Session

from api.models import Change, Contract, Movement, Offer, Replica, Task

KINDS = ("task", "offer", "contract")
# The most notices one heartbeat returns; the rest follow with the next one.
PAGE = 500


def notify(session: Session, kind: str, participant_ids: Iterable[int | None]) -> None:
    """One notice of `kind` for each participant (once each)."""
    assert kind in KINDS, kind
    ids = sorted({i for i in participant_ids if i is not None})
    if ids:
        session.execute(insert(Change), [{"participant_id": i, "kind": kind} for i in ids])


def task_changed(session: Session, task_ids: Iterable[int], *also: int | None) -> None:
    """Tasks changed (host, epoch, replicas): notify everyone they concern, and `also` those
    they concerned before the change (a previous host, the sides of a movement that ended)."""
    ids = list(task_ids)
    if not ids:
        return
    concerned = union(
        select(Task.origin_id).where(Task.id.in_(ids)),
        select(Task.host_id).where(Task.id.in_(ids)),
        select(Replica.participant_id).where(Replica.task_id.in_(ids)),
        select(Movement.from_id).where(Movement.task_id.in_(ids), Movement.state == "active"),
        select(Movement.to_id).where(Movement.task_id.in_(ids), Movement.state == "active"),
    )
    notify(session, "task", [*session.scalars(concerned), *also])


def offer_changed(session: Session, offer: Offer) -> None:
    notify(session, "offer", (offer.from_id, offer.to_id))


def contract_changed(session: Session, contract: Contract) -> None:
    notify(session, "contract", (contract.proposer_id, contract.counterparty_id))


def pending(session: Session, participant_id: int, acknowledged: Iterable[int] = ()) -> list[Change]:
    """Delete the participant's acknowledged notices; return those still pending, oldest first."""
    done = sorted(set(acknowledged))
    if done:
        session.execute(
            delete(Change).where(Change.participant_id == participant_id, Change.id.in_(done)).execution_options(synchronize_session=False)
        )
    query = select(Change).where(Change.participant_id == participant_id).order_by(Change.id).limit(PAGE)
    return list(session.scalars(query))


def partners(participant_id: int):
    """The ids of the participants whose liveness concerns this one (a query, itself among
    them): its contract partners, the origins and hosts of the tasks it is involved in, and
    the holders of their replicas."""
    from api.services.tasks import involved_tasks

    involved = involved_tasks(participant_id)
    return union(
        select(Contract.proposer_id).where(Contract.counterparty_id == participant_id, Contract.state == "active"),
        select(Contract.counterparty_id).where(Contract.proposer_id == participant_id, Contract.state == "active"),
        select(Task.origin_id).where(Task.id.in_(involved)),
        select(Task.host_id).where(Task.id.in_(involved)),
        select(Replica.participant_id).where(Replica.task_id.in_(involved), or_(Replica.state == "active", Replica.state == "promoted")),
    )
