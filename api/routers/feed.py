"""The change feed as server-sent events: the admin UI reads a list again when it changed."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable

from fastapi import Request
from fastapi.responses import StreamingResponse
from sqlalchemy.exc import SQLAlchemyError
from starlette.background import BackgroundTask
from starlette.concurrency import run_in_threadpool

from api.auth import Bearer, authenticate, hash_key
from api.deps import Caller, in_transaction
from api.errors import Unauthorized
from api.quotas import FEED_RENEW_S, FEED_SLOT_S, Slot
from api.services import feed
from api.routing import Router

log = logging.getLogger("api.feed")

router = Router(tags=["change feed"])

# A message at least this often, seconds, so that proxies keep the connection and the page
# knows the registry's clock and that the stream lives.
KEEPALIVE_S = 5.0
# What a client waits before it connects again after the stream ends, milliseconds.
RETRY_MS = 2000


def _message(event: str, data: dict) -> str:
    return f"event: {event}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n"


@router.get(
    "/changes/stream",
    response_class=StreamingResponse,
    responses={200: {"description": "Server-sent events", "content": {"text/event-stream": {}}}},
)
async def change_stream(request: Request, caller: Caller, credentials: Bearer) -> StreamingResponse:
    """Which lists changed, as server-sent events (`text/event-stream`).

    The first event, `change`, names every list; later ones name the lists (participants,
    contracts, tasks, offers, movements, ledger, events, replicas, failovers) that changed as
    the caller may read them, each with the registry's time (`at`). An event `time` with no
    list comes at least every 5 s. The stream ends after the registry's `BPM_FEED_LIFETIME_S`
    (the client connects again), or with an event `revoked` when the key stops being valid.
    One key holds at most `api.quotas.FEED_STREAMS` streams open at once (429 past it)."""
    participant_id = None if caller.is_operator else caller.participant.id
    assert credentials is not None  # the caller was authenticated with them
    quotas = request.app.state.quotas
    slot = await in_transaction(request.app.state, lambda db: quotas.open_stream(db, hash_key(credentials.credentials), caller.name))
    closed = _once(lambda: in_transaction(request.app.state, lambda db: quotas.close_stream(db, slot)))
    # Freed when the stream ends, and after the response in any case (a stream the client left
    # before it began never runs its own end); a worker that dies meanwhile frees it by expiry.
    return StreamingResponse(_stream(request, credentials.credentials, participant_id, slot, closed), media_type="text/event-stream",
                             headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"}, background=BackgroundTask(closed))


def _once(end: Callable[[], Awaitable[None]]) -> Callable[[], Awaitable[None]]:
    ended = False

    async def once() -> None:
        nonlocal ended
        if not ended:
            ended = True
            await end()

    return once


def _marks(state, key: str, participant_id: int | None):
    """The registry's time and the marks of the lists, once the key is checked again (it may have been revoked)."""
    now = state.clock()
    with state.read_session() as session:
        authenticate(session, state.admin_key, key)
        return now, feed.marks(session, participant_id, now, state.settings.heartbeat_timeout_s)


async def _stream(request: Request, key: str, participant_id: int | None, slot: Slot, closed: Callable[[], Awaitable[None]]):
    try:
        async for message in _messages(request, key, participant_id, slot):
            yield message
    finally:
        await closed()


async def _messages(request: Request, key: str, participant_id: int | None, slot: Slot):
    state = request.app.state
    settings = state.settings
    began = renewed = time.monotonic()
    yield f"retry: {RETRY_MS}\n\n"
    before, said = None, 0.0
    while time.monotonic() - began < settings.feed_lifetime_s:
        if time.monotonic() - renewed >= FEED_RENEW_S:
            renewed = time.monotonic()
            try:
                held = await in_transaction(state, lambda db: state.quotas.renew_stream(db, slot))
            except SQLAlchemyError:
                log.warning("change feed: the database does not answer; the stream ends", exc_info=True)
                return
            if not held:  # the client connects again, and holds a slot again if one is free
                log.warning("change feed: a stream lost its slot, unrenewed for %g s; it ends", FEED_SLOT_S)
                return
        try:
            now, marks = await run_in_threadpool(_marks, state, key, participant_id)
        except Unauthorized as exc:
            yield _message("revoked", {"detail": str(exc)})
            return
        except SQLAlchemyError:
            log.warning("change feed: the database does not answer; the stream ends", exc_info=True)
            return
        lists = feed.changed(before, marks)
        before = marks
        if lists or time.monotonic() - said >= KEEPALIVE_S:
            said = time.monotonic()
            yield _message("change" if lists else "time", {"lists": lists, "at": now.isoformat()})
        if await request.is_disconnected():
            return
        await asyncio.sleep(settings.feed_interval_s)
