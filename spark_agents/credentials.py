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

from bpm_http.client import RegistryClient, RegistryError
from bpm.tokens import TTL_S, Grant, TokenRefused, key_id, verify

log = logging.getLogger(__name__)

KEYS_REFRESH_S = 1.0  # an unknown key id makes the agent re-read the registry's keys, at most this often
# The keys an agent knows are read again when a call comes this long after the last read: a
# key the registry no longer lists (retired past its grace) stops verifying here within it.
KEYS_MAX_AGE_S = 60.0
# A caller's key mark (`bpm.tokens`) is read again when a call comes this long after the last
# read: a token of a key revoked or rotated since stops working here within it.
KEY_MARK_MAX_AGE_S = 5.0


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
        self._marks: dict[str, tuple[str | None, float]] = {}  # caller -> (its key mark, None: no such participant; when read)
        self._marks_reading: set[str] = set()  # callers whose mark is being read
        self._marks_tried: dict[str, float] = {}  # caller -> when its mark was last asked for, answered or not

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

    def forget_tokens(self) -> None:
        """Ask the registry afresh for every later call (this participant's key changed)."""
        with self._lock:
            self._tokens.clear()

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
        grant = verify(token, pem, audience=self.me, purpose=purpose, task=task, epoch=epoch, now=self.clock())
        self._check_key(grant)
        return grant

    def _check_key(self, grant: Grant) -> None:
        """TokenRefused if the caller's key changed (rotated or revoked) since the registry
        issued the token: the token's key mark against the caller's as the registry lists it
        (`GET /participants/{caller}`). A mark read less than `KEY_MARK_MAX_AGE_S` ago is used
        as it is; an older one that agrees is read again in the background (this call goes on,
        and never waits on a registry that may be unreachable); a mark that disagrees, or none
        known, is read before the answer, at most once a `KEYS_REFRESH_S` per caller. With the
        registry unreachable and nothing known, the registry's signature stands."""
        if grant.key_mark is None:
            raise TokenRefused(401, "the token names no key of its caller; ask the registry for a new one")
        with self._lock:
            known, read_at = self._marks.get(grant.caller, (None, float("-inf")))
            tried_at = self._marks_tried.get(grant.caller, float("-inf"))
        now = self.clock()
        if known == grant.key_mark:
            if now - read_at >= KEY_MARK_MAX_AGE_S and now - tried_at >= KEYS_REFRESH_S:
                threading.Thread(target=self._read_mark, args=(grant.caller,), name="bpm-key-mark", daemon=True).start()
            return
        if now - tried_at >= KEYS_REFRESH_S:
            self._read_mark(grant.caller)
            with self._lock:
                known, read_at = self._marks.get(grant.caller, (None, float("-inf")))
        if read_at == float("-inf") or known == grant.key_mark:
            return
        raise TokenRefused(401, f"{grant.caller}'s registry key changed (rotated or revoked) after the token was issued; "
                                "ask the registry for a new one")

    def _read_mark(self, caller: str) -> None:
        """Read `caller`'s key mark from the registry, unless another call is reading it; unreachable, it stays as it was."""
        with self._lock:
            if caller in self._marks_reading:
                return
            self._marks_reading.add(caller)
            at = self._marks_tried[caller] = self.clock()
        try:
            try:
                mark = self.client.participant(caller).get("key_mark") or None
            except RegistryError as exc:
                if exc.status != 404:
                    log.warning("cannot read %s's key mark: %s", caller, exc)
                    return
                mark = None  # no such participant: none of its tokens stands
            except Exception as exc:  # the registry unreachable
                log.warning("cannot read %s's key mark: %s", caller, exc)
                return
            with self._lock:
                self._marks[caller] = (mark, at)
        finally:
            with self._lock:
                self._marks_reading.discard(caller)

    def read_keys_now(self) -> None:
        """Read the registry's keys now, however recent the last read (the registry told of a
        rotation: a key it revoked stops verifying here at once)."""
        with self._lock:
            self._keys_read_at = float("-inf")
        self._read_keys()

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
