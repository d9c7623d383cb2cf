"""Domain errors raised by services, and their JSON rendering (never a bare 500 for bad input)."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from sqlalchemy.exc import DataError, IntegrityError, OperationalError

# PostgreSQL's codes for a transaction it aborted because another one ran concurrently:
# deadlock detected, serialization failure. Nothing was written; the caller may retry.
CONCURRENCY_ABORTS = {"40P01", "40001"}


class RegistryError(Exception):
    status_code = 400

    def __init__(self, message: str, **extra: object) -> None:
        super().__init__(message)
        self.message = message
        self.extra = extra


class Unauthorized(RegistryError):
    status_code = 401


class Forbidden(RegistryError):
    status_code = 403


class NotFound(RegistryError):
    status_code = 404


class Conflict(RegistryError):
    status_code = 409


class Invalid(RegistryError):
    status_code = 422


class TooManyRequests(RegistryError):
    """Over a quota (`api.quotas`); `retry_after_s` goes out as `Retry-After` too."""

    status_code = 429


class ErrorOut(BaseModel):
    detail: str | list = "what was wrong, readable"


# Every status the API answers with besides success, documented on every operation.
ERROR_RESPONSES: dict[int | str, dict] = {
    status: {"model": ErrorOut, "description": text}
    for status, text in {
        400: "The request cannot be done as asked (a rule of the mechanism says why)",
        401: "No key, or a key the registry does not know",
        403: "The key's holder is not a party to this",
        404: "No such record",
        409: "The record's state does not allow this now, or a concurrent change won; retry",
        413: "The request body is too large",
        422: "Invalid input: the detail lists each field and why",
        429: "Over a quota of the caller's (or of its address, for bad keys); Retry-After says when to try again",
    }.items()
}


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(RegistryError)
    async def _registry_error(_request: Request, exc: RegistryError) -> JSONResponse:
        headers = {"WWW-Authenticate": "Bearer"} if exc.status_code == 401 else None
        if exc.status_code == 429:
            headers = {"Retry-After": str(exc.extra.get("retry_after_s", 1))}
        return JSONResponse({"detail": exc.message, **exc.extra}, status_code=exc.status_code, headers=headers)

    @app.exception_handler(IntegrityError)
    async def _integrity(_request: Request, _exc: IntegrityError) -> JSONResponse:
        # A constraint caught a race the services' checks could not see (at flush or at commit).
        return JSONResponse({"detail": "the change conflicts with the registry's current state; retry"}, status_code=409)

    @app.exception_handler(OperationalError)
    async def _operational(_request: Request, exc: OperationalError) -> JSONResponse:
        if getattr(exc.orig, "sqlstate", None) in CONCURRENCY_ABORTS:
            return JSONResponse({"detail": "a concurrent change won; nothing was written, retry"}, status_code=409)
        raise exc

    @app.exception_handler(DataError)
    async def _data_error(_request: Request, _exc: DataError) -> JSONResponse:
        # A value the database refused (out of a column's range, say) that validation let through.
        return JSONResponse({"detail": "a value is out of the range the registry can store"}, status_code=422)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = [
            {"loc": list(e.get("loc", ())), "msg": e.get("msg", ""), "type": e.get("type", "")}
            for e in exc.errors()
        ]
        summary = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in errors)
        return JSONResponse({"detail": errors, "message": summary or "invalid request"}, status_code=422)
