"""The registry's signing keys and the call tokens it signs with them (see `bpm.tokens`).

A key's private half is kept in the database sealed (Fernet: AES and an HMAC) with a secret
held outside it (`Sealer`: the settings' `signing_secret`, by default derived from the
operator's key): a copy of the database alone signs nothing. A key an older registry
kept in clear is sealed at start (`seal_all`)."""

from __future__ import annotations

import base64
import hashlib
from datetime import datetime, timedelta

import jwt
from cryptography.fernet import Fernet, InvalidToken
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from sqlalchemy import delete, or_, select, update
from sqlalchemy.orm import Session

from api.models import SigningKey
from bpm.tokens import ALGORITHM, ISSUER, TTL_S

# A retired key keeps verifying this long: longer than any token it signed lives.
GRACE = timedelta(seconds=10 * TTL_S)
ERASED = ""  # the private half of a retired key
SEALED = "fernet:"  # what begins a sealed private half


class SealedElsewhere(RuntimeError):
    """A signing key was sealed with another secret than this registry's."""


class Sealer:
    """Seals and opens signing keys' private halves with `secret` (kept outside the database)."""

    def __init__(self, secret: str) -> None:
        self._fernet = Fernet(base64.urlsafe_b64encode(hashlib.sha256(b"bpm-signing-key\0" + secret.encode()).digest()))
        self._opened: dict[str, Ed25519PrivateKey] = {}  # kid -> private key: opened once per process

    def seal(self, private_pem: str) -> str:
        return SEALED + self._fernet.encrypt(private_pem.encode()).decode()

    def open(self, key: SigningKey) -> Ed25519PrivateKey:
        """The private key of `key`; SealedElsewhere if it was sealed with another secret."""
        opened = self._opened.get(key.kid)
        if opened is None:
            stored = key.private_pem
            try:
                pem = self._fernet.decrypt(stored.removeprefix(SEALED).encode()) if stored.startswith(SEALED) else stored.encode()
            except InvalidToken:
                raise SealedElsewhere(f"signing key {key.kid} was sealed with another secret than this registry's "
                                      "(BPM_SIGNING_SECRET, or the operator key it is derived from)") from None
            opened = self._opened[key.kid] = serialization.load_pem_private_key(pem, password=None)
        return opened


def _new_key(now: datetime, sealer: Sealer) -> SigningKey:
    private = Ed25519PrivateKey.generate()
    public_pem = private.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo).decode()
    private_pem = private.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()).decode()
    kid = hashlib.sha256(public_pem.encode()).hexdigest()[:16]
    return SigningKey(kid=kid, private_pem=sealer.seal(private_pem), public_pem=public_pem, created_at=now)


def current(session: Session, now: datetime, sealer: Sealer) -> SigningKey:
    """The key that signs now: the newest unretired one, made on first use."""
    key = session.scalar(select(SigningKey).where(SigningKey.retired_at.is_(None)).order_by(SigningKey.id.desc()).limit(1))
    if key is None:
        key = _new_key(now, sealer)
        session.add(key)
        session.flush()
    return key


def seal_all(session: Session, sealer: Sealer) -> int:
    """Seal every private half kept in clear (by a registry before sealing); returns how many."""
    clear = list(session.scalars(select(SigningKey).where(SigningKey.private_pem != ERASED, ~SigningKey.private_pem.startswith(SEALED))))
    for key in clear:
        key.private_pem = sealer.seal(key.private_pem)
    session.flush()
    return len(clear)


def verifying(session: Session, now: datetime) -> list[SigningKey]:
    """Keys a token may be signed with: the current ones and those retired within the grace period."""
    return list(
        session.scalars(
            select(SigningKey).where(or_(SigningKey.retired_at.is_(None), SigningKey.retired_at > now - GRACE)).order_by(SigningKey.id)
        )
    )


def rotate(session: Session, now: datetime, sealer: Sealer, *, revoke: bool = False) -> SigningKey:
    """Retire every signing key and make a new one; tokens already issued stay valid until they
    lapse, or, with `revoke` (a key thought stolen), not at all: the old keys are deleted.

    A retired key never signs again, so its private half is erased at once (only its public
    half verifies, for the grace period); keys retired longer than that are deleted."""
    gone = SigningKey.id.is_not(None) if revoke else SigningKey.retired_at <= now - GRACE
    session.execute(delete(SigningKey).where(gone).execution_options(synchronize_session=False))
    session.execute(update(SigningKey).where(SigningKey.retired_at.is_(None)).values(retired_at=now, private_pem=ERASED)
                    .execution_options(synchronize_session=False))
    key = _new_key(now, sealer)
    session.add(key)
    session.flush()
    return key


def sign(session: Session, claims: dict, now: datetime, sealer: Sealer) -> tuple[str, str, datetime]:
    """(the token, the id of the key that signed it, when it expires) for `claims`."""
    key = current(session, now, sealer)
    expires = now + timedelta(seconds=TTL_S)
    payload = {**claims, "iss": ISSUER, "iat": int(now.timestamp()), "exp": int(expires.timestamp())}
    return jwt.encode(payload, sealer.open(key), algorithm=ALGORITHM, headers={"kid": key.kid}), key.kid, expires
