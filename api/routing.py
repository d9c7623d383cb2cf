"""The registry's router: each request's blocking work in one turn of a worker thread.

FastAPI runs a blocking (`def`) endpoint in a worker thread, each blocking dependency in
another, and validates the endpoint's answer in yet another; each turn is a hand-off to a
thread and back, which on the registry's hot paths cost more CPU than the statements. Here
the caller's key is looked up (`api.auth.KeyToCheck`), the endpoint run and its session
committed (`api.deps.commit`) in one turn; the answer is then validated on the event loop.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

from fastapi import APIRouter
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool

from api.auth import KeyToCheck
from api.deps import commit


def _checked(values: dict[str, Any]) -> dict[str, Any]:
    return {name: value.principal() if isinstance(value, KeyToCheck) else value for name, value in values.items()}


def in_one_turn(endpoint: Callable[..., Any]) -> Callable[..., Any]:
    """`endpoint` as a coroutine that FastAPI reads as it would the endpoint (parameters and
    annotations through `__wrapped__`): a blocking one runs in one thread turn with the check
    of its caller's key and its commit; a coroutine gets its caller checked in a turn first."""
    if inspect.iscoroutinefunction(endpoint):

        @functools.wraps(endpoint)
        async def run_coroutine(**values: Any) -> Any:
            if any(isinstance(value, KeyToCheck) for value in values.values()):
                values = await run_in_threadpool(_checked, values)
            return await endpoint(**values)

        return run_coroutine

    def turn(values: dict[str, Any]) -> Any:
        answer = endpoint(**_checked(values))
        for session in {value.session if isinstance(value, KeyToCheck) else value for value in values.values()
                        if isinstance(value, (Session, KeyToCheck))}:
            commit(session)
        return answer

    @functools.wraps(endpoint)
    async def run(**values: Any) -> Any:
        return await run_in_threadpool(turn, values)

    return run


class Router(APIRouter):
    def add_api_route(self, path: str, endpoint: Callable[..., Any], **kwargs: Any) -> None:
        super().add_api_route(path, in_one_turn(endpoint), **kwargs)
