from __future__ import annotations

from fastapi import Request

from api import schemas
from api.deps import Caller, DbSession, Now
from api.services import tokens as service
from api.routing import Router

router = Router(tags=["tokens"])


@router.post("/tokens", status_code=201, response_model=schemas.TokenOut)
def issue_token(body: schemas.TokenCreate, request: Request, session: DbSession, caller: Caller, now: Now):
    """A short-lived token for one call to another participant's agent about one task at one epoch (see `GET /keys`)."""
    return service.issue(session, caller, body, now, request.app.state.sealer)


@router.get("/keys", response_model=list[schemas.KeyOut])
def signing_keys(session: DbSession, now: Now):
    """The public keys agents verify call tokens with: open to all, like a certificate."""
    return service.keys(session, now)


@router.post("/keys/rotate", status_code=201, response_model=schemas.KeyOut)
def rotate_signing_key(request: Request, session: DbSession, caller: Caller, now: Now, revoke: bool = False):
    """Operator: sign with a new key from now on; tokens signed before stay valid until they
    expire, or, with `revoke=true` (a key thought stolen), no longer at all. Every participant
    gets a `keys` change notice, and its agent reads the keys again."""
    return service.rotate(session, caller, now, request.app.state.sealer, revoke)
