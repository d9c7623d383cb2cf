"""Request-scoped dependencies: the session whose transaction the request owns, and the caller."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from datetime import datetime
from typing import Annotated

from fastapi import Depends, Request
from sqlalchemy.orm import Session

from api.auth import Principal, principal_dependency

_READ_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


async def _write_turn(request: Request) -> AsyncIterator[None]:
    """On SQLite, writing requests take turns here, on the event loop.

    SQLite has one writer at a time. Queued here, writers wake in turn at once, where
    SQLite's busy handler would poll with growing sleeps; and waiting costs no worker
    thread, so a crowd of writers cannot starve the thread the current one needs to finish.
    """
    lock = request.app.state.write_lock
    if lock is None or request.method in _READ_METHODS:
        yield
        return
    async with lock:
        yield


def _session(request: Request, _turn: None = Depends(_write_turn, scope="function")) -> Iterator[Session]:
    """Commit when the endpoint returns, roll back when it raises: services only flush."""
    state = request.app.state
    factory = state.read_session if request.method in _READ_METHODS else state.write_session
    session = factory()
    try:
        yield session
        session.commit()
    except BaseException:
        session.rollback()
        raise
    finally:
        session.close()


# "function" scope runs the commit before the response is sent, so a failed commit is never reported as success.
DbSession = Annotated[Session, Depends(_session, scope="function")]
Caller = Annotated[Principal, Depends(principal_dependency(_session), scope="function")]


def _now(request: Request):
    """The registry's clock; tests replace `app.state.clock` to step time without sleeping."""
    return request.app.state.clock()


Now = Annotated[datetime, Depends(_now)]
