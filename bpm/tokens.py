"""Call tokens: what one agent shows another to prove who calls, for which task and epoch.

The registry signs a token (Ed25519, a JWT) for one call between two parties: `sub` the
caller, `ck` the mark of the caller's API key when it was issued (the registry's
`key_mark`: an agent refuses the token once the caller's key changed), `aud` the agent called, `purpose` (a `handover` fetch of a checkpoint, an HA
`delta`, the `stream` credentials of the task's origin's broker), the task's key and epoch;
or `alerts`, the credentials that read a contract partner's shared alerts, about no task. It issues one only to a caller the rules allow (the
task's host at that epoch). The agent called verifies it against the registry's public
keys (`GET /api/v1/keys`, open) and trusts no name in the request itself.
"""

from __future__ import annotations

from dataclasses import dataclass

import jwt

ISSUER = "bpm-registry"
ALGORITHM = "EdDSA"
PURPOSES = ("handover", "delta", "stream", "alerts")
TTL_S = 120  # a token is asked for just before its call, and refreshed well before it lapses
LEEWAY_S = 5  # clocks of separate hosts differ a little


class TokenRefused(Exception):
    """The call's credential is missing, invalid, expired or for another call: `status` 401 or 403."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Grant:
    caller: str
    audience: str
    purpose: str
    task: str | None
    epoch: int | None
    expires_at: float
    key_mark: str | None = None  # the caller's key when the token was issued (`ck`)


def key_id(token: str) -> str | None:
    """The id of the registry key that signed `token` (from its header), or None if unreadable."""
    try:
        return jwt.get_unverified_header(token).get("kid")
    except jwt.PyJWTError:
        return None


def verify(token: str | None, public_pem: str | None, *, audience: str, purpose: str, task: str | None, epoch: int | None,
           now: float) -> Grant:
    """The grant `token` carries, if the registry key `public_pem` signed it for exactly this
    call (audience, purpose, task, epoch: None for a call about no task) and it has not
    expired at `now` (the verifier's clock, in seconds since the epoch); else TokenRefused."""
    if not token:
        raise TokenRefused(401, "missing credential: send 'Authorization: Bearer <token>' with a token the registry issued for this call")
    if public_pem is None:
        raise TokenRefused(401, "the token is not signed by a key the registry lists")
    try:
        claims = jwt.decode(
            token, public_pem, algorithms=[ALGORITHM], audience=audience, issuer=ISSUER,
            options={"require": ["exp", "iat", "sub", "aud", "iss"], "verify_exp": False, "verify_iat": False},
        )
    except jwt.InvalidAudienceError:
        raise TokenRefused(403, f"the token is for another participant, not {audience}") from None
    except jwt.PyJWTError as exc:
        raise TokenRefused(401, f"invalid token: {exc}") from None
    if not isinstance(claims["exp"], int | float) or now > claims["exp"] + LEEWAY_S:
        raise TokenRefused(401, "the token has expired; ask the registry for a new one")
    wanted = {"purpose": purpose, "task": task, "epoch": epoch}
    granted = {k: claims.get(k) for k in wanted}
    if granted != wanted:
        raise TokenRefused(403, f"the token grants {granted}, not {wanted}")
    mark = claims.get("ck")
    return Grant(claims["sub"], audience, purpose, task, epoch, float(claims["exp"]), mark if isinstance(mark, str) else None)
