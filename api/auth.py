"""Keys and who is calling: the operator, or one participant (`Authorization: Bearer KEY`)."""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy import bindparam, select
from sqlalchemy.orm import Session

from api.errors import Forbidden, NotFound, Unauthorized
from api.models import Participant
from api.quotas import Quotas

_bearer = HTTPBearer(auto_error=False, description="The operator's key or a participant's key")
# The key a request carries (`Authorization: Bearer`), if any.
Bearer = Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]


def new_key() -> str:
    return "bpm_" + secrets.token_urlsafe(32)


def hash_key(key: str) -> str:
    # Keys are 256 random bits, so a fast hash is enough: no dictionary attack applies.
    return hashlib.sha256(key.encode()).hexdigest()


@dataclass(frozen=True)
class Principal:
    """Who is calling: `participant` is None for the operator."""

    participant: Participant | None

    @property
    def is_operator(self) -> bool:
        return self.participant is None

    @property
    def name(self) -> str:
        return "operator" if self.participant is None else self.participant.name

    def require_operator(self) -> None:
        if not self.is_operator:
            raise Forbidden("only the operator may do this")

    def require_participant(self) -> Participant:
        if self.participant is None:
            raise Forbidden("this action belongs to a participant; sign in with a participant's key")
        return self.participant

    def may_see(self, *participant_ids: int) -> bool:
        return self.participant is None or self.participant.id in participant_ids


def get_private(session: Session, caller: Principal, model, record_id: int, label: str, parties) -> object:
    """The record of `model` with this id: 404 when absent, 403 unless the caller is one of
    its parties (`parties(record)` gives their ids) or the operator."""
    return private(caller, session.get(model, record_id), record_id, label, parties)


def private(caller: Principal, record, record_id: int, label: str, parties):
    """`record` (an ORM object or a row; None: there is none with this id) if the caller may
    see it: 404 when absent, 403 unless the caller is one of its parties or the operator."""
    if record is None:
        raise NotFound(f"no {label} #{record_id}")
    if not caller.may_see(*parties(record)):
        raise Forbidden(f"{label} #{record_id} is private to the participants it concerns")
    return record


_BY_KEY = select(Participant).where(Participant.key_hash == bindparam("key_hash"))  # every request's: built once


def authenticate(session: Session, admin_key: str, key: str | None) -> Principal:
    if not key:
        raise Unauthorized("missing API key: send 'Authorization: Bearer <key>'")
    if hmac.compare_digest(key.encode(), admin_key.encode()):
        return Principal(participant=None)
    participant = session.scalar(_BY_KEY, {"key_hash": hash_key(key)})
    if participant is None:
        raise Unauthorized("invalid API key")
    return Principal(participant=participant)


@dataclass(frozen=True)
class KeyToCheck:
    """A participant's key that the request carries, looked up in the thread turn that runs
    the endpoint (`api.routing`) rather than in a turn of its own."""

    session: Session
    admin_key: str
    key: str
    quotas: Quotas
    address: str

    def principal(self) -> Principal:
        try:
            return authenticate(self.session, self.admin_key, self.key)
        except Unauthorized:
            # The request's transaction will not be kept: the key it cost is taken in one of
            # its own, after the request's ends (on SQLite it may hold the write lock).
            self.session.rollback()
            with self.session.get_bind().begin() as conn:
                self.quotas.take(conn, "bad_keys", self.address)
            raise


def principal_dependency(session_dependency):
    """A FastAPI dependency resolving the caller with the given session dependency: the
    operator's key (or none) at once, a participant's as a `KeyToCheck`."""

    async def _principal(
        request: Request,
        credentials: Bearer,
        session: Session = Depends(session_dependency, scope="function"),
    ) -> Principal | KeyToCheck:
        key = credentials.credentials if credentials else None
        admin_key = request.app.state.admin_key
        if not key or hmac.compare_digest(key.encode(), admin_key.encode()):
            return authenticate(session, admin_key, key)
        # An address that sent too many keys the registry does not know gets 429 before its
        # next key is looked up (`api.quotas`).
        quotas, address = request.app.state.quotas, request.client.host if request.client else "unknown"
        quotas.check_address(address)
        return KeyToCheck(session, admin_key, key, quotas, address)

    return _principal
