"""The registry application: `create_app()` plus a lifespan that owns the database engine."""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
from collections.abc import Callable
from contextlib import asynccontextmanager
from datetime import datetime
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from sqlalchemy import text

from api import metrics, signing
from api.db import REQUEST_TURNS, make_engine, session_factories, utcnow
from api.errors import ERROR_RESPONSES, install_error_handlers
from api.quotas import Quotas
from api.routers import contracts, feed, ha, ledger, offers, participants, tasks, tokens
from api.ui import router as ui_router
from bpm import __version__
from api.settings import Settings, get_settings
from bpm_http.web import harden

log = logging.getLogger("bpm.registry")

ADMIN_KEY_FILE = ".bpm-admin-key"


class ProductionKeyMissing(RuntimeError):
    pass


def resolve_admin_key(settings: Settings, key_file: Path = Path(ADMIN_KEY_FILE)) -> tuple[str, bool]:
    """The operator key and whether it was just generated.

    Production refuses to run without BPM_ADMIN_KEY. Locally a key is generated once and
    kept in `.bpm-admin-key` (mode 0600) so it survives restarts, like the SQLite file.
    """
    if settings.admin_key:
        return settings.admin_key, False
    if settings.mode == "production":
        raise ProductionKeyMissing("BPM_ADMIN_KEY must be set in production mode")
    if key_file.exists():
        return key_file.read_text().strip(), False
    key = "bpm_admin_" + secrets.token_urlsafe(32)
    fd = os.open(key_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(key + "\n")
    return key, True


def create_app(
    settings: Settings | None = None,
    *,
    admin_key: str | None = None,
    migrate: bool = True,
    clock: Callable[[], datetime] = utcnow,
) -> FastAPI:
    """Build the registry app; the engine is created and disposed by the lifespan."""
    settings = settings or get_settings()
    if admin_key is None:
        admin_key, _ = resolve_admin_key(settings)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        if migrate:
            from api.migrate import upgrade

            upgrade(settings.database_url)
        engine = make_engine(settings.database_url)
        app.state.engine = engine
        app.state.read_session, app.state.write_session = session_factories(engine)
        app.state.write_lock = asyncio.Lock() if engine.dialect.name == "sqlite" else None
        app.state.turns = asyncio.Semaphore(REQUEST_TURNS)
        with app.state.write_session() as session, session.begin():
            signing.seal_all(session, app.state.sealer)
            # Agents read the key that verifies call tokens from the start. One this registry
            # cannot open (its signing secret changed, with the operator key it derives from) is
            # retired: tokens it signed verify until they lapse, a new key signs from now on.
            try:
                app.state.sealer.open(signing.current(session, clock(), app.state.sealer))
            except signing.SealedElsewhere as exc:
                log.warning("%s; rotating to a new signing key", exc)
                signing.rotate(session, clock(), app.state.sealer)
        try:
            yield
        finally:
            engine.dispose()

    app = FastAPI(
        title="BPM contract registry",
        version=__version__,
        description="Participants, bounded-price contracts, tasks, offers, movements and the ledger of a federation.",
        lifespan=lifespan,
        # The API's pages (/docs, /redoc) load their scripts from a CDN, in the registry's own
        # origin, where the operator types keys: served in local mode only. /openapi.json stays.
        docs_url="/docs" if settings.mode == "local" else None,
        redoc_url="/redoc" if settings.mode == "local" else None,
    )
    app.state.settings = settings
    app.state.quotas = Quotas()
    app.state.admin_key = admin_key
    app.state.sealer = signing.Sealer(settings.signing_secret or f"operator:{admin_key}")
    app.state.clock = clock
    harden(app)
    install_error_handlers(app)

    for router in (participants.router, participants.me_router, contracts.router, tasks.router, offers.router, ledger.router, ha.router, tokens.router,
                   feed.router):
        app.include_router(router, prefix="/api/v1", responses=ERROR_RESPONSES)

    @app.get("/healthz", tags=["health"])
    def healthz(request: Request):
        """Ready when the database answers."""
        try:
            with request.app.state.engine.connect() as conn:
                conn.execute(text("SELECT 1"))
        except Exception:  # any database failure means not ready; its text stays in the log
            log.warning("health check: the database does not answer", exc_info=True)
            return JSONResponse({"status": "unavailable", "detail": "the database does not answer"}, status_code=503)
        return {"status": "ok", "version": __version__}

    metrics.install(app)  # after harden: its timer is the outermost middleware
    app.include_router(ui_router)
    return app


def create_app_from_env() -> FastAPI:
    """Factory for `uvicorn --factory` (several workers): settings from the environment, no migration."""
    return create_app(migrate=False)
