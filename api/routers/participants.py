from __future__ import annotations

from datetime import datetime
from typing import Annotated

from fastapi import Query, Request, Response

from api import schemas
from api.deps import Caller, DbSession, Now
from api.errors import Forbidden
from api.models import Participant
from api.pages import Page
from api.services import ha as ha_service
from api.services import heartbeats
from api.services import offers as offer_service
from api.services import participants as service
from api.services import tasks as task_service
from api.routing import Router

router = Router(prefix="/participants", tags=["participants"])
me_router = Router(tags=["participants"])


def _out(request: Request, participant: Participant, hosted: list[int], now: datetime, cls=schemas.ParticipantOut, **extra):
    status, age = service.liveness(participant, now, request.app.state.settings.heartbeat_timeout_s)
    if "certificate" in cls.model_fields:  # not on the heartbeat's hot path: it does not change there
        extra.update(certificate=participant.certificate, certificate_sha256=service.certificate_sha256(participant))
    return cls(
        name=participant.name,
        endpoint=participant.endpoint,
        created_at=participant.created_at,
        status=status,
        heartbeat_at=participant.heartbeat_at,
        heartbeat_age_s=age,
        load=participant.load,
        threshold=participant.threshold,
        marginal_cost=participant.marginal_cost,
        hosted_tasks=hosted,
        key_revoked=service.key_revoked(participant),
        key_mark=service.key_mark(participant),
        **extra,
    )


@router.post("", status_code=201, response_model=schemas.ParticipantCreated)
def register_participant(body: schemas.ParticipantCreate, request: Request, session: DbSession, caller: Caller, now: Now):
    """Register a participant (operator only); the response carries its API key, shown this once."""
    participant, key = service.register(session, caller, body)
    return _out(request, participant, [], now, schemas.ParticipantCreated, api_key=key)


@router.get("", response_model=list[schemas.ParticipantOut])
def list_participants(request: Request, response: Response, session: DbSession, caller: Caller, now: Now, page: Page):
    """List all participants with their liveness and last load report, by name (a page of them with `limit`)."""
    from sqlalchemy import select

    rows = page.rows(session, select(Participant), Participant.name)
    page.tell(response)
    hosted = service.hosted_task_ids(session, [p.id for p in rows])
    return [_out(request, p, hosted[p.id], now) for p in rows]


@me_router.get("/me", response_model=schemas.Identity)
def who_am_i(caller: Caller):
    """Who the key in use belongs to: the operator, or one participant."""
    return schemas.Identity(name=caller.name, role="operator" if caller.is_operator else "participant")


@router.get("/{name}", response_model=schemas.ParticipantOut)
def get_participant(name: schemas.NamePath, request: Request, session: DbSession, caller: Caller, now: Now):
    """One participant with its liveness, last load report and hosted tasks."""
    participant = service.get(session, name)
    return _out(request, participant, service.hosted_task_ids(session, [participant.id])[participant.id], now)


@router.get("/{name}/view", response_model=schemas.ParticipantView)
def participant_view(name: schemas.NamePath, session: DbSession, caller: Caller, now: Now):
    """What concerns the participant, in one read (that participant only): the tasks it
    originates, hosts or keeps a replica of, and their replicas (the same records as
    `GET /tasks?involving=` and `/replicas`); of the movements and failovers it sees, the
    part its agent decides on (`offers.movements_in_view`, `ha.failovers_in_view`), while
    `/movements?participant=` and `/failovers` keep the whole history."""
    if caller.participant is None or caller.participant.name != name:
        raise Forbidden(f"only {name} may read its view")
    return schemas.ParticipantView(
        tasks=[task_service.to_out(t) for t in task_service.list_tasks(session, None, None, name)],
        movements=[offer_service.movement_out(m, now) for m in offer_service.movements_in_view(session, caller.participant.id)],
        replicas=[ha_service.replica_out(r) for r in ha_service.list_replicas(session, caller, None, None)],
        failovers=[ha_service.failover_out(f) for f in ha_service.failovers_in_view(session, caller.participant.id)],
    )


@router.post("/{name}/heartbeat", response_model=schemas.HeartbeatOut)
def heartbeat(name: schemas.NamePath, body: schemas.Heartbeat, request: Request, session: DbSession, caller: Caller, now: Now):
    """Report the participant's load, threshold, marginal costs and hosted tasks (that participant only).

    The answer is also its change feed: the notices of changes that concern it that it has
    not acknowledged yet (`acknowledged` in the body deletes those acted on), and the
    liveness of the participants that concern it (`api.services.changes`)."""
    timeout_s = request.app.state.settings.heartbeat_timeout_s
    participant = heartbeats.heartbeat(session, caller, name, body, now, timeout_s)
    notices, partners = heartbeats.feed(session, participant, body.acknowledged)
    return _out(
        request, participant, service.hosted_by(session, participant.id), now, schemas.HeartbeatOut,
        changes=[schemas.ChangeOut(id=c.id, kind=c.kind) for c in notices],
        partners={p.name: service.liveness(p, now, timeout_s)[0] for p in partners},
    )


@router.get("/{name}/loads", response_model=list[schemas.LoadSampleOut])
def load_history(name: schemas.NamePath, session: DbSession, caller: Caller, since: schemas.MomentQuery = None,
                 limit: Annotated[int, Query(ge=1, le=service.LOAD_SAMPLES_MAX)] = service.LOAD_SAMPLES_MAX):
    """The participant's recent load and threshold samples after `since`, oldest first: the
    newest `limit` of them (at most an hour's at one heartbeat a second)."""
    return [schemas.LoadSampleOut(at=s.at, load=s.load, threshold=s.threshold) for s in service.load_samples(session, name, since, limit)]


@router.post("/{name}/key", status_code=201, response_model=schemas.KeyRotated)
def rotate_key(name: schemas.NamePath, session: DbSession, caller: Caller, now: Now):
    """A new key for the participant (by itself or the operator), shown this once; the old key stops working."""
    participant, key = service.rotate_key(session, caller, name, now)
    return schemas.KeyRotated(name=participant.name, api_key=key)


@router.put("/{name}/certificate", response_model=schemas.ParticipantOut)
def register_certificate(name: schemas.NamePath, body: schemas.CertificateIn, request: Request, session: DbSession, caller: Caller, now: Now):
    """Register the TLS certificate the participant's agent serves (by itself or the operator),
    in place of the one before: partners pin it from their next read of the participant."""
    participant = service.set_certificate(session, caller, name, body.certificate, now)
    return _out(request, participant, service.hosted_task_ids(session, [participant.id])[participant.id], now)


@router.delete("/{name}/key", response_model=schemas.KeyRevoked)
def revoke_key(name: schemas.NamePath, session: DbSession, caller: Caller, now: Now):
    """Operator: withdraw the participant's key; it can do nothing until the operator rotates it."""
    participant = service.revoke_key(session, caller, name, now)
    return schemas.KeyRevoked(name=participant.name, key_revoked=True)
