"""Participants: registration with a one-time key, heartbeats with load reports, liveness."""

from __future__ import annotations

import hashlib
import secrets
from datetime import datetime, timedelta

from sqlalchemy import bindparam, or_, select, union
from sqlalchemy.orm import Session

from api import schemas
from api.auth import Principal, hash_key, new_key
from api.errors import Conflict, Forbidden, NotFound
from api.models import Contract, Event, Failover, LoadSample, Participant, Replica, Task
from api.services import events
from bpm import certificates

# Load samples older than this are dropped: the UI charts the recent past only.
SAMPLE_RETENTION = timedelta(hours=2)
LOAD_SAMPLES_MAX = 3600  # samples one read of a load history returns at most


def get(session: Session, name: str) -> Participant:
    participant = session.scalar(select(Participant).where(Participant.name == name))
    if participant is None:
        raise NotFound(f"no participant named {name!r}")
    return participant


def _task_ids_of(participant_id: int):
    """Tasks a participant originates, hosts, holds or held a replica of, or took part in a failover of."""
    return union(
        select(Task.id).where(or_(Task.origin_id == participant_id, Task.host_id == participant_id)),
        select(Replica.task_id).where(Replica.participant_id == participant_id),
        select(Failover.task_id).where(
            or_(Failover.failed_id == participant_id, Failover.from_host_id == participant_id, Failover.to_host_id == participant_id)
        ),
    )


def related(session: Session, a: int, b: int) -> bool:
    """Whether two participants have dealt with each other: a contract in any state, or a task
    both have had a part in. What one may say about the other (an event's subject) needs it."""
    if a == b:
        return True
    lo, hi = sorted((a, b))
    if session.scalar(select(Contract.id).where(Contract.pair_lo == lo, Contract.pair_hi == hi).limit(1)) is not None:
        return True
    shared = select(Task.id).where(Task.id.in_(_task_ids_of(a)), Task.id.in_(_task_ids_of(b))).limit(1)
    return session.scalar(shared) is not None


def report_event(session: Session, caller: Principal, kind: str, message: str, subject: str | None, data: dict, now: datetime) -> Event:
    """An event a participant's agent reports, in its own name; its subject (whose feed it
    shows in) is the reporter itself or a participant it has dealt with (`related`)."""
    me = caller.require_participant()
    if subject is not None and subject != me.name:
        other = get(session, subject)
        if not related(session, me.id, other.id):
            raise Forbidden(f"{me.name} has no contract and no task with {subject}; it reports events only about itself or a participant it deals with")
    return session.get(Event, events.record(session, kind, message, actor=me.name, subject=subject, data=data, at=now))


def register(session: Session, caller: Principal, body: schemas.ParticipantCreate) -> tuple[Participant, str]:
    caller.require_operator()
    if session.scalar(select(Participant.id).where(Participant.name == body.name)) is not None:
        raise Conflict(f"the name {body.name!r} is taken")
    key = new_key()
    participant = Participant(name=body.name, endpoint=body.endpoint, certificate=body.certificate, key_hash=hash_key(key))
    session.add(participant)
    session.flush()
    events.record(session, "participant.registered", f"{body.name} joined at {body.endpoint}", actor="operator", subject=body.name)
    return participant, key


# A revoked key's stored hash: never the SHA-256 hex digest of any key, unique per participant.
_REVOKED = "revoked-"


def key_mark(participant: Participant) -> str:
    """What names the participant's current API key without revealing it (a digest of the key's
    hash): a call token carries its caller's mark (`bpm.tokens`), and an agent refuses one whose
    caller's key has changed since, by rotation or revocation."""
    return hashlib.sha256(b"bpm-call-key\0" + participant.key_hash.encode()).hexdigest()[:16]


def key_revoked(participant: Participant) -> bool:
    return participant.key_hash.startswith(_REVOKED)


def key_revoked_sql():
    """`key_revoked` as an SQL condition."""
    return Participant.key_hash.startswith(_REVOKED)


def rotate_key(session: Session, caller: Principal, name: str, now: datetime) -> tuple[Participant, str]:
    """A new key for the participant, by itself or the operator; the old key stops working at once."""
    participant = get(session, name)
    if not caller.is_operator and caller.participant.id != participant.id:
        raise Forbidden(f"only {name} or the operator may rotate {name}'s key")
    key = new_key()
    participant.key_hash = hash_key(key)
    session.flush()
    events.record(session, "participant.key_rotated", f"{caller.name} rotated {name}'s key", actor=caller.name, subject=name, at=now)
    return participant, key


def set_certificate(session: Session, caller: Principal, name: str, pem: str, now: datetime) -> Participant:
    """The participant's TLS certificate (`pem`, checked by the schema), set by itself or the
    operator; recorded as an event when it changes."""
    participant = get(session, name)
    if not caller.is_operator and caller.participant.id != participant.id:
        raise Forbidden(f"only {name} or the operator may register {name}'s certificate")
    if participant.certificate != pem:
        participant.certificate = pem
        session.flush()
        digest = certificates.sha256(pem)
        events.record(session, "participant.certificate", f"{caller.name} registered {name}'s TLS certificate {digest[:16]}...",
                      actor=caller.name, subject=name, at=now, data={"sha256": digest})
    return participant


def certificate_sha256(participant: Participant) -> str | None:
    return certificates.sha256(participant.certificate) if participant.certificate else None


def revoke_key(session: Session, caller: Principal, name: str, now: datetime) -> Participant:
    """The operator withdraws the participant's key (lost or stolen): every call with it gets 401
    until the operator rotates it, which hands out a new one."""
    caller.require_operator()
    participant = get(session, name)
    participant.key_hash = _REVOKED + secrets.token_hex(28)
    session.flush()
    events.record(session, "participant.key_revoked", f"the operator revoked {name}'s key", actor="operator", subject=name, at=now)
    return participant


def liveness(participant: Participant, now: datetime, timeout_s: float) -> tuple[str, float | None]:
    """('new'|'alive'|'suspected'|'failed', heartbeat age): suspected past the timeout, failed past twice it."""
    if participant.heartbeat_at is None:
        return "new", None
    age = max(0.0, (now - participant.heartbeat_at).total_seconds())
    if age <= timeout_s:
        return "alive", age
    return ("suspected" if age <= 2 * timeout_s else "failed"), age


_HOSTED = select(Task.id).where(Task.host_id == bindparam("host")).order_by(Task.id)


def hosted_task_ids(session: Session, participant_ids: list[int]) -> dict[int, list[int]]:
    hosted: dict[int, list[int]] = {pid: [] for pid in participant_ids}
    rows = session.execute(select(Task.host_id, Task.id).where(Task.host_id.in_(participant_ids)).order_by(Task.id))
    for host_id, task_id in rows:
        hosted[host_id].append(task_id)
    return hosted


def hosted_by(session: Session, participant_id: int) -> list[int]:
    """The ids of the tasks the participant hosts."""
    return list(session.scalars(_HOSTED, {"host": participant_id}))


def load_samples(session: Session, name: str, since: datetime | None, limit: int = LOAD_SAMPLES_MAX) -> list[LoadSample]:
    """The participant's newest `limit` load samples after `since`, oldest first."""
    participant = get(session, name)
    query = select(LoadSample).where(LoadSample.participant_id == participant.id)
    if since is not None:
        query = query.where(LoadSample.at > since)
    return list(reversed(session.scalars(query.order_by(LoadSample.at.desc(), LoadSample.id.desc()).limit(limit)).all()))
