"""What the registry's and the agents' HTTP apps share: against hostile callers, request
bodies capped (413) and an unexpected failure answered as JSON, never as plain text; and
how long their servers keep idle connections."""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

log = logging.getLogger("bpm_http.web")

MAX_BODY = 1 << 20  # JSON requests: 1 MiB is thousands of tasks
# How long the servers keep an idle connection open: longer than any client keeps one for
# reuse (httpx: 5 s), so that a client never sends on a connection the server is closing
# at that moment, which fails a POST with no answer (seen under load as ReadError and
# "Server disconnected without sending a response").
KEEP_ALIVE_S = 30


class BodyLimit:
    """ASGI middleware refusing request bodies over `max_bytes` with 413, whether the
    client declares the length or streams the body in chunks."""

    def __init__(self, app: ASGIApp, max_bytes: int = MAX_BODY, paths: dict[str, int] | None = None) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.paths = paths or {}  # larger caps for path prefixes (checkpoint archives)

    def _cap(self, path: str) -> int:
        return max([cap for prefix, cap in self.paths.items() if path.startswith(prefix)], default=self.max_bytes)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        cap = self._cap(scope.get("path", ""))
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None:
            if not declared.isdigit():
                await _answer(send, 400, "Content-Length is not a number")
                return
            if int(declared) > cap:
                await _answer(send, 413, f"request body over {cap} bytes")
                return
        seen = 0

        async def counted() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > cap:
                    raise HTTPException(413, f"request body over {cap} bytes")
            return message

        await self.app(scope, counted, send)


async def _answer(send: Send, status: int, detail: str) -> None:
    response = JSONResponse({"detail": detail}, status_code=status)
    await response({"type": "http"}, _no_receive, send)


async def _no_receive() -> Message:
    return {"type": "http.disconnect"}


def harden(app: FastAPI, max_body: int = MAX_BODY, paths: dict[str, int] | None = None) -> None:
    """Cap request bodies and answer unexpected failures with a JSON 500 (logged here)."""
    app.add_middleware(BodyLimit, max_bytes=max_body, paths=paths)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.error("%s %s failed", request.method, request.url.path, exc_info=exc)
        return JSONResponse({"detail": "internal error; the server's log has the details"}, status_code=500)
