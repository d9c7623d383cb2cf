"""Call tokens: the registry vouches for who calls another agent, for which task and epoch."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from api import schemas, signing
from api.auth import Principal
from api.errors import Conflict, Forbidden, Invalid
from api.models import Replica
from api.services import changes, contracts, events, participants, tasks
from api.services.ha import task_label


def issue(session: Session, caller: Principal, body: schemas.TokenCreate, now: datetime, sealer: signing.Sealer) -> schemas.TokenOut:
    """A token for the caller's call to `body.audience` about one task at one epoch (or, for
    `alerts`, to a contract partner: `_alerts`).

    Only the task's host at that epoch gets one: for a handover it fetches the checkpoint
    from the task's previous host; for a delta it sends an HA delta to a holder of an
    active replica of the task; for a stream it asks the task's origin for the credentials
    that read the task's share of the origin's broker stream, or acknowledges that stream.
    A holder of an active active-standby replica of the task, which reads the same input,
    gets one for a stream too.
    """
    me = caller.require_participant()
    audience = participants.get(session, body.audience)
    if audience.id == me.id:
        raise Invalid("a token is for a call to another participant")
    if body.purpose == "alerts":
        return _alerts(session, me, audience, now, sealer)
    task = tasks.get(session, body.task_id)
    replicates = body.purpose == "stream" and session.scalar(
        select(Replica.id).where(Replica.task_id == task.id, Replica.participant_id == me.id, Replica.state == "active",
                                 Replica.role == "active_standby")
    ) is not None
    if (task.host_id != me.id and not replicates) or task.epoch != body.epoch:
        raise Conflict(
            f"task #{task.id} {task_label(task)} runs at {task.host.name} at epoch {task.epoch}; only its host at an epoch calls others about it",
            host=task.host.name, epoch=task.epoch,
        )
    if body.purpose == "stream" and audience.id != task.origin_id:
        raise Forbidden(f"task #{task.id} reads {task.origin.name}'s stream; credentials for it come from {task.origin.name}, not {audience.name}")
    if body.purpose == "delta":
        holds = session.scalar(
            select(Replica.id).where(Replica.task_id == task.id, Replica.participant_id == audience.id, Replica.state == "active")
        )
        if holds is None:
            raise Forbidden(f"{audience.name} holds no active replica of task #{task.id}; deltas go only to replica holders")
    return _token(session, me, audience, now, sealer, purpose=body.purpose, task=task_label(task), task_id=task.id, epoch=task.epoch)


def _alerts(session: Session, me, audience, now: datetime, sealer: signing.Sealer) -> schemas.TokenOut:
    """A token for `me` to ask `audience` for the credentials that read its shared alerts:
    only between two parties of a contract in force (whether `audience` shares is its own choice)."""
    contract = contracts.active_between(session, me.id, audience.id)
    if contract is None or not contracts.in_force(contract, now):
        raise Forbidden(f"{me.name} and {audience.name} have no contract in force; alerts are shared only between contract partners")
    return _token(session, me, audience, now, sealer, purpose="alerts", task=None, task_id=None, epoch=None)


def _token(session: Session, me, audience, now: datetime, sealer: signing.Sealer, **about) -> schemas.TokenOut:
    """A signed token from `me` (and the mark of its key, `bpm.tokens`) to `audience`, about what `about` says."""
    claims = {"sub": me.name, "ck": participants.key_mark(me), "aud": audience.name, **about}
    token, kid, expires = signing.sign(session, claims, now, sealer)
    return schemas.TokenOut(token=token, expires_at=expires, kid=kid)


def keys(session: Session, now: datetime) -> list[schemas.KeyOut]:
    return [
        schemas.KeyOut(kid=k.kid, public_key=k.public_pem, created_at=k.created_at, retired_at=k.retired_at)
        for k in signing.verifying(session, now)
    ]


def rotate(session: Session, caller: Principal, now: datetime, sealer: signing.Sealer, revoke: bool = False) -> schemas.KeyOut:
    caller.require_operator()
    key = signing.rotate(session, now, sealer, revoke=revoke)
    changes.keys_changed(session)
    earlier = "earlier keys are revoked" if revoke else f"earlier keys verify for {signing.GRACE.total_seconds():g} s more"
    events.record(session, "registry.key_rotated", f"the registry's signing key is now {key.kid}; {earlier}", actor="operator",
                  data={"kid": key.kid, "revoked": revoke}, at=now)
    return schemas.KeyOut(kid=key.kid, public_key=key.public_pem, created_at=key.created_at, retired_at=None)
