"""Request-scoped dependencies: the session whose transaction the request owns, and the caller."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime
from typing import Annotated

from fastapi import Depends, Request
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from api.auth import Principal, principal_dependency
from api.errors import Conflict

_READ_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


def _session(request: Request) -> Iterator[Session]:
    """Commit when the endpoint returns, roll back when it raises: services only flush."""
    state = request.app.state
    writing = request.method not in _READ_METHODS
    factory = state.write_session if writing else state.read_session
    # SQLite has one writer at a time; queueing writers on a lock here wakes them in turn
    # at once, where SQLite's own busy handler would poll with growing sleeps.
    lock = state.write_lock if writing else None
    if lock is not None:
        lock.acquire()
    session = factory()
    try:
        yield session
        try:
            session.commit()
        except IntegrityError as exc:
            session.rollback()
            raise Conflict("the change conflicts with the registry's current state; retry") from exc
    except BaseException:
        session.rollback()
        raise
    finally:
        session.close()
        if lock is not None:
            lock.release()


# "function" scope runs the commit before the response is sent, so a failed commit is never reported as success.
DbSession = Annotated[Session, Depends(_session, scope="function")]
Caller = Annotated[Principal, Depends(principal_dependency(_session), scope="function")]


def _now(request: Request):
    """The registry's clock; tests replace `app.state.clock` to step time without sleeping."""
    return request.app.state.clock()


Now = Annotated[datetime, Depends(_now)]
