"""An agent's call tokens: it asks the registry for its own and verifies its callers' (`bpm.tokens`);
and how it keeps a secret in a file."""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

from bpm_http.client import RegistryClient
from bpm.tokens import TTL_S, Grant, TokenRefused, key_id, verify

log = logging.getLogger(__name__)

KEYS_REFRESH_S = 1.0  # an unknown key id makes the agent re-read the registry's keys, at most this often
# The keys an agent knows are read again when a call comes this long after the last read: a
# key the registry no longer lists (retired past its grace) stops verifying here within it.
KEYS_MAX_AGE_S = 60.0


class Credentials:
    def __init__(self, client: RegistryClient, me: str, clock: Callable[[], float] = time.time) -> None:
        self.client = client
        self.me = me
        self.clock = clock
        self._lock = threading.Lock()
        self._tokens: dict[tuple, tuple[str, float]] = {}
        self._keys: dict[str, str] = {}
        self._keys_read_at = float("-inf")
        self._reading = threading.Lock()  # one read of the keys at a time

    def token(self, task_id: int | None, purpose: str, audience: str, epoch: int | None) -> str:
        """A token for my call to `audience` about task `task_id` at `epoch` (None, None: about
        no task, as for alerts); reused while it has more than half its life left."""
        wanted = (task_id, purpose, audience, epoch)
        now = self.clock()
        with self._lock:
            held = self._tokens.get(wanted)
            if held is not None and held[1] - now > TTL_S / 2:
                return held[0]
        issued = self.client.call_token(task_id, purpose, audience, epoch)
        expires = datetime.fromisoformat(issued["expires_at"]).timestamp()
        with self._lock:
            self._tokens = {k: v for k, v in self._tokens.items() if v[1] > now}
            self._tokens[wanted] = (issued["token"], expires)
        return issued["token"]

    def verify(self, token: str | None, purpose: str, task: str | None, epoch: int | None) -> Grant:
        """Who calls me with `token` for this purpose, task and epoch; TokenRefused if nobody the registry vouches for."""
        kid = key_id(token) if token else None
        if kid is not None and kid not in self._keys:
            self._read_keys()
        elif kid is not None and self.clock() - self._keys_read_at >= KEYS_MAX_AGE_S:
            # Read in the background: this call goes on with the keys as they are, and never
            # waits on a registry that may be unreachable.
            threading.Thread(target=self._read_keys, name="bpm-keys", daemon=True).start()
        pem = self._keys.get(kid) if kid else None
        if pem is None and kid is not None:
            raise TokenRefused(401, f"the token is not signed by a key the registry lists (read at most every {KEYS_REFRESH_S:g} s: "
                                    "a key just rotated in is known by then)")
        return verify(token, pem, audience=self.me, purpose=purpose, task=task, epoch=epoch, now=self.clock())

    def _read_keys(self) -> None:
        """Read the registry's keys again (for a token signed by a key unknown here, or when
        the last read is older than `KEYS_MAX_AGE_S`), unless they were read less than
        `KEYS_REFRESH_S` ago or another caller is reading them. Unreachable, the registry
        leaves the keys as they were: calls between agents go on through its outage.

        Nobody waits: a flood of tokens with made-up key ids costs the registry one read per
        interval and delays no call (a call that waited would hold up the handover or delta it
        came for). A key newer than the last read (a rotation) is refused until the next read,
        at most an interval later; the caller's next attempt gets through.
        """
        if not self._reading.acquire(blocking=False):
            return
        try:
            if self.clock() - self._keys_read_at < KEYS_REFRESH_S:
                return
            self._keys_read_at = self.clock()
            try:
                listed = self.client.signing_keys()
            except Exception as exc:  # the registry unreachable: the keys stay as they were
                log.warning("cannot read the registry's signing keys: %s", exc)
                return
            with self._lock:
                self._keys = {k["kid"]: k["public_key"] for k in listed}
        finally:
            self._reading.release()


def write_private(path: Path, text: str) -> None:
    """Write a file readable by its owner only (a secret, a memory of its own), replacing it in one step."""
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = path.with_name(path.name + ".new")
    fd = os.open(staging, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(text)
    os.replace(staging, path)


def bearer(header: str | None) -> str | None:
    """The credential of an `Authorization: Bearer ...` header, or None."""
    if not header:
        return None
    scheme, _, value = header.partition(" ")
    if scheme.lower() != "bearer":
        return None
    return value.strip() or None


__all__ = ["Credentials", "Grant", "TokenRefused", "bearer", "write_private"]
