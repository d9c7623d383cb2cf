"""The registry's signing keys and the call tokens it signs with them (see `bpm.tokens`)."""

from __future__ import annotations

import hashlib
from datetime import datetime, timedelta

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from sqlalchemy import delete, or_, select, update
from sqlalchemy.orm import Session

from api.models import SigningKey
from bpm.tokens import ALGORITHM, ISSUER, TTL_S

# A retired key keeps verifying this long: longer than any token it signed lives.
GRACE = timedelta(seconds=10 * TTL_S)
ERASED = ""  # the private half of a retired key


def _new_key(now: datetime) -> SigningKey:
    private = Ed25519PrivateKey.generate()
    public_pem = private.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo).decode()
    private_pem = private.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()).decode()
    kid = hashlib.sha256(public_pem.encode()).hexdigest()[:16]
    return SigningKey(kid=kid, private_pem=private_pem, public_pem=public_pem, created_at=now)


def current(session: Session, now: datetime) -> SigningKey:
    """The key that signs now: the newest unretired one, made on first use."""
    key = session.scalar(select(SigningKey).where(SigningKey.retired_at.is_(None)).order_by(SigningKey.id.desc()).limit(1))
    if key is None:
        key = _new_key(now)
        session.add(key)
        session.flush()
    return key


def verifying(session: Session, now: datetime) -> list[SigningKey]:
    """Keys a token may be signed with: the current ones and those retired within the grace period."""
    return list(
        session.scalars(
            select(SigningKey).where(or_(SigningKey.retired_at.is_(None), SigningKey.retired_at > now - GRACE)).order_by(SigningKey.id)
        )
    )


def rotate(session: Session, now: datetime) -> SigningKey:
    """Retire every signing key and make a new one; tokens already issued stay valid until they lapse.

    A retired key never signs again, so its private half is erased at once (only its public
    half verifies, for the grace period); keys retired longer than that are deleted."""
    session.execute(delete(SigningKey).where(SigningKey.retired_at <= now - GRACE).execution_options(synchronize_session=False))
    session.execute(update(SigningKey).where(SigningKey.retired_at.is_(None)).values(retired_at=now, private_pem=ERASED)
                    .execution_options(synchronize_session=False))
    key = _new_key(now)
    session.add(key)
    session.flush()
    return key


def sign(session: Session, claims: dict, now: datetime) -> tuple[str, datetime]:
    key = current(session, now)
    expires = now + timedelta(seconds=TTL_S)
    payload = {**claims, "iss": ISSUER, "iat": int(now.timestamp()), "exp": int(expires.timestamp())}
    return jwt.encode(payload, key.private_pem, algorithm=ALGORITHM, headers={"kid": key.kid}), expires
