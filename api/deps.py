"""Request-scoped dependencies: the session whose transaction the request owns, and the caller."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, nullcontext
from datetime import datetime
from typing import Annotated, TypeVar

import anyio
from fastapi import Depends, Request
from sqlalchemy.engine import Connection
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool

from api.auth import Principal, principal_dependency
from api.quotas import Quotas

_READ_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
T = TypeVar("T")


async def _turn(request: Request) -> AsyncIterator[None]:
    """A request takes its turn here, on the event loop, before it holds a connection.

    At most `REQUEST_TURNS` requests hold a connection at once: fewer than the worker threads
    and the pool's connections. Without the limit, a crowd of requests each took a connection
    (to authenticate) and then waited for a thread, while the threads waited for a connection:
    every request stalled until the pool's timeout. Waiting here costs neither.

    On SQLite, writing requests also take turns with each other first: SQLite has one writer at
    a time, and queued here writers wake in turn at once, where SQLite's busy handler would
    poll with growing sleeps.
    """
    state = request.app.state
    async with _writers_turn(state, request.method not in _READ_METHODS), state.turns:
        yield


def _writers_turn(state, writes: bool = True) -> AbstractAsyncContextManager:
    """On SQLite, a writer's turn after the other writers (`_turn`); otherwise, and for a reader, none."""
    return state.write_lock if writes and state.write_lock is not None else nullcontext()


async def _session(request: Request, _turn: None = Depends(_turn, scope="function")) -> AsyncIterator[Session]:
    """Commit when the endpoint returns, roll back when it raises: services only flush.

    Opening a session does no I/O, so it happens on the event loop. A blocking endpoint
    commits in its own thread turn (`api.routing`); otherwise the commit, and any rollback,
    takes a turn here, shielded from the request's cancellation so that a client that hangs
    up never leaves a connection in a transaction. Closing a session that has ended does no I/O.
    """
    state = request.app.state
    factory = state.read_session if request.method in _READ_METHODS else state.write_session
    session = factory()
    try:
        yield session
        if not session.info.get(_COMMITTED):
            with anyio.CancelScope(shield=True):
                await run_in_threadpool(commit, session)
    except BaseException:
        with anyio.CancelScope(shield=True):
            await run_in_threadpool(session.rollback)
        raise
    finally:
        session.close()


_COMMITTED = "committed"


async def in_transaction(state, work: Callable[[Connection], T]) -> T:
    """`work` on a connection, in a write transaction of its own outside any request (a
    change-feed stream's slot, `api.routers.feed`): after SQLite's other writers (`_turn`),
    in one thread turn, shielded from cancellation so that no connection is left in a
    transaction."""
    def run() -> T:
        with state.write_session() as session, session.begin():
            return work(session.connection())

    with anyio.CancelScope(shield=True):
        async with _writers_turn(state):
            return await run_in_threadpool(run)


def commit(session: Session) -> None:
    """Commit the request's session, in the thread that ran its endpoint."""
    session.commit()
    session.info[_COMMITTED] = True


# "function" scope runs the commit before the response is sent, so a failed commit is never reported as success.
DbSession = Annotated[Session, Depends(_session, scope="function")]
Caller = Annotated[Principal, Depends(principal_dependency(_session), scope="function")]


async def _now(request: Request):
    """The registry's clock; tests replace `app.state.clock` to step time without sleeping."""
    return request.app.state.clock()


Now = Annotated[datetime, Depends(_now)]


async def _quotas(request: Request) -> Quotas:
    return request.app.state.quotas


Quota = Annotated[Quotas, Depends(_quotas)]
